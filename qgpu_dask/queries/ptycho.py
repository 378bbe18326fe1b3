"""Iterative ptychography's owner half: each shard keeps an object per resident of a reconstruction run
and updates it in place, one pass over its frames at a time, from the resident's feed
(``phase.iterative``); the driver on the client (``ptycho.reconstruct``) adds the probe's sums in series
order and updates the probe."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..device import to_host
from ..phase.iterative import geometry, update
from ..phase.iterative.window import Window
from ..phase.optics import Optics
from ..resident import Resident
from .base import Context, Kept, Query, register


class Reconstructions(Kept):
    """Run -> acquisition name -> (geometry, object on the device): the objects count against the budget
    until their run ends (``PtychoEnd``)."""

    def __init__(self, ctx: Context):
        self.address = ctx.address
        self.runs: dict[str, dict[str, tuple[geometry.Geometry, Any]]] = {}

    def held_bytes(self, run: str | None = None) -> int:
        """Device bytes of the objects of ``run`` (default: of every run)."""
        runs = [self.runs.get(run, {})] if run is not None else list(self.runs.values())
        return sum(obj.nbytes for state in runs for _, obj in state.values())

    def state(self, run: str, name: str) -> tuple[geometry.Geometry, Any]:
        try:
            return self.runs[run][name]
        except KeyError:
            raise KeyError(f"no state of reconstruction {run!r} for {name!r} on {self.address} (a lost worker, or never started)") from None


KEEPS = {"ptycho": Reconstructions}


class PtychoQuery(Query):
    """A step of reconstruction ``run``: the run's id first, then the step's own arguments (sent as given)."""

    keeps = KEEPS


@register
class PtychoStart(PtychoQuery):
    """Keep an object per resident for reconstruction ``run``: ones, or the given NumPy ``objects`` (one per
    acquisition of the series, each sent only to its owner); ``optics`` are those of the detector reduced to
    ``window``."""

    name = "ptycho_start"

    def __init__(self, series, run: str, optics: Optics, window: Window, objects: list | None):
        self.names = list(series.names)
        self.args = (run, optics, window, objects)

    async def send(self, call, owner: str, names: list[str]):
        run, optics, window, objects = self.args
        given = None if objects is None else [objects[self.names.index(n)] for n in names]
        return await call(owner, names, run, optics, window, given)

    @staticmethod
    def run(ctx: Context, residents: list[Resident], run: str, optics: Optics, window: Window, objects: list | None) -> list[None]:
        kept: Reconstructions = ctx.kept["ptycho"]
        names = [r.name for r in residents]
        geos = [geometry.geometry(optics, r.scan_shape, window.det_shape) for r in residents]
        others = sum(obj.nbytes for n, (_, obj) in kept.runs.get(run, {}).items() if n not in names)
        need = sum(8 * g.object_shape[0] * g.object_shape[1] for g in geos) + others  # complex64 objects, replacing any of these names
        ctx.check_room(f"the objects of reconstruction {run[:8]} need", need - kept.held_bytes(run))
        state = {}
        for i, (r, geo) in enumerate(zip(residents, geos)):
            if objects is None:
                obj = r.xp.ones(geo.object_shape, np.complex64)
            else:
                if objects[i].shape != geo.object_shape:
                    raise ValueError(f"the object given for {r.name!r} has shape {objects[i].shape}, the scan needs {geo.object_shape}")
                obj = r.xp.asarray(objects[i], dtype=np.complex64)
            state[r.name] = (geo, obj)
        kept.runs.setdefault(run, {}).update(state)
        return [None] * len(residents)


@register
class PtychoPass(PtychoQuery):
    """One pass over each resident's scan positions, its object updated in place with ``probe``, in blocks
    of ``batch`` made ``depth`` ahead and reduced to ``window``, with object step ``step``; the probe's sums
    of each (``update.Pass``)."""

    name = "ptycho_pass"

    @staticmethod
    def run(ctx: Context, residents: list[Resident], run: str, probe: np.ndarray, window: Window, batch: int, depth: int,
            step: float) -> list:
        kept: Reconstructions = ctx.kept["ptycho"]
        states = [kept.state(run, r.name) for r in residents]
        passes = []
        for r, (geo, obj) in zip(residents, states):
            # counts: the projection takes their roots
            blocks = (window.reduce(block, r.xp) for block in r.feed(batch, amplitude=False, depth=depth))
            passes.append(update.frame_pass(obj, r.xp.asarray(probe), blocks, geo, step, r.xp))
        return passes


@register
class PtychoObjects(PtychoQuery):
    """The objects of ``run``, as NumPy."""

    name = "ptycho_objects"

    @staticmethod
    def run(ctx: Context, residents: list[Resident], run: str) -> list[np.ndarray]:
        kept: Reconstructions = ctx.kept["ptycho"]
        return [to_host(kept.state(run, r.name)[1]) for r in residents]


@register
class PtychoEnd(PtychoQuery):
    """Drop the state of reconstruction ``run`` for these acquisitions (idempotent)."""

    name = "ptycho_end"
    inline = True
    on_names = True  # the run ends also for acquisitions released meanwhile

    @staticmethod
    def reads(names: list[str], run: str) -> int:
        return 0

    @staticmethod
    def run(ctx: Context, names: list[str], run: str) -> list[None]:
        kept: Reconstructions = ctx.kept["ptycho"]
        state = kept.runs.get(run, {})
        for name in names:
            state.pop(name, None)
        if not state:
            kept.runs.pop(run, None)
        return [None] * len(names)
