"""Single-sideband ptychography: the aberration-corrected SSB phase of each acquisition, computed on its
owner from G(k, Q) of the bright-field pixels, which is kept there (``preparations``) so other aberrations
on the same calibration cost only the final sum. ``spectrum`` is that kept G, for the fit and direct
ptychography too."""

from __future__ import annotations

import numpy as np

from ..device import synchronize
from ..phase import sideband
from ..phase.optics import Optics
from ..resident import Resident
from .base import Context, Query, filled, register
from .preparations import PreparedCache, pixels_key
from .results import result_array

KEEPS = {"ssb_cache": PreparedCache}  # G and the direct equations: info()["ssb_cache_bytes"]


def check_optics(optics) -> None:
    """TypeError unless ``optics`` is an Optics; ValueError naming the calibration fields it lacks."""
    if not isinstance(optics, Optics):
        raise TypeError(f"ssb takes a qd.Optics (from acq.calibrate), got {type(optics).__name__}")
    optics.require_calibration("ssb")


def spectrum(ctx: Context, resident: Resident, optics: Optics) -> tuple[sideband.Spectrum, np.ndarray, np.ndarray]:
    """(G, k_y, k_x) of a resident's bright-field pixels under ``optics``' calibration, G kept on the shard."""
    indices, ky, kx = sideband.bright_field_pixels(optics, resident.det_shape)
    prepared: PreparedCache = ctx.kept["ssb_cache"]
    spec, _ = prepared.get(resident.name, "G:" + pixels_key(indices), lambda: sideband.spectrum(resident, indices))
    return spec, ky, kx


@register
class SSB(Query):
    """(n_acquisitions, scan_rows, scan_cols) aberration-corrected SSB phases (rad, mean 0, float32) with
    calibrated ``optics``."""

    name = "ssb"
    long = True
    keeps = KEEPS

    def __init__(self, series, optics: Optics):
        check_optics(optics)
        self.args = (optics,)
        self.scan_shape = series.same("scan_shape")
        self.out: np.ndarray | None = None

    def destination(self, n: int) -> np.ndarray:
        self.out = result_array((n, *self.scan_shape), np.float32)
        return self.out

    @staticmethod
    def run(ctx: Context, residents: list[Resident], optics: Optics) -> list:
        """Each resident's phase, on its device: it goes from there straight into the client's result where
        that is on this host (``written``)."""
        images = [sideband.phase(*spectrum(ctx, r, optics), optics, r.xp) for r in residents]
        synchronize()
        return images

    @staticmethod
    def written(reply: list, write) -> list:
        """The reply less the images written into the client's result."""
        return [None if write([i], image[None]) else image for i, image in enumerate(reply)]

    def assemble(self, parts: list) -> np.ndarray:
        """The client's result, with the parts not written there placed in it."""
        return filled(self.out, [(i, image) for i, image in enumerate(parts) if image is not None], (len(parts), *self.scan_shape), np.float32)
