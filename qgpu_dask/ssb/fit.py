"""Defocus and twofold astigmatism from the data: the aberrations that maximise the coherent SSB signal.

Cross-correlating bright-field images of a crystal can lock onto the wrong
lattice site; the coherent signal S(C) = sum_Q |sum_k G conj(Gamma_C) / |Gamma_C||
does not (physics notes). The search: C10 over +/- ``c10_range_A`` in steps
of the defocus that turns chi at the aperture edge by pi / 2
(lambda / (2 alpha^2)), on every other bright-field pixel, then coordinate
steps on (C10, C12a, C12b) with all of them, halved down to 1/32 of that
quantum. The signal is summed on a strided subset of about 32 x 32 scan
frequencies, which locates its peak as well at a fraction of the cost. Its
uncertainty: the same refinement on two
disjoint halves of the bright-field pixels; half their difference estimates
the standard error of each coefficient.
"""

from __future__ import annotations

import math

import numpy as np

from . import sideband
from .optics import Optics

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


def fit(G, ky: np.ndarray, kx: np.ndarray, optics: Optics, c10_range_A: float, xp=np) -> dict:
    """``optics`` with the (C10, C12, phi12) that maximise the SSB signal and their standard errors
    (``uncertainties``), the signal there and the evaluations it took."""
    q = quantum(optics)
    stride = max(1, min(G.shape[1:]) // Q_SIDE)
    evaluations = [0]

    def score_on(rows):
        def score(p):
            evaluations[0] += 1
            return sideband.signal(G[rows], ky[rows], kx[rows], with_terms(optics, *p), xp, stride)
        return score

    everything = np.arange(len(ky))
    start = optics.aberrations.get("C10", 0.0)
    grid = np.arange(start - c10_range_A, start + c10_range_A + q / 2, q)
    coarse_score = score_on(everything[::2])
    coarse = [coarse_score(np.array([c, 0.0, 0.0])) for c in grid]
    seed = np.array([grid[int(np.argmax(coarse))], 0.0, 0.0])
    best, value = refine(score_on(everything), seed, q / 2)
    halves = [refine(score_on(everything[h::2]), best, q / 4)[0] for h in (0, 1)]
    error = np.abs(halves[0] - halves[1]) / 2
    c12 = math.hypot(best[1], best[2])
    phi_error = math.hypot(error[1], error[2]) / (2 * c12) if c12 > 0 else math.pi / 2
    uncertainties = {"C10": float(error[0]), "C12": float(math.hypot(error[1], error[2])), "phi12": min(phi_error, math.pi / 2)}
    return {"optics": with_terms(optics, *best).with_(uncertainties=uncertainties), "signal": value, "evaluations": evaluations[0]}
