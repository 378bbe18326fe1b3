"""Where each scan position's probe window falls on a frame's object, and the probe to start from.

The object is reconstructed on the detector's conjugate grid: pixels of 1 / (det_rows dk) x 1 / (det_cols dk)
A (dk: the detector sampling in 1/A), axes along the detector's (so the far field of a window is its plain
FFT, with no interpolation). Scan positions (row i, col j at i and j scan steps, scan axes) are turned
into detector axes (the inverse of ``calibration.to_scan``) and rounded to whole pixels; a scan step that
is a whole number of object pixels keeps them exact. FFT index 0 sits on the bright-field disk centre
rounded to a pixel; its fractional part is a tilt the starting probe carries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..calibration import to_scan
from ..optics import Optics, probe_spectrum


@dataclass(frozen=True)
class Geometry:
    """``corners`` (n_positions, 2) int64: each window's top-left object pixel, scan positions in C order;
    ``object_shape``: the object grid; ``window``: the detector shape; ``pixel_A``: object pixel (rows, cols);
    ``center``: the detector pixel at FFT index 0 (the bright-field centre, rounded)."""

    corners: np.ndarray
    object_shape: tuple[int, int]
    window: tuple[int, int]
    pixel_A: tuple[float, float]
    center: tuple[int, int]


def to_detector(vectors: np.ndarray, rotation_deg: float, flip: bool) -> np.ndarray:
    """Scan-axis (row, col) vectors (2, n) in detector axes: the inverse of ``calibration.to_scan``."""
    t = math.radians(rotation_deg)
    rows = math.cos(t) * vectors[0] + math.sin(t) * vectors[1]
    cols = -math.sin(t) * vectors[0] + math.cos(t) * vectors[1]
    return np.stack([cols, rows]) if flip else np.stack([rows, cols])


def geometry(optics: Optics, scan_shape: tuple[int, int], det_shape: tuple[int, int]) -> Geometry:
    """The windows of every scan position on the object grid of calibrated ``optics``."""
    optics.require_calibration("ptychography")
    dk = optics.k_per_pixel()
    pixel = (1 / (det_shape[0] * dk), 1 / (det_shape[1] * dk))
    rows, cols = np.indices(scan_shape).reshape(2, -1) * optics.scan_step_A
    on_detector = to_detector(np.stack([rows, cols]).astype(np.float64), optics.rotation_deg, optics.flip)
    corners = np.rint(np.stack([on_detector[0] / pixel[0], on_detector[1] / pixel[1]], axis=1)).astype(np.int64)
    corners -= corners.min(axis=0)
    shape = (int(corners[:, 0].max()) + det_shape[0], int(corners[:, 1].max()) + det_shape[1])
    center = (int(round(optics.bf_center_px[0])), int(round(optics.bf_center_px[1])))
    return Geometry(corners, shape, tuple(det_shape), pixel, center)


def starting_probe(optics: Optics, geo: Geometry, mean_counts: float) -> np.ndarray:
    """The aperture with the optics' aberrations, in real space centred on the window (complex64), scaled so
    that its far field holds ``mean_counts`` (the mean counts of a pattern): sum |FFT(P)|^2 = mean_counts.
    A scan position's probe centre is then half a window from its corner."""
    n0, n1 = geo.window
    d0 = (np.arange(n0) + n0 // 2) % n0 - n0 // 2 + (geo.center[0] - optics.bf_center_px[0])
    d1 = (np.arange(n1) + n1 // 2) % n1 - n1 // 2 + (geo.center[1] - optics.bf_center_px[1])
    grid = np.stack(np.meshgrid(d0, d1, indexing="ij")).reshape(2, -1)
    ky, kx = to_scan(grid, optics.rotation_deg, optics.flip) * optics.k_per_pixel()
    spectrum = probe_spectrum(kx, ky, optics).reshape(n0, n1)
    power = float((np.abs(spectrum) ** 2).sum())
    if power == 0:
        raise ValueError("the probe's aperture holds no detector pixel: check semiangle_mrad and det_sampling_mrad")
    spectrum *= math.sqrt(mean_counts / power)
    return np.fft.fftshift(np.fft.ifft2(spectrum)).astype(np.complex64)  # centred in the window: no wrap-around
