"""The SSB kernels on the GPU (kernels/ssb.cu), twins of ``phase.cpu`` and ``phase.direct_cpu``: the sideband sum
over bright-field pixels, the aberration fit's signal and the normal equations of direct ptychography, and their
solve (from ``phase.solve_cuda``); the scan spectrum of images through cuFFT.

Same contracts as the CPU twins (see their docstrings). chi and Gamma are evaluated in float32 registers
(the phases they give differ from float64 by about 1e-6 rad), the aperture tests as in float64 and the sums
over pixels in float64 (the sideband sum's from float32 runs of 32 terms).
"""

from __future__ import annotations

import math
import threading

import cupy
import cupyx.scipy.fft
import numpy as np

from .. import compile
from . import solve_cuda
from .optics import monomials

THREADS = 256
MAX_GRID_Y = 65535  # CUDA's limit on a grid's second dimension
BLOCKS_PER_SM = 16  # slices of the pixels are added until about this many blocks fill each multiprocessor
COLUMN_STRIDE = 36  # doubles per column of a normal_equations warp's buffer: 32 pixels, padded so fragment loads meet no bank conflict
FIT_THREADS = 128  # threads of a fit_terms block: one (frequency, trial) pair
DEFINES = compile.defines(COLUMN_STRIDE=COLUMN_STRIDE, FIT_THREADS=FIT_THREADS)  # the constants kernels/ssb.cu takes from Python


def kernel(name_expr: str) -> cupy.RawKernel:
    return compile.kernel("ssb.cu", name_expr, DEFINES)


PLANS = threading.local()  # each thread's spectrum plans: a plan's work area serves one transform at a time
KEPT_PLANS = 2  # a chunk's shape and the last chunk's; each plan holds cuFFT's work area


def spectrum_plan(images: cupy.ndarray) -> cupy.cuda.cufft.PlanNd:
    """cuFFT's plan of the rfft2 of (n, rows, cols) float32 images like these, kept by this thread for the next
    chunk of the same shape."""
    plans = PLANS.__dict__.setdefault("by_shape", {})
    key = (images.shape, images.device.id)
    if key not in plans:
        if len(plans) >= KEPT_PLANS:
            plans.pop(next(iter(plans)))
        plans[key] = cupyx.scipy.fft.get_fft_plan(images, axes=(-2, -1), value_type="R2C")
    return plans[key]


def spectrum_of(images: cupy.ndarray, out: cupy.ndarray) -> None:
    """out[i] = rfft2(images[i]) for (n, rows, cols) images, through cuFFT written straight into ``out`` (no
    temporary and copy: a pass over G saved): the twin of ``phase.cpu.spectrum_of``."""
    if not (images.dtype == cupy.float32 and images.flags.c_contiguous and out.dtype == cupy.complex64 and out.flags.c_contiguous):
        raise ValueError("spectrum_of takes C-contiguous float32 images and a C-contiguous complex64 out")
    spectrum_plan(images).fft(images, out, cupy.cuda.cufft.CUFFT_FORWARD)


def poly_argument(poly: np.ndarray) -> np.void:
    """P (``optics.monomials``) as the kernels' Poly<N> struct of float32, passed by value."""
    value = np.zeros((), np.dtype([("c", np.float32, (poly.size,))]))
    value["c"] = poly.ravel().astype(np.float32)
    return value[()]


