"""One pass of single-slice ptychography over one frame's scan positions, on the frame's owner.

For a batch of positions with measured amplitudes a = sqrt(I) (the resident's feed), windows O_R of the
frame's object and the probe P: the exit waves psi = P O_R, their far fields Psi = FFT(psi), and the
corrections chi = IFFT(a Psi / |Psi|) - psi that make the far fields' moduli the measured ones (the negative
gradient of sum (|Psi| - a)^2 up to a factor). The object takes, per pixel, the batch's
sum conj(P) chi / (sum |P|^2 + floor); the probe's numerator sum conj(O_R) chi and denominator sum |O_R|^2
are returned, so the probe is updated once per iteration from every frame's sums, added in series order,
whichever shard holds a frame. Complex64 arithmetic, float64 error sums. Each step is a kernel of
``ptycho.cuda`` (twin ``ptycho.cpu``) or an FFT; the object's sums are gathered per pixel in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...device import to_host
from .cpu import Batch
from .geometry import Geometry

FLOOR = 0.1  # of the largest denominator (rPIE's alpha, Maiden, Johnson & Li, Optica 4 (2017) 736): weakly lit pixels move less, noise grows less


@dataclass
class Pass:
    """What one pass over a frame gives the probe update: numerator, denominator (window-shaped) and the
    amplitude error sum (|Psi| - a)^2, all on the host."""

    numerator: np.ndarray
    denominator: np.ndarray
    error: float


def kernels(xp):
    """The batch kernels for ``xp``: ``ptycho.cpu`` (NumPy) or ``ptycho.cuda``."""
    if xp is np:
        from . import cpu

        return cpu
    from . import cuda

    return cuda


def batch_of(geo: Geometry, first: int, n: int) -> Batch:
    """Positions [first, first + n) with the object box their windows cover; ValueError past the geometry's."""
    if first + n > geo.corners.shape[0]:
        raise ValueError(f"the feed gave more than the geometry's {geo.corners.shape[0]} scan positions")
    mine = geo.corners[first : first + n]
    low, high = mine.min(axis=0), mine.max(axis=0)
    return Batch(first, n, (int(low[0]), int(high[0]) + geo.window[0], int(low[1]), int(high[1]) + geo.window[1]))


def frame_pass(obj, probe, blocks, geo: Geometry, step: float, xp) -> Pass:
    """Update ``obj`` (object_shape complex64, on the device) in place from ``blocks`` (the feed's blocks,
    positions in order: counts, whose square roots the projection takes, or float32 amplitudes) with
    ``probe``; the probe's sums for this frame."""
    k = kernels(xp)
    corners = xp.asarray(geo.corners)
    floor = FLOOR * float((probe.real**2 + probe.imag**2).max())
    scale = 1.0 / (geo.window[0] * geo.window[1])
    numerator = xp.zeros(geo.window, xp.complex64)
    denominator = xp.zeros(geo.window, xp.float32)
    errors, start = [], 0
    for measured in blocks:
        batch = batch_of(geo, start, int(measured.shape[0]))
        start += batch.n
        updated, error = k.updated_waves(obj, probe, measured, corners, batch, geo.center, scale, numerator, denominator)
        errors.append(error)
        k.object_update(obj, probe, updated, corners, batch, step, floor)
    if start != geo.corners.shape[0]:
        raise ValueError(f"the feed gave {start} scan positions, the geometry has {geo.corners.shape[0]}")
    return Pass(to_host(numerator), to_host(denominator), float(to_host(xp.stack(errors)).sum()) if errors else 0.0)


def probe_step(probe: np.ndarray, passes: list[Pass], step: float) -> np.ndarray:
    """The probe after one iteration: P + step sum numerators / (sum denominators + floor), frames in series
    order."""
    numerator = np.zeros_like(passes[0].numerator)
    denominator = np.zeros_like(passes[0].denominator)
    for p in passes:
        numerator += p.numerator
        denominator += p.denominator
    return (probe + step * numerator / (denominator + FLOOR * denominator.max())).astype(np.complex64)
