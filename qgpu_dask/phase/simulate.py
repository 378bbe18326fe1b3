"""A wave-optical 4D-STEM forward model of a thin object, for tests and benchmarks of the phase methods.

The object O(r) = exp((i - absorption) sigma V(r)) (a phase object unless
``absorption`` > 0) lives on a periodic grid ``oversample`` times finer than the scan.
The probe psi(k) = A(k) exp(-i chi(k)) (hard aperture of the optics'
semiangle, the optics' aberrations) is shifted to every scan position R; the
pattern is |FFT[P(r - R) O(r)]|^2, cropped to the detector around the optic
axis, scaled to ``dose`` electrons per position and, with ``seed``, drawn as
Poisson counts. The detector sampling is one reciprocal grid step,
1 / (scan_rows x scan_step) in 1/A.
"""

from __future__ import annotations

import numpy as np

from .optics import Optics, interaction_constant, probe_spectrum


def atoms_potential(shape: tuple[int, int], pixel_A: float, spacing_A: float, sigma_A: float = 0.35, peak_VA: float = 200.0, seed: int = 0) -> np.ndarray:
    """A projected potential (V A) of Gaussian columns on a square lattice, slightly jittered, peaks 0.6-1 x ``peak_VA``."""
    rng = np.random.default_rng(seed)
    rows, cols = np.indices(shape) * pixel_A
    extent = (shape[0] * pixel_A, shape[1] * pixel_A)
    potential = np.zeros(shape)
    for y in np.arange(spacing_A / 2, extent[0], spacing_A):
        for x in np.arange(spacing_A / 2, extent[1], spacing_A):
            cy, cx = y + rng.normal(0, 0.05 * spacing_A), x + rng.normal(0, 0.05 * spacing_A)
            dy = (rows - cy + extent[0] / 2) % extent[0] - extent[0] / 2  # periodic distance
            dx = (cols - cx + extent[1] / 2) % extent[1] - extent[1] / 2
            potential += peak_VA * rng.uniform(0.6, 1.0) * np.exp(-(dy**2 + dx**2) / (2 * sigma_A**2))
    return potential


def acquisition(
    optics: Optics,
    scan_shape: tuple[int, int],
    det_shape: tuple[int, int],
    potential: np.ndarray,
    oversample: int,
    dose: float = 1e4,
    seed: int | None = 0,
    absorption: float = 0.0,
) -> np.ndarray:
    """I[scan_row, scan_col, det_row, det_col]: uint32 Poisson counts (``seed``), or float64 intensities (seed None).

    ``potential`` is (scan_rows * oversample, scan_cols * oversample) in V A on
    a grid of scan_step / oversample; the optic axis falls on detector pixel
    (det_rows // 2, det_cols // 2). ``absorption`` makes the object exp((i - absorption) sigma V): an
    amplitude that falls where the potential is high.
    """
    grid = (scan_shape[0] * oversample, scan_shape[1] * oversample)
    if potential.shape != grid:
        raise ValueError(f"potential has shape {potential.shape}, expected {grid} (scan shape x oversample)")
    pixel = optics.scan_step_A / oversample
    transmission = np.exp((1j - absorption) * interaction_constant(optics.energy_eV) * potential)
    ky = np.fft.fftfreq(grid[0], pixel)[:, None]
    kx = np.fft.fftfreq(grid[1], pixel)[None, :]
    probe = np.fft.ifft2(probe_spectrum(kx, ky, optics))
    probe /= np.sqrt((np.abs(probe) ** 2).sum())
    out = np.empty((*scan_shape, *det_shape))
    rows = (np.arange(det_shape[0]) - det_shape[0] // 2) % grid[0]
    cols = (np.arange(det_shape[1]) - det_shape[1] // 2) % grid[1]
    for i in range(scan_shape[0]):
        for j in range(scan_shape[1]):
            shifted = np.roll(probe, (i * oversample, j * oversample), axis=(0, 1))
            wave = np.fft.fft2(shifted * transmission) / np.sqrt(grid[0] * grid[1])
            out[i, j] = np.abs(wave[np.ix_(rows, cols)]) ** 2
    out *= dose
    if seed is None:
        return out
    return np.random.default_rng(seed).poisson(out).astype(np.uint32)


def band_limited(fine: np.ndarray, over: int) -> np.ndarray:
    """A fine-grid image low-passed to the band of a grid ``over`` times coarser, sampled on it: what a
    phase method can recover at the scan's sampling, to compare its image with."""
    spectrum = np.fft.fft2(fine)
    ky = np.fft.fftfreq(fine.shape[0]) * fine.shape[0]
    kx = np.fft.fftfreq(fine.shape[1]) * fine.shape[1]
    keep = (np.abs(ky)[:, None] < fine.shape[0] / over / 2) & (np.abs(kx)[None, :] < fine.shape[1] / over / 2)
    return np.fft.ifft2(np.where(keep, spectrum, 0)).real[::over, ::over]
