"""Single-sideband (SSB) ptychography from the bright-field pixels of a resident, on its own device.

G(k, Q) = sum_R I(R, k) exp(-2 pi i Q.R) is the scan Fourier transform of
every bright-field pixel's image, I normalised by the mean bright-field
intensity. For a weak phase object G = i Phi(Q) Gamma(k, Q) where
Gamma = conj(psi(k)) psi(k - Q) - psi(k) conj(psi(k + Q)) (Pennycook et al.,
Ultramicroscopy 151 (2015) 160). The aberration-corrected sum
Psi(Q) = sum_k G conj(Gamma) / |Gamma| over |Gamma| > 1e-3, normalised by
sum |Gamma|, gives i Phi(Q); the phase image is Re IFFT(-i Psi), mean 0.

The counts are real, so G(k, -Q) = conj G(k, Q) and Gamma(k, -Q) = -conj Gamma(k, Q):
half of the scan frequencies (an rfft2) carry everything. The sum over pixels
is one fused kernel (``phase.cuda``, twin ``phase.cpu``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..resident.base import Resident
from ..resident.dense import DenseCounts
from .calibration import to_scan
from .optics import Optics, chi, chi_table

GAMMA_FLOOR = 1e-3
CHUNK_BYTES = 1 << 30  # float32 images transformed at once


@dataclass
class Spectrum:
    """G of a resident's bright-field pixels: ``G`` (n_pixels, scan_rows, scan_cols // 2 + 1) complex64 of the
    counts as they are, ``scale`` = 1 / their mean, which normalises it."""

    G: Any
    scale: float
    scan_shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return int(self.G.nbytes)


def sum_kernels(xp):
    """The SSB kernels (sideband sum, the fit's terms) for ``xp``'s arrays: ``phase.cpu`` or ``phase.cuda``."""
    if xp is np:
        from . import cpu

        return cpu
    from . import cuda

    return cuda


def bright_field_pixels(optics: Optics, det_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat detector indices, k_y, k_x in 1/A in scan coordinates) of the pixels inside the bright-field disk:
    new arrays, made once per calibration and detector (a change of aberrations asks again)."""
    optics.require_calibration("ssb")
    made = disk_pixels(optics.semiangle_mrad / optics.det_sampling_mrad, tuple(optics.bf_center_px), optics.rotation_deg, optics.flip,
                       optics.k_per_pixel(), tuple(det_shape))
    return tuple(a.copy() for a in made)


@functools.lru_cache(maxsize=64)
def disk_pixels(radius_px: float, center: tuple[float, float], rotation_deg: float, flip: bool, k_per_pixel: float,
                det_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, cols = np.indices(det_shape, dtype=np.float64)
    offsets = np.stack([rows - center[0], cols - center[1]])
    inside = np.hypot(offsets[0], offsets[1]) <= radius_px
    if inside.sum() < 4:
        raise ValueError(f"the bright-field disk holds {int(inside.sum())} pixels: check det_sampling_mrad and bf_center_px")
    k = to_scan(offsets[:, inside], rotation_deg, flip) * k_per_pixel
    return np.flatnonzero(inside.ravel()), k[0], k[1]


def spectrum(resident: Resident, indices: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> Spectrum:
    """G of the flat detector pixels ``indices``, on the resident's device: on a CPU from dense counts straight
    from the frames, in threads (``phase.cpu.scan_spectrum``), else their images decoded ``chunk_bytes`` at a time
    and transformed (``spectrum_of``)."""
    xp = resident.xp
    rows, cols = resident.scan_shape
    kernels = sum_kernels(xp)
    if xp is np and isinstance(resident, DenseCounts):
        G = kernels.scan_spectrum(resident.flat, indices, (rows, cols))
    else:
        G = xp.empty((len(indices), rows, cols // 2 + 1), xp.complex64)
        step = max(1, chunk_bytes // (4 * rows * cols))
        for lo in range(0, len(indices), step):
            kernels.spectrum_of(resident.pixel_images(indices[lo : lo + step]).reshape(-1, rows, cols), G[lo : lo + step])
    mean = float(G[:, 0, 0].real.sum()) / (G.shape[0] * rows * cols)
    if not mean > 0:
        raise ValueError("the bright-field pixels hold no counts: no phase can be formed")
    return Spectrum(G, 1.0 / mean, (rows, cols))


def frequency_steps(optics: Optics, scan_shape: tuple[int, int]) -> tuple[float, float]:
    """(dq_y, dq_x) in 1/A between neighbouring scan frequencies."""
    return 1.0 / (scan_shape[0] * optics.scan_step_A), 1.0 / (scan_shape[1] * optics.scan_step_A)


def corrected_sum(spec: Spectrum, ky: np.ndarray, kx: np.ndarray, optics: Optics, xp=np):
    """(sum_k G conj(Gamma) / |Gamma|, sum_k |Gamma|) over |Gamma| > GAMMA_FLOOR on the half spectrum, G normalised."""
    total, weight = sum_kernels(xp).sideband_sum(
        spec.G, ky, kx, chi(kx, ky, optics), chi_table(optics), *frequency_steps(optics, spec.scan_shape), optics.aperture_k**2, GAMMA_FLOOR
    )
    return total * spec.scale, weight


def phase(spec: Spectrum, ky: np.ndarray, kx: np.ndarray, optics: Optics, xp=np) -> np.ndarray:
    """The aberration-corrected SSB phase (rad, mean 0, float32 (scan_rows, scan_cols)) from G and the pixels' k."""
    total, weight = corrected_sum(spec, ky, kx, optics, xp)
    psi = xp.where(weight > 0, total / xp.where(weight > 0, weight, 1.0), 0)
    image = xp.fft.irfft2(-1j * psi, s=spec.scan_shape)
    return (image - image.mean()).astype(xp.float32)
