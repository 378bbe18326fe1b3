"""Calls to a shard over Dask's comm, the one way for the client and the scheduler alike (``call_shard``; the
client's lane is the other transport, ``lane.py``), and the futures users hold.

A client's call goes straight to the owning worker's ``actor_execute``
handler over the client's connection pool (never through the scheduler's
proxy), whatever ``direct_to_workers`` the client was made with; the catalog's
and recovery's go through the scheduler's rpc. Results are
assembled on the client (series results from one call per shard); which
shard a call goes to, and going again after a shard is lost, is
``Service.routed``.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable

from distributed import Client
from distributed.core import ConnectionPool
from distributed.protocol import deserialize, to_serialize
from distributed.protocol.serialize import Serialized

from .errors import ShardUnreachable


PLAIN = (str, int, float, bool, type(None))


def wrap(value: Any) -> Any:
    """Scalars and lists of strings travel in the message itself (msgpack); the rest is serialized by Dask.

    Serializing each small argument separately costs more than the query it
    carries; arrays, callables and records still go through Dask's serializers.
    """
    if isinstance(value, PLAIN) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return value
    return to_serialize(value)


SHARD_CONNECT_TIMEOUT = 3.0  # seconds to open a connection to a shard: a dead worker is noticed this soon


def shard_pool(client: Client) -> ConnectionPool:
    """Connections from this client to the shards, with a short connect timeout: the client's own pool
    would retry a dead worker's address for the full ``distributed.comm.timeouts.connect``
    (30 s) before a query could go to the acquisition's new owner."""
    return ConnectionPool(limit=512, deserialize=True, connection_args=client.connection_args, timeout=SHARD_CONNECT_TIMEOUT)


def plain(value: Any) -> Any:
    """A reply value as sent (the scheduler does not deserialize what workers send it)."""
    return deserialize(value.header, value.frames) if isinstance(value, Serialized) else value


async def call_shard(connect: Callable, address: str, key: str, method: Callable | str, *args, **kwargs) -> Any:
    """Run ``method`` (a Shard method, or its name) of the actor ``key`` on worker ``address``, reached through
    ``connect(address)`` (a client's ConnectionPool or the scheduler's rpc); its result, or the exception it
    raised. ShardUnreachable (an OSError) where the call or its reply did not get through."""
    try:
        reply = await connect(address).actor_execute(
            function=method if isinstance(method, str) else method.__name__,
            actor=key,
            args=[wrap(a) for a in args],
            kwargs={k: wrap(v) for k, v in kwargs.items()},
        )
    except OSError as err:
        raise ShardUnreachable(f"the shard on {address} could not be reached ({type(err).__name__}: {err})") from err
    if reply["status"] == "OK":
        return plain(reply["result"])
    raise plain(reply["exception"])


class QueryFuture:
    """A query in flight: ``result()`` waits for every shard's reply and assembles them.

    ``future`` gives [(reply, positions)], one pair per shard call (``Service.routed``);
    ``assemble(replies, positions)`` builds the result.
    """

    def __init__(self, future: concurrent.futures.Future, assemble: Callable[[list, list[list[int]]], Any]):
        self.future = future
        self.assemble = assemble

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> Any:
        """The assembled result; the first shard error is raised (nothing partial is returned)."""
        try:
            pairs = self.future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"shard replies still pending after {timeout} s") from None
        return self.assemble([reply for reply, _ in pairs], [where for _, where in pairs])

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except BaseException as e:
            return e
        return None

    def __repr__(self) -> str:
        return f"<QueryFuture {'done' if self.done() else 'pending'}>"
