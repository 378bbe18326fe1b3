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
errors by a jackknife over the scan frequencies. The trial points of each
stage go to one fused kernel together (a grid, the finite differences, the two
steps of a coordinate), rotation included, so a fit is a few hundred short
kernel launches rather than thousands of array operations.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..device import to_host
from . import sideband
from .optics import Optics, chi_table
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


def refine(score: Callable[[np.ndarray], np.ndarray], start: np.ndarray, step: float) -> tuple[np.ndarray, float]:
    """Coordinate ascent from ``start``, steps halved from ``step`` to ``step * FINEST``: along each axis in turn
    the step up, else the step down, is taken where it raises the score. ``score`` gives the values of a batch
    of points (rows): the two steps of an axis are evaluated together."""
    best = np.array(start, dtype=np.float64)
    value = float(score(best[None])[0])
    h = step
    while h >= step * FINEST:
        moved = False
        for axis in range(len(best)):
            trials = np.repeat(best[None], 2, axis=0)
            trials[:, axis] += (h, -h)
            for trial, v in zip(trials, score(trials)):
                if v > value:
                    best, value, moved = trial, float(v), True
                    break
        if not moved:
            h /= 2
    return best, value


class Signal:
    """The coherent SSB signal sum_Q |sum_k w G conj(Gamma) / |Gamma|| on a few scan frequencies (w: the part
    of the pixel inside an overlap) as a function of trial rows (C10, C12a, C12b, rotation_deg), the rest of
    the optics fixed, evaluated for a batch of rows at once by one fused kernel (``fit_terms`` of
    ``phase.cpu`` / ``phase.cuda``).

    chi is quadratic in k in these coefficients: chi = pi lambda [C10 (kx^2 + ky^2) + C12a (kx^2 - ky^2)
    + C12b 2 kx ky] + the other terms, so its differences across Q are differenced exactly in the kernel,
    and the rotation turns the pixels' k there: a new rotation costs nothing more than a new defocus.
    """

    def __init__(self, G, qy: np.ndarray, qx: np.ndarray, k0: tuple[np.ndarray, np.ndarray], optics: Optics, xp=np):
        n_pix = G.shape[0]
        self.kernels = sideband.sum_kernels(xp)
        self.Gt = xp.ascontiguousarray(G.reshape(n_pix, -1).T)
        uv = np.stack([np.asarray(k0[0], np.float64), np.asarray(k0[1], np.float64)], axis=1)
        rest = optics.with_(aberrations={k: v for k, v in optics.aberrations.items() if k not in ("C10", "C12", "phi12")})
        self.setup = self.kernels.fit_setup(uv, qy, qx, chi_table(rest))
        self.scale = np.pi * optics.wavelength_A
        self.cutoff, self.pixel = optics.aperture_k, optics.k_per_pixel()

    def terms(self, rows: np.ndarray, step: int = 1):
        """|sum_k G conj(Gamma) / |Gamma|| per scan frequency (``xp`` array (len(rows), n_q)) for each trial row
        (C10, C12a, C12b, rotation_deg), over every ``step``-th bright-field pixel: the signal is their sum."""
        rows = np.asarray(rows, np.float64).reshape(-1, 4)
        turn = np.radians(rows[:, 3])
        params = np.column_stack([rows[:, :3] * self.scale, np.cos(turn), np.sin(turn)])
        return self.kernels.fit_terms(self.Gt, self.setup, params, self.cutoff, self.pixel, sideband.GAMMA_FLOOR, step)

    def __call__(self, rows: np.ndarray, step: int = 1) -> np.ndarray:
        """The signal of each trial row (float64, on the host)."""
        return np.asarray(to_host(self.terms(rows, step).sum(axis=1)), np.float64)


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

    Gradient and curvature of each term by central differences of ``terms_at(points)`` (a row of terms per
    point, all asked at once) with ``steps``; the maximum is one Newton step from ``centre`` (at most two
    steps along any axis): the searches refine one parameter group at a time, which stops short of the joint
    peak where they are correlated (rotation, C10 and C12), and stop on bumps of the signal finer than the
    steps (0.1 deg of rotation on noise-free data).
    The covariance is the jackknife's over the scan frequencies (each left out in turn, its Newton step
    recomputed): their terms are independent samples (Poisson noise is white over the scan, and the object's
    errors differ from one frequency to the next), and leaving one out also counts how few of them hold the
    signal (a crystal's Bragg peaks), which a curvature-only or sandwich error misses. Frequencies of the same
    ``labels`` are one sample. Infinite where the curvature makes no peak without some frequency."""
    n = len(centre)
    unit = np.eye(n, dtype=np.int64)
    offsets = [0 * unit[0]] + [s * unit[i] for i in range(n) for s in (1, -1)]
    offsets += [si * unit[i] + sj * unit[j] for i in range(n) for j in range(i) for si in (1, -1) for sj in (1, -1)]
    values = np.asarray(terms_at(centre + np.array(offsets) * steps))
    seen = {tuple(int(v) for v in offset): row for offset, row in zip(offsets, values)}

    def f(offset: np.ndarray) -> np.ndarray:
        return seen[tuple(int(v) for v in offset)]

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


def fit(spec: Spectrum, k0: tuple[np.ndarray, np.ndarray], optics: Optics, c10_range_A: float, xp=np) -> dict:
    """``optics`` with the rotation_deg and (C10, C12, phi12) that maximise the SSB signal and their standard
    errors (``uncertainties``), the signal there and the trial points it evaluated. ``k0`` is the bright-field
    pixels' (k_y, k_x) at rotation_deg 0 (``sideband.bright_field_pixels``): at rotation t they are turned by t."""
    q = quantum(optics)
    rows, cols = spec.scan_shape
    stride = max(1, math.ceil(max(rows, cols) / Q_SIDE))
    G = spec.G[:, ::stride, ::stride] * np.float32(spec.scale)
    qy = np.fft.fftfreq(rows, optics.scan_step_A)[::stride]
    qx = np.fft.rfftfreq(cols, optics.scan_step_A)[::stride]
    signal = Signal(G, qy, qx, k0, optics, xp)
    evaluations = [0]

    def scores(points: np.ndarray, step: int = 1) -> np.ndarray:
        evaluations[0] += len(points)
        return signal(points, step)

    def at_rotation(rotation: float, step: int = 1):
        """The score of aberration rows (C10, C12a, C12b) at ``rotation``."""
        return lambda p: scores(np.column_stack([p, np.full(len(p), rotation)]), step)

    def with_aberrations(p: np.ndarray, step: int = 1):
        """The score of rotation rows (rotation_deg,) with the aberrations ``p``."""
        return lambda turns: scores(np.column_stack([np.repeat(p[None], len(turns), axis=0), turns]), step)

    rotation = float(optics.rotation_deg)
    start = optics.aberrations.get("C10", 0.0)
    grid = np.arange(start - c10_range_A, start + c10_range_A + q / 2, q)
    if optics.uncertainties.get("rotation_deg", 0.0) > WIDE_DEG:  # too rough to start from: turns and C10 on a few pixels
        turns = rotation + np.arange(-90, 90, WIDE_STEP_DEG)  # (t + 180, -C) fits as well: calibrate's twin stays
        pairs = np.array([(c, 0.0, 0.0, t) for t in turns for c in grid])
        rotation = float(pairs[int(np.argmax(scores(pairs, 4))), 3])
    coarse = at_rotation(rotation, 2)(np.column_stack([grid, np.zeros((len(grid), 2))]))
    best, _ = refine(at_rotation(rotation), np.array([grid[int(np.argmax(coarse))], 0.0, 0.0]), q / 2)
    turns = rotation + np.arange(-ROTATION_RANGE_DEG, ROTATION_RANGE_DEG + 0.5, 1.0)
    rotation = float(turns[int(np.argmax(with_aberrations(best, 2)(turns[:, None])))])
    rotation = float(refine(with_aberrations(best), np.array([rotation]), 0.5)[0][0])
    best, value = refine(at_rotation(rotation), best, q / 4)
    steps = np.array([q / 16, q / 16, q / 16, 0.25])  # finite-difference steps: a fraction of the peak's width

    def terms_at(points: np.ndarray) -> np.ndarray:
        evaluations[0] += len(points)
        return np.asarray(to_host(signal.terms(points)), np.float64)

    top, cov = peak(terms_at, np.array([*best, rotation]), steps, paired_frequencies(rows, cols, stride))
    best, rotation, value = top[:3], float(top[3]), float(terms_at(top[None]).sum())
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
