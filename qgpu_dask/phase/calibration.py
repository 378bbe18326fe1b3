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
  with detector rows and columns swapped) for the least curl, in Fourier
  space with each frequency weighted by signal / (signal + noise) (``Turned``);
  the 180 deg twin is chosen so that the iCoM phase correlates positively
  with the ADF image (atoms bright in both). The angle is an estimate: its
  standard error goes to ``uncertainties["rotation_deg"]``, and
  ``fit_aberrations`` refines it.
- iCoM (DPC) phase: phi(Q) = -i Q.c(Q) / |Q|^2 with c the CoM in 1/A in scan
  coordinates, Q in 1/A; radians, mean 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def cosine_sums(x: np.ndarray, axis: int) -> np.ndarray:
    """y[k] = 2 sum_n x[n] cos(pi k (2 n + 1) / (2 N)) along ``axis`` (length N) for k = 0..N (y[N] = 0): the
    DCT-II, from one N-point FFT of the even samples followed by the odd ones reversed."""
    x = np.moveaxis(x, axis, -1)
    n = x.shape[-1]
    spectrum = np.fft.fft(np.concatenate([x[..., ::2], x[..., 1::2][..., ::-1]], axis=-1), axis=-1)
    y = 2 * (spectrum * np.exp(-0.5j * np.pi * np.arange(n) / n)).real
    return np.moveaxis(np.concatenate([y, np.zeros_like(y[..., :1])], axis=-1), -1, axis)


def sine_sums(x: np.ndarray, axis: int) -> np.ndarray:
    """y[k] = 2 sum_n x[n] sin(pi k (2 n + 1) / (2 N)) along ``axis`` for k = 0..N: ``cosine_sums`` of
    (-1)^n x taken in reverse order (sin(pi (N - k) (2 n + 1) / (2 N)) = (-1)^n cos(pi k (2 n + 1) / (2 N)))."""
    signs = np.where(np.arange(x.shape[axis]) % 2, -1.0, 1.0).reshape([-1 if a == axis else 1 for a in range(x.ndim)])
    return np.flip(cosine_sums(x * signs, axis), axis)


def reflected_spectrum(component: np.ndarray, odd_axis: int) -> np.ndarray:
    """One component of a gradient field reflected across its far edges into a periodic field of twice the size
    (odd across ``odd_axis``, the axis it is the derivative along; even across the other: the gradient of the
    evenly reflected potential, so a curl-free field stays curl-free and the FFT sees no edge), Fourier
    transformed, on the quadrant 0 <= k <= N of each axis. Along an axis reflected evenly the 2N-point DFT is
    exp(i pi k / 2N) times the cosine sums, oddly -i exp(i pi k / 2N) times the sine sums: transforms of the
    component itself, and the other quadrants follow by symmetry (every sum over them is the quadrant's, each
    frequency counted for its mirror images: ``Band.count``). ``odd_axis`` -1: even across both, as an image."""
    values = component
    for axis in (0, 1):
        values = sine_sums(values, axis) if axis == odd_axis else cosine_sums(values, axis)
    ramps = [np.exp(0.5j * np.pi * np.arange(n + 1) / n) * (-1j if axis == odd_axis else 1) for axis, n in enumerate(component.shape)]
    return values * ramps[0][:, None] * ramps[1][None, :]


@dataclass
class Band:
    """The scan frequencies 0 < |Q| <= band_k on the quadrant 0 <= k <= N of a field reflected to twice the
    size each way (the other quadrants are its mirror images): where (``inside``), |Q| and its direction (uy,
    ux) there, and how many frequencies of the whole plane each stands for (``count``: 2 per axis, 1 on the
    axis's k = 0 and k = N), which every sum over the band weighs by."""

    inside: np.ndarray
    q: np.ndarray
    uy: np.ndarray
    ux: np.ndarray
    count: np.ndarray

    @staticmethod
    def of(shape: tuple[int, int], scan_step_A: float, band_k: float) -> "Band":
        """The band of a field of ``shape`` reflected to twice the size each way."""
        qy = (np.arange(shape[0] + 1) / (2 * shape[0] * scan_step_A))[:, None]
        qx = (np.arange(shape[1] + 1) / (2 * shape[1] * scan_step_A))[None, :]
        q = np.hypot(qy, qx)
        inside = (q > 0) & (q <= band_k)
        sides = [np.where((np.arange(n + 1) == 0) | (np.arange(n + 1) == n), 1.0, 2.0) for n in shape]
        count = sides[0][:, None] * sides[1][None, :]
        return Band(inside, q[inside], (qy / np.where(q > 0, q, 1.0))[inside], (qx / np.where(q > 0, q, 1.0))[inside], count[inside])


