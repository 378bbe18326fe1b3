"""Shard: the Dask actor on each worker that holds its residents, their budget, loads and live acquisitions,
and runs every registered query (``queries``) on them through one call, ``ask``.

This class is the shard's call surface: the router, recovery, the catalog and the local lane call its
methods by name, and each hands its work to one of the parts: ``residency.py`` (admit, claim, build, commit or
undo; cancel and discard), ``loader.py`` (inspect, loads, puts, saves), ``copies.py`` (node-local copies),
``live.py`` (live acquisitions) and ``restore.py`` (held again for the catalog).

Every method is ``async``: Dask runs it on the worker's event loop, and the shard hands real work to its own
threads (``threads.py``: one for queries, three for loads, each with its own CUDA stream on a GPU), so a long
load never blocks a short query and the event loop stays free to receive the next call. Queries that read at
most ``INLINE_BYTES`` (a frame, a tiny acquisition) run on the loop itself: the hop to a thread and back would
cost more than they do. A client on this host sends ``ask`` and ``ping`` over the shard's local lane instead
(``lane.py``), whose threads call ``ask_here``: there such queries run on the lane's thread.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any, Callable

import numpy as np
from distributed import get_worker
from tornado.ioloop import PeriodicCallback

from ...device import (array_module, default_budget, device_info, free_cached_memory, memory_bytes, pool_bytes, to_host,
                       use_own_stream)
from ...io.export import Calibration
from ...io.source import Source
from ...io.stream import FrameSource
from ... import jit
from ...config import settings
from ...queries.base import INLINE_BYTES, REGISTRY, Context, Query, UnknownQuery, lookup
from ...resident import Resident
from ..budget import Budget
from ..handoff import Handoff
from ..sweeping import REPLY_GRACE, sweep
from .. import warm_up
from ..lane import LaneServer
from .copies import LocalCopies
from .live import LiveIngest
from .loader import LOAD_THREADS, Loader
from .residency import Residency
from .restore import Restorer
from .threads import on


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
        self.residency = Residency(self.worker, self.residents, self.budget, self.ctx, self.loads, self.queries)
        self.copies = LocalCopies(self.worker, self.residents, self.loads)
        self.loader = Loader(self.residency, self.copies, self.device.kind, self.loads)
        self.live = LiveIngest(self.residency, self.copies, self.loads)
        self.restorer = Restorer(self.residency, self.copies, self.loader, self.live)
        self.handoff = Handoff()
        if "qgpu-handoff-sweep" not in self.worker.periodic_callbacks:  # reply segments no client took; stops with the worker
            sweeps = PeriodicCallback(sweep, REPLY_GRACE / 2 * 1000)
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
        "pool_bytes": the device memory this worker's CuPy pools hold, used and cached (0 on CPU workers); the
        ``qgpu`` settings in force on its worker."""
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
            "settings": settings(),
        }

    async def frames(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Frames ``lo`` .. ``hi`` of ``name``, flat, in host memory (a chunk of its Dask array: ``acq.to_dask()``)."""
        resident = self.residency.resident(name)
        return await on(self.queries, lambda: to_host(resident.frames_flat(lo, hi)))

    # -- queries -----------------------------------------------------------

    async def ask(self, name: str, names: list[str], *args, handoff: str | None = None, into: tuple | None = None) -> Any:
        """Run the registered query ``name`` on this shard's residents ``names`` (in that order): its
        ``run(ctx, residents, *args)``, on the event loop when it reads little, else on its thread.
        Large arrays of the reply are handed over in /dev/shm to a client on this host (``handoff``, its
        token: ``handoff.py``), or written into the client's result array there (``into``: its Target and the
        series position of each of ``names``). UnknownQuery for a user's query type not sent here yet (``learn``)."""
        query, answer, pool = self.asked(name, names, args, handoff, into)
        reply = answer() if pool is None else await on(pool, answer)
        if query.settles:
            for n in names:  # worker-side code may have appended the last frames of live ones (should this fail,
                await self.live.settle(n)  # the sweep unlinks the reply's segments)
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
        on_what = names if query.on_names else [self.residency.resident(n) for n in names]

        def answer() -> Any:
            reply = query.run(self.ctx, on_what, *args)
            if into is not None:
                reply = self.handoff.written(query, reply, into, handoff)
            return self.handoff.give(reply, handoff)

        if query.inline and self.warming.done() and query.reads(on_what, *args) <= INLINE_BYTES:  # it might wait for a compile
            return query, answer, None
        return query, answer, self.loads if query.thread == "load" else self.queries

    async def learn(self, name: str, query: type[Query]) -> None:
        """Know a user's query type, sent pickled by the client that asked for it, by the client's wire name."""
        self.ctx.keep(query)
        self.learned[name] = query

    # -- loading (``loader.py``) -------------------------------------------

    async def inspect(self, sources: list[Source], layout: str = "auto") -> list[dict]:
        """Shape, dtype and the bytes a load here would hold of each source, as this worker sees the files."""
        return await self.loader.inspect(sources, layout)

    async def load(self, name: str, source: Source, layout: str = "auto", asker: str | None = None) -> dict:
        """Read ``source`` into a new resident named ``name``, stopped if ``asker`` (a client's id) leaves or
        cancels; its record."""
        return await self.loader.load(name, source, layout, asker)

    async def load_progress(self, names: list[str]) -> int:
        """Bytes of counts read so far by the loads of ``names`` under way here (0 for each that is not)."""
        return self.loader.progress(names)

    async def put(self, name: str, array: np.ndarray, layout: str = "auto") -> dict:
        """Hold an array sent by a client as a new resident named ``name``."""
        return await self.loader.put(name, array, layout)

    async def save(self, name: str, path: str) -> dict:
        """Write resident ``name`` as it is held to ``path`` (on this worker's file system)."""
        return await self.loader.save(name, path)

    async def export(self, name: str, path: str, calibration: Calibration | None) -> dict:
        """Write resident ``name`` to ``path`` (on this worker's file system) in the layout its suffix names."""
        return await self.loader.export(name, path, calibration)

    async def cancel(self, name: str, asker: str | None = None, why: str = "its name was released") -> str:
        """Stop the load or ingest of ``name`` under way here (only if ``asker`` asked for it, unless None) and
        wait until it has ended: "stopped", or "nothing under way" (``residency.py``)."""
        return await self.residency.cancel(name, asker, why)

    # -- live acquisitions (``live.py``) ------------------------------------

    async def create(self, name: str, shape: tuple, dtype: str, layout: str, copy: dict | None = None,
                     frames: np.ndarray | None = None) -> dict:
        """Hold a new, empty live acquisition ``name`` with a live copy as its second home (``copy`` and the
        ``frames`` it holds, taken over from a lost shard, else a new one)."""
        return await self.live.create(name, shape, dtype, layout, copy, frames)

    async def append(self, name: str, frames: np.ndarray) -> int:
        """Add the next scan positions' frames to live acquisition ``name``; the positions received."""
        return await self.live.append(name, frames)

    async def received(self, name: str) -> int:
        """Scan positions held so far (all of them for an acquisition that is not live)."""
        return self.live.received(name)

    async def ingest(self, names: list[str], source: FrameSource, asker: str | None = None) -> dict:
        """Read ``source``'s frames into live acquisitions ``names`` here as they come, until it ends or ``asker``
        cancels; frames, positions received, and "stopped" (why) if it was."""
        return await self.live.ingest(names, source, asker)

    # -- recovery and release -----------------------------------------------

    async def restore(self, name: str, how: dict) -> dict:
        """Hold ``name`` again after its shard was lost, or take it over from another shard (``restore.py``):
        from its node-local copy, source file, saved resident or put backup, as ``how`` says."""
        return await self.restorer.restore(name, how)

    async def discard(self, name: str) -> bool:
        """Free ``name`` here (its node-local copy too) without touching the catalog: it was released there, or has
        moved to another shard (which keeps a copy of its own). Whether it was held here."""
        self.copies.discard(name)
        return await self.residency.discard(name)

    async def stop(self) -> None:
        """Drop every resident and node-local copy here and hand the device memory back: the cluster shuts
        down (``Service.close`` of a local one), and the worker then exits at once. A copy being written
        is removed as it ends."""
        warm_up.abandon()
        self.copies.stop()
        self.residents.clear()
        await on(self.queries, self.dropped)

    def dropped(self) -> None:
        """The copies removed and the device's cached memory handed back (``stop``)."""
        self.copies.dropped()
        free_cached_memory()
