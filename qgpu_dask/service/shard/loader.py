"""Loads: a source inspected, read into a new resident, or a saved one reopened; a client's array put; a
resident saved or exported.

A load opens its file once. A compressed one is coded as it is read and admitted by the bytes a sample of its
frames makes it expect; one that outgrows them and the shard's free budget is refused, nothing of it left.
``inspect`` makes the same plan from the same sample: a compressed plan is kept (``PLAN_SECONDS``, while the
file is unchanged) for the loads of that file, which then do not sample it again. LOADS_OPEN loads run at a
time, the others wait with their files not opened yet; a load from a detector file that came out compressed
leaves a node-local copy behind (``copies.py``).
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
from dask.utils import format_bytes

from ...device import array_module, synchronize
from ...io.export import Calibration, export_resident
from ...io.load import describe, inspect, model_sample, read_coded, read_dense
from ...io.registry import open_reader
from ...io.saved import describe_saved, is_saved, open_resident, resident_from, save_resident
from ...io.source import Source
from ...resident import DenseCounts, Resident
from ...resident.base import check_dtype, check_shape
from ..layout import Plan, check_saved, held_as, planned
from ..stops import Stop
from .copies import LocalCopies
from .residency import ADMIT_POLL, Residency
from .threads import on

INSPECTORS = 8  # sources inspected at a time (each may read a sample of its frames)
LOADS_OPEN = 5  # loads with their file open at a time: three reading on the load threads, two waiting for them
LOAD_THREADS = 3  # a GPU coded 0.54 s an acquisition with three loads at a time, 0.62 s with two
PLAN_SECONDS = 600.0  # how long a compressed plan made by inspect is kept for the loads of its file (a long series)


def stamp(source: Source) -> tuple[int, int]:
    """(modification time, size) of a source's file or folder: a plan made from it holds while they do."""
    info = os.stat(source.path)
    return info.st_mtime_ns, info.st_size


def named(source: Source, fn: Callable[[], Any]) -> Any:
    """``fn()``, its ValueError naming ``source``'s file where it does not already."""
    try:
        return fn()
    except ValueError as err:
        if source.path in str(err):
            raise
        raise ValueError(f"{source.path!r}: {err}") from err


