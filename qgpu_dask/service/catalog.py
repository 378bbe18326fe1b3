"""The catalog: which shard owns which acquisition, kept on the scheduler.

A SchedulerPlugin is the single source of truth: it outlives any client, every
client and shard reads and writes it through the scheduler's RPC handlers
below, and it sees workers come and go. An acquisition is "loading", "ready",
"lost" (its shard died), "rehoming" (being held again elsewhere) or "moving"
(to a shard that joined); while re-homed or moved it names its ``target``
shard, which alone may claim it. The backups of ``svc.put`` arrays that a
re-home needs are kept here, limited to ``BACKUP_LIMIT`` bytes in all; where a
compressed acquisition has a node-local copy (``shard/copies.py``), its entry names
it (``local``). A load's entry names the client that asked for it (``asker``)
until it is ready: when that client leaves, the load is stopped on its owner
(``stops.py``). ``release`` frees a name in any state.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from dask.utils import format_bytes
from distributed.diagnostics.plugin import SchedulerPlugin

from .placement import free_bytes
from .calls import call_shard
from .recovery import Recovery
from .shard import Shard, shard_key
from .errors import Cancelled, ShardUnreachable

PLUGIN_NAME = "qgpu-catalog"
BACKUP_LIMIT = 2 * 2**30  # bytes of put arrays the scheduler keeps ('backups'; a node-local saved file is a 'copy')


def check_backup_room(nbytes: int, used: int) -> None:
    """ValueError unless a put's backup of ``nbytes`` fits beside the ``used`` bytes of the others (checked by the
    client before an array is sent, and by the catalog)."""
    if used + nbytes > BACKUP_LIMIT:
        raise ValueError(
            f"svc.put keeps a backup of each array on the scheduler, so it survives the loss of a worker; these backups "
            f"are limited to {format_bytes(BACKUP_LIMIT)} in all and {format_bytes(used)} are used, this array needs "
            f"{format_bytes(nbytes)}: save a large array (np.save) and svc.load the file instead"
        )


class Catalog(SchedulerPlugin):
    """Shards (one per worker), acquisitions (name -> owner and description) and the backups of puts."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.shards: dict[str, dict[str, Any]] = {}
        self.acquisitions: dict[str, dict[str, Any]] = {}
        self.backups: dict[str, bytes] = {}
        self.events: list[dict[str, Any]] = []
        self.budget_request: int | None = None
        self.recovery: Recovery | None = None
        self.workers: dict = {}  # the scheduler's workers (address -> state), once started
        self.clients: dict = {}  # the scheduler's clients (id -> state), once started
        self.rpc = None  # the scheduler's connections to workers, once started

    async def start(self, scheduler) -> None:
        self.workers = scheduler.workers
        self.clients = scheduler.clients
        self.rpc = scheduler.rpc
        scheduler.handlers.update(
            {
                "qgpu_register_shard": self.register_shard,
                "qgpu_claim": self.claim,
                "qgpu_commit": self.commit,
                "qgpu_drop": self.drop,
                "qgpu_release": self.release,
                "qgpu_keep_backup": self.keep_backup,
                "qgpu_forget_backup": self.forget_backup,
                "qgpu_local_copy": self.local_copy,
                "qgpu_copy_lost": self.copy_lost,
                "qgpu_restored": self.restored,
                "qgpu_state": self.state,
            }
        )
        self.recovery = Recovery(self, scheduler)

    async def close(self) -> None:
        if self.recovery is not None:
            await self.recovery.close()

    def log(self, event: str, **fields: Any) -> None:
        self.events.append({"time": time.time(), "event": event, **fields})
        del self.events[:-200]

    def register_shard(self, *, address: str, key: str, device: dict, budget: int, requested: int | None = None) -> None:
        """A shard actor announces itself; one on a worker that joined later gets a share of the acquisitions."""
        new = address not in self.shards
        self.shards[address] = {"address": address, "key": key, "device": device, "budget": int(budget), "budget_given": requested is not None}
        self.budget_request = requested
        if new:
            self.log("shard-added", address=address)
            self.recovery.schedule()

    def claim(self, *, name: str, owner: str, nbytes: int, asker: str | None = None, restore: bool = False) -> None:
        """Reserve ``name`` for a load on ``owner`` asked for by client ``asker``; ValueError if the name is taken
        (unless ``owner`` is its target). ``restore``: the load holds ``name`` again for this catalog (a re-home or
        move), Cancelled if it was released meanwhile; so is a load whose client has left."""
        held = self.acquisitions.get(name)
        if restore and (held is None or held.get("target") != owner):
            raise Cancelled(f"acquisition {name!r} was released while {owner} was holding it again")
        if held is not None:
            if held.get("target") == owner:
                return
            raise ValueError(f"an acquisition named {name!r} already exists (on {held['owner']}, {held['state']}): release it or choose another name")
        self.check_asker(name, asker)
        if owner not in self.shards:
            raise KeyError(f"no shard on worker {owner}")
        free = free_bytes(self.state())[owner]
        if nbytes > free:  # the shard's own budget was checked by the shard: this is its GPU, shared with other shards
            raise ValueError(
                f"acquisition {name!r} needs {format_bytes(nbytes)}, but the GPU of {owner}, shared with other shards, "
                f"has {format_bytes(max(free, 0))} of its budget left"
            )
        self.acquisitions[name] = {"name": name, "owner": owner, "nbytes": int(nbytes), "state": "loading", "asker": asker}

    def check_asker(self, name: str, asker: str | None) -> None:
        """Cancelled where the client that asked for the load of ``name`` has left: nobody would hold it."""
        if asker is not None and asker not in self.clients:
            raise Cancelled(f"the client that asked for acquisition {name!r} has left")

    def commit(self, *, name: str, owner: str, record: dict) -> None:
        """A load finished: ``name`` is ready on ``owner`` (for a re-home or move: the target becomes the owner).
        A live acquisition is logged "created", and "completed" when its last scan position arrives."""
        entry = self.acquisitions.get(name)
        if entry is None or owner not in (entry["owner"], entry.get("target")):
            raise KeyError(f"acquisition {name!r} was not claimed by {owner}")
        self.check_asker(name, entry.pop("asker", None))
        settled = "completed" if entry["state"] == "ready" else "created" if record.get("live") else "loaded"
        previous, event = entry["owner"], {"rehoming": "rehomed", "moving": "moved"}.get(entry["state"], settled)
        entry.pop("target", None)
        entry.pop("error", None)
        if entry["state"] == "moving":
            entry.pop("local", None)  # the old owner removes its copy; the new one saves its own
        entry.update(record, state="ready", owner=owner)
        self.log(event, name=name, owner=owner, **({} if previous == owner else {"was": previous}))

    def drop(self, *, name: str, owner: str) -> bool:
        """Forget ``name`` if ``owner`` holds it (a release, or a failed load); a failed re-home or move
        only clears its target."""
        entry = self.acquisitions.get(name)
        if entry is None:
            return False
        if entry.get("target") == owner:
            del entry["target"]
            entry["state"] = "ready" if entry["owner"] in self.shards else "lost"
            return True
        if entry["owner"] == owner:
            del self.acquisitions[name]
            self.backups.pop(name, None)
            self.log("load-failed" if entry["state"] == "loading" else "released", name=name, owner=owner)
            return True
        return False

    async def release(self, *, name: str) -> str:
        """Free ``name`` in any state, and say what was done: its name and put backup are forgotten here at once,
        then its load is stopped on its owner ("loading": ``Shard.cancel``, which waits until the load has undone
        its budget), a re-home or move is stopped on its target, and the owner frees what it holds
        (``Shard.discard``). KeyError for a name the catalog does not know."""
        entry = self.acquisitions.pop(name, None)
        if entry is None:
            raise KeyError(f"no acquisition named {name!r} (known: {sorted(self.acquisitions) or 'none'})")
        self.backups.pop(name, None)
        state, owner, target = entry["state"], entry["owner"], entry.get("target")
        self.log("released", name=name, owner=owner, state=state)
        done = []
        if state == "loading":
            done.append(f"its load on {owner} {await self.tell(owner, Shard.cancel, name, None, 'its name was released')}")
        if target is not None:
            done.append(f"holding it again on {target} {await self.tell(target, Shard.cancel, name, None, 'its name was released')}")
            await self.tell(target, Shard.discard, name)  # it may have finished as the name went
        if state in ("ready", "moving", "rehoming", "lost") and owner in self.shards:
            done.append(f"freed on {owner}" if await self.tell(owner, Shard.discard, name) is True else f"not held on {owner}")
        if state in ("lost", "rehoming") and owner not in self.shards:
            done.append(f"its shard {owner} was lost")
        return f"released {name!r} ({state}): " + "; ".join(done)

    async def tell(self, address: str, method, *args) -> object:
        """Shard method ``method(*args)`` on worker ``address``, its reply; a shard that cannot be reached (its
        worker gone: the catalog's entry is gone already) says so in the reply."""
        if address not in self.shards:
            return "gone"
        try:
            return await call_shard(self.rpc, address, shard_key(address), method, *args)
        except ShardUnreachable as err:
            return f"unreachable ({err.__cause__})"

    def keep_backup(self, *, name: str, data: bytes) -> None:
        """Keep a put array's bytes (``np.save`` form) so the acquisition can be held again if its shard is lost."""
        if name in self.acquisitions:
            raise ValueError(f"an acquisition named {name!r} already exists: release it or choose another name")
        check_backup_room(len(data), sum(len(c) for n, c in self.backups.items() if n != name))
        self.backups[name] = data

    def forget_backup(self, *, name: str) -> None:
        """Drop the backup of a put that did not become an acquisition."""
        if name not in self.acquisitions:
            self.backups.pop(name, None)

    def local_copy(self, *, name: str, owner: str, copy: dict) -> bool:
        """Record the node-local copy ``owner`` saved of ``name``; False (the shard removes it) if ``name`` is no
        longer ``owner``'s, ready."""
        entry = self.acquisitions.get(name)
        if entry is None or entry["owner"] != owner or entry["state"] != "ready":
            return False
        entry["local"] = copy
        return True

    def copy_lost(self, *, name: str, owner: str, error: str) -> None:
        """``owner`` removed the live copy of ``name`` (it could not grow): the entry says why it has none."""
        entry = self.acquisitions.get(name)
        if entry is not None and entry["owner"] == owner:
            entry.pop("local", None)
            entry["copy_error"] = error
            self.log("copy-lost", name=name, owner=owner, error=error)

    def second_home(self, name: str, entry: dict) -> str:
        """Where ``name`` would be held again from if its shard were lost, in words."""
        local = entry.get("local")
        if local is not None:
            what = "live copy (its frames written as they arrive)" if local.get("live") else "saved copy"
            return f"a node-local {what}, {local['path']} on {local['host']}"
        if entry.get("source"):
            return f"its source file, {entry['source']['path']}"
        if name in self.backups:
            return "the backup of the put array the scheduler keeps"
        return f"none{': ' + entry['copy_error'] if entry.get('copy_error') else ''}: save it (acq.save) to keep it beyond its worker"

    def restored(self, *, name: str, owner: str, restored_from: str, stale: dict | None = None, copy_error: str | None = None) -> None:
        """Where ``owner`` held ``name`` again from ("local copy", "source file", "put backup"), and why its local
        copy could not be used, in its entry and its re-home's (or move's) event; a copy ``stale`` that was not
        used is forgotten (the new owner saves its own)."""
        entry = self.acquisitions.get(name)
        if entry is None or entry["owner"] != owner:
            return
        entry["restored_from"] = restored_from
        entry.pop("copy_error", None)
        if copy_error:
            entry["copy_error"] = copy_error
        if restored_from != "local copy" and stale is not None and entry.get("local") == stale:
            del entry["local"]
        for event in reversed(self.events):  # the event of this re-home or move says what it came from
            if event.get("name") == name and event["event"] in ("rehomed", "moved"):
                event.update(source=restored_from, **({"copy_error": copy_error} if copy_error else {}))
                break

    def state(self) -> dict:
        """Everything, for clients: workers, shards, acquisitions, recent events."""
        for name, entry in self.acquisitions.items():
            entry["second_home"] = self.second_home(name, entry)
        return {"workers": sorted(self.workers), "shards": self.shards, "acquisitions": self.acquisitions, "events": self.events[-50:],
                "backup_bytes": sum(len(c) for c in self.backups.values())}

    def add_worker(self, scheduler, worker: str) -> None:
        """A worker joined (a nanny's restart, a new node): recovery starts a shard on it and gives it a share."""
        self.recovery.schedule()

    def remove_client(self, scheduler, client: str) -> None:
        """A client left (closed, or its process died): the loads it asked for and that are still under way are
        stopped on their owners (those not yet claimed are refused by ``claim``)."""
        for name, entry in list(self.acquisitions.items()):
            if entry["state"] == "loading" and entry.get("asker") == client:
                asyncio.ensure_future(self.tell(entry["owner"], Shard.cancel, name, client, "its client left"))

    def remove_worker(self, scheduler, worker: str, **kwargs: Any) -> None:
        """A worker left: its acquisitions are lost until re-homed, its loads in flight fail, moves to it stop."""
        if self.shards.pop(worker, None) is None:
            return
        lost, failed = [], []
        for name, entry in list(self.acquisitions.items()):
            if entry.get("target") == worker:
                del entry["target"]
                entry["state"] = "ready" if entry["owner"] in self.shards else "lost"
            if entry["owner"] != worker:
                continue
            if entry["state"] == "loading":
                del self.acquisitions[name]
                self.backups.pop(name, None)
                failed.append(name)
            else:
                entry["state"] = "lost"
                lost.append(name)
        self.log("shard-lost", address=worker, acquisitions=lost, loads_failed=failed)
        self.recovery.forget_shard(worker)
        self.recovery.schedule()
