"""What a query is, what a shard lends it, and the registry of query types.

A query type is one class, in one module of ``queries/`` (or in a user's notebook), holding both halves:

- the client half: ``__init__(series, *args)`` checks the arguments against the series before anything is
  sent (a bad argument is an error here, on the client); ``arguments()`` is what travels to the owners;
  ``merge(replies, positions)`` turns the per-shard replies into one exact result, in series order.
  A type whose result is one large array may give it beforehand (``destination``, in ``results`` memory):
  the owners on the client's host then write their parts straight into it (``written``).
- the owner half: ``run(ctx, residents, *arguments)``, a static method run once per shard on the shard's
  residents of the series (in series order), returning one part per resident (``assemble`` stacks them).

``Series.ask(QueryType, *args)`` (service layer) sends one call per owning shard, waits for the shard
that holds an acquisition again after a worker loss, and assembles. A shard finds a built-in type by its
``name`` in the registry (every worker imports ``queries``); a user's type travels once per shard,
pickled, under a name with its digest, so editing the class in a notebook sends the new one.
"""

from __future__ import annotations

import functools
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, ClassVar

import cloudpickle
import numpy as np

from ..resident import Resident
from .results import result_array


class Kept:
    """Something queries keep on a shard between calls (mask plans, phase preparations, reconstruction
    state), made once per shard from ``Query.keeps``: the shard counts its bytes against the budget, asks
    it for room before refusing a load, and has it drop what it keeps for an acquisition released, moved
    or replaced. The defaults hold nothing that counts."""

    def held_bytes(self) -> int:
        """Device bytes held that count against the budget and stay until their owner drops them."""
        return 0

    def spare_bytes(self) -> int:
        """Device bytes held that count against the budget but may be dropped to make room (``release``)."""
        return 0

    def release(self, nbytes: int) -> int:
        """Drop at least ``nbytes`` of spare bytes (or all of them); the bytes dropped."""
        return 0

    def forget(self, name: str) -> None:
        """Drop everything kept for acquisition ``name``."""


@dataclass
class Context:
    """What a shard lends the queries it runs: its address and device kind, its budget, a room check that
    refuses an allocation before it is made, and what queries keep there (``Query.keeps``), by key."""

    address: str
    kind: str
    budget: int
    check_room: Callable[[str, int], None]
    kept: dict[str, Kept] = field(default_factory=dict)

    def keep(self, query: type["Query"]) -> None:
        """Create what ``query`` keeps, where this shard does not keep it yet."""
        for key, make in query.keeps.items():
            if key not in self.kept:
                self.kept[key] = make(self)


class Query:
    """One query type (see the module's docstring). Subclasses set ``name`` and write ``run``; the rest
    has defaults: send the arguments given, answer each resident with one part, return the parts in
    series order (``assemble``), and give an acquisition its own part (``single``)."""

    name: ClassVar[str]
    thread: ClassVar[str] = "query"  # where the owner runs it: "query" (the query thread) or "load" (reads everything)
    inline: ClassVar[bool] = False  # whether a call reading at most INLINE_BYTES runs on the shard's event loop instead
    long: ClassVar[bool] = False  # whether waiting for it shows a progress bar (it may take seconds)
    on_names: ClassVar[bool] = False  # whether run gets the acquisitions' names instead (a step that must work after a release)
    settles: ClassVar[bool] = False  # whether it may append a live acquisition's last frames (the shard settles them after)
    keeps: ClassVar[dict[str, Callable[[Context], Kept]]] = {}  # what it keeps on a shard, by key

    def __init__(self, series, *args) -> None:
        self.args = args

    def arguments(self) -> tuple:
        """The arguments the owner's ``run`` gets after the residents."""
        return self.args

    async def send(self, call: Callable[..., Awaitable], owner: str, names: list[str]) -> Any:
        """One shard's call: ``call(owner, names, *arguments)`` (a type may send less, e.g. a digest)."""
        return await call(owner, names, *self.arguments())

    @staticmethod
    def run(ctx: Context, residents: list[Resident], *args) -> list:
        """On the owner: one part per resident, in the order given."""
        raise NotImplementedError

    @staticmethod
    def reads(residents: list[Resident], *args) -> int:
        """Bytes of counts the owner reads (with ``inline``: whether it runs on the event loop)."""
        return sum(r.raw_bytes for r in residents)

    def destination(self, n: int) -> np.ndarray | None:
        """On the client, before anything is sent: the array the result of a series of ``n`` is assembled in,
        which the owners on this host write their parts into (``written``); None: the replies are merged."""
        return None

    @staticmethod
    def written(reply: Any, write: Callable[[list[int], Any], bool]) -> Any:
        """On the owner, where the client's ``destination`` is in reach: ``reply`` less the arrays that
        ``write(places, rows)`` put there (rows of the result for the residents at ``places``; False: not put,
        a shape or dtype that does not fit)."""
        return reply

    def merge(self, replies: list, positions: list[list[int]]) -> Any:
        """The result from each shard's reply and the series positions of its acquisitions."""
        return self.assemble(ordered(replies, positions))

    def assemble(self, parts: list) -> Any:
        """The series result from one part per acquisition, in series order."""
        return parts

    def single(self, result: Any) -> Any:
        """An acquisition's result from that of a series of one."""
        return result[0]