def sideband_sum(G, ky, kx, chi_k, table, dqy: float, dqx: float, kmax2: float, floor: float) -> tuple[cupy.ndarray, cupy.ndarray]:
    """(sum_k G conj(Gamma) / |Gamma|, sum_k |Gamma|) over |Gamma| > ``floor``, each (rows, half_cols)."""
    n_pix, rows, half = G.shape
    if G.dtype != np.complex64 or not G.flags.c_contiguous:
        raise ValueError("G must be a C-contiguous complex64 array")
    nq = rows * half
    blocks = math.ceil(nq / THREADS)
    sms = compile.limits(cupy.cuda.Device().id)[0]
    slices = max(1, min(n_pix, math.ceil(sms * BLOCKS_PER_SM / blocks)))
    per_slice = math.ceil(n_pix / slices) if n_pix else 1
    slices = math.ceil(n_pix / per_slice) if n_pix else 1
    parts = cupy.zeros((3, slices, nq), np.float64)
    degree, poly = monomials(np.asarray(table))
    name = f"sideband_sum<{degree}>"
    kernel(name)(
        (blocks, slices), (THREADS,),
        (G, np.int64(n_pix), np.int32(rows), np.int32(half), cupy.asarray(pixel_table(ky, kx, chi_k, kmax2)), cupy.asarray(ky, np.float64),
         cupy.asarray(kx, np.float64), poly_argument(poly), np.float64(dqy), np.float64(dqx), np.float64(kmax2), np.float32(floor),
         np.int64(per_slice), parts[0], parts[1], parts[2]),
    )
    sums = parts.sum(axis=1).reshape(3, rows, half)
    return sums[0] + 1j * sums[1], sums[2]


def pixel_table(ky, kx, chi_k, kmax2: float) -> np.ndarray:
    """sideband_sum's pixels: (n, 4) float32 rows (k_y, k_x, |k|^2 - kmax2, chi(k)), the third +inf for a pixel
    outside the aperture (decided in float64, as the CPU twin does)."""
    ky, kx = np.asarray(ky, np.float64), np.asarray(kx, np.float64)
    off = kx * kx + ky * ky - kmax2
    return np.stack([ky, kx, np.where(off > 0, np.inf, off), np.asarray(chi_k, np.float64)], axis=1).astype(np.float32)


def fit_setup(uv, qy, qx, table) -> tuple:
    """The twin of ``phase.cpu.fit_setup``: the pixels and frequencies on the device in float32 and chi's rest
    as the kernel's polynomial, made once per fit rather than at each of its launches."""
    degree, poly = monomials(np.asarray(table))
    uv = cupy.ascontiguousarray(cupy.asarray(uv, np.float32))
    return uv, cupy.asarray(qy, np.float32), cupy.asarray(qx, np.float32), degree, poly_argument(poly)


def fit_terms(Gt, setup: tuple, params, cutoff: float, pixel: float, floor: float, step: int) -> cupy.ndarray:
    """The twin of ``phase.cpu.fit_terms`` (see there): the fit's signal terms (P, nq) float64 on the device,
    one block per (frequency, trial), in float32 summed in float64."""
    if Gt.dtype != np.complex64 or not Gt.flags.c_contiguous:
        raise ValueError("Gt must be a C-contiguous complex64 array")
    uv, qy, qx, degree, poly = setup
    nq, n_pix = Gt.shape
    params = cupy.asarray(params, np.float32)
    terms = cupy.empty((len(params), nq), np.float64)
    run = kernel(f"fit_terms<{degree}>")
    for lo in range(0, len(params), MAX_GRID_Y):
        rows = params[lo : lo + MAX_GRID_Y]
        run((nq, len(rows)), (FIT_THREADS,), (Gt, np.int64(n_pix), np.int32(step), uv, rows, qy, qx, np.int32(qx.size), poly,
                                              np.float32(cutoff), np.float32(1.0 / pixel), np.float32(floor), terms[lo:]))
    return terms


NORMAL_WARPS = 4  # frequencies per block of normal_equations, fewer where a warp's buffer is large
PATCH = (8, 4)  # pixel pitches per patch of normal_equations' pixel order: 32 pixels, one warp's


