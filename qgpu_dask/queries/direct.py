"""Regularized direct ptychography of each acquisition (``phase.direct``) on its owner. Its equations are
kept there per acquisition, optics and upsampling, for each method (``preparations``): another strength
only re-solves; another optics or upsampling drops both methods' equations. Equations the kept room could
not hold are refused before any work."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from dask.utils import format_bytes

from ..device import synchronize, to_host
from ..phase import direct
from ..phase.direct import DirectResult
from ..phase.optics import Optics
from ..resident import Resident
from .base import Context, Query, register
from .preparations import PreparedCache
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
        direct.upsampling_of(optics, upsampling)
        self.args = (optics, method, upsampling, direct.check_strength(strength))

    @staticmethod
    def run(ctx: Context, residents: list[Resident], optics: Optics, method: str, upsampling, strength: float) -> list[DirectResult]:
        prepared: PreparedCache = ctx.kept["ssb_cache"]
        u = direct.upsampling_of(optics, upsampling)
        key = "direct:" + direct.optics_key(optics, u)

        def prepare(r: Resident) -> direct.Prepared:
            found = direct.aliases(r.scan_shape, optics, u, r.xp)
            need = direct.equations_bytes(found, method)
            if need > prepared.limit:
                raise ValueError(f"direct ptychography of {r.name!r} at upsampling {u} ({method}) needs {format_bytes(need)} for its "
                                 f"equations, more than the {format_bytes(prepared.limit)} this shard keeps for phase preparations: "
                                 "use a smaller upsampling")
            return direct.prepare(*spectrum(ctx, r, optics), optics, found, method, r.xp)

        results = []
        for r in residents:
            prepared.retain(r.name, "direct:", key)
            prep, made = prepared.get(r.name, f"{key}:{method}", lambda r=r: prepare(r))
            result = direct.solve(prep, strength, r.xp)
            results.append(replace(result, phase=to_host(result.phase), amplitude=to_host(result.amplitude), prepared=made))
        synchronize()
        return results

    def assemble(self, parts: list[DirectResult]) -> DirectResult:
        """One DirectResult stacking the images of the series; ``prepared`` if any acquisition's equations were made now."""
        first = parts[0]
        amplitude = np.stack([r.amplitude for r in parts]) if first.amplitude is not None else None
        return replace(first, phase=np.stack([r.phase for r in parts]), amplitude=amplitude, prepared=any(r.prepared for r in parts))

    def single(self, result: DirectResult) -> DirectResult:
        amplitude = result.amplitude[0] if result.amplitude is not None else None
        return replace(result, phase=result.phase[0], amplitude=amplitude)
