"""Single-sideband (SSB) ptychography from the bright-field pixels of a resident, on its own device.

G(k, Q) = sum_R I(R, k) exp(-2 pi i Q.R) is the scan Fourier transform of
every bright-field pixel's image, with I normalised by the mean bright-field
intensity. For a weak phase object G = i Phi(Q) Gamma(k, Q) where
Gamma = conj(psi(k)) psi(k - Q) - psi(k) conj(psi(k + Q)) (Pennycook et al.,
Ultramicroscopy 151 (2015) 160). The aberration-corrected sum
Psi(Q) = sum_k G conj(Gamma) / |Gamma| over |Gamma| > 1e-3, normalised by
sum |Gamma|, gives i Phi(Q); the phase image is Re IFFT(-i Psi), mean 0.

The functions take NumPy or CuPy arrays (``xp``), so one code serves the CPU
and the GPU; the sums over bright-field pixels go in chunks to bound memory.
"""

from __future__ import annotations

import numpy as np

from .calibration import to_scan
from .optics import Optics, probe_spectrum

GAMMA_FLOOR = 1e-3
CHUNK_BYTES = 256 * 2**20  # complex temporaries per chunk of bright-field pixels


def bright_field_pixels(optics: Optics, det_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat detector indices, k_y, k_x in 1/A in scan coordinates) of the pixels inside the bright-field disk."""
    optics.require_calibration("ssb")
    rows, cols = np.indices(det_shape, dtype=np.float64)
    offsets = np.stack([rows - optics.bf_center_px[0], cols - optics.bf_center_px[1]])
    radius_px = optics.semiangle_mrad / optics.det_sampling_mrad
    inside = np.hypot(offsets[0], offsets[1]) <= radius_px
    if inside.sum() < 4:
        raise ValueError(f"the bright-field disk holds {int(inside.sum())} pixels: check det_sampling_mrad and bf_center_px")
    k = to_scan(offsets[:, inside], optics.rotation_deg, optics.flip) * optics.k_per_pixel()
    return np.flatnonzero(inside.ravel()), k[0], k[1]


def spectrum(images, scan_shape: tuple[int, int], xp=np):
    """G: the scan FFT (complex64, (n_pixels, scan_rows, scan_cols)) of bright-field pixel images
    (n_pixels, n_frames), normalised by their mean intensity."""
    stack = images.reshape(images.shape[0], *scan_shape).astype(xp.float32)
    mean = float(stack.mean())
    if not mean > 0:
        raise ValueError("the bright-field pixels hold no counts: no phase can be formed")
    return xp.fft.fft2(stack / mean, axes=(1, 2)).astype(xp.complex64)


def projected(G, gamma, xp=np):
    """(sum over pixels (axis 0) of G conj(Gamma) / |Gamma| where |Gamma| > GAMMA_FLOOR, and |Gamma| there, 0 elsewhere)."""
    size = xp.abs(gamma)
    kept = xp.where(size > GAMMA_FLOOR, size, 0)
    return xp.where(kept > 0, G * xp.conj(gamma) / xp.where(kept > 0, kept, 1.0), 0).sum(axis=0), kept


def corrected_sum(G, ky, kx, optics: Optics, xp=np):
    """(sum_k G conj(Gamma) / |Gamma|, sum_k |Gamma|) over |Gamma| > GAMMA_FLOOR, each (scan_rows, scan_cols)."""
    n, rows, cols = G.shape
    qy = xp.asarray(np.fft.fftfreq(rows, optics.scan_step_A))[:, None]
    qx = xp.asarray(np.fft.fftfreq(cols, optics.scan_step_A))[None, :]
    ky, kx = xp.asarray(ky), xp.asarray(kx)
    total = xp.zeros((rows, cols), xp.complex128)
    weight = xp.zeros((rows, cols), xp.float64)
    step = max(1, CHUNK_BYTES // (16 * rows * cols))
    for lo in range(0, n, step):
        y, x = ky[lo : lo + step, None, None], kx[lo : lo + step, None, None]
        here = probe_spectrum(x, y, optics, xp)
        gamma = xp.conj(here) * probe_spectrum(x - qx, y - qy, optics, xp) - here * xp.conj(probe_spectrum(x + qx, y + qy, optics, xp))
        part, kept = projected(G[lo : lo + step], gamma, xp)
        total += part
        weight += kept.sum(axis=0)
    return total, weight


def phase(G, ky: np.ndarray, kx: np.ndarray, optics: Optics, xp=np) -> np.ndarray:
    """The aberration-corrected SSB phase (rad, mean 0, float32 (scan_rows, scan_cols)) from G and the pixels' k."""
    total, weight = corrected_sum(G, ky, kx, optics, xp)
    psi = xp.where(weight > 0, total / xp.where(weight > 0, weight, 1.0), 0)
    image = xp.fft.ifft2(-1j * psi).real
    return (image - image.mean()).astype(xp.float32)