class Turned:
    """A centre-of-mass field's Fourier components across and along Q after any turn t, on the scan
    frequencies 0 < |Q| <= ``band_k`` (1/A; 2 alpha / lambda, beyond which the CoM carries no signal).

    A gradient field lies along Q. Each component is reflected into a periodic field (``reflected_spectrum``); the turned
    field's components are then linear in four spectra, across(t) = cos t a - sin t b and
    along(t) = cos t c + sin t d with a, b, c, d fixed arrays, and the four spectra's summed power is the
    same at every turn.
    """

    def __init__(self, spectra: dict[tuple[int, int], np.ndarray], flip: bool, band: Band, power: np.ndarray):
        r, c = (1, 0) if flip else (0, 1)  # the flip swaps the field's components: the same four spectra in other roles
        rr, cc, cr, rc = spectra[r, 0], spectra[c, 1], spectra[c, 0], spectra[r, 1]
        self.inside, self.q, self.count = band.inside, band.q, band.count
        uy, ux = band.uy, band.ux
        self.a, self.b = ux * rr - uy * cc, ux * cr + uy * rc
        self.c, self.d = uy * rr + ux * cc, ux * rc - uy * cr
        self.power = power  # the four spectra's summed power: the same at every turn and flip

    @staticmethod
    def both(field: np.ndarray, scan_step_A: float, band_k: float) -> dict[bool, "Turned"]:
        """The field's ``Turned`` without and with the flip, from one set of four spectra (each component
        reflected across each axis), taken on the band once."""
        band = Band.of(field.shape[1:], scan_step_A, band_k)
        spectra = {(i, axis): reflected_spectrum(field[i], axis)[band.inside] for i in (0, 1) for axis in (0, 1)}
        power = np.abs(spectra[0, 0]) ** 2 + np.abs(spectra[1, 1]) ** 2 + np.abs(spectra[1, 0]) ** 2 + np.abs(spectra[0, 1]) ** 2
        return {flip: Turned(spectra, flip, band, power) for flip in (False, True)}

    def across(self, angle_deg: float) -> np.ndarray:
        t = math.radians(angle_deg)
        return math.cos(t) * self.a - math.sin(t) * self.b

    def along(self, angle_deg: float) -> np.ndarray:
        t = math.radians(angle_deg)
        return math.cos(t) * self.c + math.sin(t) * self.d

    def curl(self, weight: np.ndarray):
        """The ``weight``ed power across Q as a function of t (deg): three sums answer every angle."""
        weight = weight * self.count
        aa = float((weight * np.abs(self.a) ** 2).sum())
        bb = float((weight * np.abs(self.b) ** 2).sum())
        ab = float((weight * (self.a * self.b.conj()).real).sum())

        def curl(angle_deg: float) -> float:
            t = math.radians(angle_deg)
            return math.cos(t) ** 2 * aa - 2 * math.sin(t) * math.cos(t) * ab + math.sin(t) ** 2 * bb

        return curl

    def signal_weights(self, noise: float) -> np.ndarray:
        """signal / (signal + noise) per frequency from the turn-free power and the noise power across Q of one
        component (white): under white noise this weighting of the power across Q is the likelihood of the
        turn. Unweighted, the noise at all Q drowns a defocused probe's signal, which sits on a few low ones."""
        excess = self.power - 4 * noise
        return np.where(excess > 0, excess / np.maximum(self.power - 2 * noise, noise), 0.0)

    def phase_agreement(self, angle_deg: float, weight: np.ndarray, adf: np.ndarray) -> float:
        """Correlation of the iCoM phase (-i along / |Q|) at the turn with the ``adf`` image (reflected evenly, as
        the field is), both weighted by ``weight``: > 0 when atoms come out bright in both."""
        phase = -1j * self.along(angle_deg) / self.q * weight
        image = reflected_spectrum(adf, -1)[self.inside] * weight
        norm = math.sqrt(float((self.count * np.abs(phase) ** 2).sum() * (self.count * np.abs(image) ** 2).sum()))
        return float((self.count * (phase * image.conj()).real).sum() / norm) if norm else 0.0


