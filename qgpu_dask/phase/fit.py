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
the cost. A calibrated rotation with a standard error above ``WIDE_DEG``
starts with a coarse search over turns and C10. The aperture edges of the
overlaps are ramps one pixel wide, so the signal is smooth in the rotation.
Then one Newton step on all four parameters (``peak``), and their standard
errors by a jackknife over the scan frequencies.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..device import to_host
from . import sideband
from .optics import Optics, chi
from .sideband import Spectrum

FINEST = 1 / 32
Q_SIDE = 32  # the signal is summed on about this many scan frequencies per axis: enough to locate its peak
ROTATION_RANGE_DEG = 20  # searched around the calibrated rotation
WIDE_DEG = 3  # a calibrated rotation with a larger standard error starts a search over +/- 90 deg of it
WIDE_STEP_DEG = 5


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
    """The coherent SSB signal sum_Q |sum_k w G conj(Gamma) / |Gamma|| on a few scan frequencies (w: the part
    of the pixel inside an overlap), as a function of (C10, C12a, C12b), the rest of the optics (rotation
    included) fixed.

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

        pixel = optics.k_per_pixel()

        def inside(bx, by):
            """The part of a detector pixel at (bx, by) inside the aperture: a ramp one pixel wide across its edge."""
            return xp.clip((cutoff / lam - xp.hypot(bx, by)) / pixel + 0.5, 0, 1).astype(xp.float32)

        here, minus, plus = (x, y), (x - qx, y - qy), (x + qx, y + qy)
        self.minus_basis = basis(*here) - basis(*minus)
        self.plus_basis = basis(*plus) - basis(*here)
        self.minus_fixed = (chi(*here, rest, xp) - chi(*minus, rest, xp)).astype(xp.float32)
        self.plus_fixed = (chi(*plus, rest, xp) - chi(*here, rest, xp)).astype(xp.float32)
        self.minus_overlap = inside(*here) * inside(*minus)
        self.plus_overlap = inside(*here) * inside(*plus)
        self.weight = xp.maximum(self.minus_overlap, self.plus_overlap)

    def __call__(self, p: np.ndarray, pixels=slice(None)) -> float:
        return float(self.terms(p, pixels).sum())

    def terms(self, p: np.ndarray, pixels=slice(None)):
        """|sum_k G conj(Gamma) / |Gamma|| per scan frequency (``xp`` array): the signal is their sum."""
        xp = self.xp
        c = [np.float32(v) for v in p]
        minus = c[0] * self.minus_basis[0, pixels] + c[1] * self.minus_basis[1, pixels] + c[2] * self.minus_basis[2, pixels] + self.minus_fixed[pixels]
        plus = c[0] * self.plus_basis[0, pixels] + c[1] * self.plus_basis[1, pixels] + c[2] * self.plus_basis[2, pixels] + self.plus_fixed[pixels]
        gamma = self.minus_overlap[pixels] * xp.exp(np.complex64(1j) * minus) - self.plus_overlap[pixels] * xp.exp(np.complex64(1j) * plus)
        size = xp.abs(gamma)
        kept = size > sideband.GAMMA_FLOOR
        total = xp.where(kept, self.G[pixels] * xp.conj(gamma) * (self.weight[pixels] / xp.where(kept, size, np.float32(1))), np.complex64(0)).sum(axis=0)
        return xp.abs(total)


def paired_frequencies(rows: int, cols: int, stride: int) -> np.ndarray:
    """A label per frequency of the strided half spectrum (rows ``[::stride]`` of the fft2, columns ``[::stride]``
    of the rfft2), shared by Q and -Q where both are in it: the columns q_x = 0 and Nyquist hold each frequency's
    mirror, whose signal term is the same number."""
    ys, xs = np.arange(0, rows, stride), np.arange(0, cols // 2 + 1, stride)
    labels = np.arange(ys.size * xs.size).reshape(ys.size, xs.size)
    for col in np.flatnonzero((xs == 0) | (2 * xs == cols)):
        for row, y in enumerate(ys):
            mirror = np.flatnonzero(ys == (rows - y) % rows)
            if mirror.size:
                labels[row, col] = labels[min(row, int(mirror[0])), col]
    return labels


def peak(terms_at: Callable[[np.ndarray], np.ndarray], centre: np.ndarray, steps: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the maximum, its covariance) of a sum of per-frequency terms near ``centre``.

    Gradient and curvature of each term by central differences of ``terms_at(x)`` with ``steps``; the maximum
    is one Newton step from ``centre`` (at most two steps along any axis): the searches refine one parameter
    group at a time, which stops short of the joint peak where they are correlated (rotation, C10 and C12),
    and stop on bumps of the signal finer than the steps (0.1 deg of rotation on noise-free data).
    The covariance is the jackknife's over the scan frequencies (each left out in turn, its Newton step
    recomputed): their terms are independent samples (Poisson noise is white over the scan, and the object's
    errors differ from one frequency to the next), and leaving one out also counts how few of them hold the
    signal (a crystal's Bragg peaks), which a curvature-only or sandwich error misses. Frequencies of the same
    ``labels`` are one sample. Infinite where the curvature makes no peak without some frequency."""
    n = len(centre)
    unit = np.eye(n, dtype=np.int64)
    seen: dict[tuple, np.ndarray] = {}

    def f(offset: np.ndarray) -> np.ndarray:
        key = tuple(int(v) for v in offset)
        if key not in seen:
            seen[key] = terms_at(centre + offset * steps).ravel()
        return seen[key]

    _, group = np.unique(labels.ravel(), return_inverse=True)
    samples = int(group.max()) + 1

    def grouped(values: np.ndarray) -> np.ndarray:
        return np.bincount(group, values, minlength=samples)

    here = f(0 * unit[0])
    gradients = np.stack([grouped((f(unit[i]) - f(-unit[i])) / (2 * steps[i])) for i in range(n)], axis=1)
    curvatures = np.empty((samples, n, n))  # minus the Hessian of each sample
    for i in range(n):
        curvatures[:, i, i] = -grouped(f(unit[i]) - 2 * here + f(-unit[i])) / steps[i] ** 2
        for j in range(i):
            mixed = f(unit[i] + unit[j]) - f(unit[i] - unit[j]) - f(unit[j] - unit[i]) + f(-unit[i] - unit[j])
            curvatures[:, i, j] = curvatures[:, j, i] = -grouped(mixed) / (4 * steps[i] * steps[j])
    gradient, curvature = gradients.sum(axis=0), curvatures.sum(axis=0)
    left = curvature - curvatures  # each sample left out
    if not (np.all(np.linalg.eigvalsh(curvature) > 0) and np.all(np.linalg.eigvalsh(left) > 0)):
        return centre, np.full((n, n), math.inf)
    step = np.linalg.solve(curvature, gradient)
    moved = np.linalg.solve(left, (gradient - gradients)[..., None])[..., 0]
    spread = moved - moved.mean(axis=0)
    step /= max(1.0, float(np.abs(step / steps).max()) / 2)
    return centre + step, spread.T @ spread * (samples - 1) / samples


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
    start = optics.aberrations.get("C10", 0.0)
    grid = np.arange(start - c10_range_A, start + c10_range_A + q / 2, q)
    if optics.uncertainties.get("rotation_deg", 0.0) > WIDE_DEG:  # too rough to start from: turns and C10 on a few pixels
        few = slice(None, None, 4)
        scores = {}
        for turn in rotation + np.arange(-90, 90, WIDE_STEP_DEG):  # (t + 180, -C) fits as well: calibrate's twin stays
            wide = signal_at(float(turn), few)
            evaluations[0] += len(grid)
            scores |= {(float(turn), float(c)): wide(np.array([c, 0.0, 0.0])) for c in grid}
        rotation = max(scores, key=scores.get)[0]
    signal = signal_at(rotation)
    coarse_score = aberration_score(signal, slice(None, None, 2))
    coarse = [coarse_score(np.array([c, 0.0, 0.0])) for c in grid]
    best, _ = refine(aberration_score(signal, slice(None)), np.array([grid[int(np.argmax(coarse))], 0.0, 0.0]), q / 2)
    turns = rotation + np.arange(-ROTATION_RANGE_DEG, ROTATION_RANGE_DEG + 0.5, 1.0)
    turn_score = rotation_score(best, slice(None, None, 2))
    rotation = float(turns[int(np.argmax([turn_score([t]) for t in turns]))])
    rotation = float(refine(rotation_score(best, slice(None)), np.array([rotation]), 0.5)[0][0])
    signal = signal_at(rotation)
    best, value = refine(aberration_score(signal, slice(None)), best, q / 4)
    steps = np.array([q / 16, q / 16, q / 16, 0.25])  # finite-difference steps: a fraction of the peak's width
    signals = {rotation: signal}

    def terms_at(x: np.ndarray) -> np.ndarray:
        evaluations[0] += 1
        turn = float(x[3])
        if turn not in signals:
            signals[turn] = signal_at(turn)
        return np.asarray(to_host(signals[turn].terms(x[:3])), np.float64)

    top, cov = peak(terms_at, np.array([*best, rotation]), steps, paired_frequencies(rows, cols, stride))
    best, rotation, value = top[:3], float(top[3]), float(terms_at(top).sum())
    c12a, c12b = best[1], best[2]
    c12 = math.hypot(c12a, c12b)
    resolution = q / 4 * FINEST  # no finer than the search resolves
    if c12 > 0:
        c12_var = (c12a**2 * cov[1, 1] + 2 * c12a * c12b * cov[1, 2] + c12b**2 * cov[2, 2]) / c12**2
        phi_var = (c12b**2 * cov[1, 1] - 2 * c12a * c12b * cov[1, 2] + c12a**2 * cov[2, 2]) / (4 * c12**4)
    else:
        c12_var, phi_var = cov[1, 1] + cov[2, 2], math.inf
    error = {name: math.sqrt(v) if math.isfinite(v) else math.inf for name, v in
             (("C10", cov[0, 0]), ("C12", c12_var), ("phi12", phi_var), ("rotation_deg", cov[3, 3]))}
    uncertainties = {"C10": max(error["C10"], resolution), "C12": max(error["C12"], resolution),
                     "phi12": min(error["phi12"], math.pi / 2), "rotation_deg": max(error["rotation_deg"], 0.25 * FINEST)}
    fitted = with_terms(optics, *best).with_(rotation_deg=rotation, uncertainties=uncertainties)
    return {"optics": fitted, "signal": value, "evaluations": evaluations[0]}
