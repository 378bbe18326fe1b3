"""Direct ptychography's kernels on the CPU (Numba), twins of ``phase.cuda``'s: the normal equations of every
alias group (``normal_equations``; kernels/ssb.cu) and their solve at one strength (``shifted_solve``;
kernels/solve.cu), contracts in their docstrings. Every step is float64; the transfers' phase factors are running
products along lines of fine frequencies (``cpu.line_phases``), within 1e-12 of factors evaluated at each
frequency where chi is tens of rad.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from .cpu import PIXEL_BLOCK, advance, line_polynomial, pixel_blocks, start_lines


@numba.njit(cache=True, fastmath=True)
def add_products(x_re, x_im, width: int, upper_re, upper_im, at: int) -> None:
    """upper[at + i * width + j] += sum_b conj(x[i, b]) x[j, b] for i <= j < width over a block of pixels, split
    complex: a reduction the compiler may reorder (fastmath) into vector lanes; the sums change in their last
    bits, not more."""
    for i in range(width):
        for j in range(i, width):
            sr = 0.0
            si = 0.0
            for b in range(PIXEL_BLOCK):
                sr += x_re[i, b] * x_re[j, b] + x_im[i, b] * x_im[j, b]
                si += x_re[i, b] * x_im[j, b] - x_im[i, b] * x_re[j, b]
            upper_re[at + i * width + j] += sr
            upper_im[at + i * width + j] += si


@numba.njit(parallel=True, cache=True, fastmath={"reassoc", "nsz"})  # sums reordered, no multiply-add contracted
def normal_equations_rows(G, pixels, ky, kx, root_w, chi_k, poly, binomial, onto, half, line_of, alias_q, group_of, slot_of,
                          count_of, width_of, start_of, dqx, complex_method, inv_u2, kmax2, upper_re, upper_im):
    n = poly.shape[0]
    lines = line_of.shape[1]
    max_width = width_of.max()
    sides = 2 if complex_method else 1
    for jr in numba.prange(group_of.size // half):
        state_re, state_im = np.empty((2, n, PIXEL_BLOCK)), np.empty((2, n, PIXEL_BLOCK))  # one line's factors and differences
        phases = np.empty((2, n, PIXEL_BLOCK))
        # each line's columns of X at each frequency of the row, for the block: Gamma_plus and Gamma_minus (complex
        # method) or i (Gamma_plus - Gamma_minus) (phase), times sqrt(W) / u^2 where inside the aperture
        col_re, col_im = np.zeros((lines, half, sides, PIXEL_BLOCK)), np.zeros((lines, half, sides, PIXEL_BLOCK))
        seen = np.zeros((lines, half), np.bool_)  # whether any pixel of the block has a term there
        x_re, x_im = np.empty((max_width, PIXEL_BLOCK)), np.empty((max_width, PIXEL_BLOCK))  # [T, g] scaled by sqrt(W)
        scratch = np.empty(n)
        for lo in range(0, ky.size, PIXEL_BLOCK):
            for a in range(lines):  # line by line along the row: its factors stay in the first-level cache
                last_c, last_qx = -2, 0.0
                for c in range(half):
                    f = jr * half + c
                    gi = group_of[f]
                    if gi < 0:
                        continue
                    m = 0
                    while m < count_of[gi] and line_of[f, m] != a:
                        m += 1
                    if m == count_of[gi]:
                        continue
                    qy, qx = alias_q[f, m, 0], alias_q[f, m, 1]
                    if last_c == c - 1 and abs(qx - last_qx - dqx) < 0.5 * dqx:  # the next point of the line
                        advance(state_re, state_im, n)
                    else:  # the line (re)starts here
                        start_lines(poly, binomial, onto, ky, kx, chi_k, lo, qy, qx, dqx, scratch, phases, state_re, state_im)
                    last_c, last_qx = c, qx
                    terms = 0.0
                    for b in range(PIXEL_BLOCK):  # each side where it falls inside the aperture, without branches
                        k = lo + b
                        y, x = ky[k], kx[k]
                        plus = root_w[k] * inv_u2 * ((x - qx) * (x - qx) + (y - qy) * (y - qy) <= kmax2)
                        minus = root_w[k] * inv_u2 * ((x + qx) * (x + qx) + (y + qy) * (y + qy) <= kmax2)
                        terms += plus + minus
                        pr, pi = state_re[0, 0, b] * plus, state_im[0, 0, b] * plus
                        mr, mi = state_re[1, 0, b] * minus, state_im[1, 0, b] * minus
                        if complex_method:
                            col_re[a, c, 0, b], col_im[a, c, 0, b] = pr, pi
                            col_re[a, c, 1, b], col_im[a, c, 1, b] = mr, mi
                        else:
                            col_re[a, c, 0, b], col_im[a, c, 0, b] = mi - pi, pr - mr
                    seen[a, c] = terms != 0.0
            for c in range(half):
                f = jr * half + c
                gi = group_of[f]
                if gi < 0:
                    continue
                d = count_of[gi]
                cols = width_of[gi] - 1
                any_term = False
                for m in range(d):
                    a = line_of[f, m]
                    any_term |= seen[a, c]
                    for side in range(sides):
                        for b in range(PIXEL_BLOCK):
                            x_re[side * d + m, b], x_im[side * d + m, b] = col_re[a, c, side, b], col_im[a, c, side, b]
                if not any_term:
                    continue
                for b in range(PIXEL_BLOCK):
                    g = G[pixels[lo + b], f] * root_w[lo + b]
                    x_re[cols, b], x_im[cols, b] = g.real, g.imag
                add_products(x_re, x_im, cols + 1, upper_re, upper_im, start_of[gi] + slot_of[f] * (cols + 1) * (cols + 1))


def normal_equations(G, ky, kx, weights, chi_k, table, found, complex_method: bool, kmax2: float) -> list:
    """For each alias group of ``found`` (``phase.direct.Aliases``; G (n_pix, rows, half_cols)): the Gram
    T^H W T (n, C, C) and right side T^H W g (n, C) of the direct-ptychography model (``phase.direct``) at each of
    its frequencies, complex128, with one column per alias (phase method: i Gamma / u^2) or two (complex method:
    Gamma_plus / u^2, then Gamma_minus / u^2). Each coarse row is one thread's; along it each alias line's phase
    factors are running products (``line_phases``, as the sideband sum's), restarted where the line starts
    or wraps, for blocks of pixels at once."""
    n_pix, rows, half = G.shape
    u = found.upsampling
    fine_cols = found.scan_shape[1] * u
    groups = found.groups
    group_of = np.full(rows * half, -1, np.int64)
    slot_of = np.zeros(rows * half, np.int64)
    line_of = np.zeros((rows * half, u * u), np.int64)
    alias_q = np.zeros((rows * half, u * u, 2), np.float64)
    widths = [(2 * g.count if complex_method else g.count) + 1 for g in groups]
    starts = np.cumsum([0] + [int(g.freq.size) * w * w for g, w in zip(groups, widths)])
    for gi, g in enumerate(groups):
        freq = np.asarray(g.freq, np.int64)
        group_of[freq] = gi
        slot_of[freq] = np.arange(freq.size)
        fine_r, fine_c = np.divmod(np.asarray(g.here_at, np.int64), fine_cols)
        line_of[freq, : g.count] = ((fine_r // rows) * u + fine_c // found.scan_shape[1]).reshape(-1, g.count)
        alias_q[freq, : g.count] = g.q
    upper_re = np.zeros(int(starts[-1]), np.float64)
    upper_im = np.zeros(int(starts[-1]), np.float64)
    inside = np.flatnonzero(np.asarray(kx, np.float64) ** 2 + np.asarray(ky, np.float64) ** 2 <= kmax2)
    pixels, values = pixel_blocks(inside, *(np.asarray(v, np.float64)[inside] for v in (ky, kx, np.sqrt(weights), chi_k)))
    normal_equations_rows(G.reshape(n_pix, -1), pixels, *values, *line_polynomial(table), half, line_of, alias_q,
                          group_of, slot_of, np.array([g.count for g in groups], np.int64), np.array(widths, np.int64),
                          starts[:-1].astype(np.int64), float(found.q_step[1]), bool(complex_method), 1.0 / u**2, float(kmax2),
                          upper_re, upper_im)
    out = []
    for g, w, start in zip(groups, widths, starts):
        upper = (upper_re[start : start + g.freq.size * w * w] + 1j * upper_im[start : start + g.freq.size * w * w]).reshape(-1, w, w)
        upper = np.triu(upper)
        full = upper + np.conj(np.swapaxes(np.triu(upper, 1), 1, 2))
        out.append((np.ascontiguousarray(full[:, : w - 1, : w - 1]), np.ascontiguousarray(full[:, : w - 1, w - 1])))
    return out


@numba.njit(parallel=True, cache=True)
def shifted_solve_loop(matrix, rhs, shift, out):
    n, C = rhs.shape
    for f in numba.prange(n):
        L = np.empty((C, C), np.complex128)
        y = np.empty(C, np.complex128)
        for j in range(C):  # L L^H = matrix + shift I, column by column
            d = matrix[f, j, j].real + shift
            for k in range(j):
                d -= L[j, k].real ** 2 + L[j, k].imag ** 2
            d = math.sqrt(max(d, shift))  # a pivot of M + s I is >= s when M >= 0: only rounding could take it lower
            L[j, j] = d
            for i in range(j + 1, C):
                v = matrix[f, i, j]
                for k in range(j):
                    v -= L[i, k] * np.conj(L[j, k])
                L[i, j] = v / d
        for i in range(C):  # L y = rhs
            v = rhs[f, i]
            for k in range(i):
                v -= L[i, k] * y[k]
            y[i] = v / L[i, i].real
        for i in range(C - 1, -1, -1):  # L^H x = y
            v = y[i]
            for k in range(i + 1, C):
                v -= np.conj(L[k, i]) * out[f, k]
            out[f, i] = v / L[i, i].real


def shifted_solve(matrix, rhs, shift: float) -> np.ndarray:
    """x (n, C) complex128 with (matrix + shift I) x = rhs for each of n Hermitian positive semi-definite
    ``matrix`` (n, C, C) (only its lower triangle is read) and ``shift`` > 0: a Cholesky factorisation per system,
    the regularized solve of direct ptychography at one strength (``phase.direct.unknowns``)."""
    out = np.empty(rhs.shape, np.complex128)
    shifted_solve_loop(np.asarray(matrix, np.complex128), np.asarray(rhs, np.complex128), float(shift), out)
    return out
