"""Detector calibration, centre of mass and DPC: built on the client from exact virtual images (moments,
dark-field ring) and mean patterns of a series, two calls per shard at most; no owner half of their own."""

from __future__ import annotations

import numpy as np

from ..phase import calibration
from ..phase.optics import Optics
from .reductions import Reduce
from .virtual_images import VirtualImages


def center_of_mass(series, center: tuple[float, float] | None = None) -> np.ndarray:
    """(n_acquisitions, 2, scan_rows, scan_cols) float64 centre of mass (row, col) of every pattern, in
    detector pixels from ``center`` (default: each acquisition's bright-field disk centre), from exact
    moment images."""
    moments = series.ask(VirtualImages, calibration.moment_masks(series.same("det_shape")))
    if center is not None:
        return np.stack([calibration.center_of_mass(m, center) for m in moments])
    means = series.ask(Reduce, None, "mean")
    return np.stack([calibration.center_of_mass(m, calibration.bright_field_disk(mean)[0]) for m, mean in zip(moments, means)])


def calibrate(series, optics: Optics) -> list[Optics]:
    """``optics`` for each acquisition with det_sampling_mrad (from the bright-field disk radius, unless
    given), bf_center_px, rotation_deg and flip (least CoM curl, the 180 deg twin by the iCoM-ADF sign,
    unless given) filled in, from one mean-pattern call and one images call per shard."""
    det_shape = series.same("det_shape")
    disks = [calibration.bright_field_disk(mean) for mean in series.ask(Reduce, None, "mean")]
    rings = np.stack([calibration.dark_field_ring(det_shape, disk) for disk in disks])
    images = series.ask(VirtualImages, np.concatenate([calibration.moment_masks(det_shape), rings]))
    return [calibration.calibrated(optics, disk, images[i, :3], images[i, 3 + i])[0] for i, disk in enumerate(disks)]


def dpc(series, optics: Optics) -> np.ndarray:
    """(n_acquisitions, scan_rows, scan_cols) iCoM phases in rad, mean 0, float64, with calibrated ``optics``."""
    optics.require_calibration("dpc")
    moments = series.ask(VirtualImages, calibration.moment_masks(series.same("det_shape")))
    return np.stack([calibration.dpc(m, optics) for m in moments])
