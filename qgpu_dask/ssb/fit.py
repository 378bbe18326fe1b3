"""Defocus and twofold astigmatism from the data: the aberrations that maximise the coherent SSB signal.

Cross-correlating bright-field images of a crystal can lock onto the wrong
lattice site; the coherent signal S(C) = sum_Q |sum_k G conj(Gamma_C) / |Gamma_C||
does not (physics notes). The search: C10 over +/- ``c10_range_A`` in steps
of the defocus that turns chi at the aperture edge by pi / 2
(lambda / (2 alpha^2)), on every other bright-field pixel, then coordinate
steps on (C10, C12a, C12b) with all of them, halved down to 1/32 of that
quantum. Then the detector rotation: the centre-of-mass curl that
``calibrate`` minimises is biased by astigmatism (9 deg on a simulated crystal
with C12 = 10 A, where the signal peaks within 0.1 deg of the truth), so the
rotation is searched within +/- 20 deg in 1 deg steps and refined to 1/32 deg
on the same signal, and the aberrations refined again there. The signal is
summed on a strided subset of about 32 x 16 scan frequencies (half of them:
the other half mirrors it), which locates its peak as well at a fraction of
the cost. The uncertainty: the same refinements on two disjoint halves of
the bright-field pixels; half their difference estimates the standard error
of each coefficient and of the rotation.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from . import sideband
from .optics import Optics, chi
from .sideband import Spectrum

FINEST = 1 / 32
Q_SIDE = 32  # the signal is summed on about this many scan frequencies per axis: enough to locate its peak
ROTATION_RANGE_DEG = 20  # searched around the calibrated rotation


def with_terms(optics: Optics, c10: float, c12a: float, c12b: float) -> Optics:
    """``optics`` with C10 and (C12, phi12) from Cartesian (C12a, C12b)."""
    aberrations = dict(optics.aberrations)
    aberrations["C10"] = c10
    aberrations["C12"] = math.hypot(c12a, c12b)
    aberrations["phi12"] = math.atan2(c12b, c12a) / 2
    return optics.with_(aberrations=aberrations)


def quantum(optics: Optics) -> float:
    """The defocus (A) that changes chi at the aperture edge by pi / 2."""
    alpha = optics.semiangle_mrad * 1e-3
    return optics.wavelength_A / (2 * alpha**2)


def refine(score, start: np.ndarray, step: float) -> tuple[np.ndarray, float]:
    """Coordinate ascent of ``score`` from ``start``, steps halved from ``step`` to ``step * FINEST``."""
    best = np.array(start, dtype=np.float64)
    value = score(best)
    h = step
    while h >= step * FINEST:
        moved = False
        for axis in range(len(best)):
            for sign in (1, -1):
                trial = best.copy()
                trial[axis] += sign * h
                v = score(trial)
                if v > value:
                    best, value, moved = trial, v, True
                    break
        if not moved:
            h /= 2
    return best, value


class Signal:
    """The coherent SSB signal sum_Q |sum_k G conj(Gamma) / |Gamma|| on a few scan frequencies, as a
    function of (C10, C12a, C12b), the rest of the optics (rotation included) fixed.

    chi is linear in the coefficients: chi = pi lambda [C10 (kx^2 + ky^2) + C12a (kx^2 - ky^2)
    + C12b 2 kx ky] + the other terms, so the phase differences chi(k) - chi(k - Q) and
    chi(k + Q) - chi(k) of Gamma are three fixed arrays each, weighted by the coefficients
    (plus a fixed part): an evaluation costs two complex exponentials per (k, Q), not three
    aberration functions.
    """

    def __init__(self, G, qy, qx, ky: np.ndarray, kx: np.ndarray, optics: Optics, xp=np):
        self.G = G
        self.xp = xp
        qy, qx = qy[None, :, None], qx[None, None, :]
        y, x = xp.asarray(ky)[:, None, None], xp.asarray(kx)[:, None, None]
        rest = optics.with_(aberrations={k: v for k, v in optics.aberrations.items() if k not in ("C10", "C12", "phi12")})
        lam, cutoff = optics.wavelength_A, optics.semiangle_mrad * 1e-3

        def basis(bx, by):
            return (xp.stack([bx * bx + by * by, bx * bx - by * by, 2 * bx * by]) * (np.pi * lam)).astype(xp.float32)

        def inside(bx, by):
            return lam * xp.hypot(bx, by) <= cutoff

        here, minus, plus = (x, y), (x - qx, y - qy), (x + qx, y + qy)
        self.minus_basis = basis(*here) - basis(*minus)
        self.plus_basis = basis(*plus) - basis(*here)
        self.minus_fixed = (chi(*here, rest, xp) - chi(*minus, rest, xp)).astype(xp.float32)
        self.plus_fixed = (chi(*plus, rest, xp) - chi(*here, rest, xp)).astype(xp.float32)
        self.minus_overlap = inside(*here) & inside(*minus)
        self.plus_overlap = inside(*here) & inside(*plus)

    def __call__(self, p: np.ndarray, pixels=slice(None)) -> float:
        xp = self.xp
        c = [np.float32(v) for v in p]
        minus = c[0] * self.minus_basis[0, pixels] + c[1] * self.minus_basis[1, pixels] + c[2] * self.minus_basis[2, pixels] + self.minus_fixed[pixels]
        plus = c[0] * self.plus_basis[0, pixels] + c[1] * self.plus_basis[1, pixels] + c[2] * self.plus_basis[2, pixels] + self.plus_fixed[pixels]
        gamma = self.minus_overlap[pixels] * xp.exp(np.complex64(1j) * minus) - self.plus_overlap[pixels] * xp.exp(np.complex64(1j) * plus)
        size = xp.abs(gamma)
        kept = size > sideband.GAMMA_FLOOR
        total = xp.where(kept, self.G[pixels] * xp.conj(gamma) / xp.where(kept, size, np.float32(1)), np.complex64(0)).sum(axis=0)
        return float(xp.abs(total).sum())


def fit(spec: Spectrum, k_at: Callable[[float], tuple[np.ndarray, np.ndarray]], optics: Optics, c10_range_A: float, xp=np) -> dict:
    """``optics`` with the rotation_deg and (C10, C12, phi12) that maximise the SSB signal and their standard
    errors (``uncertainties``), the signal there and the evaluations it took. ``k_at(rotation_deg)`` gives
    the bright-field pixels' (k_y, k_x) under that rotation."""
    q = quantum(optics)
    rows, cols = spec.scan_shape
    stride = max(1, math.ceil(max(rows, cols) / Q_SIDE))
    G = spec.G[:, ::stride, ::stride] * np.float32(spec.scale)
    qy = xp.asarray(np.fft.fftfreq(rows, optics.scan_step_A)[::stride])
    qx = xp.asarray(np.fft.rfftfreq(cols, optics.scan_step_A)[::stride])
    evaluations = [0]

    def signal_at(rotation: float, pixels=slice(None)) -> Signal:
        ky, kx = k_at(rotation)
        return Signal(G[pixels], qy, qx, ky[pixels], kx[pixels], optics.with_(rotation_deg=rotation), xp)

    def aberration_score(signal: Signal, pixels):
        def score(p):
            evaluations[0] += 1
            return signal(p, pixels)
        return score

    def rotation_score(terms: np.ndarray, pixels):
        def score(p):
            evaluations[0] += 1
            return signal_at(float(p[0]), pixels)(terms)
        return score

    rotation = float(optics.rotation_deg)
    signal = signal_at(rotation)
    start = optics.aberrations.get("C10", 0.0)
    grid = np.arange(start - c10_range_A, start + c10_range_A + q / 2, q)
    coarse_score = aberration_score(signal, slice(None, None, 2))
    coarse = [coarse_score(np.array([c, 0.0, 0.0])) for c in grid]
    best, _ = refine(aberration_score(signal, slice(None)), np.array([grid[int(np.argmax(coarse))], 0.0, 0.0]), q / 2)
    turns = rotation + np.arange(-ROTATION_RANGE_DEG, ROTATION_RANGE_DEG + 0.5, 1.0)
    turn_score = rotation_score(best, slice(None, None, 2))
    rotation = float(turns[int(np.argmax([turn_score([t]) for t in turns]))])
    rotation = float(refine(rotation_score(best, slice(None)), np.array([rotation]), 0.5)[0][0])
    signal = signal_at(rotation)
    best, value = refine(aberration_score(signal, slice(None)), best, q / 4)
    halves = [refine(aberration_score(signal, slice(h, None, 2)), best, q / 4)[0] for h in (0, 1)]
    turned = [refine(rotation_score(best, slice(h, None, 2)), np.array([rotation]), 0.25)[0][0] for h in (0, 1)]
    error = np.maximum(np.abs(halves[0] - halves[1]) / 2, q / 4 * FINEST)  # no finer than the search resolves
    c12 = math.hypot(best[1], best[2])
    phi_error = math.hypot(error[1], error[2]) / (2 * c12) if c12 > 0 else math.pi / 2
    uncertainties = {"C10": float(error[0]), "C12": float(math.hypot(error[1], error[2])), "phi12": min(phi_error, math.pi / 2),
                     "rotation_deg": float(max(abs(turned[0] - turned[1]) / 2, 0.25 * FINEST))}
    fitted = with_terms(optics, *best).with_(rotation_deg=rotation, uncertainties=uncertainties)
    return {"optics": fitted, "signal": value, "evaluations": evaluations[0]}