def least_curl(turned: Turned, weight: np.ndarray) -> tuple[float, float]:
    """(angle in [-89, 90] deg or just past, weighted curl there): 1 deg steps, then 0.05 deg around the best."""
    curl = turned.curl(weight)
    angle = min(range(-89, 91), key=curl)
    angle = min(np.arange(angle - 1, angle + 1.0001, 0.05), key=curl)
    return float(angle), curl(angle)


def rotation_search(com: np.ndarray, optics: Optics) -> tuple[dict, np.ndarray, dict]:
    """The least noise-weighted curl (``Turned``) with and without the flip: ({flip: Turned}, the weights,
    {flip: (angle in [-89, 90] deg, relative curl, standard error in deg)}). A first search with every frequency
    of the band weighted alike measures the noise by its least curl; the second weights each frequency by
    signal / (signal + noise)."""
    field = np.nan_to_num(com - np.nanmean(com, axis=(1, 2), keepdims=True))
    turned = Turned.both(field, optics.scan_step_A, 2 * optics.aperture_k)
    noise = min(least_curl(t, np.ones(t.q.shape))[1] / t.count.sum() for t in turned.values())
    weight = turned[False].signal_weights(noise)  # the four spectra are the same with the flip: so are the weights
    found = {}
    for flip, t in turned.items():
        angle, curl = least_curl(t, weight)
        across, along = np.abs(t.across(angle)) ** 2, np.abs(t.along(angle)) ** 2
        total = float((weight * t.count * (across + along)).sum())
        found[flip] = (angle - 180 if angle > 90 else angle, curl / total if total else 1.0,  # the fine search may step past 90
                       turn_error(weight * t.count, weight**2 * t.count, across, along, noise))
    return turned, weight, found


def turn_error(weight: np.ndarray, weight2: np.ndarray, across: np.ndarray, along: np.ndarray, noise: float) -> float:
    """Standard error (deg) of the least weighted curl's angle: near it the curl is sum w |a - t b|^2 (a across Q,
    b along), so t = sum w Re(a conj b) / sum w |b|^2 with a pure noise of power ``noise``; the curvature is
    sum w (|b|^2 - |a|^2) (noise removed). ``weight`` is w and ``weight2`` w^2, each times the frequencies of
    the plane a band frequency stands for. Every frequency of the reflected field appears four times (its
    mirror images), hence the factor 4 on the variance. 180 where the curvature shows no minimum."""
    curvature = float((weight * (along - across)).sum())
    if curvature <= 0:
        return 180.0
    variance = 4 * noise / 2 * float((weight2 * along).sum()) / curvature**2
    return min(math.degrees(math.sqrt(variance)), 180.0)


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
    uncertainties = optics.uncertainties
    if optics.rotation_deg is None or optics.flip is None:
        turned, weight, found = rotation_search(com, optics)
        flip = optics.flip if optics.flip is not None else min(found, key=lambda f: found[f][1])
        angle = optics.rotation_deg if optics.rotation_deg is not None else found[flip][0]
        report |= {"relative_curl": found[flip][1], "relative_curl_other_flip": found[not flip][1]}
        agree = turned[flip].phase_agreement(angle, weight, adf)
        if agree < 0 and optics.rotation_deg is None:  # the 180 deg twin: atoms must come out bright in both
            angle = angle - 180 if angle > 0 else angle + 180
            agree = -agree
        report["icom_adf_correlation"] = agree
        if optics.rotation_deg is None:  # an estimate, with its error, for fit_aberrations to refine
            uncertainties = optics.uncertainties | {"rotation_deg": found[flip][2]}
    else:
        angle, flip = optics.rotation_deg, optics.flip
    return optics.with_(det_sampling_mrad=sampling, bf_center_px=center, rotation_deg=float(angle), flip=bool(flip), uncertainties=uncertainties), report
