"""Shard: the Dask actor on each worker that holds its residents, their budget, loads and live acquisitions,
and runs every registered query (``queries``) on them through one call, ``ask``.

Every method is ``async``: Dask runs it on the worker's event loop, and the
shard hands real work to its own threads (one for queries, two for loads, each
with its own CUDA stream on a GPU), so a long load never blocks a short query
and the event loop stays free to receive the next call. Queries that read at
most ``INLINE_BYTES`` (a frame, a tiny acquisition) run on the loop itself: the
hop to a thread and back would cost more than they do. A client on this host
sends ``ask`` and ``ping`` over the shard's local lane instead (``lane.py``),
whose threads call ``ask_here``: there such queries run on the lane's thread.
"""

from __future__ import annotations

import asyncio
import atexit
import io
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
from dask.utils import format_bytes
from distributed import get_worker
from tornado.ioloop import PeriodicCallback

from ...device import (array_module, default_budget, device_info, free_cached_memory, memory_bytes, pool_bytes, synchronize,
                      to_host, use_own_stream)
from ...io.export import Calibration, export_resident
from ...io.load import describe, inspect, model_sample, read_coded, read_dense
from ...io.registry import open_reader
from ...io.saved import describe_saved, is_saved, open_resident, read_saved, resident_from, save_resident
from ...io.source import Source
from ...io.stream import FrameSource
from ... import jit
from ...queries.base import INLINE_BYTES, REGISTRY, Context, Query, UnknownQuery, lookup
from ...resident import DenseCounts, Resident
from ...resident.base import check_dtype, check_shape
from ...resident.compressed import check_layout
from ...resident.live import LIVE_LAYOUTS, LiveCounts, start_bytes
from ..budget import Budget
from ..handoff import STALE, Handoff, sweep
from .. import warm_up
from ..lane import LaneServer
from ..layout import Plan, check_saved, held_as, planned
from ..stops import Stop
from .copies import live_appended, live_frames, live_started, reachable, removed, sweep as sweep_copies, taken_over, written


logger = logging.getLogger(__name__)
INSPECTORS = 8  # sources inspected at a time (each may read a sample of its frames)
LOADS_OPEN = 5  # loads with their file open at a time: three reading on the load threads, two waiting for them
LOAD_THREADS = 3  # a GPU coded 0.54 s an acquisition with three loads at a time, 0.62 s with two
ADMIT_POLL = 0.05  # seconds between asks of a load waiting for others' reservations to end
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


def shard_key(address: str) -> str:
    """The actor key of the shard on ``address`` (the same from every client and the catalog)."""
    return f"qgpu-shard-{address}"


