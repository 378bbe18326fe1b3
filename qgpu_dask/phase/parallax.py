"""Parallax (tilt-corrected bright field): every bright-field pixel's image moved back by its own shift.

The image of bright-field pixel k is the object shifted by s(k) = -grad chi(k) / (2 pi)
(physics notes). Each pixel's image, normalised by its mean, is put back on a
grid ``upsampling`` times finer than the scan at R - s(k), summed and divided
by the number of samples each fine pixel got; the different sub-step shifts
of the pixels fill in detail beyond the scan's own sampling. The sum carries
the phase with a sin chi transfer, so its spectrum is multiplied by
sign(sin chi_even(q)) exp(-i chi_odd(q)) to give contrast of one sign.
Functions take NumPy or CuPy arrays (``xp``); pixels go in chunks.
"""

from __future__ import annotations

import numpy as np

from .optics import Optics, chi, grad_chi

CHUNK_SAMPLES = 1 << 24


def check_upsampling(upsampling, also: str = "") -> None:
    """ValueError unless ``upsampling`` is an integer from 1 to 8 (``also``: what else the caller takes, for the message)."""
    if not isinstance(upsampling, (int, np.integer)) or isinstance(upsampling, bool) or not 1 <= upsampling <= 8:
        raise ValueError(f"upsampling must be {also}an integer from 1 to 8, got {upsampling!r}")


def parallax(images, scan_shape: tuple[int, int], ky: np.ndarray, kx: np.ndarray, optics: Optics, upsampling: int, xp=np):
    """The contrast-corrected tilt-corrected bright field, float32 (scan_rows * u, scan_cols * u), mean 0."""
    check_upsampling(upsampling)
    rows, cols = scan_shape
    u = int(upsampling)
    fine = optics.scan_step_A / u
    gx, gy = grad_chi(kx, ky, optics)
    shift_rows = xp.asarray(-gy / (2 * np.pi) / fine)  # in fine pixels
    shift_cols = xp.asarray(-gx / (2 * np.pi) / fine)
    grid_rows = xp.arange(rows, dtype=xp.float64)[:, None] * u
    grid_cols = xp.arange(cols, dtype=xp.float64)[None, :] * u
    size = rows * u * cols * u
    sums = xp.zeros(size, xp.float64)
    hits = xp.zeros(size, xp.float64)
    n = images.shape[0]
    step = max(1, CHUNK_SAMPLES // (rows * cols))
    for lo in range(0, n, step):
        chunk = images[lo : lo + step].reshape(-1, rows, cols).astype(xp.float64)
        means = chunk.mean(axis=(1, 2), keepdims=True)
        values = xp.where(means > 0, chunk / xp.where(means > 0, means, 1) - 1, 0)
        at_rows = xp.rint(grid_rows[None] - shift_rows[lo : lo + step, None, None]).astype(xp.int64) % (rows * u)
        at_cols = xp.rint(grid_cols[None] - shift_cols[lo : lo + step, None, None]).astype(xp.int64) % (cols * u)
        where = (at_rows * (cols * u) + at_cols).ravel()
        sums += xp.bincount(where, weights=values.ravel(), minlength=size)
        hits += xp.bincount(where, minlength=size)
    image = (sums / xp.maximum(hits, 1)).reshape(rows * u, cols * u)
    qy = xp.asarray(np.fft.fftfreq(rows * u, fine))[:, None]
    qx = xp.asarray(np.fft.fftfreq(cols * u, fine))[None, :]
    forward, backward = chi(qx, qy, optics, xp), chi(-qx, -qy, optics, xp)
    even, odd = (forward + backward) / 2, (forward - backward) / 2
    corrected = xp.fft.ifft2(xp.fft.fft2(image) * xp.sign(xp.sin(even)) * xp.exp(-1j * odd)).real
    return (corrected - corrected.mean()).astype(xp.float32)
