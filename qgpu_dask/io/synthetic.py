"""Synthetic 4D-STEM acquisitions of a crystal, for demos, tests and benchmarks.

The specimen is a square lattice of atomic columns with a Gaussian projected
potential V (normalised so a column peaks at 1). At each scan position the
probe's electrons land on the detector as

- a bright-field disk, centred on the optic axis and deflected along grad V
  (the momentum transfer that DPC measures), holding the unscattered part of
  the beam: dimmer on a column. Its radial profile tilts with the slope of
  the field, towards its centre on a ring around each column (moderate
  slope), outwards where the field is flat or steepest, balanced over the
  lattice so that the mean pattern stays a uniform disk: annular bright
  field (the disk's outer half) then darkens around each column and differs
  from BF (a uniform disk made ABF a copy of BF, correlation 0.99);
- a dark-field ring around it (diffuse scattering), holding the scattered
  part: brighter on a column, so ADF shows columns bright;
- a weak uniform background.

Counts are drawn electron by electron (a Poisson process: Poisson numbers per
component, positions drawn from its intensity, binned to pixels), which gives
independent Poisson counts per pixel with the disk's edge softened over about
one pixel by the binning, and costs time in proportion to the dose rather
than the detector size. Each run of `STREAM_POSITIONS` scan positions along a
scan row has its own random stream, keyed by (seed, row, run), so a smaller
scan is the top-left corner of a larger one with the same seed (when its
column count is a multiple of `STREAM_POSITIONS`), and memory beyond the
result stays bounded by one run's electrons and pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Fractions of each probe's electrons, at a column's centre (V = 1) and between
# columns (V = 0): the scattered fraction goes from the disk into the ring.
SCATTERED_MIN = 0.05
SCATTERED_MAX = 0.40
BACKGROUND = 0.02
# The tilt of the disk's radial profile towards its centre per unit of the
# slope's offset from its lattice mean (see `_tilt_offsets`), the largest tilt
# either way, and the Newton steps drawing a radius from the tilted profile.
ABF_TILT = 5.0
MAX_TILT = 0.7
NEWTON_STEPS = 5

# Scan positions per random stream, and per vectorised step.
STREAM_POSITIONS = 16


@dataclass(frozen=True)
class CrystalGeometry:
    """Where things land on the detector and where the columns are in the scan.

    Detector lengths are in detector pixels, measured from pixel centres
    (pixel (i, j) is centred on (i, j)); scan lengths are in scan steps.
    Build masks from this to match `crystal`: BF = disk of `bf_radius` around
    `center`, ABF = annulus `abf_inner` .. `bf_radius` (the disk's outer
    half), ADF = annulus `adf_inner` .. `adf_outer`.
    """

    det_shape: tuple[int, int]
    center: tuple[float, float]
    bf_radius: float
    max_shift: float
    ring_radius: float
    ring_width: float
    abf_inner: float
    adf_inner: float
    adf_outer: float
    spacing: float
    column_sigma: float
    column_origin: float

    def column_positions(self, scan_shape: tuple[int, int]) -> np.ndarray:
        """(n, 2) float array of the (row, col) scan coordinates of the columns inside the scan."""
        rows = _column_coords(scan_shape[0], self)
        cols = _column_coords(scan_shape[1], self)
        rr, cc = np.meshgrid(rows, cols, indexing="ij")
        return np.stack([rr.ravel(), cc.ravel()], axis=1)


def crystal_geometry(det_shape: tuple[int, int] = (64, 64), spacing: float = 8.0) -> CrystalGeometry:
    """The detector and lattice geometry `crystal` uses for these shapes.

    The BF disk radius is a seventh of the smaller detector side; the disk
    moves by at most `max_shift` pixels; the dark-field ring peaks at twice
    the disk radius. The suggested ADF annulus starts clear of the moving
    disk and ends inside the detector.
    """
    det = _shape2("det_shape", det_shape)
    if min(det) < 8:
        raise ValueError(f"det_shape {det} too small: need at least 8 x 8 pixels")
    spacing = float(spacing)
    if not np.isfinite(spacing) or spacing < 2.0:
        raise ValueError(f"spacing must be a finite number of scan steps >= 2, got {spacing}")
    half = min(det) / 2.0
    radius = min(det) / 7.0
    max_shift = max(0.75, 0.08 * radius)
    return CrystalGeometry(
        det_shape=det,
        center=((det[0] - 1) / 2.0, (det[1] - 1) / 2.0),
        bf_radius=radius,
        max_shift=max_shift,
        ring_radius=2.0 * radius,
        ring_width=0.35 * radius,
        abf_inner=radius / 2.0,
        adf_inner=radius + max_shift + 1.5,
        adf_outer=half - 0.5,
        spacing=spacing,
        column_sigma=0.15 * spacing,
        column_origin=spacing / 2.0,
    )


def projected_potential(
    scan_shape: tuple[int, int], geometry: CrystalGeometry
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """V and its gradient (dV/drow, dV/dcol) at every scan position, float64 of scan_shape.

    V peaks at 1 on a column and falls to ~0 between columns. The square
    lattice makes V a product of two 1-D periodic Gaussian sums, so it costs
    O(scan rows + scan cols) exponentials, not one per column and position.
    """
    scan = _shape2("scan_shape", scan_shape)
    f_r, d_r = _comb(np.arange(scan[0], dtype=np.float64), geometry)
    f_c, d_c = _comb(np.arange(scan[1], dtype=np.float64), geometry)
    potential = f_r[:, None] * f_c[None, :]
    grad_r = d_r[:, None] * f_c[None, :]
    grad_c = f_r[:, None] * d_c[None, :]
    return potential, grad_r, grad_c


def crystal(
    scan_shape: tuple[int, int] = (64, 64),
    det_shape: tuple[int, int] = (64, 64),
    dtype: str | np.dtype = "uint16",
    spacing: float = 8.0,
    dose: float = 2000.0,
    seed: int = 0,
    rows: tuple[int, int] | None = None,
) -> np.ndarray:
    """A synthetic 4D-STEM acquisition I[scan_row, scan_col, det_row, det_col] of a crystal.

    `dose` is the mean number of electrons per probe position (all of them
    land on a large enough detector). Counts above the dtype's maximum are
    clipped to it, so uint8 works at any dose. Same arguments, same array.
    `rows` = (start, stop) gives only those scan rows of it (the same
    counts), so a large acquisition can be written block by block.
    Time grows with scan positions x dose (about 60 ns per electron).
    """
    scan = _shape2("scan_shape", scan_shape)
    out_dtype = np.dtype(dtype)
    if out_dtype.kind not in "uif":
        raise ValueError(f"dtype must be an integer or float type, got {out_dtype}")
    dose = float(dose)
    if not np.isfinite(dose) or dose < 0:
        raise ValueError(f"dose must be a finite number >= 0, got {dose}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    start, stop = (0, scan[0]) if rows is None else (int(rows[0]), int(rows[1]))
    if not 0 <= start < stop <= scan[0]:
        raise ValueError(f"rows must be (start, stop) with 0 <= start < stop <= {scan[0]} (the scan rows), got {rows!r}")
    geometry = crystal_geometry(det_shape, spacing)
    det = geometry.det_shape
    out = np.empty((stop - start, scan[1]) + det, dtype=out_dtype)
    cap = np.iinfo(out_dtype).max if out_dtype.kind in "ui" else None

    potential, grad_r, grad_c = projected_potential(scan, geometry)
    # Deflection towards the column (the potential attracts electrons),
    # scaled so the steepest slope of an isolated column moves the disk by max_shift.
    steepest = np.exp(-0.5) / geometry.column_sigma
    shift_r = geometry.max_shift * grad_r / steepest
    shift_c = geometry.max_shift * grad_c / steepest
    scattered = SCATTERED_MIN + (SCATTERED_MAX - SCATTERED_MIN) * potential
    bf_mean = dose * (1.0 - BACKGROUND - scattered)
    df_mean = dose * scattered
    slope = np.hypot(shift_r, shift_c) / geometry.max_shift
    a, b = _tilt_offsets(geometry)
    tilt = np.clip(ABF_TILT * (slope - a - b * slope**2), -MAX_TILT, MAX_TILT)

    for row in range(start, stop):
        for run, c0 in enumerate(range(0, scan[1], STREAM_POSITIONS)):
            rng = np.random.default_rng([seed, row, run])
            cols = slice(c0, min(c0 + STREAM_POSITIONS, scan[1]))
            counts = _sample_frames(
                rng, geometry,
                bf_mean[row, cols], df_mean[row, cols], dose * BACKGROUND,
                shift_r[row, cols], shift_c[row, cols], tilt[row, cols],
            )
            if cap is not None:
                np.minimum(counts, cap, out=counts)
            out[row - start, cols] = counts
    return out


def _sample_frames(
    rng: np.random.Generator,
    geometry: CrystalGeometry,
    bf_mean: np.ndarray,
    df_mean: np.ndarray,
    bg_mean: float,
    shift_r: np.ndarray,
    shift_c: np.ndarray,
    tilt: np.ndarray,
) -> np.ndarray:
    """Counts (n, det_r, det_c) int64 for n probe positions, drawn electron by electron."""
    n = bf_mean.shape[0]
    det_r, det_c = geometry.det_shape
    cy, cx = geometry.center
    frame_ids = np.arange(n)

    # Bright-field disk of bf_radius R, centre deflected per position. In u = r^2 / R^2 its density is
    # 1 + t (1 - u) (1 - 3u) on [0, 1] (t = `tilt`): as many electrons as a uniform disk and the same at its
    # edge, more in the centre and fewer in the outer half for t > 0. u is drawn by inverting its
    # distribution v = u + t u (1 - u)^2 with Newton steps (the density stays >= 0.3 for the tilts used).
    n_bf = rng.poisson(bf_mean)
    f_bf = np.repeat(frame_ids, n_bf)
    v = rng.random(f_bf.size)
    t = tilt[f_bf]
    u = v.copy()
    for _ in range(NEWTON_STEPS):
        w = 1.0 - u
        u -= (u + t * u * w * w - v) / (1.0 + t * w * (1.0 - 3.0 * u))
        np.clip(u, 0.0, 1.0, out=u)
    rho = geometry.bf_radius * np.sqrt(u)
    theta = (2.0 * np.pi) * rng.random(f_bf.size)
    y_bf = (cy + shift_r[f_bf]) + rho * np.sin(theta)
    x_bf = (cx + shift_c[f_bf]) + rho * np.cos(theta)

    # Dark-field ring: Gaussian in radius around ring_radius, uniform in angle.
    n_df = rng.poisson(df_mean)
    f_df = np.repeat(frame_ids, n_df)
    rho = geometry.ring_radius + geometry.ring_width * rng.standard_normal(f_df.size)
    theta = (2.0 * np.pi) * rng.random(f_df.size)
    y_df = cy + rho * np.sin(theta)
    x_df = cx + rho * np.cos(theta)

    # Background: uniform over the detector, drawn directly as pixel indices.
    n_bg = rng.poisson(bg_mean, size=n)
    f_bg = np.repeat(frame_ids, n_bg)
    pix_bg = rng.integers(0, det_r * det_c, size=f_bg.size)

    # Bin the continuous positions to pixels; electrons that miss the detector are lost.
    y = np.floor(np.concatenate([y_bf, y_df]) + 0.5).astype(np.int64)
    x = np.floor(np.concatenate([x_bf, x_df]) + 0.5).astype(np.int64)
    frames = np.concatenate([f_bf, f_df])
    hit = (y >= 0) & (y < det_r) & (x >= 0) & (x < det_c)
    flat = np.concatenate([
        (frames[hit] * det_r + y[hit]) * det_c + x[hit],
        f_bg * (det_r * det_c) + pix_bg,
    ])
    counts = np.bincount(flat, minlength=n * det_r * det_c)
    return counts.reshape(n, det_r, det_c)


def _comb(x: np.ndarray, geometry: CrystalGeometry) -> tuple[np.ndarray, np.ndarray]:
    """Periodic sum of unit Gaussians (columns along one axis) at x, and its derivative."""
    a, s, x0 = geometry.spacing, geometry.column_sigma, geometry.column_origin
    # Nearest column for every x, plus enough neighbours to cover 6 sigma.
    nearest = np.round((x - x0) / a)
    reach = int(np.ceil(6.0 * s / a)) + 1
    f = np.zeros_like(x)
    df = np.zeros_like(x)
    for k in range(-reach, reach + 1):
        d = x - (x0 + (nearest + k) * a)
        g = np.exp(-0.5 * (d / s) ** 2)
        f += g
        df += -d / (s * s) * g
    # Normalise by the value on a column of the infinite lattice so V(column) = 1.
    peak = sum(np.exp(-0.5 * (k * a / s) ** 2) for k in range(-reach, reach + 1))
    return f / peak, df / peak


def _tilt_offsets(geometry: CrystalGeometry, periods: int = 16) -> tuple[float, float]:
    """(a, b) such that the tilt s - a - b s^2 of slope s (|grad V| / steepest slope of a column) has mean 0
    and mean 0 times s^2 over scan positions (integer steps) of ``periods`` lattice periods, weighted by the
    disk's electrons there: neither the tilt nor its blur by the deflection (~ s^2) then changes the mean
    pattern. It depends on the geometry only, so a smaller scan stays the corner of a larger one."""
    x = np.arange(int(round(periods * geometry.spacing)), dtype=np.float64)
    f, df = _comb(x, geometry)
    slope = np.hypot(df[:, None] * f[None, :], f[:, None] * df[None, :]) / (np.exp(-0.5) / geometry.column_sigma)
    disk = 1.0 - BACKGROUND - (SCATTERED_MIN + (SCATTERED_MAX - SCATTERED_MIN) * f[:, None] * f[None, :])
    m = [float((disk * slope**k).sum() / disk.sum()) for k in range(5)]
    a, b = np.linalg.solve([[m[0], m[2]], [m[2], m[4]]], [m[1], m[3]])
    return float(a), float(b)


def _column_coords(n: int, geometry: CrystalGeometry) -> np.ndarray:
    """Column coordinates along a scan axis of n steps that fall inside [0, n - 1]."""
    a, x0 = geometry.spacing, geometry.column_origin
    k = np.arange(int(np.floor((n - 1 - x0) / a)) + 1)
    return x0 + k * a


def _shape2(name: str, shape: tuple[int, int]) -> tuple[int, int]:
    """A validated 2-tuple of positive ints."""
    try:
        values = tuple(int(v) for v in shape)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be two positive integers, got {shape!r}") from None
    if len(values) != 2 or min(values) < 1:
        raise ValueError(f"{name} must be two positive integers, got {shape!r}")
    return values  # type: ignore[return-value]
