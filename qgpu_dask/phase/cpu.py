"""The SSB kernels on the CPU (Numba, and NumPy's FFTs in threads), twins of kernels/ssb.cu: the scan spectrum
of images (``spectrum_of``), the sideband sum and the aberration fit's signal (``fit_terms``), contracts in their
docstrings; the scan spectrum of dense counts in threads (``scan_spectrum``); chi along a line of frequencies as
phases for running products (``line_phases``), which direct ptychography's twins (``phase.direct_cpu``) share.

Contract of ``sideband_sum(G, ky, kx, chi_k, table, dqy, dqx, kmax2, floor)``, shared with
``qgpu_dask.phase.cuda``: it takes G (n_pix, rows, half_cols) complex64 (the rfft2 over the scan of each
bright-field pixel's image), the pixels' k_y, k_x (1/A, scan axes) and chi there, the aberration table of
``optics.chi_table``, the scan frequency steps, the squared aperture radius (1/A^2) and the |Gamma| floor,
and returns (sum_k G conj(Gamma) / |Gamma| complex128, sum_k |Gamma| float64), each (rows, half_cols),
over the pixels and frequencies where |Gamma| > floor. Here every step is float64 (Gamma's phase factors
advanced along each row of frequencies by running products, for PIXEL_BLOCK pixels at once in vector lanes:
sums within 1e-12 of chi evaluated at each frequency where chi is tens of rad, 1e-9 where it reaches thousands);
the CUDA twins evaluate chi and Gamma in float32 at each frequency and sum in float64.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from .optics import monomials

SPECTRUM_BYTES = 1 << 28  # float32 images a thread gathers and transforms at once
PIXEL_BLOCK = 128  # bright-field pixels whose phase factors advance together (vector lanes) along a line of frequencies


def in_threads(n: int, per_item: int, work) -> None:
    """work(lo, hi) over [0, n) in slices of at most SPECTRUM_BYTES / per_item items, one thread per CPU twin's
    thread (NumPy's FFTs let go of the GIL)."""
    threads = numba.get_num_threads()
    step = max(1, min(-(-n // threads), SPECTRUM_BYTES // per_item))
    with ThreadPoolExecutor(threads, thread_name_prefix="spectrum") as pool:
        list(pool.map(lambda lo: work(lo, min(n, lo + step)), range(0, n, step)))


def spectrum_of(images: np.ndarray, out: np.ndarray) -> None:
    """out[i] = rfft2(images[i]) for (n, rows, cols) images (out complex64 (n, rows, cols // 2 + 1)), slices in
    threads: the twin of ``phase.cuda.spectrum_of``."""
    n, rows, cols = images.shape

    def work(lo: int, hi: int) -> None:
        out[lo:hi] = np.fft.rfft2(images[lo:hi])

    in_threads(n, 4 * rows * cols, work)


def scan_spectrum(counts: np.ndarray, pixels: np.ndarray, scan_shape: tuple[int, int]) -> np.ndarray:
    """G (n_pixels, rows, cols // 2 + 1) complex64, the rfft2 over the scan of the images of the flat detector
    ``pixels`` of dense ``counts`` (n_frames, frame_len): each thread gathers a slice of the images and transforms
    it (a GPU's images are gathered and transformed apart)."""
    rows, cols = scan_shape
    pixels = np.asarray(pixels, np.int64)
    G = np.empty((pixels.size, rows, cols // 2 + 1), np.complex64)

    def work(lo: int, hi: int) -> None:
        G[lo:hi] = np.fft.rfft2(counts[:, pixels[lo:hi]].T.astype(np.float32).reshape(-1, rows, cols))

    in_threads(pixels.size, 4 * rows * cols, work)
    return G


@numba.njit(cache=True, inline="always")
def chi_of(x, y, poly):
    """chi at k = (x, y) from its monomials (``optics.monomials``: chi = sum poly[b, a] x^a y^b), Horner in x
    within each power of y, then in y: 27 multiply-adds at degree 6, a fifth of the polar table's work."""
    n = poly.shape[0]
    total = 0.0
    for b in range(n - 1, -1, -1):
        row = 0.0
        for a in range(n - 1 - b, -1, -1):
            row = row * x + poly[b, a]
        total = total * y + row
    return total


def surjections(degree: int) -> np.ndarray:
    """S[i, j] = j! S2(i, j) (onto maps of i things to j): the j-th forward difference at 0 of c^i, so that a
    polynomial sum_i b_i c^i has differences sum_i b_i S[i, j], summed without cancelling large values."""
    table = np.zeros((degree + 1, degree + 1), np.float64)
    table[0, 0] = 1.0
    for i in range(1, degree + 1):
        for j in range(1, i + 1):
            table[i, j] = j * (table[i - 1, j - 1] + table[i - 1, j])
    return table


@numba.njit(cache=True, inline="always")
def line_phases(poly, binomial, onto, y_of, x_of, here_of, dy, dx, step, sign, scratch, out):
    """out[j, b] = D^j a_b(0) for a_b(c) = sign (chi(x_of[b] + dx + c step, y_of[b] + dy) - here_of[b]) over a
    block of pixels, chi = sum poly[i, a] x^a y^i: the phases whose factors exp(i D^j a(0)) give exp(i a(c)) at
    c = 0, 1, ... by running products (a(c) a polynomial of the poly's degree in c). Taylor coefficients of chi
    along the line, then differences from them: no difference of large chi values is formed, so a row of
    1000-rad phases keeps float64's precision. Each step runs over the block (vector lanes); ``scratch`` is
    (2, n, block)."""
    n = poly.shape[0]
    r, coefficient = scratch[0], scratch[1]
    for a in range(n):  # r_a = sum_i poly[i, a] y^i: chi on the line as sum_a r_a (x + s)^a
        r_a = r[a]
        r_a[:] = 0.0
        for i in range(n - 1 - a, -1, -1):
            p = poly[i, a]
            for b in range(PIXEL_BLOCK):
                r_a[b] = r_a[b] * (y_of[b] + dy) + p
    scale = 1.0
    for i in range(n):  # coefficient of c^i: step^i sum_a r_a binom(a, i) x^(a - i)
        e = coefficient[i]
        e[:] = 0.0
        for a in range(n - 1, i - 1, -1):
            r_a, binom = r[a], binomial[a, i]
            for b in range(PIXEL_BLOCK):
                e[b] = e[b] * (x_of[b] + dx) + r_a[b] * binom
        for b in range(PIXEL_BLOCK):
            e[b] = e[b] * scale
        scale *= step
    for j in range(n - 1, -1, -1):
        d = out[j]
        if j == 0:
            for b in range(PIXEL_BLOCK):
                d[b] = -here_of[b]
        else:
            d[:] = 0.0
        for i in range(j, n):
            e, o = coefficient[i], onto[i, j]
            for b in range(PIXEL_BLOCK):
                d[b] = d[b] + e[b] * o
        for b in range(PIXEL_BLOCK):
            d[b] = d[b] * sign


@numba.njit(cache=True, inline="always")
def sin_cos(v):
    """(sin v, cos v) in float64 to 1 ulp for |v| < 2^20 pi, without branches so that loops of it run in vector
    lanes (libm's are calls, one value at a time): v reduced by pi / 2 in three parts (Cody and Waite), fdlibm's
    minimax polynomials on [-pi / 4, pi / 4], the quadrant chosen arithmetically."""
    n = np.floor(v * 0.63661977236758134308 + 0.5)
    r = ((v - n * 1.57079632673412561417e+00) - n * 6.07710050630396597660e-11) - n * 2.02226624871116645580e-21
    z = r * r
    s = r + r * z * (-1.66666666666666324348e-01 + z * (8.33333333332248946124e-03 + z * (-1.98412698298579493134e-04 + z * (
        2.75573137070700676789e-06 + z * (-2.50507602534068634195e-08 + z * 1.58969099521155010221e-10)))))
    c = 1.0 - 0.5 * z + z * z * (4.16666666666666019037e-02 + z * (-1.38888888888741095749e-03 + z * (2.48015872894767294178e-05 + z * (
        -2.75573143513906633035e-07 + z * (2.08757232129817482790e-09 + z * -1.13596475577881948265e-11)))))
    half = np.floor(n * 0.5)
    odd = n - 2.0 * half  # quadrant n mod 4: odd swaps sin and cos, 2 and 3 negate sin, 1 and 2 negate cos
    sin_sign = 1.0 - 2.0 * (half - 2.0 * np.floor(half * 0.5))
    next_half = np.floor((n + 1.0) * 0.5)
    cos_sign = 1.0 - 2.0 * (next_half - 2.0 * np.floor(next_half * 0.5))
    return (s + (c - s) * odd) * sin_sign, (c + (s - c) * odd) * cos_sign


@numba.njit(cache=True)
def start_lines(poly, binomial, onto, y_of, x_of, here_of, qy, qx, dqx, scratch, phases, state) -> None:
    """The phase factors of an alias line at q = (qy, qx) (side 0: Gamma_plus, 1: Gamma_minus) and their
    differences along it for a block of pixels (k_y, k_x, chi(k): ``y_of``, ``x_of``, ``here_of``), into
    ``state`` (side, difference, real / imaginary, pixel): the phases and their sines and cosines in vector lanes
    (float64 to the last bit: no fast-math here)."""
    n = poly.shape[0]
    line_phases(poly, binomial, onto, y_of, x_of, here_of, -qy, -qx, -dqx, -1.0, scratch, phases[0])
    line_phases(poly, binomial, onto, y_of, x_of, here_of, qy, qx, dqx, 1.0, scratch, phases[1])
    for side in range(2):
        for j in range(n):
            for b in range(PIXEL_BLOCK):
                state[side, j, 1, b], state[side, j, 0, b] = sin_cos(phases[side, j, b])


@numba.njit(cache=True, inline="always")
def sides_inside(y, x, qy, qx, kmax2):
    """(1.0 where k - q falls inside the aperture, else 0.0; the same for k + q) at k = (y, x): Gamma's two sides
    as factors, so that the loops over pixels that weigh them run without branches."""
    return 1.0 * ((x - qx) * (x - qx) + (y - qy) * (y - qy) <= kmax2), 1.0 * ((x + qx) * (x + qx) + (y + qy) * (y + qy) <= kmax2)


@numba.njit(cache=True, inline="always")
def advance(state, n) -> None:
    """One step along a line for a block of pixels: factor[j] *= factor[j + 1], both sides of ``state`` (side,
    difference, real / imaginary, pixel: one array, which the compiler vectorizes where split arrays it would
    not), lowest j first so that each factor meets its difference before the step."""
    for side in range(2):
        for j in range(n - 1):
            for b in range(PIXEL_BLOCK):
                r0, i0 = state[side, j, 0, b], state[side, j, 1, b]
                r1, i1 = state[side, j + 1, 0, b], state[side, j + 1, 1, b]
                state[side, j, 0, b] = r0 * r1 - i0 * i1
                state[side, j, 1, b] = r0 * i1 + i0 * r1


@numba.njit(parallel=True, cache=True, fastmath={"reassoc", "nsz"})  # sums reordered, no multiply-add contracted
def sideband_sum_loop(G, pixels, ky, kx, in_aperture, chi_k, poly, binomial, onto, dqy, dqx, kmax2, floor, total, weight):
    rows, half = G.shape[1], G.shape[2]
    n = poly.shape[0]
    for r in numba.prange(rows):
        qy = (r if r < (rows + 1) // 2 else r - rows) * dqy
        state = np.empty((2, n, 2, PIXEL_BLOCK))  # Gamma's two phase factors and their differences
        phases = np.empty((2, n, PIXEL_BLOCK))
        scratch = np.empty((2, n, PIXEL_BLOCK))
        for lo in range(0, ky.size, PIXEL_BLOCK):
            # the block's views: indexed by the loop's counter alone, the loop over pixels runs in vector lanes (an
            # index lo + b would be checked for wrap-around element by element)
            block_y, block_x, block_in = ky[lo : lo + PIXEL_BLOCK], kx[lo : lo + PIXEL_BLOCK], in_aperture[lo : lo + PIXEL_BLOCK]
            block_pixels = pixels[lo : lo + PIXEL_BLOCK]
            start_lines(poly, binomial, onto, block_y, block_x, chi_k[lo : lo + PIXEL_BLOCK], qy, 0.0, dqx, scratch, phases, state)
            for c in range(half):
                if c > 0:
                    advance(state, n)
                qx = c * dqx
                sum_re = sum_im = sum_size = 0.0
                for b in range(PIXEL_BLOCK):  # without branches, in vector lanes
                    plus, minus = sides_inside(block_y[b], block_x[b], qy, qx, kmax2)
                    plus, minus = block_in[b] * plus, block_in[b] * minus
                    gr = state[0, 0, 0, b] * plus - state[1, 0, 0, b] * minus
                    gi = state[0, 0, 1, b] * plus - state[1, 0, 1, b] * minus
                    size = math.sqrt(gr * gr + gi * gi)
                    kept = 1.0 * (size > floor)
                    scale = kept / max(size, floor)
                    g = G[block_pixels[b], r, c]
                    sum_re += (g.real * gr + g.imag * gi) * scale
                    sum_im += (g.imag * gr - g.real * gi) * scale
                    sum_size += size * kept
                total[r, c] += complex(sum_re, sum_im)
                weight[r, c] += sum_size


def sideband_sum(G, ky, kx, chi_k, table, dqy: float, dqx: float, kmax2: float, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """(sum_k G conj(Gamma) / |Gamma|, sum_k |Gamma|) over |Gamma| > ``floor``, each (rows, half_cols). Along each
    row of frequencies Gamma's phase factors are running products (``line_phases``) for a block of pixels at once:
    a few complex multiplies per frequency instead of two evaluations of chi and two sincos."""
    total = np.zeros(G.shape[1:], np.complex128)
    weight = np.zeros(G.shape[1:], np.float64)
    ky, kx = np.asarray(ky, np.float64), np.asarray(kx, np.float64)
    pixels, values = pixel_blocks(np.arange(ky.size), ky, kx, kx * kx + ky * ky <= kmax2, chi_k)
    sideband_sum_loop(G, pixels, *values, *line_polynomial(table), float(dqy), float(dqx), float(kmax2), float(floor), total, weight)
    return total, weight


def line_polynomial(table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What ``line_phases`` takes for chi's polar ``table`` (``optics.chi_table``): its monomials
    (``optics.monomials``), binomial coefficients and ``surjections`` up to its degree."""
    degree, poly = monomials(np.asarray(table))
    binomial = np.array([[math.comb(a, i) for i in range(degree + 1)] for a in range(degree + 1)], np.float64)
    return poly, binomial, surjections(degree)


def pixel_blocks(pixels: np.ndarray, *values) -> tuple[np.ndarray, list[np.ndarray]]:
    """The pixel indices ``pixels`` and per-pixel ``values`` (as float64) padded with zeros to whole PIXEL_BLOCKs,
    so the loops over a block run in vector lanes; a kernel weighs the padding (pixel 0) by a padded value of 0."""
    padded = -(-len(pixels) // PIXEL_BLOCK) * PIXEL_BLOCK
    index = np.zeros(padded, np.int64)
    index[: len(pixels)] = pixels
    blocks = [np.zeros(padded, np.float64) for _ in values]
    for block, v in zip(blocks, values):
        block[: len(pixels)] = v
    return index, blocks


@numba.njit(cache=True, inline="always")
def inside(r, cutoff, inv_pixel):
    """The part of a detector pixel at radius ``r`` inside the aperture: a ramp one pixel wide across its edge."""
    return min(max((cutoff - r) * inv_pixel + 0.5, 0.0), 1.0)


@numba.njit(parallel=True, cache=True)
def fit_terms_loop(Gt, uv, params, qy, qx, poly, has_rest, cutoff, inv_pixel, floor, step, terms):
    n_pix = Gt.shape[1]
    nq, nqx = terms.shape[1], qx.size
    for job in numba.prange(terms.size):
        p, q = job // nq, job % nq
        c10, a, b, ct, st = params[p, 0], params[p, 1], params[p, 2], params[p, 3], params[p, 4]
        fy, fx = qy[q // nqx], qx[q % nqx]
        quad = c10 * (fx * fx + fy * fy) + a * (fx * fx - fy * fy) + 2.0 * b * fx * fy
        total = 0j
        for k in range(0, n_pix, step):
            y = ct * uv[k, 0] - st * uv[k, 1]
            x = st * uv[k, 0] + ct * uv[k, 1]
            here = inside(math.hypot(x, y), cutoff, inv_pixel)
            om = here * inside(math.hypot(x - fx, y - fy), cutoff, inv_pixel)
            op = here * inside(math.hypot(x + fx, y + fy), cutoff, inv_pixel)
            if om == 0.0 and op == 0.0:
                continue
            lin = 2.0 * (c10 * (y * fy + x * fx) + a * (x * fx - y * fy) + b * (x * fy + y * fx))
            dm, dp = lin - quad, lin + quad
            if has_rest:
                centre = chi_of(x, y, poly)
                dm += centre - chi_of(x - fx, y - fy, poly)
                dp += chi_of(x + fx, y + fy, poly) - centre
            gamma = om * complex(math.cos(dm), math.sin(dm)) - op * complex(math.cos(dp), math.sin(dp))
            size = abs(gamma)
            if not size > floor:
                continue
            total += Gt[q, k] * gamma.conjugate() * (max(om, op) / size)
        terms[p, q] = abs(total)


def fit_setup(uv, qy, qx, table) -> tuple:
    """``fit_terms``'s fixed arguments, made once per fit: ``uv`` (n_pix, 2) the bright-field pixels' k_y, k_x
    before the rotation (1/A), the scan frequencies ``qy`` and ``qx``, the rest of chi as ``table``
    (``optics.chi_table``, evaluated as its monomials)."""
    table = np.asarray(table, np.complex128)
    return np.asarray(uv, np.float64), np.asarray(qy, np.float64), np.asarray(qx, np.float64), monomials(table)[1], bool(np.any(table != 0))


def fit_terms(Gt, setup: tuple, params, cutoff: float, pixel: float, floor: float, step: int) -> np.ndarray:
    """The coherent SSB signal's terms (P, nq) float64 for the trial rows ``params`` (P, 5): (pi lambda C10,
    pi lambda C12a, pi lambda C12b, cos t, sin t of the detector rotation t), over every ``step``-th pixel of
    ``setup`` (``fit_setup``) and Gt (nq, n_pix) complex64 (G at the scan frequencies (qy[i // len(qx)],
    qx[i % len(qx)])); the aperture's radius ``cutoff`` and a pixel's width ``pixel`` in 1/A. Contract in
    kernels/ssb.cu (fit_terms), which evaluates in float32 where this is float64."""
    uv, qy, qx, poly, has_rest = setup
    terms = np.empty((len(params), Gt.shape[0]), np.float64)
    fit_terms_loop(Gt, uv, np.asarray(params, np.float64), qy, qx, poly, has_rest, float(cutoff), 1.0 / pixel, float(floor), int(step), terms)
    return terms
