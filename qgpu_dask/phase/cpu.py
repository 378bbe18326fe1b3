"""The SSB kernels on the CPU (Numba), twins of kernels/ssb.cu: the sideband sum and the normal equations
of direct ptychography (``normal_equations``, contract in its docstring).

Contract of ``sideband_sum(G, ky, kx, chi_k, table, dqy, dqx, kmax2, floor)``, shared with
``qgpu_dask.phase.cuda``: it takes G (n_pix, rows, half_cols) complex64 (the rfft2 over the scan of each
bright-field pixel's image), the pixels' k_y, k_x (1/A, scan axes) and chi there, the aberration table of
``optics.chi_table``, the scan frequency steps, the squared aperture radius (1/A^2) and the |Gamma| floor,
and returns (sum_k G conj(Gamma) / |Gamma| complex128, sum_k |Gamma| float64), each (rows, half_cols),
over the pixels and frequencies where |Gamma| > floor. Here every step is float64; the CUDA twins
evaluate chi and Gamma in float32 and sum in float64.
"""

from __future__ import annotations

import math

import numba
import numpy as np


@numba.njit(cache=True)
def chi_at(x, y, table):
    r2 = x * x + y * y
    z = complex(x, y)
    power = complex(1.0, 0.0)
    total = 0.0
    for m in range(table.shape[0]):
        poly = complex(0.0, 0.0)
        for p in range(table.shape[1] - 1, -1, -1):
            poly = poly * r2 + table[m, p]
        total += (poly * power).real
        power *= z
    return total


@numba.njit(cache=True, inline="always")
def trotters(x, y, here, qy, qx, table, kmax2):
    """(Gamma_plus, Gamma_minus) of pixel k = (x, y) with chi(k) = ``here`` at frequency (qy, qx): the phase
    factors exp(i (chi(k) - chi(k - q))) and exp(i (chi(k + q) - chi(k))) where k - q and k + q fall inside the
    aperture, else 0."""
    plus = 0j
    minus = 0j
    my, mx, py, px = y - qy, x - qx, y + qy, x + qx
    if mx * mx + my * my <= kmax2:
        a = here - chi_at(mx, my, table)
        plus = complex(math.cos(a), math.sin(a))
    if px * px + py * py <= kmax2:
        a = chi_at(px, py, table) - here
        minus = complex(math.cos(a), math.sin(a))
    return plus, minus


@numba.njit(parallel=True, cache=True)
def sideband_sum_loop(G, ky, kx, chi_k, table, dqy, dqx, kmax2, floor, total, weight):
    n_pix, rows, half = G.shape
    for r in numba.prange(rows):
        qy = (r if r < (rows + 1) // 2 else r - rows) * dqy
        for k in range(n_pix):
            y, x = ky[k], kx[k]
            if x * x + y * y > kmax2:
                continue
            here = chi_k[k]
            for c in range(half):
                plus, minus = trotters(x, y, here, qy, c * dqx, table, kmax2)
                gamma = plus - minus
                size = math.sqrt(gamma.real * gamma.real + gamma.imag * gamma.imag)
                if not size > floor:
                    continue
                total[r, c] += G[k, r, c] * gamma.conjugate() / size
                weight[r, c] += size


def sideband_sum(G, ky, kx, chi_k, table, dqy: float, dqx: float, kmax2: float, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """(sum_k G conj(Gamma) / |Gamma|, sum_k |Gamma|) over |Gamma| > ``floor``, each (rows, half_cols)."""
    total = np.zeros(G.shape[1:], np.complex128)
    weight = np.zeros(G.shape[1:], np.float64)
    sideband_sum_loop(G, np.asarray(ky, np.float64), np.asarray(kx, np.float64), np.asarray(chi_k, np.float64),
                      np.asarray(table, np.complex128), float(dqy), float(dqx), float(kmax2), float(floor), total, weight)
    return total, weight


@numba.njit(parallel=True, cache=True)
def normal_equations_loop(G, ky, kx, weights, chi_k, table, freq, alias_q, complex_method, inv_u2, kmax2, gram, rhs):
    n_pix = G.shape[0]
    d = alias_q.shape[1]
    cols = gram.shape[1]
    for f in numba.prange(len(freq)):
        column = np.zeros(cols, np.complex128)
        for k in range(n_pix):
            y, x = ky[k], kx[k]
            if x * x + y * y > kmax2:
                continue
            here = chi_k[k]
            any_term = False
            for m in range(d):
                plus, minus = trotters(x, y, here, alias_q[f, m, 0], alias_q[f, m, 1], table, kmax2)
                plus, minus = plus * inv_u2, minus * inv_u2
                if complex_method:
                    column[m] = plus
                    column[d + m] = minus
                else:
                    column[m] = 1j * (plus - minus)
                any_term = any_term or plus != 0 or minus != 0
            if not any_term:
                continue
            w = weights[k]
            g = G[k, freq[f]]
            for i in range(cols):
                ci = column[i].conjugate() * w
                if ci == 0:
                    continue
                rhs[f, i] += ci * g
                for j in range(cols):
                    gram[f, i, j] += ci * column[j]


def normal_equations(G, ky, kx, weights, chi_k, table, freq, alias_q, complex_method: bool, upsampling: int, kmax2: float):
    """For the frequencies ``freq`` (flat indices into G's half spectrum, G (n_pix, rows, half_cols)), each with
    the aliases ``alias_q`` (n, D, 2) (1/A, (q_y, q_x)): the Gram T^H W T (n, C, C) and right side T^H W g
    (n, C) of the direct-ptychography model (``phase.direct``), complex128, with one column per alias (phase
    method: i Gamma / u^2) or two (complex method: Gamma_plus / u^2, then Gamma_minus / u^2)."""
    n_pix = G.shape[0]
    n, d = alias_q.shape[:2]
    cols = d * (2 if complex_method else 1)
    gram = np.zeros((n, cols, cols), np.complex128)
    rhs = np.zeros((n, cols), np.complex128)
    normal_equations_loop(G.reshape(n_pix, -1), np.asarray(ky, np.float64), np.asarray(kx, np.float64), np.asarray(weights, np.float64),
                          np.asarray(chi_k, np.float64), np.asarray(table, np.complex128), np.asarray(freq, np.int64),
                          np.asarray(alias_q, np.float64), bool(complex_method), 1.0 / upsampling**2, float(kmax2), gram, rhs)
    return gram, rhs
