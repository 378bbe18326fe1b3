"""Parallax: the contrast-corrected tilt-corrected bright field of each acquisition (``phase.parallax``),
from its bright-field pixel images on the owner."""

from __future__ import annotations

import numpy as np

from ..device import synchronize, to_host
from ..phase import parallax, sideband
from ..phase.optics import Optics
from ..resident import Resident
from .base import Context, Query, register
from .sideband import check_optics


@register
class Parallax(Query):
    """(n_acquisitions, scan_rows * u, scan_cols * u) tilt-corrected bright fields with contrast correction,
    float32, mean 0, with calibrated ``optics`` carrying the aberrations, on a grid ``upsampling`` times
    finer than the scan."""

    name = "parallax"
    long = True

    def __init__(self, series, optics: Optics, upsampling: int = 2):
        check_optics(optics)
        parallax.check_upsampling(upsampling)
        self.args = (optics, upsampling)

    @staticmethod
    def run(ctx: Context, residents: list[Resident], optics: Optics, upsampling: int) -> list[np.ndarray]:
        images = []
        for r in residents:
            indices, ky, kx = sideband.bright_field_pixels(optics, r.det_shape)
            images.append(to_host(parallax.parallax(r.pixel_images(indices), r.scan_shape, ky, kx, optics, upsampling, r.xp)))
        synchronize()
        return images

    def assemble(self, parts: list) -> np.ndarray:
        return np.stack(parts)
