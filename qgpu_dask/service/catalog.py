"""The catalog: which shard owns which acquisition, kept on the scheduler.

A SchedulerPlugin is the single source of truth: it outlives any client, every
client and shard reads and writes it through the scheduler's RPC handlers
below, and it sees workers leave (their acquisitions are marked lost).
"""

from __future__ import annotations

import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

PLUGIN_NAME = "qgpu-catalog"


class Catalog(SchedulerPlugin):
    """Shards (one per worker) and acquisitions (name -> owner and description)."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.shards: dict[str, dict[str, Any]] = {}
        self.acquisitions: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []

    async def start(self, scheduler) -> None:
        scheduler.handlers.update(
            {
                "qgpu_register_shard": self.register_shard,
                "qgpu_claim": self.claim,
                "qgpu_commit": self.commit,
                "qgpu_drop": self.drop,
                "qgpu_state": self.state,
            }
        )

    def log(self, event: str, **fields: Any) -> None:
        self.events.append({"time": time.time(), "event": event, **fields})
        del self.events[:-200]

    def register_shard(self, *, address: str, key: str, device: dict, budget: int) -> None:
        """A shard actor announces itself (again after a restart of its worker)."""
        self.shards[address] = {"address": address, "key": key, "device": device, "budget": int(budget)}
        self.log("shard-added", address=address)

    def claim(self, *, name: str, owner: str, nbytes: int) -> None:
        """Reserve ``name`` for a load on ``owner``; ValueError if the name is taken."""
        if name in self.acquisitions:
            held = self.acquisitions[name]
            raise ValueError(f"an acquisition named {name!r} already exists (on {held['owner']}, {held['state']}): release it or choose another name")
        if owner not in self.shards:
            raise KeyError(f"no shard on worker {owner}")
        self.acquisitions[name] = {"name": name, "owner": owner, "nbytes": int(nbytes), "state": "loading"}

    def commit(self, *, name: str, owner: str, record: dict) -> None:
        """A load finished: ``name`` is ready on ``owner``."""
        entry = self.acquisitions.get(name)
        if entry is None or entry["owner"] != owner:
            raise KeyError(f"acquisition {name!r} was not claimed by {owner}")
        entry.update(record, state="ready", owner=owner)
        self.log("loaded", name=name, owner=owner)

    def drop(self, *, name: str, owner: str) -> bool:
        """Forget ``name`` if ``owner`` holds it (a release, or a failed load)."""
        entry = self.acquisitions.get(name)
        if entry is not None and entry["owner"] == owner:
            del self.acquisitions[name]
            self.log("released", name=name, owner=owner)
            return True
        return False

    def state(self) -> dict:
        """Everything, for clients: shards, acquisitions, recent events."""
        return {"shards": self.shards, "acquisitions": self.acquisitions, "events": self.events[-50:]}

    def remove_worker(self, scheduler, worker: str, **kwargs: Any) -> None:
        if self.shards.pop(worker, None) is None:
            return
        lost = [n for n, a in self.acquisitions.items() if a["owner"] == worker]
        for name in lost:
            self.acquisitions[name]["state"] = "lost"
        self.log("shard-lost", address=worker, acquisitions=lost)
