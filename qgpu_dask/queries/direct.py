"""Regularized direct ptychography of each acquisition (``phase.direct``) on its owner. Its equations are
kept there per acquisition, optics and upsampling, for each method (``preparations``): another strength
only re-solves; another optics or upsampling drops both methods' equations. Equations the kept room could
not hold are refused before any work."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from dask.utils import format_bytes

from ..device import synchronize
from ..phase import direct
from ..phase.direct import DirectResult
from ..phase.optics import Optics
from ..resident import Resident
from .base import Context, Query, filled, register
from .preparations import PreparedCache
from .results import result_array
from .sideband import KEEPS, check_optics, spectrum


@register
class DirectPtycho(Query):
    """Direct ptychography of every acquisition with the same calibrated ``optics``: one DirectResult whose
    ``phase`` (and ``amplitude`` for method "complex") stack those of the series, float32
    (n_acquisitions, scan_rows * u, scan_cols * u)."""

    name = "direct_ptycho"
    long = True
    keeps = KEEPS

    def __init__(self, series, optics: Optics, method: str = "phase", upsampling="auto", strength: float = 0.1):
        check_optics(optics)
        direct.check_method(method)
        u = direct.upsampling_of(optics, upsampling)
        self.args = (optics, method, upsampling, direct.check_strength(strength))
        rows, cols = series.same("scan_shape")
        self.images_shape = (2 if method == "complex" else 1, rows * u, cols * u)  # phase, then amplitude
        self.settings = (method, u, self.args[3])
        self.out: np.ndarray | None = None

    def destination(self, n: int) -> np.ndarray:
        """The (n, 1 or 2, rows * u, cols * u) float32 images (phase, and amplitude for method "complex")."""
        self.out = result_array((n, *self.images_shape), np.float32)
        return self.out

    @staticmethod
    def run(ctx: Context, residents: list[Resident], optics: Optics, method: str, upsampling, strength: float) -> list[tuple]:
        """(images (1 or 2, rows * u, cols * u) float32 on the device: phase, then amplitude; whether this call
        prepared the equations) per resident: the images go from the device straight into the client's result
        where it is on this host (``written``)."""
        prepared: PreparedCache = ctx.kept["ssb_cache"]
        u = direct.upsampling_of(optics, upsampling)
        key = "direct:" + direct.optics_key(optics, u)

        def prepare(r: Resident) -> direct.Prepared:
            geometry = "aliases:" + direct.aliases_key(r.scan_shape, optics, u)
            prepared.retain(r.name, "aliases:", geometry)
            found, _ = prepared.get(r.name, geometry, lambda: direct.aliases(r.scan_shape, optics, u, r.xp))
            need = direct.equations_bytes(found, method)
            if need > prepared.limit:
                raise ValueError(f"direct ptychography of {r.name!r} at upsampling {u} ({method}) needs {format_bytes(need)} for its "
                                 f"equations, more than the {format_bytes(prepared.limit)} this shard keeps for phase preparations: "
                                 "use a smaller upsampling")
            return direct.prepare(*spectrum(ctx, r, optics), optics, found, method, r.xp)

        parts = []
        for r in residents:
            prepared.retain(r.name, "direct:", key)
            prep, made = prepared.get(r.name, f"{key}:{method}", lambda r=r: prepare(r))
            result = direct.solve(prep, strength, r.xp)
            images = [result.phase] if result.amplitude is None else [result.phase, result.amplitude]
            parts.append((r.xp.stack(images), made))
        synchronize()
        return parts

    @staticmethod
    def written(reply: list[tuple], write) -> list[tuple]:
        """The reply less the images written into the client's result."""
        return [(None if write([i], images[None]) else images, made) for i, (images, made) in enumerate(reply)]

    def assemble(self, parts: list[tuple]) -> DirectResult:
        """One DirectResult of the series' images (the client's result, with the parts not written there placed
        in it); ``prepared`` if any acquisition's equations were made now."""
        rows = [(i, images) for i, (images, _) in enumerate(parts) if images is not None]
        out = filled(self.out, rows, (len(parts), *self.images_shape), np.float32)
        method, u, strength = self.settings
        return DirectResult(out[:, 0], out[:, 1] if len(out[0]) == 2 else None, method, u, strength, prepared=any(made for _, made in parts))

    def single(self, result: DirectResult) -> DirectResult:
        amplitude = result.amplitude[0] if result.amplitude is not None else None
        return replace(result, phase=result.phase[0], amplitude=amplitude)
