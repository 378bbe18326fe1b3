"""Detector calibration from an acquisition: bright-field disk, centre of mass, scan rotation and flip, iCoM phase.

All of it works from small results the owning shard sends back (the mean
pattern; exact integer moment images), never from the counts themselves:

- The bright-field disk: the mean pattern thresholded at half its maximum;
  radius = sqrt(pixels / pi), centre = the intensity centroid inside;
  mrad per pixel = probe semiangle / radius (one rule for every backend).
- Centre of mass per scan position, from three exact virtual images with
  integer weights (1, row index, column index), in detector pixels from the
  disk centre.
- Rotation and flip: the CoM field of a phase object is a gradient, so its
  curl vanishes in scan coordinates. Search the angle in [-89, 90] deg (and
  with detector rows and columns swapped) for the least mean |curl|; the 180
  deg twin is chosen so that the iCoM phase correlates positively with the
  ADF image (atoms bright in both).
- iCoM (DPC) phase: phi(Q) = -i Q.c(Q) / |Q|^2 with c the CoM in 1/A in scan
  coordinates, Q in 1/A; radians, mean 0.
"""

from __future__ import annotations

import math

import numpy as np

from ..detector.masks import annulus
from .optics import Optics

MIN_RADIUS_PX = 1.5  # a bright-field disk smaller than this is not a disk


def bright_field_disk(mean_pattern: np.ndarray) -> tuple[tuple[float, float], float]:
    """((row, col) centre, radius) in detector pixels of the bright-field disk of a mean pattern.

    ValueError when the pattern has none: not finite, flat, a half-maximum
    region too small or touching most of the detector.
    """
    pattern = np.asarray(mean_pattern, np.float64)
    if pattern.ndim != 2:
        raise ValueError(f"a mean pattern is 2-D, got shape {pattern.shape}")
    if not np.isfinite(pattern).all():
        raise ValueError("the mean pattern is not finite (NaN or inf counts): no bright-field disk can be found")
    top = pattern.max()
    inside = pattern >= top / 2
    pixels = int(inside.sum())
    radius = math.sqrt(pixels / math.pi)
    if top <= 0 or pixels == pattern.size or radius < MIN_RADIUS_PX or pixels > 0.8 * pattern.size:
        raise ValueError(
            f"the mean pattern has no bright-field disk: {pixels} of {pattern.size} pixels are at least half its "
            f"maximum ({top:g}); a disk of radius >= {MIN_RADIUS_PX} px covering less than 80 % of the detector is needed"
        )
    rows, cols = np.indices(pattern.shape)
    weights = np.where(inside, pattern, 0.0)
    total = weights.sum()
    return (float((rows * weights).sum() / total), float((cols * weights).sum() / total)), radius


def moment_masks(det_shape: tuple[int, int]) -> np.ndarray:
    """(3, rows, cols) integer weights whose virtual images are the zeroth and first moments of every pattern."""
    rows, cols = np.indices(det_shape, dtype=np.int64)
    return np.stack([np.ones(det_shape, np.int64), rows, cols])


def center_of_mass(moments: np.ndarray, center: tuple[float, float]) -> np.ndarray:
    """(2, scan_rows, scan_cols) float64 centre of mass (row, col) in detector pixels from ``center``,
    from the moment images (3, scan_rows, scan_cols); NaN where a pattern has no counts."""
    total = moments[0].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.stack([moments[1] / total - center[0], moments[2] / total - center[1]])


def to_scan(com: np.ndarray, rotation_deg: float, flip: bool) -> np.ndarray:
    """A detector-pixel vector field (row, col components) turned into scan (row, col) directions."""
    rows, cols = (com[1], com[0]) if flip else (com[0], com[1])
    t = math.radians(rotation_deg)
    return np.stack([math.cos(t) * rows - math.sin(t) * cols, math.sin(t) * rows + math.cos(t) * cols])


def curl_by_angle(field: np.ndarray, flip: bool):
    """The mean squared curl of ``to_scan(field, t, flip)`` as a function of t (deg). Squares rather than
    |curl|, so noise makes a smooth bowl around the true angle. The gradient is linear, so the curl after a
    turn by t is cos t a - sin t b with a = d r / d col - d c / d row and b = d c / d col + d r / d row of the
    unturned (row r, col c) field: three means answer every angle."""
    r, c = (field[1], field[0]) if flip else (field[0], field[1])
    a = np.gradient(r, axis=1) - np.gradient(c, axis=0)
    b = np.gradient(c, axis=1) + np.gradient(r, axis=0)
    aa, ab, bb = float(np.mean(a * a)), float(np.mean(a * b)), float(np.mean(b * b))

    def curl(angle_deg: float) -> float:
        t = math.radians(angle_deg)
        return math.cos(t) ** 2 * aa - 2 * math.sin(t) * math.cos(t) * ab + math.sin(t) ** 2 * bb

    return curl


