"""Defocus and twofold astigmatism from the data: the aberrations that maximise the coherent SSB signal.

Cross-correlating bright-field images of a crystal can lock onto the wrong
lattice site; the coherent signal S(C) = sum_Q |sum_k G conj(Gamma_C) / |Gamma_C||
does not (physics notes). The search: C10 over +/- ``c10_range_A`` in steps
of the defocus that turns chi at the aperture edge by pi / 2
(lambda / (2 alpha^2)), on every other bright-field pixel, then coordinate
steps on (C10, C12a, C12b) with all of them, halved down to 1/32 of that
quantum. The signal is summed on a strided subset of about 32 x 16 scan
frequencies (half of them: the other half mirrors it), which locates its peak as well at a fraction of the cost. Its
uncertainty: the same refinement on two
disjoint halves of the bright-field pixels; half their difference estimates
the standard error of each coefficient.
"""

from __future__ import annotations

import math

import numpy as np

from . import sideband
from .sideband import Spectrum
from .optics import Optics, chi

FINEST = 1 / 32
Q_SIDE = 32  # the signal is summed on about this many scan frequencies per axis: enough to locate its peak


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
    """The coherent SSB signal sum_Q |sum_k G conj(Gamma) / |Gamma||, on every ``stride``-th scan
    frequency, as a function of (C10, C12a, C12b), the rest of the optics fixed.

    chi is linear in the coefficients: chi = pi lambda [C10 (kx^2 + ky^2) + C12a (kx^2 - ky^2)
    + C12b 2 kx ky] + the other terms, so the phase differences chi(k) - chi(k - Q) and
    chi(k + Q) - chi(k) of Gamma are three fixed arrays each, weighted by the coefficients
    (plus a fixed part): an evaluation costs two complex exponentials per (k, Q), not three
    aberration functions.
    """

    def __init__(self, spec: Spectrum, ky: np.ndarray, kx: np.ndarray, optics: Optics, stride: int, xp=np):
        rows, cols = spec.scan_shape
        self.G = spec.G[:, ::stride, ::stride] * np.float32(spec.scale)
        self.xp = xp
        qy = xp.asarray(np.fft.fftfreq(rows, optics.scan_step_A)[::stride])[None, :, None]
        qx = xp.asarray(np.fft.rfftfreq(cols, optics.scan_step_A)[::stride])[None, None, :]
        y, x = xp.asarray(ky)[:, None, None], xp.asarray(kx)[:, None, None]
        rest = optics.with_(aberrations={k: v for k, v in optics.aberrations.items() if k not in ("C10", "C12", "phi12")})
        lam, cutoff = optics.wavelength_A, optics.semiangle_mrad * 1e-3

        def basis(bx, by):
            return xp.stack([bx * bx + by * by, bx * bx - by * by, 2 * bx * by]) * (np.pi * lam)

        def inside(bx, by):
            return lam * xp.hypot(bx, by) <= cutoff

        here, minus, plus = (x, y), (x - qx, y - qy), (x + qx, y + qy)
        self.minus_basis = basis(*here) - basis(*minus)
        self.plus_basis = basis(*plus) - basis(*here)
        self.minus_fixed = chi(*here, rest, xp) - chi(*minus, rest, xp)
        self.plus_fixed = chi(*plus, rest, xp) - chi(*here, rest, xp)
        self.minus_overlap = inside(*here) & inside(*minus)
        self.plus_overlap = inside(*here) & inside(*plus)

    def __call__(self, p: np.ndarray, pixels=slice(None)) -> float:
        xp = self.xp
        c = [float(v) for v in p]
        minus = c[0] * self.minus_basis[0, pixels] + c[1] * self.minus_basis[1, pixels] + c[2] * self.minus_basis[2, pixels] + self.minus_fixed[pixels]
        plus = c[0] * self.plus_basis[0, pixels] + c[1] * self.plus_basis[1, pixels] + c[2] * self.plus_basis[2, pixels] + self.plus_fixed[pixels]
        gamma = self.minus_overlap[pixels] * xp.exp(1j * minus) - self.plus_overlap[pixels] * xp.exp(1j * plus)
        size = xp.abs(gamma)
        kept = size > sideband.GAMMA_FLOOR
        total = xp.where(kept, self.G[pixels] * xp.conj(gamma) / xp.where(kept, size, 1.0), 0).sum(axis=0)
        return float(xp.abs(total).sum())


def fit(spec: Spectrum, ky: np.ndarray, kx: np.ndarray, optics: Optics, c10_range_A: float, xp=np) -> dict:
    """``optics`` with the (C10, C12, phi12) that maximise the SSB signal and their standard errors
    (``uncertainties``), the signal there and the evaluations it took."""
    q = quantum(optics)
    signal = Signal(spec, ky, kx, optics, max(1, min(spec.scan_shape) // Q_SIDE), xp)
    evaluations = [0]

    def score_on(pixels):
        def score(p):
            evaluations[0] += 1
            return signal(p, pixels)
        return score

    start = optics.aberrations.get("C10", 0.0)
    grid = np.arange(start - c10_range_A, start + c10_range_A + q / 2, q)
    coarse_score = score_on(slice(None, None, 2))
    coarse = [coarse_score(np.array([c, 0.0, 0.0])) for c in grid]
    seed = np.array([grid[int(np.argmax(coarse))], 0.0, 0.0])
    best, value = refine(score_on(slice(None)), seed, q / 2)
    halves = [refine(score_on(slice(h, None, 2)), best, q / 4)[0] for h in (0, 1)]
    error = np.abs(halves[0] - halves[1]) / 2
    c12 = math.hypot(best[1], best[2])
    phi_error = math.hypot(error[1], error[2]) / (2 * c12) if c12 > 0 else math.pi / 2
    uncertainties = {"C10": float(error[0]), "C12": float(math.hypot(error[1], error[2])), "phi12": min(phi_error, math.pi / 2)}
    return {"optics": with_terms(optics, *best).with_(uncertainties=uncertainties), "signal": value, "evaluations": evaluations[0]}
