"""Holding an acquisition again for the catalog: after its shard was lost (a re-home), or to take it over
from another shard (a move).

It comes from its node-local copy where this shard can reach it (read and checked before anything is
claimed; a damaged one is removed): a live copy is held as live as it was, a saved one reopened and taken over
as this shard's copy. Else from its source file or saved resident, else from the bytes the catalog kept of a
put array. The catalog learns where it came from, and why the copy could not be used.
"""

from __future__ import annotations

import io

import numpy as np

from ...io.source import Source
from .copies import LocalCopies, taken_over
from .live import LiveIngest
from .loader import Loader
from .residency import Residency


class Restorer:
    """Holds names again on one shard, through its other parts."""

    def __init__(self, residency: Residency, copies: LocalCopies, loader: Loader, live: LiveIngest):
        self.residency = residency
        self.copies = copies
        self.loader = loader
        self.live = live

    async def restore(self, name: str, how: dict) -> dict:
        """Hold ``name`` again as ``how`` says (source or None, layout, copy or None, local: the node-local copy
        or None), then tell the catalog where it came from (``restored_from``, and ``copy_error``); its record."""
        self.residency.restoring.add(name)
        try:
            record, restored_from, copy_error, local = await self.restored(name, how)
        finally:
            self.residency.restoring.discard(name)
        await self.residency.worker.scheduler.qgpu_restored(name=name, owner=self.residency.address, restored_from=restored_from,
                                                            stale=local, copy_error=copy_error)
        return record

    async def restored(self, name: str, how: dict) -> tuple[dict, str, str | None, dict | None]:
        """``restore``'s hold: the record, where it came from, why the copy could not be used, the copy."""
        local = how["local"]
        live, saved, copy_error = await self.copies.reopened(local)
        if live is not None:
            header, frames = live
            record = await self.live.create(name, tuple(header["shape"]), header["dtype"], header["layout"], taken_over(local), frames)
            await self.live.settle(name)
            restored_from = "live copy"
        elif saved is not None:
            record = await self.loader.load_saved(name, Source(path=local["path"]), how["layout"], recorded=how["source"], saved=saved)
            restored_from = "local copy"
            try:
                mine = taken_over(local)
            except OSError:
                pass  # it went meanwhile: the source remains
            else:
                await self.copies.own(name, self.residency.residents[name], mine)
        elif how["source"] is not None:
            described = dict(how["source"])
            if described["scan_shape"] is not None:
                described["scan_shape"] = tuple(described["scan_shape"])
            record = await self.loader.load(name, Source(**described), how["layout"], None)
            restored_from = "source file"
        elif how["backup"] is not None:
            array = np.load(io.BytesIO(how["backup"]), allow_pickle=False)
            record = await self.loader.put(name, array, how["layout"])
            restored_from = "put backup"
        else:
            raise ValueError(f"acquisition {name!r} has no source file and no copy to be held again from")
        return record, restored_from, copy_error, local
