"""Live acquisitions: created empty, grown by appends and by streams ingested as their frames come, and
settled into the plain resident they are once every scan position has arrived.

A live acquisition's second home is its live copy (``copies.py``): every frame it receives is written there
too, so a worker's death loses nothing a detector sent. One stream feeds an acquisition at a time (its frames
stay in order); a detector's series may send consecutive acquisitions on one connection (a ``SeriesSource``).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...device import array_module, synchronize, use_own_stream
from ...io.stream import FrameSource
from ...resident import DenseCounts, Resident
from ...resident.base import check_dtype, check_shape
from ...resident.compressed import check_layout
from ...resident.live import LIVE_LAYOUTS, LiveCounts, start_bytes
from ..stops import Stop
from .copies import LocalCopies
from .residency import Residency
from .threads import on

INGEST_THREADS = 8  # streams read at a time


class LiveIngest:
    """The live acquisitions of one shard, the streams feeding them (on threads of their own) and their appends
    (on ``loads``, its load threads)."""

    def __init__(self, residency: Residency, copies: LocalCopies, loads: ThreadPoolExecutor):
        self.residency = residency
        self.residents = residency.residents
        self.copies = copies
        self.loads = loads
        self.ingests = ThreadPoolExecutor(INGEST_THREADS, thread_name_prefix="qgpu-ingest", initializer=use_own_stream)
        self.ingesting: dict[str, str] = {}  # live acquisition -> the stream feeding it

    async def create(self, name: str, shape: tuple, dtype: str, layout: str, copy: dict | None = None,
                     frames: np.ndarray | None = None) -> dict:
        """Hold a new, empty live acquisition ``name`` that grows by ``append`` and ``ingest``, with a live copy
        (``copies.py``) as its second home: ``copy`` and the ``frames`` it holds (taken over from a lost
        shard: appended before the acquisition is ready again), else a new one."""
        shape, dtype = check_shape(shape), check_dtype(dtype)
        check_layout(layout, dtype, LIVE_LAYOUTS)
        budget = self.residency.budget

        def build() -> tuple[Resident, str]:
            resident = LiveCounts(name, shape, dtype, layout, array_module())
            resident.room = lambda nbytes: budget.check_room(f"live acquisition {name!r} needs", nbytes)
            if frames is not None:
                step = max(1, shape[1], len(frames) // 8)
                for lo in range(0, len(frames), step):
                    resident.append(np.array(frames[lo:lo + step]))
            synchronize()
            return resident, f"{layout}: asked for"

        record = await self.residency.add(name, start_bytes(shape, dtype, layout), build, None, layout)
        if copy is None:
            copy = await self.copies.started_live(name, shape, dtype, layout)
        if copy is not None:
            await self.copies.own(name, self.residents[name], copy)
        return record

    def live(self, name: str) -> LiveCounts:
        resident = self.residency.resident(name)
        if not isinstance(resident, LiveCounts):
            raise ValueError(f"acquisition {name!r} is not live: it was loaded, or all its {resident.n_frames} scan positions have arrived")
        return resident

    async def append(self, name: str, frames: np.ndarray) -> int:
        """Add the next scan positions' frames to live acquisition ``name``; the positions received."""
        resident = self.live(name)
        if name in self.ingesting:
            raise ValueError(f"acquisition {name!r} is ingesting from {self.ingesting[name]}: appends would interleave with its frames")
        loop = asyncio.get_running_loop()
        received = await on(self.loads, lambda: self.copies.appended(name, resident.append(frames), frames, loop))
        await self.settle(name)
        return received

    def received(self, name: str) -> int:
        """Scan positions held so far (all of them for an acquisition that is not live)."""
        resident = self.residency.resident(name)
        return resident.received if isinstance(resident, LiveCounts) else resident.n_frames

    async def ingest(self, names: list[str], source: FrameSource, asker: str | None) -> dict:
        """Read ``source``'s frames into live acquisitions ``names`` here, as they come (one stream at a time):
        one acquisition, or consecutive acquisitions of a detector's series on one connection (a
        ``SeriesSource``), each settled as it completes. When the stream ends early or breaks, what arrived
        is kept (and the error raised). Releasing an acquisition drops the stream; ``cancel`` (its client,
        ``asker``, interrupted) stops reading it after the frames in hand, keeping them (the reply's "stopped": why)."""
        residents = [self.live(name) for name in names]
        if len(names) > 1 and not hasattr(source, "series"):
            raise ValueError(f"{source.describe()} sends one acquisition a connection: ingest {len(names)} acquisitions one by one")
        shapes = {(r.det_shape, r.dtype) for r in residents}
        if len(shapes) > 1:
            raise ValueError(f"the acquisitions of one stream hold frames of one shape and dtype, these hold {sorted(map(str, shapes))}")
        busy = [f"{n!r} is already ingesting from {self.ingesting[n]}" for n in names if n in self.ingesting]
        if busy:
            raise ValueError(f"acquisition {busy[0]}: one stream at a time keeps its frames in order")
        stops = self.residency.stops
        busy = [n for n in names if n in stops]
        if busy:
            raise ValueError(f"acquisition {busy[0]!r} is being loaded on {self.residency.address}")
        self.ingesting.update((n, source.describe()) for n in names)
        stop = Stop(names, asker)
        stops.update((n, stop) for n in names)
        loop = asyncio.get_running_loop()

        def pull() -> int:
            frames, det_shape, xp = 0, residents[0].det_shape, residents[0].xp
            if hasattr(source, "series"):
                blocks = source.series(det_shape, residents[0].dtype, [r.n_frames - r.received for r in residents], xp)
            else:
                blocks = ((0, block) for block in source.frames(det_shape, residents[0].dtype, xp))
            try:
                for k, block in blocks:
                    name, resident = names[k], residents[k]
                    if self.residents.get(name) is not resident:
                        raise ValueError(f"acquisition {name!r} was released while {source.describe()} streamed into it: the stream was dropped")
                    self.copies.appended(name, resident.append(block), block, loop)
                    frames += len(block)
                    if resident.complete and k + 1 < len(names):
                        asyncio.run_coroutine_threadsafe(self.settle(name), loop).result()
                    if stop.asked:
                        break  # the frames in hand are kept; closing the blocks closes the connection
            finally:
                blocks.close()
            return frames

        try:
            frames = await on(self.ingests, pull)
        finally:
            for name in names:
                self.ingesting.pop(name, None)
                stops.pop(name, None)
            stop.ended.set()
            for name in names:
                await self.settle(name)
        return {"frames": frames, "received": [r.received for r in residents]} | ({} if stop.why is None else {"stopped": stop.why})

    async def settle(self, name: str) -> None:
        """A live acquisition whose every position has arrived becomes the plain resident it now is (and
        the catalog's record says so): saved, fed and reconstructed as one loaded from a file."""
        resident = self.residents.get(name)
        if isinstance(resident, LiveCounts) and resident.complete:
            index = resident.layout == "dense" and DenseCounts.index_bytes(resident.shape, resident.dtype) <= self.residency.budget.free_bytes()
            done = await on(self.loads, resident.finished, index)
            if self.residents.get(name) is resident:
                self.residents[name] = done
                self.residency.forget(name)
                reason = f"{resident.layout}: asked for" + ("" if index or resident.layout != "dense" else
                                                           "; its index did not fit the budget, so every query reads the counts")
                await self.residency.worker.scheduler.qgpu_commit(name=name, owner=self.residency.address,
                                                                  record={**done.describe(), "source": None, "live": False, "layout_reason": reason})
                if self.copies.live(name) and resident.layout == "compressed":
                    asyncio.ensure_future(self.copies.keep(name, done))  # saved as held: smaller than its frames
