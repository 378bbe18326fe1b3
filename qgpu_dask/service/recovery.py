"""Recovery, run by the catalog on the scheduler: no acquisition is lost with its worker.

Dask does not recreate an actor whose worker died. When a shard is lost, each
of its acquisitions is held again on a surviving shard (placed by free budget
like any load) from its source file or saved resident, or from the catalog's
copy of a ``svc.put`` array; a shard that fails to take one hands it to the
next. A worker that joins later (a nanny's restart, a new node) gets a shard
actor started here, and acquisitions move to it until shards hold about as
many each. Clients whose query met the lost shard wait for the new owner and
ask again (``Service.routed``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from .calls import call_shard
from .placement import place
from .shard import Shard, shard_key
from .shard.copies import host_of

if TYPE_CHECKING:
    from .catalog import Catalog

logger = logging.getLogger(__name__)


class Recovery:
    """Re-homes lost acquisitions, starts shards on joining workers and gives them a share."""

    def __init__(self, catalog: "Catalog", scheduler):
        self.catalog = catalog
        self.scheduler = scheduler
        self.task: asyncio.Task | None = None
        self.again = False
        self.client = None

    def schedule(self) -> None:
        """Run a recovery pass now (or once more after the one running)."""
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self.run())
        else:
            self.again = True

    async def run(self) -> None:
        while True:
            self.again = False
            try:
                await self.start_shards()
                await self.rehome()
                await self.balance()
            except Exception as err:  # recovery must never take the scheduler down; say what failed
                logger.exception("qgpu recovery pass failed")
                self.catalog.log("recovery-error", error=f"{type(err).__name__}: {err}")
            if not self.again:
                return

    # -- shards --------------------------------------------------------------

    async def start_shards(self) -> None:
        """A shard actor on every worker without one, once acquisitions exist (before, each client's
        ``ensure_shards`` starts them)."""
        if not self.catalog.acquisitions:
            return
        missing = [w for w in self.scheduler.workers if w not in self.catalog.shards]
        if not missing:
            return
        client = await self.own_client()
        for address in missing:
            key = shard_key(address)
            future = client.submit(Shard, key, self.catalog.budget_request, actor=True, workers=[address], key=key)
            try:
                await future
                await client.publish_dataset(future, name=key, override=True)
                await call_shard(self.scheduler.rpc, address, key, Shard.start)
            except Exception as err:
                self.catalog.log("shard-start-failed", address=address, error=f"{type(err).__name__}: {err}")

    async def own_client(self):
        """A client of this scheduler, in its own process, to start actors with."""
        if self.client is None:
            from distributed import Client

            self.client = await Client(self.scheduler.address, asynchronous=True, name="qgpu-recovery")
        return self.client

    def forget_shard(self, address: str) -> None:
        """Stop publishing the lost shard's actor (it would wait for its worker forever)."""
        if self.client is not None:
            asyncio.ensure_future(self.client.unpublish_dataset(shard_key(address)))
        else:
            self.scheduler.extensions["publish"].datasets.pop(shard_key(address), None)

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.client is not None:
            await self.client.close()

    # -- re-homing -------------------------------------------------------------

    async def rehome(self) -> None:
        """Hold every lost acquisition again on a surviving shard; one no shard can take stays lost, with the reasons."""
        entries = self.catalog.acquisitions
        lost = [n for n, e in entries.items() if e["state"] == "lost"]
        if not lost or not self.catalog.shards:
            return
        t0 = time.perf_counter()
        tried: dict[str, list[str]] = {n: [] for n in lost}
        errors: dict[str, list[str]] = {n: [] for n in lost}
        moved = raw = 0
        while lost:
            attempts = []
            for name in lost:
                target = self.choose(name, exclude=tried[name])
                if target is None:
                    entries[name]["error"] = "; ".join(errors[name]) or "no surviving shard has room for it"
                    self.catalog.log("lost", name=name, error=entries[name]["error"])
                    continue
                tried[name].append(target)
                attempts.append((name, target))
            outcomes = await asyncio.gather(*(self.hold(name, target, "rehoming") for name, target in attempts))
            lost = []
            for (name, target), error in zip(attempts, outcomes):
                if error is None:
                    moved += entries[name]["nbytes"]
                    raw += entries[name].get("raw_bytes", entries[name]["nbytes"])
                elif name in entries:
                    errors[name].append(f"{target}: {error}")
                    lost.append(name)
        self.catalog.log("rehome-done", seconds=time.perf_counter() - t0, bytes=moved, raw_bytes=raw)

    def choose(self, name: str, exclude: list[str]) -> str | None:
        """The shard that would take ``name`` now (as a new load is placed), not one of ``exclude``: one of the
        host of its node-local copy where one of them has room (it reopens the copy), else any."""
        shards = {a: s for a, s in self.catalog.shards.items() if a not in exclude}
        entry = self.catalog.acquisitions[name]
        local = entry.get("local")
        near = {a: s for a, s in shards.items() if local is not None and host_of(a) == local["host"]}
        others = {n: e for n, e in self.catalog.acquisitions.items() if n != name}
        for among in (near, shards):
            if not among:
                continue
            try:
                return place([entry["nbytes"]], {"shards": among, "acquisitions": others})[0]
            except ValueError:
                continue  # none of them has room
        return None

    async def hold(self, name: str, target: str, state: str) -> str | None:
        """Have ``target`` hold ``name`` (from its source or copy); None when it does, else why not."""
        entry = self.catalog.acquisitions.get(name)
        if entry is None:
            return "released meanwhile"
        how = {"source": entry.get("source"), "layout": entry.get("asked", "auto"), "backup": self.catalog.backups.get(name),
               "local": entry.get("local") if state == "rehoming" else None}  # a move reads the source: the copy's owner lives
        if how["source"] is None and how["backup"] is None and how["local"] is None:
            return "it has no source file and no copy to be held again from"
        entry["state"] = state
        entry["target"] = target
        try:
            await call_shard(self.scheduler.rpc, target, self.catalog.shards[target]["key"], Shard.restore, name, how)
            error = None
        except Exception as err:
            error = err
        entry = self.catalog.acquisitions.get(name)
        if error is not None and entry is not None and entry.get("target") == target:
            self.catalog.drop(name=name, owner=target)  # the shard could not say so itself
        return None if error is None else f"{type(error).__name__}: {error}"

    # -- balance ---------------------------------------------------------------

    async def balance(self) -> None:
        """Move acquisitions to shards holding fewer (a worker that joined) until counts differ by at most one."""
        entries = self.catalog.acquisitions
        while True:
            counts = dict.fromkeys(self.catalog.shards, 0)
            for e in entries.values():
                if e["owner"] in counts:
                    counts[e["owner"]] += 1
            if len(counts) < 2:
                return
            low = min(counts, key=lambda a: (counts[a], a))
            high = max(counts, key=lambda a: (counts[a], a))
            if counts[high] - counts[low] <= 1:
                return
            movable = sorted(
                (n for n, e in entries.items() if e["owner"] == high and e["state"] == "ready"
                 and (e.get("source") is not None or n in self.catalog.backups)),
                key=lambda n: entries[n]["nbytes"],
            )
            name = next((n for n in movable if self.choose(n, exclude=[a for a in counts if a != low]) == low), None)
            if name is None:
                return
            error = await self.hold(name, low, "moving")
            if error is not None:
                self.catalog.log("move-failed", name=name, target=low, error=error)
                return
            try:
                await call_shard(self.scheduler.rpc, high, shard_key(high), Shard.discard, name)
            except Exception:
                pass  # its worker is gone too: nothing left to free