class Loader:
    """The loads, puts, saves and exports of one shard (on ``loads``, its load threads), and the plans
    ``inspect`` made for them."""

    def __init__(self, residency: Residency, copies: LocalCopies, kind: str, loads: ThreadPoolExecutor):
        self.residency = residency
        self.budget = residency.budget
        self.copies = copies
        self.kind = kind
        self.loads = loads
        self.inspections = ThreadPoolExecutor(1, thread_name_prefix="qgpu-inspections")  # beside the loads, not behind them
        self.slots = asyncio.Semaphore(LOADS_OPEN)
        self.reading: dict[str, int] = {}  # acquisition being loaded -> bytes of counts read so far
        self.plans: dict[tuple[Source, str], tuple[float, tuple, Plan]] = {}  # inspect's compressed plans: (made, stamp, plan)

    async def inspect(self, sources: list[Source], layout: str) -> list[dict]:
        """Shape, dtype and bytes of each source as this worker sees the files, its "load_bytes" those a load
        here would hold (for a compressed one, what a sample of its frames makes it expect), several at a time."""
        def one(source: Source) -> dict:
            if is_saved(source):
                return inspect(source)
            reader = open_reader(source)
            try:
                meta = describe(reader)
                plan = self.plan(source, reader, layout, meta, free)
                if plan.coding is not None:  # its load here takes it rather than sample the file again
                    self.plans[(source, layout)] = (time.monotonic(), stamp(source), plan)
                return {**meta, "load_bytes": plan.expected}
            finally:
                reader.close()

        free = self.budget.free_bytes()  # here, on the event loop that changes what is held
        for key, (made, _, _) in list(self.plans.items()):
            if time.monotonic() - made > PLAN_SECONDS:
                self.plans.pop(key, None)

        def every() -> list[dict]:
            with ThreadPoolExecutor(min(INSPECTORS, len(sources)), thread_name_prefix="qgpu-inspect") as pool:
                return list(pool.map(one, sources))

        return await on(self.inspections, every)

    def plan(self, source: Source, reader, layout: str, meta: dict, free: int) -> Plan:
        """The plan of loading ``reader`` here with ``free`` bytes free (``layout.planned``), a sample of its frames
        read where it may be coded as read; a failed sample read names the file."""
        return named(source, lambda: planned(layout, meta["shape"], meta["dtype"], self.kind, free,
                                              lambda: model_sample(reader), array_module()))

    def inspected_plan(self, source: Source, layout: str) -> Plan | None:
        """The compressed plan ``inspect`` made here for ``source`` and ``layout``, while it is fresh and the file
        unchanged (a compressed plan does not depend on the free budget; every load of the file takes it); None
        otherwise."""
        kept = self.plans.get((source, layout))
        if kept is None or time.monotonic() - kept[0] > PLAN_SECONDS or kept[1] != stamp(source):
            return None
        return kept[2]

    async def load(self, name: str, source: Source, layout: str, asker: str | None) -> dict:
        """Read ``source`` into a new resident named ``name`` (a saved resident is reopened as saved), in one of
        the load slots; ``asker``: the id of the client that asked for it, whose leaving or ``cancel`` stops it
        (``stops.py``). One read from a detector file that is held compressed gets a node-local copy."""
        stops = self.residency.stops
        if name in stops:
            raise ValueError(f"an acquisition named {name!r} is already being loaded or ingested on {self.residency.address}: "
                             "release it or choose another name")
        stop = stops[name] = Stop([name], asker)
        with self.copies.held_back():
            try:
                await self.slot(stop)
                try:
                    if await on(self.loads, is_saved, source):
                        return await self.load_saved(name, source, layout)
                    record = await self.read_source(name, source, layout)
                finally:
                    self.slots.release()
            finally:
                del stops[name]
                stop.ended.set()
        if record["layout"] == "compressed":
            asyncio.ensure_future(self.copies.keep(name, self.residency.residents[name]))
        return record

    async def slot(self, stop: Stop) -> None:
        """One of the LOADS_OPEN load slots, in turn; Cancelled if ``stop`` is asked while waiting for it."""
        acquire = asyncio.ensure_future(self.slots.acquire())
        while not (await asyncio.wait([acquire], timeout=ADMIT_POLL))[0]:
            if stop.asked:
                acquire.cancel()
                try:
                    await acquire
                except asyncio.CancelledError:
                    pass
                else:
                    self.slots.release()  # it got the slot as it was cancelled
                stop.check()

    async def read_source(self, name: str, source: Source, layout: str) -> dict:
        """``load`` of a detector file (opened once here): its resident added, its record."""
        reader = await on(self.loads, open_reader, source)
        try:
            meta = describe(reader)
            plan = self.inspected_plan(source, layout)
            if plan is None:
                plan = await on(self.loads, self.plan, source, reader, layout, meta, self.budget.free_bytes())
            frame_bytes = meta["raw_bytes"] // (meta["shape"][0] * meta["shape"][1])

            stop = self.residency.stops[name]

            def seen(frames: int) -> None:  # after each block read: a stop asked ends the read here
                self.reading[name] = frames * frame_bytes
                stop.check()

            def read() -> tuple[Resident, str]:
                more = 0  # reserved beyond plan.reserve by a load that outgrew it

                def beyond(nbytes: int) -> None:
                    nonlocal more
                    if nbytes > more:
                        self.budget.reserve_more(f"acquisition {name!r} outgrew the {format_bytes(plan.reserve)} reserved for it "
                                                 f"from a sample of its frames: it needs", nbytes - more)
                        more = nbytes

                try:
                    if plan.coding is not None or layout == "compressed":  # coded as read: the dense counts are never held
                        chosen = plan.choice(None)
                        resident = read_coded(name, reader, plan.coding, array_module(), progress=seen, reserved=plan.reserve,
                                              beyond=beyond)
                    else:
                        dense = read_dense(name, reader, progress=seen)
                        chosen = plan.choice(dense)
                        resident = held_as(dense, chosen)
                    synchronize()
                    return resident, chosen.reason
                finally:
                    self.budget.unreserve(more)

            kept = {"positions": meta["positions"]} if "positions" in meta else None  # a scan that is not a raster's
            record = await self.residency.add(name, plan.reserve, lambda: named(source, read), source.describe(), layout, kept)
        finally:
            self.reading.pop(name, None)
            reader.close()
        return record

    def progress(self, names: list[str]) -> int:
        """Bytes of counts read so far by the loads of ``names`` under way here (0 for each that is not)."""
        return sum(self.reading.get(n, 0) for n in names)

    async def load_saved(self, name: str, source: Source, layout: str, recorded: dict | None = None, saved: tuple | None = None) -> dict:
        """Reopen the resident saved at ``source.path`` as it was held, admitted by its resident bytes; the
        catalog records ``recorded`` as its source (default: that file); ``saved``: the file's header and
        arrays, read and checked already."""
        meta = await on(self.loads, describe_saved, source)
        check_saved(layout, meta["layout"])

        def reopen() -> tuple[Resident, str]:
            path = Path(source.path).expanduser()
            resident = open_resident(name, path) if saved is None else resident_from(name, path, *saved)
            synchronize()
            if resident.nbytes != meta["load_bytes"]:
                raise ValueError(f"{source.path!r} changed while it was loaded (its arrays no longer match the header read first)")
            return resident, f"{meta['layout']}: reopened as it was saved"

        return await self.residency.add(name, meta["load_bytes"], reopen, recorded or source.describe(), layout)

    async def save(self, name: str, path: str) -> dict:
        """Write resident ``name`` as it is held to ``path`` (on this worker's file system)."""
        nbytes = await on(self.loads, save_resident, self.residency.resident(name), path)
        return {"path": path, "bytes": nbytes}

    async def export(self, name: str, path: str, calibration: Calibration | None) -> dict:
        """Write resident ``name`` to ``path`` (on this worker's file system) in the layout its suffix names."""
        nbytes = await on(self.loads, export_resident, self.residency.resident(name), path, calibration)
        return {"path": path, "bytes": nbytes}

    async def put(self, name: str, array: np.ndarray, layout: str) -> dict:
        """Hold an array sent by a client as a new resident named ``name``."""
        array = np.asarray(array)
        shape = check_shape(array.shape)
        dtype = check_dtype(array.dtype)
        plan = planned(layout, shape, dtype, self.kind, self.budget.free_bytes())

        def place() -> tuple[Resident, str]:
            dense = DenseCounts.empty(name, shape, dtype)
            dense.write(0, array.reshape(-1, shape[2], shape[3]))
            chosen = plan.choice(dense)
            resident = held_as(dense, chosen)
            synchronize()
            return resident, chosen.reason

        return await self.residency.add(name, plan.reserve, place, None, layout)