def patch_order(ky, kx) -> cupy.ndarray:
    """The bright-field pixels in patches of 8 x 4 pixel pitches (row band by row band): a warp's 32 pixels lie
    together, so at a given q they mostly fall on one side of the shifted aperture's edge and the warp's
    branches diverge less (30% of chi evaluations taken instead of 40% in plain row order, for 26% needed)."""
    n = ky.size
    pitch = math.sqrt(math.pi / 4 * float(ky.max() - ky.min()) * float(kx.max() - kx.min()) / n) or 1.0
    row = cupy.floor((ky - ky.min()) / pitch).astype(np.int64)
    col = cupy.floor((kx - kx.min()) / pitch).astype(np.int64)
    width = int(col.max()) + 1
    patch = (row // PATCH[0]) * (width // PATCH[1] + 1) + col // PATCH[1]
    return cupy.argsort((patch * PATCH[0] + row % PATCH[0]) * width + col)


def normal_equations(G, ky, kx, weights, chi_k, table, found, complex_method: bool, kmax2: float) -> list:
    """The twin of ``phase.direct_cpu.normal_equations`` (see there): each alias group's Gram and right side, complex128
    on the device, summed in float64 from float32 transfers (``group_equations``, one launch per group)."""
    return [group_equations(G, ky, kx, weights, chi_k, table, g.freq, g.q, complex_method, found.upsampling, kmax2) for g in found.groups]


def group_equations(G, ky, kx, weights, chi_k, table, freq, alias_q, complex_method: bool, upsampling: int, kmax2: float):
    """Gram and right side of each listed frequency ``freq`` with its aliases' q ``alias_q`` (n, D, 2). The kernel
    takes the pixels in ``patch_order`` (for speed only) and writes Y^T Y, which ``normal_gram`` turns into the two."""
    n_pix = G.shape[0]
    if G.dtype != np.complex64 or not G.flags.c_contiguous:
        raise ValueError("G must be a C-contiguous complex64 array")
    n, d = alias_q.shape[:2]
    cols = 2 * d if complex_method else d
    gram = cupy.zeros((n, cols, cols), np.complex128)
    rhs = cupy.zeros((n, cols), np.complex128)
    if n == 0:
        return gram, rhs
    degree, poly = monomials(np.asarray(table))
    ky, kx = cupy.asarray(ky, np.float64), cupy.asarray(kx, np.float64)
    order = patch_order(ky, kx)
    ky, kx = ky[order], kx[order]
    width = 2 * (cols + 1)  # Y = [Re X, Im X] of X = [T, g]
    span = 16 * math.ceil(width / 16)
    per_warp = (span * COLUMN_STRIDE + 4 * d) * 8
    optin = compile.limits(cupy.cuda.Device().id)[1]
    warps = min(NORMAL_WARPS, optin // per_warp)
    if warps == 0:
        raise ValueError(f"{d} aliases per frequency need {per_warp} bytes of shared memory per warp, more than the "
                         f"{optin} a block may have: use a smaller upsampling")
    yy = cupy.empty((n, width, width), np.float64)
    name = f"normal_equations<{degree}, {d}, {'true' if complex_method else 'false'}>"
    kernel(name)(
        (math.ceil(n / warps),), (32 * warps,),
        (G, np.int64(G[0].size), order, np.int64(n_pix), cupy.asarray(freq, np.int64), np.int64(n), ky, kx,
         cupy.stack([ky, kx], axis=1).astype(np.float32), cupy.asarray(chi_k, np.float32)[order],
         cupy.sqrt(cupy.asarray(weights, np.float32))[order], poly_argument(poly),
         cupy.ascontiguousarray(cupy.asarray(alias_q, np.float64)), np.float64(kmax2), np.float32(1.0 / upsampling**2), yy),
        shared_mem=warps * per_warp,
    )
    total = n * cols * (cols + 1)
    kernel(f"normal_gram<{cols}>")((math.ceil(total / THREADS),), (THREADS,), (yy, np.int64(n), gram, rhs))
    return gram, rhs


shifted_solve = solve_cuda.shifted_solve  # its own source (kernels/solve.cu) and module
