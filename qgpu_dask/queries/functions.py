"""User functions next to the data (``svc.submit``): ``fn(resident, *args, **kwargs)`` on the owner of an
acquisition, or ``fn(part, *args, **kwargs)`` once per shard holding some of a series (``part``: a
``ShardSeries``). The function travels pickled with each call; CuPy results come back as NumPy. A
function may append a live acquisition's last frames: the shard settles it after."""

from __future__ import annotations

from typing import Any, Callable

from ..device import to_host
from ..resident import Resident
from ..resident.feed import ShardSeries
from .base import Context, Query, register


def check_function(fn) -> None:
    if not callable(fn):
        raise TypeError(f"submit runs a function next to the data; got {type(fn).__name__} {fn!r}")


@register
class Function(Query):
    """``fn(resident, *args, **kwargs)`` for each acquisition (one per call: a single acquisition's handle)."""

    name = "function"
    settles = True

    def __init__(self, series, fn: Callable, args: tuple = (), kwargs: dict | None = None):
        check_function(fn)
        self.args = (fn, tuple(args), dict(kwargs or {}))

    @staticmethod
    def run(ctx: Context, residents: list[Resident], fn: Callable, args: tuple, kwargs: dict) -> list:
        return [to_host(fn(r, *args, **kwargs)) for r in residents]


@register
class ShardFunction(Function):
    """``fn(part, *args, **kwargs)`` once per shard holding some of the series; the result is
    [(positions, fn's result)] per shard, by first position."""

    name = "shard_function"

    def __init__(self, series, fn: Callable, args: tuple = (), kwargs: dict | None = None):
        super().__init__(series, fn, args, kwargs)
        self.names = list(series.names)

    async def send(self, call, owner: str, names: list[str]) -> Any:
        fn, args, kwargs = self.args
        return await call(owner, names, [self.names.index(n) for n in names], fn, args, kwargs)

    @staticmethod
    def run(ctx: Context, residents: list[Resident], positions: list[int], fn: Callable, args: tuple, kwargs: dict) -> list:
        return [to_host(fn(ShardSeries(residents, positions), *args, **kwargs))]

    def merge(self, replies: list, positions: list[list[int]]) -> list:
        return sorted(((where, reply[0]) for reply, where in zip(replies, positions)), key=lambda pair: pair[0][0])

    def single(self, result: list) -> Any:
        return result[0][1]