class Shard:
    """The residents of one worker (one GPU), their memory budget, and the queries on them."""

    def __init__(self, key: str, budget: int | None = None):
        self.worker = get_worker()
        self.address = self.worker.address
        self.key = key
        self.residents: dict[str, Resident] = {}
        self.device = device_info()
        self.requested = int(budget) if budget else None
        limit = self.worker.memory_manager.memory_limit
        limit = min(self.requested, memory_bytes(limit)) if self.requested else default_budget(limit)  # the client warns of a cut
        self.ctx = Context(self.address, self.device.kind, limit, lambda what_needs, nbytes: self.budget.check_room(what_needs, nbytes))
        self.budget = Budget(limit, self.address, self.device.kind, self.residents, self.ctx.kept)
        for query in REGISTRY.values():
            self.ctx.keep(query)
        self.learned: dict[str, type[Query]] = {}  # users' query types sent here, by wire name
        self.queries = ThreadPoolExecutor(1, thread_name_prefix="qgpu-query", initializer=use_own_stream)
        self.loads = ThreadPoolExecutor(LOAD_THREADS, thread_name_prefix="qgpu-load", initializer=use_own_stream)
        self.ingests = ThreadPoolExecutor(8, thread_name_prefix="qgpu-ingest", initializer=use_own_stream)
        self.copying = ThreadPoolExecutor(1, thread_name_prefix="qgpu-copy")
        self.inspections = ThreadPoolExecutor(1, thread_name_prefix="qgpu-inspections")  # beside the loads, not behind them
        self.load_slots = asyncio.Semaphore(LOADS_OPEN)
        self.loads_waiting = 0  # loads asked of this shard and not yet done
        self.loads_done = asyncio.Event()  # set while loads_waiting is 0: copies are written then
        self.loads_done.set()
        self.copy_turn = asyncio.Lock()  # one copy written at a time, each after the loads before it
        self.copies: dict[str, dict] = {}  # the node-local copy of each compressed resident that has one (``copies.py``)
        sweep_copies()
        atexit.register(self.remove_copies)
        self.ingesting: dict[str, str] = {}  # live acquisition -> the stream feeding it
        self.stops: dict[str, Stop] = {}  # the stop of each load and ingest under way here, by name (``stops.py``)
        self.restoring: set[str] = set()  # names being held again here for the catalog (a re-home or move)
        self.reading: dict[str, int] = {}  # acquisition being loaded -> bytes of counts read so far
        self.plans: dict[tuple[Source, str], tuple[float, tuple, Plan]] = {}  # inspect's compressed plans: (made, stamp, plan)
        self.handoff = Handoff()
        if "qgpu-handoff-sweep" not in self.worker.periodic_callbacks:  # reply segments no client took; stops with the worker
            sweeps = PeriodicCallback(sweep, STALE / 2 * 1000)
            self.worker.periodic_callbacks["qgpu-handoff-sweep"] = sweeps
            self.worker.loop.add_callback(sweeps.start)
        self.lane_server = LaneServer.started({"ask": self.ask_here, "ping": lambda: None})
        self.warming = warm_up.started(array_module())  # first calls should not wait for the compiler

    # -- bookkeeping -------------------------------------------------------

    async def start(self) -> dict:
        """Announce this shard to the catalog (idempotent); returns :meth:`info`."""
        await self.worker.scheduler.qgpu_register_shard(
            address=self.address, key=self.key, device=asdict(self.device), budget=self.budget.limit, requested=self.requested
        )
        return await self.info()

    async def ping(self) -> None:
        """Nothing: the cheapest round trip, for measuring call overhead."""

    async def warmed_up(self) -> bool:
        """Whether the kernels this shard warms up as it starts (``warm_up.py``) are compiled or loaded by now."""
        return self.warming.done()

    async def compiling(self) -> str | None:
        """The kernel this worker is compiling now (its warm-up's or a call's), or None: a progress bar says so."""
        return jit.compiling()

    async def lane(self) -> str | None:
        """The name of this shard's local lane (``lane.py``), for clients on its host; None where it has none."""
        return None if self.lane_server is None else self.lane_server.name

    async def info(self) -> dict:
        """Device, budget, bytes held and the residents of this shard, and the bytes its queries keep
        (``<key>_bytes``: "ssb_cache", the phase preparations; "ptycho", reconstruction objects), and
        "pool_bytes": the device memory this worker's CuPy pools hold, used and cached (0 on CPU workers)."""
        kept = {f"{key}_bytes": k.held_bytes() + k.spare_bytes() for key, k in self.ctx.kept.items()}
        return {
            "worker": self.address,
            "device": asdict(device_info()),
            "budget": self.budget.limit,
            "resident_bytes": sum(r.nbytes for r in self.residents.values()),
            "reserved_bytes": self.budget.reserved,
            "pool_bytes": pool_bytes(),
            **kept,
            "acquisitions": {n: r.describe() for n, r in self.residents.items()},
        }

    def resident(self, name: str) -> Resident:
        try:
            return self.residents[name]
        except KeyError:
            raise KeyError(f"acquisition {name!r} is not resident on {self.address} (released, or never loaded)") from None

    async def frames(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Frames ``lo`` .. ``hi`` of ``name``, flat, in host memory (a chunk of its Dask array: ``acq.to_dask()``)."""
        resident = self.resident(name)
        return await self.on(self.queries, lambda: to_host(resident.frames_flat(lo, hi)))

    async def on(self, pool: ThreadPoolExecutor, fn: Callable, *args) -> Any:
        """``fn(*args)`` on one of this shard's threads."""
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    # -- queries -----------------------------------------------------------

    async def ask(self, name: str, names: list[str], *args, handoff: str | None = None, into: tuple | None = None) -> Any:
        """Run the registered query ``name`` on this shard's residents ``names`` (in that order): its
        ``run(ctx, residents, *args)``, on the event loop when it reads little, else on its thread.
        Large arrays of the reply are handed over in /dev/shm to a client on this host (``handoff``, its
        token: ``handoff.py``), or written into the client's result array there (``into``: its Target and the
        series position of each of ``names``). UnknownQuery for a user's query type not sent here yet (``learn``)."""
        query, answer, pool = self.asked(name, names, args, handoff, into)
        reply = answer() if pool is None else await self.on(pool, answer)
        if query.settles:
            for n in names:  # worker-side code may have appended the last frames of live ones (should this fail,
                await self.settle(n)  # the sweep unlinks the reply's segments)
        return reply

    def ask_here(self, name: str, names: list[str], *args, handoff: str | None = None, into: tuple | None = None) -> Any:
        """``ask`` from the local lane's thread (``lane.py``): a query that reads little runs on that thread, not
        the event loop (the hop there and back would cost more than it does), the rest as ``ask`` runs them."""
        query, answer, pool = self.asked(name, names, args, handoff, into)
        if query.settles:
            asked = self.ask(name, names, *args, handoff=handoff, into=into)
            return asyncio.run_coroutine_threadsafe(asked, self.worker.loop.asyncio_loop).result()
        return answer() if pool is None else pool.submit(answer).result()

    def asked(self, name: str, names: list[str], args: tuple, handoff: str | None,
              into: tuple | None) -> tuple[type[Query], Callable[[], Any], ThreadPoolExecutor | None]:
        """The query ``name``, its answer on ``names`` and the pool it runs on (None: where it is asked, as it
        reads at most INLINE_BYTES)."""
        query = self.learned.get(name) or (lookup(name) if "@" not in name else None)
        if query is None:
            raise UnknownQuery(name)
        on = names if query.on_names else [self.resident(n) for n in names]

        def answer() -> Any:
            reply = query.run(self.ctx, on, *args)
            if into is not None:
                reply = self.handoff.written(query, reply, into, handoff)
            return self.handoff.give(reply, handoff)

        if query.inline and self.warming.done() and query.reads(on, *args) <= INLINE_BYTES:  # it might wait for a compile
            return query, answer, None
        return query, answer, self.loads if query.thread == "load" else self.queries

    async def learn(self, name: str, query: type[Query]) -> None:
        """Know a user's query type, sent pickled by the client that asked for it, by the client's wire name."""
        self.ctx.keep(query)
        self.learned[name] = query

    # -- loading -----------------------------------------------------------

    async def inspect(self, sources: list[Source], layout: str = "auto") -> list[dict]:
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

        return await self.on(self.inspections, every)

    def plan(self, source: Source, reader, layout: str, meta: dict, free: int) -> Plan:
        """The plan of loading ``reader`` here with ``free`` bytes free (``layout.planned``), a sample of its frames
        read where it may be coded as read; a failed sample read names the file."""
        return named(source, lambda: planned(layout, meta["shape"], meta["dtype"], self.device.kind, free,
                                              lambda: model_sample(reader), array_module()))

    def inspected_plan(self, source: Source, layout: str) -> Plan | None:
        """The compressed plan ``inspect`` made here for ``source`` and ``layout``, while it is fresh and the file
        unchanged (a compressed plan does not depend on the free budget; every load of the file takes it); None
        otherwise."""
        kept = self.plans.get((source, layout))
        if kept is None or time.monotonic() - kept[0] > PLAN_SECONDS or kept[1] != stamp(source):
            return None
        return kept[2]

    async def load(self, name: str, source: Source, layout: str = "auto", asker: str | None = None) -> dict:
        """Read ``source`` into a new resident named ``name`` (the file is opened once; a saved resident is
        reopened as saved). A compressed one is coded as it is read and admitted by the bytes it is expected
        to hold; one that outgrows them and the shard's free budget is refused, nothing of it left. LOADS_OPEN
        run at a time (the others wait, their files not opened yet). ``asker``: the id of the client that
        asked for it, whose leaving or ``cancel`` stops it (``stops.py``)."""
        if name in self.stops:
            raise ValueError(f"an acquisition named {name!r} is already being loaded or ingested on {self.address}: "
                             "release it or choose another name")
        stop = self.stops[name] = Stop([name], asker)
        self.loads_waiting += 1
        self.loads_done.clear()
        try:
            await self.slot(stop)
            try:
                if await self.on(self.loads, is_saved, source):
                    return await self.load_saved(name, source, layout)
                record = await self.read_source(name, source, layout)
            finally:
                self.load_slots.release()
        finally:
            del self.stops[name]
            stop.ended.set()
            self.loads_waiting -= 1
            if not self.loads_waiting:
                self.loads_done.set()
        if record["layout"] == "compressed":
            asyncio.ensure_future(self.keep_copy(name, self.residents[name]))
        return record

    async def slot(self, stop: Stop) -> None:
        """One of the LOADS_OPEN load slots, in turn; Cancelled if ``stop`` is asked while waiting for it."""
        acquire = asyncio.ensure_future(self.load_slots.acquire())
        while not (await asyncio.wait([acquire], timeout=ADMIT_POLL))[0]:
            if stop.asked:
                acquire.cancel()
                try:
                    await acquire
                except asyncio.CancelledError:
                    pass
                else:
                    self.load_slots.release()  # it got the slot as it was cancelled
                stop.check()

    async def cancel(self, name: str, asker: str | None = None, why: str = "its name was released") -> str:
        """Stop the load or ingest of ``name`` under way here (only if ``asker`` asked for it, unless None) and
        wait until it has ended: a load undoes what it claimed (budget, what it built, its name), an ingest
        keeps the frames that arrived. What was done: "stopped", or "nothing under way"."""
        stop = self.stops.get(name)
        if stop is None or (asker is not None and stop.asker != asker):
            return "nothing under way"
        stop.ask(why)
        await stop.ended.wait()
        return "stopped"

    async def read_source(self, name: str, source: Source, layout: str) -> dict:
        """``load`` of a detector file (opened once here): its resident added, its record."""
        reader = await self.on(self.loads, open_reader, source)
        try:
            meta = describe(reader)
            plan = self.inspected_plan(source, layout)
            if plan is None:
                plan = await self.on(self.loads, self.plan, source, reader, layout, meta, self.budget.free_bytes())
            frame_bytes = meta["raw_bytes"] // (meta["shape"][0] * meta["shape"][1])

            stop = self.stops[name]

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
            record = await self.add(name, plan.reserve, lambda: named(source, read), source.describe(), layout, kept)
        finally:
            self.reading.pop(name, None)
            reader.close()
        return record

    async def keep_copy(self, name: str, resident: Resident) -> None:
        """Save a node-local copy of ``resident`` (loaded from a detector file) and tell the catalog, in the
        background once no load is waiting (a copy written beside a series of loads took 0.18 s an acquisition
        from it on the H200); none where copies are off or the disk is too full, or it failed (the source file
        remains)."""
        copy = None
        try:
            async with self.copy_turn:
                await self.loads_done.wait()
                if self.residents.get(name) is not resident:
                    return  # released, moved or replaced meanwhile
                copy = await self.on(self.copying, written, resident, self.address)
            if copy is not None:
                await self.own_copy(name, resident, copy)
        except Exception:
            removed(copy)  # a copy only speeds a re-home up

    async def own_copy(self, name: str, resident: Resident, copy: dict) -> None:
        """Hold ``copy`` as ``resident``'s node-local copy once the catalog has recorded it; removed instead if
        the catalog refuses it or ``name`` was released, moved or replaced meanwhile."""
        if await self.worker.scheduler.qgpu_local_copy(name=name, owner=self.address, copy=copy) and self.residents.get(name) is resident:
            earlier = self.copies.get(name)
            self.copies[name] = copy
            if earlier is not None and earlier["path"] != copy["path"]:
                removed(earlier)  # a live copy, once its acquisition is saved as held
        else:
            removed(copy)

    async def stop(self) -> None:
        """Drop every resident and node-local copy here and hand the device memory back: the cluster shuts
        down (``Service.close`` of a local one), and the worker then exits at once. A copy being written
        is removed as it ends."""
        self.copying.shutdown(wait=False, cancel_futures=True)
        self.residents.clear()
        await self.on(self.queries, self.dropped)

    def dropped(self) -> None:
        """The copies removed and the device's cached memory handed back (``stop``)."""
        self.remove_copies()
        self.copies.clear()
        free_cached_memory()

    def remove_copies(self) -> None:
        """Remove the copies this shard holds (at exit: a killed worker's stay, for a survivor to reopen)."""
        for copy in list(self.copies.values()):
            removed(copy)

    async def load_progress(self, names: list[str]) -> int:
        """Bytes of counts read so far by the loads of ``names`` under way here (0 for each that is not)."""
        return sum(self.reading.get(n, 0) for n in names)

    async def load_saved(self, name: str, source: Source, layout: str, recorded: dict | None = None, saved: tuple | None = None) -> dict:
        """Reopen the resident saved at ``source.path`` as it was held, admitted by its resident bytes; the
        catalog records ``recorded`` as its source (default: that file); ``saved``: the file's header and
        arrays, read and checked already."""
        meta = await self.on(self.loads, describe_saved, source)
        check_saved(layout, meta["layout"])

        def reopen() -> tuple[Resident, str]:
            path = Path(source.path).expanduser()
            resident = open_resident(name, path) if saved is None else resident_from(name, path, *saved)
            synchronize()
            if resident.nbytes != meta["load_bytes"]:
                raise ValueError(f"{source.path!r} changed while it was loaded (its arrays no longer match the header read first)")
            return resident, f"{meta['layout']}: reopened as it was saved"

        return await self.add(name, meta["load_bytes"], reopen, recorded or source.describe(), layout)

    async def save(self, name: str, path: str) -> dict:
        """Write resident ``name`` as it is held to ``path`` (on this worker's file system)."""
        nbytes = await self.on(self.loads, save_resident, self.resident(name), path)
        return {"path": path, "bytes": nbytes}

    async def export(self, name: str, path: str, calibration: Calibration | None) -> dict:
        """Write resident ``name`` to ``path`` (on this worker's file system) in the layout its suffix names."""
        nbytes = await self.on(self.loads, export_resident, self.resident(name), path, calibration)
        return {"path": path, "bytes": nbytes}

    async def put(self, name: str, array: np.ndarray, layout: str = "auto") -> dict:
        """Hold an array sent by a client as a new resident named ``name``."""
        array = np.asarray(array)
        shape = check_shape(array.shape)
        dtype = check_dtype(array.dtype)
        plan = planned(layout, shape, dtype, self.device.kind, self.budget.free_bytes())

        def place() -> tuple[Resident, str]:
            dense = DenseCounts.empty(name, shape, dtype)
            dense.write(0, array.reshape(-1, shape[2], shape[3]))
            chosen = plan.choice(dense)
            resident = held_as(dense, chosen)
            synchronize()
            return resident, chosen.reason

        return await self.add(name, plan.reserve, place, None, layout)

    async def add(self, name: str, nbytes: int, build: Callable[[], tuple[Resident, str]], source: dict | None, asked: str,
                  kept: dict | None = None) -> dict:
        """Admit ``nbytes``, claim the name in the catalog, build the resident (and the reason for its layout),
        check that it fits if it came out larger than admitted, commit (``kept``: what the reader found that the
        record keeps, the positions of a scan that is not a raster); undo everything on failure or when the
        load's stop is asked (``cancel``)."""
        stop = self.stops.get(name)
        await self.admitted(name, nbytes, stop)
        try:
            if stop is not None:
                stop.check()
            await self.worker.scheduler.qgpu_claim(name=name, owner=self.address, nbytes=nbytes, asker=None if stop is None else stop.asker,
                                                   restore=name in self.restoring)
        except BaseException:
            self.budget.unreserve(nbytes)
            raise
        try:
            try:
                resident, reason = await self.on(self.loads, build)
            except MemoryError as err:  # CuPy's OutOfMemoryError is one: the budget left the device too little
                raise ValueError(f"acquisition {name!r} ran the device out of memory as it was built ({err}); nothing of it was kept."
                                 f" The shard's budget of {format_bytes(self.budget.limit)} leaves too little beside it: set a smaller"
                                 " budget= (or QGPU_DASK_BUDGET)") from None
            if resident.nbytes > nbytes:
                self.budget.check_room(f"acquisition {name!r} ({reason}) needs", resident.nbytes - nbytes)
            if stop is not None:
                stop.check()
            self.forget(name)
            self.residents[name] = resident
            record = {**resident.describe(), **(kept or {}), "source": source, "asked": asked, "layout_reason": reason}
            await self.worker.scheduler.qgpu_commit(name=name, owner=self.address, record=record)
            if isinstance(resident, DenseCounts) and resident.index_to_come:
                asyncio.ensure_future(self.index_of(name, resident))
            return record
        except BaseException:
            self.residents.pop(name, None)
            await self.worker.scheduler.qgpu_drop(name=name, owner=self.address)
            free_cached_memory()
            raise
        finally:
            self.budget.unreserve(nbytes)

    async def index_of(self, name: str, resident: DenseCounts) -> None:
        """Build the index a dense load promised, once it has returned (queries read the counts until it is
        there); a failure leaves the resident without one, and says so in the worker's log."""
        if self.residents.get(name) is not resident:
            return
        try:
            await self.on(self.loads, resident.indexed)
        except Exception as err:  # the counts are held and answer without it
            resident.index_to_come = False
            logger.warning("the index of %r was not built (%s): its queries read the counts", name, err)

    async def admitted(self, name: str, nbytes: int, stop: Stop | None) -> None:
        """Admit ``nbytes`` for ``name``; where they do not fit while loads under way hold reservations (a coded
        load reserves more than it comes to hold), ask again as those end, so a filling GPU refuses only what
        cannot fit beside what is held (it refused the 120th of a series while two loads were still coding), or
        until ``stop`` is asked."""
        while True:
            try:
                return self.budget.admit(name, nbytes)
            except ValueError:
                if name in self.residents or not self.budget.reserved:
                    raise
            if stop is not None:
                stop.check()
            await asyncio.sleep(ADMIT_POLL)

    # -- live acquisitions ------------------------------------------------------

    async def create(self, name: str, shape: tuple, dtype: str, layout: str, copy: dict | None = None,
                     frames: np.ndarray | None = None) -> dict:
        """Hold a new, empty live acquisition ``name`` that grows by ``append`` and ``ingest``, with a live copy
        (``copies.py``) as its second home: ``copy`` and the ``frames`` it holds (taken over from a lost
        shard: appended before the acquisition is ready again), else a new one."""
        shape, dtype = check_shape(shape), check_dtype(dtype)
        check_layout(layout, dtype, LIVE_LAYOUTS)

        def build() -> tuple[Resident, str]:
            resident = LiveCounts(name, shape, dtype, layout, array_module())
            resident.room = lambda nbytes: self.budget.check_room(f"live acquisition {name!r} needs", nbytes)
            if frames is not None:
                step = max(1, shape[1], len(frames) // 8)
                for lo in range(0, len(frames), step):
                    resident.append(np.array(frames[lo:lo + step]))
            synchronize()
            return resident, f"{layout}: asked for"

        record = await self.add(name, start_bytes(shape, dtype, layout), build, None, layout)
        if copy is None:
            copy = await self.on(self.copying, live_started, name, shape, dtype, layout, self.address)
        if copy is not None:
            await self.own_copy(name, self.residents[name], copy)
        return record

    def live(self, name: str) -> LiveCounts:
        resident = self.resident(name)
        if not isinstance(resident, LiveCounts):
            raise ValueError(f"acquisition {name!r} is not live: it was loaded, or all its {resident.n_frames} scan positions have arrived")
        return resident

    async def append(self, name: str, frames: np.ndarray) -> int:
        """Add the next scan positions' frames to live acquisition ``name``; the positions received."""
        resident = self.live(name)
        if name in self.ingesting:
            raise ValueError(f"acquisition {name!r} is ingesting from {self.ingesting[name]}: appends would interleave with its frames")
        loop = asyncio.get_running_loop()
        received = await self.on(self.loads, lambda: self.kept_live(name, resident.append(frames), frames, loop))
        await self.settle(name)
        return received

    def kept_live(self, name: str, received: int, frames, loop: asyncio.AbstractEventLoop) -> int:
        """Write frames just appended (ending at position ``received``) into ``name``'s live copy, if it has
        one; a copy that cannot take them (a full disk) is removed and the catalog told; ``received``."""
        copy = self.copies.get(name)
        if copy is not None and copy.get("live"):
            try:
                live_appended(copy, frames, received - len(frames))
            except OSError as err:
                if self.copies.get(name) is copy:
                    del self.copies[name]
                removed(copy)
                error = f"its live copy could not take frames up to {received} ({err}): it has no second home now"
                asyncio.run_coroutine_threadsafe(self.worker.scheduler.qgpu_copy_lost(name=name, owner=self.address, error=error), loop)
        return received

    async def received(self, name: str) -> int:
        """Scan positions held so far (all of them for an acquisition that is not live)."""
        resident = self.resident(name)
        return resident.received if isinstance(resident, LiveCounts) else resident.n_frames

    async def ingest(self, names: list[str], source: FrameSource, asker: str | None = None) -> dict:
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
        busy = [n for n in names if n in self.stops]
        if busy:
            raise ValueError(f"acquisition {busy[0]!r} is being loaded on {self.address}")
        self.ingesting.update((n, source.describe()) for n in names)
        stop = Stop(names, asker)
        self.stops.update((n, stop) for n in names)
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
                    self.kept_live(name, resident.append(block), block, loop)
                    frames += len(block)
                    if resident.complete and k + 1 < len(names):
                        asyncio.run_coroutine_threadsafe(self.settle(name), loop).result()
                    if stop.asked:
                        break  # the frames in hand are kept; closing the blocks closes the connection
            finally:
                blocks.close()
            return frames

        try:
            frames = await self.on(self.ingests, pull)
        finally:
            for name in names:
                self.ingesting.pop(name, None)
                self.stops.pop(name, None)
            stop.ended.set()
            for name in names:
                await self.settle(name)
        return {"frames": frames, "received": [r.received for r in residents]} | ({} if stop.why is None else {"stopped": stop.why})

    async def settle(self, name: str) -> None:
        """A live acquisition whose every position has arrived becomes the plain resident it now is (and
        the catalog's record says so): saved, fed and reconstructed as one loaded from a file."""
        resident = self.residents.get(name)
        if isinstance(resident, LiveCounts) and resident.complete:
            index = resident.layout == "dense" and DenseCounts.index_bytes(resident.shape, resident.dtype) <= self.budget.free_bytes()
            done = await self.on(self.loads, resident.finished, index)
            if self.residents.get(name) is resident:
                self.residents[name] = done
                self.forget(name)
                reason = f"{resident.layout}: asked for" + ("" if index or resident.layout != "dense" else
                                                           "; its index did not fit the budget, so every query reads the counts")
                await self.worker.scheduler.qgpu_commit(name=name, owner=self.address,
                                                        record={**done.describe(), "source": None, "live": False, "layout_reason": reason})
                if (self.copies.get(name) or {}).get("live") and resident.layout == "compressed":
                    asyncio.ensure_future(self.keep_copy(name, done))  # saved as held: smaller than its frames

    # -- recovery and release ---------------------------------------------------

    async def restore(self, name: str, how: dict) -> dict:
        """Hold ``name`` again after its shard was lost, or take it over from another shard (the catalog
        names this shard its target): from its node-local copy where this shard can reach it (read and checked
        before anything is claimed; a damaged one is removed), else from its source file or saved resident,
        else from the bytes the catalog kept of a put array. ``how``: source (or None), layout, copy (or None),
        local (the node-local copy, or None). The catalog learns where it came from (``restored_from``, and
        ``copy_error`` when the copy could not be used)."""
        self.restoring.add(name)
        try:
            record, restored_from, copy_error, local = await self.restored(name, how)
        finally:
            self.restoring.discard(name)
        await self.worker.scheduler.qgpu_restored(name=name, owner=self.address, restored_from=restored_from, stale=local, copy_error=copy_error)
        return record

    async def restored(self, name: str, how: dict) -> tuple[dict, str, str | None, dict | None]:
        """``restore``'s hold: the record, where it came from, why the copy could not be used, the copy."""
        local, copy_error, saved, live = how["local"], None, None, None
        if reachable(local, self.address):
            try:
                if local.get("live"):
                    live = await self.on(self.loads, live_frames, local["path"])
                else:
                    saved = await self.on(self.loads, read_saved, local["path"])
            except (OSError, ValueError) as err:
                copy_error = f"{type(err).__name__}: {err}"
                removed(local)
        if live is not None:
            header, frames = live
            record = await self.create(name, tuple(header["shape"]), header["dtype"], header["layout"], taken_over(local), frames)
            await self.settle(name)
            restored_from = "live copy"
        elif saved is not None:
            record = await self.load_saved(name, Source(path=local["path"]), how["layout"], recorded=how["source"], saved=saved)
            restored_from = "local copy"
            try:
                mine = taken_over(local)
            except OSError:
                pass  # it went meanwhile: the source remains
            else:
                await self.own_copy(name, self.residents[name], mine)
        elif how["source"] is not None:
            described = dict(how["source"])
            if described["scan_shape"] is not None:
                described["scan_shape"] = tuple(described["scan_shape"])
            record = await self.load(name, Source(**described), how["layout"])
            restored_from = "source file"
        elif how["copy"] is not None:
            array = np.load(io.BytesIO(how["copy"]), allow_pickle=False)
            record = await self.put(name, array, how["layout"])
            restored_from = "put copy"
        else:
            raise ValueError(f"acquisition {name!r} has no source file and no copy to be held again from")
        return record, restored_from, copy_error, local

    def forget(self, name: str) -> None:
        """Drop what queries keep for ``name`` (released, moved, or its name reused)."""
        for kept in self.ctx.kept.values():
            kept.forget(name)

    async def discard(self, name: str) -> bool:
        """Free ``name`` here (its node-local copy too) without touching the catalog: it was released there, or has
        moved to another shard (which keeps a copy of its own). Whether it was held here."""
        removed(self.copies.pop(name, None))
        if self.residents.pop(name, None) is None:
            return False
        self.forget(name)
        await self.on(self.queries, free_cached_memory)
        return True

