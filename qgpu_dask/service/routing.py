"""Routing: calls from one client to the shards that own the acquisitions, one call per owning shard, sent
again to the new owner when a shard was lost or an acquisition moved; loads placed again when their
worker dies first. Calls go straight to the workers (``calls``), never through the scheduler."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from typing import Any, Awaitable, Callable

from distributed import Client

from ..queries.base import Query, UnknownQuery, built_in, wire_name
from ..queries.results import spoil, target_of
from .calls import call_shard, shard_pool
from .handoff import take, token
from .errors import AcquisitionLost, LaneGone, NotResident
from .lane import Lane
from .placement import place
from .shard import Shard, shard_key

REHOME_WAIT = 600.0  # seconds a query waits for an acquisition of a lost shard to be held again
GONE_SECONDS = 10.0  # at most this long a worker whose lane refused a connection is taken for gone


async def returned(call: Awaitable) -> Any:
    """What ``call`` returns, or the exception it raises (``gather(..., return_exceptions=True)`` of one call,
    without the task that gather makes)."""
    try:
        return await call
    except Exception as err:
        return err


class Router:
    """One client's calls to the shards: the owner last seen of each acquisition, and the connections."""

    def __init__(self, client: Client, check_open: Callable[[], None]):
        self.client = client
        self.check_open = check_open
        self.owners: dict[str, str] = {}  # the owner last seen of each acquisition name
        self.pool = shard_pool(client)
        self.lanes: dict[str, Lane | None] = {}  # each shard's local lane (None: it has none this client can reach)
        self.gone: dict[str, float] = {}  # workers whose lane refused a connection, until when they count as gone

    def on_loop(self, coroutine) -> concurrent.futures.Future:
        """Run ``coroutine`` on the client's event loop; a thread-safe future of its result."""
        try:
            self.check_open()
        except RuntimeError:
            coroutine.close()  # never awaited: no warning of it
            raise
        return asyncio.run_coroutine_threadsafe(coroutine, self.client.loop.asyncio_loop)

    def call(self, address: str, method: Callable, *args, **kwargs) -> concurrent.futures.Future:
        """A direct call of shard method ``method`` (``Shard.info``, ...) on worker ``address``."""
        return self.on_loop(self.send(address, method, *args, **kwargs))

    async def send(self, address: str, method: Callable, *args, **kwargs) -> Any:
        """Call shard method ``method`` on worker ``address`` (on the client's event loop): ``ask`` and ``ping``
        through the shard's local lane where this client can reach it (``lane.py``), the rest through Dask."""
        if self.gone.get(address, 0.0) > time.monotonic():
            raise ConnectionResetError(f"worker {address} is gone: its lane refused a connection")
        if method in (Shard.ask, Shard.ping):
            lane = await self.lane(address)
            if lane is not None:
                try:
                    return await lane.call(method.__name__, *args, **kwargs)
                except ConnectionResetError as err:
                    self.lanes.pop(address, None)  # looked up again next time (a new worker at this address has another)
                    if isinstance(err, LaneGone):
                        self.gone[address] = time.monotonic() + GONE_SECONDS  # until the catalog says what became of it
                    raise
        return await call_shard(self.pool, address, shard_key(address), method, *args, **kwargs)

    async def lane(self, address: str) -> Lane | None:
        """The local lane of the shard on ``address``, asked of it (through Dask) the first time."""
        if address not in self.lanes:
            self.lanes[address] = await Lane.opened(await call_shard(self.pool, address, shard_key(address), "lane"))
        return self.lanes[address]

    async def close(self) -> None:
        """Close the connections to the shards: through Dask and through their lanes."""
        await self.pool.close()
        for lane in self.lanes.values():
            if lane is not None:
                lane.close()
        self.lanes.clear()

    def ask(self, query: Query, names: list[str]) -> concurrent.futures.Future:
        """``query`` on the acquisitions ``names``: one ``Shard.ask`` per owning shard (a user's query type is
        sent to a shard the first time it is asked there; large replies from a shard on this host come through
        /dev/shm, ``handoff``); a future of [(reply, positions)], as ``routed``."""
        kind = type(query)
        name = wire_name(kind)
        here = self.asked_here(query, name, names)
        if here is not None:
            return here
        out = query.destination(len(names))
        target = None if out is None or token() is None else target_of(out)

        async def call(owner: str, mine: list[str], *args, rows: list[int]) -> Any:
            into = None if target is None else (target, rows)
            try:
                try:
                    return take(await self.send(owner, Shard.ask, name, mine, *args, handoff=token(), into=into))
                except UnknownQuery:
                    if built_in(kind):
                        raise
                await self.send(owner, Shard.learn, name, kind)
                return take(await self.send(owner, Shard.ask, name, mine, *args, handoff=token(), into=into))
            except (OSError, asyncio.CancelledError):
                if out is not None:
                    spoil(out)  # the shard may be writing into it still
                raise

        return self.routed(names, lambda owner, mine, rows: query.send(functools.partial(call, rows=rows), owner, mine))

    def asked_here(self, query: Query, name: str, names: list[str]) -> concurrent.futures.Future | None:
        """A query that reads little (``inline``: a frame) of one shard whose lane this client has, asked from
        this thread through the lane (``Lane.call_here``: the hops to the client's event loop and back cost
        more than the call); None where it must take the way through the loop (another owner each, no lane, a
        type of its own ``send``), or where that way has more to do (a lost lane or shard, a moved acquisition,
        a query type to send first), which then asks again."""
        kind = type(query)
        if not kind.inline or kind.send is not Query.send:
            return None
        owners = {self.owners.get(n) for n in names}
        lane = self.lanes.get(owners.pop()) if len(owners) == 1 else None
        if lane is None:
            return None
        self.check_open()
        done: concurrent.futures.Future = concurrent.futures.Future()
        try:
            done.set_result([(take(lane.call_here("ask", name, list(names), *query.arguments(), handoff=token())), list(range(len(names))))])
        except (OSError, NotResident, UnknownQuery):
            return None
        except Exception as err:
            done.set_exception(err)
        return done

    def routed(self, names: list[str], send: Callable[[str, list[str], list[int]], Awaitable]) -> concurrent.futures.Future:
        """``send(owner, names of that owner, their positions in names)`` once per owning shard; a future of
        [(reply, positions in ``names``)]. Names whose shard was lost, or that moved, go again to their new owner."""
        return self.on_loop(self.routed_async(names, send))

    async def routed_async(self, names: list[str], send: Callable[[str, list[str], list[int]], Awaitable]) -> list[tuple[Any, list[int]]]:
        todo = list(range(len(names)))
        replies = []
        deadline = time.monotonic() + REHOME_WAIT
        retried: set[str] = set()  # owners asked again after an error that looked like a failed connection
        while todo:
            groups: dict[str, list[int]] = {}
            for i in todo:
                groups.setdefault(self.owners[names[i]], []).append(i)
            calls = [send(o, [names[i] for i in idx], idx) for o, idx in groups.items()]
            outcomes = [await returned(calls[0])] if len(calls) == 1 else await asyncio.gather(*calls, return_exceptions=True)
            todo = []
            for (owner, idx), outcome in zip(groups.items(), outcomes):
                if not isinstance(outcome, BaseException):
                    replies.append((outcome, idx))
                elif await self.rerouted([names[i] for i in idx], owner, outcome, deadline, retried):
                    todo += idx
                else:
                    raise outcome
        return replies

    async def rerouted(self, names: list[str], owner: str, error: BaseException, deadline: float, retried: set[str]) -> bool:
        """Whether ``error`` from ``owner`` means these acquisitions' shard was lost (or they moved): then wait
        until each is ready again, remember the new owners, and say to send again. An OSError naming a file (the
        shard's code failed on it: a missing folder) is the call's error, and so is a second OSError from an
        owner the catalog still has alive (``retried``): a failed connection is asked again once."""
        if not isinstance(error, (OSError, NotResident)) or getattr(error, "filename", None) is not None:
            return False
        started = time.monotonic()
        while True:
            entries = (await self.client.scheduler.qgpu_state())["acquisitions"]
            if any(n not in entries for n in names):
                return False  # released: the error stands
            for n in names:
                if entries[n]["state"] == "lost" and "error" in entries[n]:
                    raise AcquisitionLost(f"acquisition {n!r} was lost with worker {owner} and could not be held again: {entries[n]['error']}")
            if all(entries[n]["state"] in ("ready", "moving") for n in names):
                if any(entries[n]["owner"] != owner for n in names):  # learn every new owner, not only these
                    self.owners.update({n: e["owner"] for n, e in entries.items() if e["state"] in ("ready", "moving")})
                    return True
                if isinstance(error, NotResident):
                    return False  # the shard is there and says so: a real error
                if time.monotonic() > started + 1.0:
                    if owner in retried:
                        return False  # alive, and it failed again: the error is the call's
                    retried.add(owner)
                    self.gone.pop(owner, None)  # the catalog has it alive: ask it (through Dask, for a new lane) again
                    return True  # still the owner a second later: the connection failed, not the worker
            if time.monotonic() > deadline:
                raise TimeoutError(f"acquisitions {names} of worker {owner} were not held again within {REHOME_WAIT:.0f} s ({error})")
            await asyncio.sleep(0.1)

    async def placed(self, name: str, owner: str, nbytes: int, pinned: bool, method: Callable, *args) -> dict:
        """Shard method ``load`` or ``put`` of a new acquisition on ``owner``; its record with the owner.
        If that worker dies first, the acquisition is placed again on a survivor (unless pinned) and sent there;
        an OSError naming a file, or a second one from a worker still alive, is the load's error."""
        deadline = time.monotonic() + REHOME_WAIT
        retried = False
        while True:
            try:
                return await self.send(owner, method, name, *args) | {"owner": owner}
            except OSError as err:
                if err.filename is not None:
                    raise
                started = time.monotonic()
                while True:  # until the catalog has settled what became of it
                    state = await self.client.scheduler.qgpu_state()
                    entry = state["acquisitions"].get(name)
                    if entry is not None and entry["state"] == "ready":
                        return dict(entry)  # it was held after all: the reply was lost
                    alive = owner in state["shards"]
                    if entry is None and (not alive or time.monotonic() > started + 1.0):
                        break
                    if time.monotonic() > deadline or (pinned and not alive):
                        raise err
                    await asyncio.sleep(0.1)
                if not alive:
                    owner = place([nbytes], state)[0]
                elif retried:
                    raise err
                retried = alive
