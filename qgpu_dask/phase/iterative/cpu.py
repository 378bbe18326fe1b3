"""One batch of a ptychographic pass in NumPy: the CPU twins of ``qgpu_dask.phase.iterative.cuda`` (kernels/ptycho.cu).

A batch is positions [first, first + n) of a frame whose windows (the probe's shape, R x C) have their top-left
object pixels at ``corners`` (n_positions, 2); ``box`` = (row0, row1, col0, col1) is the part of the object the
batch's windows cover. Complex64 arithmetic; the object's gathered sums are added in float64 (np.bincount)
before they are rounded to float32, where the GPU adds in float32 in position order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Batch:
    """Positions [first, first + n) of a frame; ``box``: the object rows and cols their windows cover."""

    first: int
    n: int
    box: tuple[int, int, int, int]


def window_index(corners: np.ndarray, batch: Batch, shape: tuple[int, int], origin: tuple[int, int], cols: int) -> np.ndarray:
    """(n, R, C) flat indices of the batch's window pixels in an array of ``cols`` columns whose pixel (0, 0) is
    object pixel ``origin``."""
    rows, columns = np.indices(shape)
    mine = corners[batch.first : batch.first + batch.n] - np.asarray(origin)
    return (mine[:, 0, None, None] + rows) * cols + mine[:, 1, None, None] + columns


def windows(obj: np.ndarray, corners: np.ndarray, batch: Batch, shape: tuple[int, int]) -> np.ndarray:
    return obj.reshape(-1)[window_index(corners, batch, shape, (0, 0), obj.shape[1])]


def exit_waves(obj: np.ndarray, probe: np.ndarray, corners: np.ndarray, batch: Batch) -> np.ndarray:
    """psi = P O_R for the batch's positions, (n, R, C) complex64."""
    return probe[None] * windows(obj, corners, batch, probe.shape)


def fft2(psi: np.ndarray) -> np.ndarray:
    return np.fft.fft2(psi)


def ifft2(far: np.ndarray) -> np.ndarray:
    """The inverse FFT without its 1 / (R C) (``project`` applies it)."""
    return np.fft.ifft2(far, norm="forward")


def amplitudes(measured: np.ndarray) -> np.ndarray:
    """float32 amplitudes as they are, or float32 sqrt of unsigned counts."""
    if measured.dtype == np.float32:
        return measured
    if measured.dtype not in (np.uint8, np.uint16, np.uint32):
        raise ValueError(f"measured patterns are float32 amplitudes or uint8/16/32 counts, got {measured.dtype}")
    return np.sqrt(measured, dtype=np.float32)


def project(far: np.ndarray, measured: np.ndarray, center: tuple[int, int], scale: float) -> np.float64:
    """far <- far a / |far| * scale in place (0 where |far| = 0), a the amplitudes of ``measured`` (detector
    pixels, (n, R, C): float32 amplitudes or counts) rolled so that ``center`` is frequency 0; returns
    sum (|far| - a)^2 in float64."""
    a = np.roll(amplitudes(measured), (-center[0], -center[1]), axis=(1, 2))
    modulus = np.sqrt(far.real**2 + far.imag**2)
    error = ((modulus - a) ** 2).sum(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(modulus > 0, a / modulus * np.float32(scale), np.float32(0))
    far *= ratio
    return error


def probe_sums(obj, probe, updated, corners, batch: Batch, numerator, denominator) -> None:
    """numerator += sum_k conj(O_k) (updated_k - P O_k), denominator += sum_k |O_k|^2 over the batch."""
    o = windows(obj, corners, batch, probe.shape)
    numerator += (np.conj(o) * (updated - probe[None] * o)).sum(axis=0)
    denominator += (o.real**2 + o.imag**2).sum(axis=0)


def updated_waves(obj, probe, measured, corners, batch: Batch, center: tuple[int, int], scale: float, numerator, denominator):
    """The batch's far-field step: exit waves, their FFTs projected on the measured amplitudes (``project``,
    with ``scale``), inverse FFTs (unscaled: ``updated``), and the probe's sums added (``probe_sums``);
    returns (updated, error sum)."""
    far = fft2(exit_waves(obj, probe, corners, batch))
    error = project(far, measured, center, scale)
    updated = ifft2(far)
    probe_sums(obj, probe, updated, corners, batch, numerator, denominator)
    return updated, error


def object_update(obj, probe, updated, corners, batch: Batch, step: float, floor: float) -> None:
    """O <- O + step (sum conj(P) updated - O sum |P|^2) / (sum |P|^2 + floor) per pixel of the box, sums over
    the batch's windows holding the pixel (pixels no window holds keep their value)."""
    row0, row1, col0, col1 = batch.box
    box = obj[row0:row1, col0:col1]
    index = window_index(corners, batch, probe.shape, (row0, col0), col1 - col0).ravel()
    size = box.size
    t = np.conj(probe)[None] * updated
    top = (np.bincount(index, t.real.ravel(), size) + 1j * np.bincount(index, t.imag.ravel(), size)).astype(np.complex64)
    lit = np.bincount(index, np.broadcast_to(probe.real**2 + probe.imag**2, updated.shape).ravel(), size).astype(np.float32)
    box += ((top.reshape(box.shape) - box * lit.reshape(box.shape)) * (np.float32(step) / (lit.reshape(box.shape) + np.float32(floor))))