def rotation_search(com: np.ndarray) -> tuple[float, bool, dict]:
    """(rotation_deg in [-89, 90], flip, curls) of least mean squared curl: 1 deg steps, then 0.05 deg around the best."""
    field = np.nan_to_num(com - np.nanmean(com, axis=(1, 2), keepdims=True))
    scale = float(np.abs(field).mean()) or 1.0
    best = None
    curls = {}
    for flip in (False, True):
        curl = curl_by_angle(field, flip)
        coarse = {float(t): curl(t) for t in range(-89, 91)}
        angle = min(coarse, key=coarse.get)
        fine = {float(t): curl(t) for t in np.arange(angle - 1, angle + 1.0001, 0.05)}
        angle = min(fine, key=fine.get)
        curls[flip] = fine[angle] / scale
        if best is None or fine[angle] < best[2]:
            best = (angle, flip, fine[angle])
    angle = best[0] - 180 if best[0] > 90 else best[0]  # the fine search may step just past 90
    return angle, best[1], {"relative_curl": curls[best[1]], "relative_curl_other_flip": curls[not best[1]]}


def icom(com_scan_k: np.ndarray, scan_step_A: float) -> np.ndarray:
    """iCoM phase (rad, mean 0) of a CoM field in 1/A along scan (row, col) with scan step ``scan_step_A``."""
    rows, cols = com_scan_k.shape[1:]
    qy = np.fft.fftfreq(rows, scan_step_A)[:, None]
    qx = np.fft.fftfreq(cols, scan_step_A)[None, :]
    q2 = qy**2 + qx**2
    q2[0, 0] = 1.0
    spectrum = -1j * (qy * np.fft.fft2(np.nan_to_num(com_scan_k[0])) + qx * np.fft.fft2(np.nan_to_num(com_scan_k[1]))) / q2
    spectrum[0, 0] = 0.0
    return np.fft.ifft2(spectrum).real


def dark_field_ring(det_shape: tuple[int, int], disk: tuple[tuple[float, float], float]) -> np.ndarray:
    """An int64 annulus from 1.5 x the bright-field disk's radius to the detector's edge: the ADF image that
    orients the phase (the 180 deg twin); ValueError if the detector leaves no dark field."""
    center, radius = disk
    outer = min(det_shape) / 2 - 0.5
    inner = min(1.5 * radius, outer - 1)
    if inner <= radius:
        raise ValueError(f"the bright-field disk (radius {radius:.1f} px) leaves no dark field on a {det_shape} detector to orient the phase by")
    return annulus(det_shape, center, inner, outer).astype(np.int64)


def dpc(moments: np.ndarray, optics: Optics) -> np.ndarray:
    """iCoM phase (rad, mean 0, float64 (scan_rows, scan_cols)) from the moment images and calibrated ``optics``."""
    optics.require_calibration("dpc")
    com = center_of_mass(moments, optics.bf_center_px)
    return icom(to_scan(com, optics.rotation_deg, optics.flip) * optics.k_per_pixel(), optics.scan_step_A)


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two images."""
    a = a - a.mean()
    b = b - b.mean()
    norm = math.sqrt(float((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / norm) if norm else 0.0


def calibrated(optics: Optics, disk: tuple[tuple[float, float], float], moments: np.ndarray, adf: np.ndarray) -> tuple[Optics, dict]:
    """``optics`` with det_sampling_mrad (unless given), bf_center_px, rotation_deg and flip (unless given) filled in
    from the bright-field ``disk`` (centre, radius) and the moment and ADF images, and what the search saw
    (disk radius, curls, iCoM-ADF correlation)."""
    center, radius = disk
    sampling = optics.det_sampling_mrad or optics.semiangle_mrad / radius
    com = center_of_mass(moments, center)
    report = {"bf_radius_px": radius, "bf_center_px": center}
    if optics.rotation_deg is None or optics.flip is None:
        angle, flip, curls = rotation_search(com)
        report |= curls
        if optics.rotation_deg is not None:
            angle = optics.rotation_deg
        if optics.flip is not None:
            flip = optics.flip
        k_per_px = sampling * 1e-3 / optics.wavelength_A
        phase = icom(to_scan(com, angle, flip) * k_per_px, optics.scan_step_A)
        agree = correlation(phase, adf)
        if agree < 0 and optics.rotation_deg is None:  # the 180 deg twin: atoms must come out bright in both
            angle = angle - 180 if angle > 0 else angle + 180
            agree = -agree
        report["icom_adf_correlation"] = agree
    else:
        angle, flip = optics.rotation_deg, optics.flip
    return optics.with_(det_sampling_mrad=sampling, bf_center_px=center, rotation_deg=float(angle), flip=bool(flip)), report
