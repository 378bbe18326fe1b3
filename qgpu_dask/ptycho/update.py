"""One pass of single-slice ptychography over one frame's scan positions, on the frame's owner.

For a batch of positions with measured amplitudes a = sqrt(I) (the resident's feed), windows O_R of the
frame's object and the probe P: the exit waves psi = P O_R, their far fields Psi = FFT(psi), and the
corrections chi = IFFT(a Psi / |Psi|) - psi that make the far fields' moduli the measured ones (the negative
gradient of sum (|Psi| - a)^2 up to a factor). The object takes, per pixel, the batch's
sum conj(P) chi / (sum |P|^2 + floor) (the denominator made once per layout of a batch's windows: the rows
of a regular scan share it); the probe's numerator sum conj(O_R) chi and denominator sum |O_R|^2 are
returned, so the probe is updated once per iteration from every frame's sums, added in series order,
whichever shard holds a frame. Complex64 arithmetic, float64 error sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..device import to_host
from .geometry import Geometry, window_offsets

FLOOR = 0.1  # of the largest denominator (rPIE's alpha, Maiden, Johnson & Li, Optica 4 (2017) 736): weakly lit pixels move less, noise grows less


@dataclass
class Pass:
    """What one pass over a frame gives the probe update: numerator, denominator (window-shaped) and the
    amplitude error sum (|Psi| - a)^2, all on the host."""

    numerator: np.ndarray
    denominator: np.ndarray
    error: float


def scatter_add(target, index, values, xp) -> None:
    """target.flat[index] += values, repeats added (complex as its float pairs): np.add.at, or CuPy's atomic
    cupyx.scatter_add (which adds repeats in any order)."""
    if xp is np:
        add = np.add.at
    else:
        import cupyx

        add = cupyx.scatter_add
    index = index.ravel()
    if xp.iscomplexobj(target):
        pairs = target.view(np.float32 if target.dtype == np.complex64 else np.float64)
        add(pairs, 2 * index, xp.ascontiguousarray(values.real).ravel())
        add(pairs, 2 * index + 1, xp.ascontiguousarray(values.imag).ravel())
    else:
        add(target, index, xp.ascontiguousarray(values).ravel())


def frame_pass(obj, probe, blocks, geo: Geometry, step: float, xp) -> Pass:
    """Update ``obj`` (object_shape complex64, on the device) in place from ``blocks`` (the feed's
    amplitude blocks, positions in order) with ``probe``; the probe's sums for this frame."""
    offsets = window_offsets(geo)
    corners = geo.corners[:, 0] * geo.object_shape[1] + geo.corners[:, 1]
    device_offsets = xp.asarray(offsets)
    flat = obj.reshape(-1)
    weight = (probe.real**2 + probe.imag**2).astype(xp.float32)
    floor = FLOOR * float(weight.max())
    numerator = xp.zeros(geo.window, xp.complex64)
    denominator = xp.zeros(geo.window, xp.float32)
    error = xp.zeros((), xp.float64)
    lit = {}  # 1 / (sum |P|^2 over a batch's windows + floor), by the windows' layout: a regular scan repeats it
    start = 0
    for amplitude in blocks:
        n = amplitude.shape[0]
        mine = corners[start : start + n]
        start += n
        lo, hi = int(mine.min()), int(mine.max()) + int(offsets[-1, -1]) + 1  # the band of the object these windows touch
        band = flat[lo:hi]
        index = xp.asarray(mine - lo)[:, None, None] + device_offsets[None]
        amplitude = xp.roll(amplitude, (-geo.center[0], -geo.center[1]), axis=(1, 2))
        windows = band[index]
        psi = probe[None] * windows
        far = xp.fft.fft2(psi)
        modulus = xp.abs(far)
        error += ((modulus - amplitude) ** 2).sum(dtype=xp.float64)
        ratio = xp.where(modulus > 0, amplitude / xp.maximum(modulus, 1e-30), 0).astype(xp.float32)
        chi = (xp.fft.ifft2(far * ratio) - psi).astype(xp.complex64)
        numerator += (xp.conj(windows) * chi).sum(axis=0)
        denominator += (windows.real**2 + windows.imag**2).sum(axis=0)
        layout = (mine - lo).tobytes()
        if layout not in lit:
            bottom = xp.zeros(band.shape, xp.float32)
            scatter_add(bottom, index, xp.broadcast_to(weight, chi.shape), xp)
            lit = {layout: step / (bottom + floor)}  # keep only the latest: consecutive batches share it
        top = xp.zeros(band.shape, xp.complex64)
        scatter_add(top, index, xp.conj(probe)[None] * chi, xp)
        band += top * lit[layout]
    if start != geo.corners.shape[0]:
        raise ValueError(f"the feed gave {start} scan positions, the geometry has {geo.corners.shape[0]}")
    return Pass(to_host(numerator), to_host(denominator), float(error))


def probe_step(probe: np.ndarray, passes: list[Pass], step: float) -> np.ndarray:
    """The probe after one iteration: P + step sum numerators / (sum denominators + floor), frames in series
    order."""
    numerator = np.zeros_like(passes[0].numerator)
    denominator = np.zeros_like(passes[0].denominator)
    for p in passes:
        numerator += p.numerator
        denominator += p.denominator
    return (probe + step * numerator / (denominator + FLOOR * denominator.max())).astype(np.complex64)
