"""The aberration fit: rotation, defocus and twofold astigmatism of each acquisition by the coherent SSB
signal (``phase.fit``), on its owner from the kept G (``sideband.spectrum``)."""

from __future__ import annotations

from ..phase import fit, sideband
from ..phase.optics import Optics
from ..resident import Resident
from .base import Context, Query, register
from .sideband import KEEPS, check_optics, spectrum


@register
class FitAberrations(Query):
    """``optics`` of each acquisition (calibrated) with the defocus C10 and twofold astigmatism C12, phi12
    that maximise the coherent SSB signal, searched over C10 within +/- ``c10_range_A`` of the given one;
    their standard errors in ``uncertainties``."""

    name = "fit_aberrations"
    long = True
    keeps = KEEPS

    def __init__(self, series, optics: Optics, c10_range_A: float = 500.0):
        check_optics(optics)
        self.args = (optics, float(c10_range_A))

    @staticmethod
    def run(ctx: Context, residents: list[Resident], optics: Optics, c10_range_A: float) -> list[dict]:
        fits = []
        for r in residents:
            k0 = sideband.bright_field_pixels(optics.with_(rotation_deg=0.0), r.det_shape)[1:]
            fits.append(fit.fit(spectrum(ctx, r, optics)[0], k0, optics, c10_range_A, r.xp))
        return fits

    def assemble(self, parts: list[dict]) -> list[Optics]:
        return [fitted["optics"] for fitted in parts]