LANES = min(8, os.cpu_count() or 1)  # threads a client assembles a series result with (made on first use)
ASSEMBLERS = ThreadPoolExecutor(LANES, thread_name_prefix="qgpu-assemble")


def placed(out: np.ndarray, rows: list[tuple[int, np.ndarray]]) -> None:
    """``out[i] = row`` for every (i, row), the copies spread over a few threads (NumPy lets the GIL go while
    it copies): a series result assembled from several shards' replies is tens of MiB written."""
    def put(share: list[tuple[int, np.ndarray]]) -> None:
        for i, row in share:
            out[i] = row

    if len(rows) < 2 or LANES < 2:
        put(rows)
        return
    list(ASSEMBLERS.map(put, [rows[j::LANES] for j in range(LANES)]))


def filled(out: np.ndarray | None, rows: list[tuple[int, np.ndarray]], shape: tuple[int, ...], dtype) -> np.ndarray:
    """The client's result ``out`` (its ``destination``; a new result array of ``shape`` where it is None or of
    another length) with ``rows`` placed in it: the parts the owners did not write there."""
    if out is None or len(out) != shape[0]:
        out = result_array(shape, dtype)
    placed(out, rows)
    return out


def ordered(replies: list, positions: list[list[int]]) -> list:
    """Per-acquisition parts of per-shard replies, back in series order."""
    out: list[Any] = [None] * sum(len(where) for where in positions)
    for reply, where in zip(replies, positions):
        for part, i in zip(reply, where):
            out[i] = part
    return out


class UnknownQuery(KeyError):
    """A shard has no query type of this name (a user's type it has not been sent yet)."""


INLINE_BYTES = 1 << 20  # an ``inline`` query reading at most this runs on the event loop: a thread hop would cost more

REGISTRY: dict[str, type[Query]] = {}


def register(query: type[Query]) -> type[Query]:
    """Add a query type to the registry (a class decorator); TypeError for a class that is not a complete
    Query, ValueError for a name already taken by another type."""
    if not (isinstance(query, type) and issubclass(query, Query)):
        raise TypeError(f"register takes a subclass of qd.Query, got {query!r}")
    name = getattr(query, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"{query.__name__}.name must be a plain identifier string (what the query is called), got {name!r}")
    if query.run is Query.run:
        raise TypeError(f"{query.__name__} has no run(ctx, residents, *args): the owner's half is missing")
    if query.thread not in ("query", "load"):
        raise TypeError(f"{query.__name__}.thread is {query.thread!r}: use 'query' or 'load'")
    known = REGISTRY.get(name)
    if known is not None and known.__qualname__ != query.__qualname__:
        raise ValueError(f"a query named {name!r} is registered already ({known.__module__}.{known.__qualname__}): choose another name")
    REGISTRY[name] = query  # the same class again (a notebook cell run twice) replaces its older self
    return query


def lookup(name: str) -> type[Query]:
    """The registered query type ``name``; KeyError naming the registered ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} (registered: {', '.join(sorted(REGISTRY))})") from None


def built_in(query: type[Query]) -> bool:
    """Whether ``query`` ships with the package (every worker has it), not a user's type sent by value."""
    return query.__module__.startswith(__name__.rsplit(".", 1)[0] + ".")


@functools.cache
def wire_name(query: type[Query]) -> str:
    """The name a shard knows ``query`` by: a built-in's name, or a user type's name with the digest of its
    pickled class (another version of the class is another type to the shard)."""
    if built_in(query):
        return query.name
    digest = hashlib.blake2b(cloudpickle.dumps(query), digest_size=8).hexdigest()
    return f"{query.name}@{digest}"
