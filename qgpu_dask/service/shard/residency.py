"""Residency: how a resident comes to be held on its shard, and how it goes.

Every new resident (a load, a put, a live acquisition, one held again for the catalog) goes through
``Residency.add``: admit its bytes against the shard's budget (asking again while loads under way hold
reservations), claim its name in the catalog, build it on a load thread, check that it fits if it came out
larger than admitted, commit it to the catalog; on a failure, or a stop asked of its load (``cancel``,
``stops.py``), each step is undone: budget, what it built, its name.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from dask.utils import format_bytes
from distributed import Worker

from ...device import free_cached_memory
from ...queries.base import Context
from ...resident import DenseCounts, Resident
from ..budget import Budget
from ..errors import NotResident, OverBudget
from ..stops import Stop
from .threads import on

logger = logging.getLogger(__name__)
ADMIT_POLL = 0.05  # seconds between asks of a load waiting for others' reservations to end


class Residency:
    """The residents of one shard, what its loads and ingests under way can be stopped by, and the names it
    holds again for the catalog."""

    def __init__(self, worker: Worker, residents: dict[str, Resident], budget: Budget, ctx: Context,
                 loads: ThreadPoolExecutor, queries: ThreadPoolExecutor):
        self.worker = worker
        self.address = worker.address
        self.residents = residents
        self.budget = budget
        self.ctx = ctx
        self.loads = loads
        self.queries = queries
        self.stops: dict[str, Stop] = {}  # the stop of each load and ingest under way here, by name (``stops.py``)
        self.restoring: set[str] = set()  # names being held again here for the catalog (a re-home or move)

    def resident(self, name: str) -> Resident:
        try:
            return self.residents[name]
        except KeyError:
            raise NotResident(f"acquisition {name!r} is not resident on {self.address} (released, or never loaded)") from None

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
                resident, reason = await on(self.loads, build)
            except MemoryError as err:  # CuPy's OutOfMemoryError is one: the budget left the device too little
                raise ValueError(f"acquisition {name!r} ran the device out of memory as it was built ({err}); nothing of it was kept."
                                 f" The shard's budget of {format_bytes(self.budget.limit)} leaves too little beside it: set a smaller"
                                 " budget= (or the qgpu.budget setting)") from None
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
            await on(self.loads, resident.indexed)
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
            except OverBudget:
                if name in self.residents or not self.budget.reserved:
                    raise
            if stop is not None:
                stop.check()
            await asyncio.sleep(ADMIT_POLL)

    async def cancel(self, name: str, asker: str | None, why: str) -> str:
        """Stop the load or ingest of ``name`` under way here (only if ``asker`` asked for it, unless None) and
        wait until it has ended: a load undoes what it claimed (budget, what it built, its name), an ingest
        keeps the frames that arrived. What was done: "stopped", or "nothing under way"."""
        stop = self.stops.get(name)
        if stop is None or (asker is not None and stop.asker != asker):
            return "nothing under way"
        stop.ask(why)
        await stop.ended.wait()
        return "stopped"

    def forget(self, name: str) -> None:
        """Drop what queries keep for ``name`` (released, moved, or its name reused)."""
        for kept in self.ctx.kept.values():
            kept.forget(name)

    async def discard(self, name: str) -> bool:
        """Free ``name`` here without touching the catalog; whether it was held here."""
        if self.residents.pop(name, None) is None:
            return False
        self.forget(name)
        await on(self.queries, free_cached_memory)
        return True
