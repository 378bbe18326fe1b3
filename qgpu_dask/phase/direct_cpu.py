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

from .cpu import PIXEL_BLOCK, advance, line_polynomial, pixel_blocks, sides_inside, start_lines


@numba.njit(cache=True, fastmath=True)
def add_products(x_re, x_im, width: int, upper_re, upper_im, at: int) -> None:
    """upper[at + i * width + j] += sum_b conj(x[i, b]) x[j, b] for i <= j < width over a block of pixels, split
    complex: a reduction the compiler may reorder (fastmath) into vector lanes; the sums change in their last
    bits, not more. Two columns j at a time, so that each load of column i serves both."""
    for i in range(width):
        a_re, a_im = x_re[i], x_im[i]
        for j in range(i, width - 1, 2):
            b_re, b_im, c_re, c_im = x_re[j], x_im[j], x_re[j + 1], x_im[j + 1]
            br = bi = cr = ci = 0.0
            for b in range(PIXEL_BLOCK):
                br += a_re[b] * b_re[b] + a_im[b] * b_im[b]
                bi += a_re[b] * b_im[b] - a_im[b] * b_re[b]
                cr += a_re[b] * c_re[b] + a_im[b] * c_im[b]
                ci += a_re[b] * c_im[b] - a_im[b] * c_re[b]
            upper_re[at + i * width + j] += br
            upper_im[at + i * width + j] += bi
            upper_re[at + i * width + j + 1] += cr
            upper_im[at + i * width + j + 1] += ci
        if (width - i) % 2:
            j = width - 1
            b_re, b_im = x_re[j], x_im[j]
            br = bi = 0.0
            for b in range(PIXEL_BLOCK):
                br += a_re[b] * b_re[b] + a_im[b] * b_im[b]
                bi += a_re[b] * b_im[b] - a_im[b] * b_re[b]
            upper_re[at + i * width + j] += br
            upper_im[at + i * width + j] += bi


@numba.njit(cache=True, fastmath={"reassoc", "nsz"})
def alias_columns(line, y_of, x_of, w_of, qy, qx, kmax2, inv_u2, complex_method, tg, m, d) -> float:
    """X's columns of alias m of d at q = (qy, qx) for a block of pixels from its line's factors (``line``: side,
    difference, real / imaginary, pixel): Gamma_plus into tg[:, m] and Gamma_minus into tg[:, d + m] (complex
    method) or i (Gamma_plus - Gamma_minus) into tg[:, m] (phase), times sqrt(W) / u^2 where inside the aperture;
    the sum of those weights (0: no pixel has a term). One function of 1-d views: its loops run in vector lanes."""
    plus_re, plus_im, minus_re, minus_im = line[0, 0, 0], line[0, 0, 1], line[1, 0, 0], line[1, 0, 1]
    out_re, out_im = tg[0, m], tg[1, m]
    terms = 0.0
    if complex_method:
        mirror_re, mirror_im = tg[0, d + m], tg[1, d + m]
        for b in range(PIXEL_BLOCK):
            plus, minus = sides_inside(y_of[b], x_of[b], qy, qx, kmax2)
            plus, minus = w_of[b] * inv_u2 * plus, w_of[b] * inv_u2 * minus
            terms += plus + minus
            out_re[b], out_im[b] = plus_re[b] * plus, plus_im[b] * plus
            mirror_re[b], mirror_im[b] = minus_re[b] * minus, minus_im[b] * minus
    else:
        for b in range(PIXEL_BLOCK):
            plus, minus = sides_inside(y_of[b], x_of[b], qy, qx, kmax2)
            plus, minus = w_of[b] * inv_u2 * plus, w_of[b] * inv_u2 * minus
            terms += plus + minus
            out_re[b] = minus_im[b] * minus - plus_im[b] * plus
            out_im[b] = plus_re[b] * plus - minus_re[b] * minus
    return terms


@numba.njit(parallel=True, cache=True, fastmath={"reassoc", "nsz"})  # sums reordered, no multiply-add contracted
def normal_equations_rows(G, pixels, ky, kx, root_w, chi_k, poly, binomial, onto, half, line_of, alias_q, group_of, slot_of,
                          count_of, width_of, start_of, dqx, complex_method, inv_u2, kmax2, upper_re, upper_im):
    n = poly.shape[0]
    lines = line_of.shape[1]
    max_width = width_of.max()
    for jr in numba.prange(group_of.size // half):
        # each alias line's phase factors and their differences for the block (a line: one alias offset, its q one
        # fine step further at each coarse column), all of them small enough to stay in cache along the row
        state = np.empty((lines, 2, n, 2, PIXEL_BLOCK))
        last_c, last_qx = np.empty(lines, np.int64), np.empty(lines)
        phases = np.empty((2, n, PIXEL_BLOCK))
        tg = np.empty((2, max_width, PIXEL_BLOCK))  # [T, g] scaled by sqrt(W), split complex in one array (below)
        scratch = np.empty((2, n, PIXEL_BLOCK))
        g_row = np.empty((half, 2, PIXEL_BLOCK))  # G of the block along the row, read pixel by pixel (contiguous)
        for lo in range(0, ky.size, PIXEL_BLOCK):
            # the block's views: indexed by the loop's counter alone, the loops over it run in vector lanes (an
            # index lo + b would be checked for wrap-around element by element)
            y_of, x_of, w_of = ky[lo : lo + PIXEL_BLOCK], kx[lo : lo + PIXEL_BLOCK], root_w[lo : lo + PIXEL_BLOCK]
            here_of = chi_k[lo : lo + PIXEL_BLOCK]
            pixel_of = pixels[lo : lo + PIXEL_BLOCK]
            last_c[:] = -2
            for b in range(PIXEL_BLOCK):
                p = pixel_of[b]
                for c in range(half):
                    g = G[p, jr * half + c]
                    g_row[c, 0, b], g_row[c, 1, b] = g.real, g.imag
            for c in range(half):
                f = jr * half + c
                gi = group_of[f]
                if gi < 0:
                    continue
                d = count_of[gi]
                cols = width_of[gi] - 1
                terms = 0.0
                for m in range(d):
                    a = line_of[f, m]
                    qy, qx = alias_q[f, m, 0], alias_q[f, m, 1]
                    if last_c[a] == c - 1 and abs(qx - last_qx[a] - dqx) < 0.5 * dqx:  # the next point of the line
                        advance(state[a], n)
                    else:  # the line (re)starts here
                        start_lines(poly, binomial, onto, y_of, x_of, here_of, qy, qx, dqx, scratch, phases, state[a])
                    last_c[a], last_qx[a] = c, qx
                    terms += alias_columns(state[a], y_of, x_of, w_of, qy, qx, kmax2, inv_u2, complex_method, tg, m, d)
                if terms == 0.0:  # no pixel of the block has a term at this frequency
                    continue
                for b in range(PIXEL_BLOCK):
                    tg[0, cols, b], tg[1, cols, b] = g_row[c, 0, b] * w_of[b], g_row[c, 1, b] * w_of[b]
                add_products(tg[0], tg[1], cols + 1, upper_re, upper_im, start_of[gi] + slot_of[f] * (cols + 1) * (cols + 1))


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
