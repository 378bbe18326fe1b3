"""One batch of a ptychographic pass on the GPU (kernels/ptycho.cu and cuFFT), twins of ``qgpu_dask.phase.iterative.cpu``.

Same contracts (see its docstrings), with ``corners`` a device array. Sums run in a fixed order without atomics:
the probe's per group of positions (FUSED_GROUP on the fused path, PER_GROUP on the others), the groups then
added in order; the object's per pixel, in position order. Launches go to the current stream and nothing waits
for the host.
"""

from __future__ import annotations

import math

import cupy
import cupyx.scipy.fft
import numpy as np

from ... import compile
from ...compile import Launch
from ..line_fft import line, padded, roots
from .cpu import Batch

TILE_ROWS, TILE_COLS = 8, 32  # a block's tile of object pixels in object_update, one thread each
THREADS = TILE_ROWS * TILE_COLS  # threads per block
PER_GROUP = 32  # positions per partial sum of the probe's (probe_sums)
FUSED_GROUP = 8  # the same in rows_inverse, which runs one warp per row and group
TILE_C = 8  # columns per block of `columns`
ROW_WARPS = 8  # rows per block of rows_forward and rows_inverse, a warp each for loads and stores
MAX_FFT = 512  # the longest row or column the fused kernels take (shared memory)
PAIR_LINES = 32  # lines far_field_pair transforms at once (its FFTs' scratch; 32 x 12 steps of a 192-point line busy 384 of its 512 threads)
PAIR_THREADS = 512  # threads of each CTA of far_field_pair
PAIR_SHARED = 227 * 1024  # the most shared memory a far_field_pair CTA may take (an H100's or H200's opt-in)
PATHS = ("fused", "pair", "cufft")  # updated_waves' ways, the first that takes the windows chosen (on an H100 at 8c36f10, 512 windows
# of 192 x 192: fused 726 us, pair 933 us, cuFFT step by step 1001 us)
DEFINES = compile.defines(TILE_ROWS=TILE_ROWS, TILE_COLS=TILE_COLS, TILE_C=TILE_C, ROW_WARPS=ROW_WARPS, PAIR_LINES=PAIR_LINES,
                          PAIR_THREADS=PAIR_THREADS)  # the constants kernels/ptycho.cu takes from Python


def kernel(name: str) -> cupy.RawKernel:
    return compile.kernel("ptycho.cu", name, DEFINES)


def fused_launches(R: int, C: int, n: int, measured_type: str) -> tuple[Launch, Launch, Launch] | None:
    """rows_forward, columns and rows_inverse for a batch of n positions of R x C windows (measured patterns of
    C type ``measured_type``), or None where a side has no ``line`` (the batch then goes through cuFFT)."""
    column, row = line(R, MAX_FFT), line(C, MAX_FFT)
    if column is None or row is None:
        return None
    row_smem = row.shared_points(ROW_WARPS) * 8
    return (Launch(f"rows_forward<{row.name}>", (math.ceil(n * R / ROW_WARPS),), 32 * ROW_WARPS, row_smem),
            Launch(f"columns<{measured_type}, {column.name}>", (math.ceil(C / TILE_C), n), 32 * TILE_C, column.shared_points(TILE_C) * 8),
            Launch(f"rows_inverse<{math.ceil(C / 32)}, {row.name}>", (math.ceil(R / ROW_WARPS), math.ceil(n / FUSED_GROUP)), 32 * ROW_WARPS,
                   row_smem))


def pair_launch(R: int, C: int, n: int, measured_type: str) -> tuple[Launch, int] | None:
    """far_field_pair for a batch of n positions of R x C windows, and its FFTs' scratch points; None for an odd R, a
    side (C, or R / 2) with no ``line``, or a half wave too large for a multiprocessor's shared memory."""
    row, half = line(C, MAX_FFT), line(R // 2, MAX_FFT) if R % 2 == 0 else None
    if row is None or half is None:
        return None
    scratch = PAIR_LINES * max(row.scratch_points, half.scratch_points)
    shared = ((R // 2) * padded(C) + scratch) * 8 + 32 * 8
    if shared > PAIR_SHARED:
        return None
    return Launch(f"far_field_pair<{measured_type}, {row.name}, {half.name}>", (2 * n,), PAIR_THREADS, shared), scratch


def clusters() -> bool:
    """Whether the current GPU launches thread-block clusters (compute capability 9.0 and later), which the pair
    path needs."""
    return int(cupy.cuda.Device().compute_capability) >= 90


def path_of(R: int, C: int, n: int, measured_type: str) -> str:
    """The first of PATHS that takes a batch of n R x C windows on the current GPU."""
    takes = {"fused": fused_launches(R, C, n, measured_type) is not None,
             "pair": clusters() and pair_launch(R, C, n, measured_type) is not None, "cufft": True}
    return next(path for path in PATHS if takes[path])


def updated_waves(obj, probe, measured, corners, batch: Batch, center: tuple[int, int], scale: float, numerator, denominator,
                  path: str | None = None):
    """The twin's ``updated_waves``, by ``path`` (default ``path_of``): "fused", three fused passes (kernels/ptycho.cu
    rows_forward, columns, rows_inverse, ``fused_launches``); "pair", one position per cluster of two CTAs
    (far_field_pair, ``pair_launch``), then the probe's sums; "cufft", step by step through cuFFT."""
    R, C = probe.shape
    measured_type = measured_ctype(measured)
    path = path or path_of(R, C, batch.n, measured_type)
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "pair" and not clusters():
        raise ValueError("the 'pair' path needs thread-block clusters, a GPU of compute capability 9.0 or later: use 'fused' or 'cufft'")
    if path == "cufft":
        far = fft2(exit_waves(obj, probe, corners, batch))
        error = project(far, measured, center, scale)
        updated = ifft2(far)
        probe_sums(obj, probe, updated, corners, batch, numerator, denominator)
        return updated, error
    launches = pair_launch(R, C, batch.n, measured_type) if path == "pair" else fused_launches(R, C, batch.n, measured_type)
    if launches is None:
        raise ValueError(f"the {path!r} path does not take {R} x {C} windows")
    device = cupy.cuda.Device().id
    run = lambda launch, args: compile.run("ptycho.cu", DEFINES, launch, args)  # noqa: E731
    wave = cupy.empty((batch.n, R, C), np.complex64)
    cols, first, n = np.int64(obj.shape[1]), np.int64(batch.first), np.int64(batch.n)
    counts, cr, cs = cupy.ascontiguousarray(measured), np.int32(center[0] % R), np.int32(center[1] % C)
    if path == "pair":
        pair, scratch = launches
        partial = cupy.empty(pair.grid[0], np.float64)
        run(pair, (obj, cols, probe, np.int32(R), np.int32(C), corners, first, counts, cr, cs, np.float32(scale), roots(C, device),
                   roots(R // 2, device), roots(R, device), np.int32(scratch), wave, partial))
        probe_sums(obj, probe, wave, corners, batch, numerator, denominator)
        return wave, partial.sum()
    forward, columns, inverse = launches
    run(forward, (obj, cols, probe, np.int32(R), np.int32(C), corners, first, n, roots(C, device), wave))
    partial = cupy.empty(math.prod(columns.grid), np.float64)
    run(columns, (wave, counts, np.int32(R), np.int32(C), cr, cs, np.float32(scale), roots(R, device), partial))
    top = cupy.empty((inverse.grid[1], R * C), np.complex64)
    bottom = cupy.empty((inverse.grid[1], R * C), np.float32)
    run(inverse, (wave, obj, cols, probe, np.int32(R), np.int32(C), corners, first, n, np.int32(FUSED_GROUP), roots(C, device), top, bottom))
    add_group_sums(top, bottom, numerator, denominator)
    return wave, partial.sum()


def exit_waves(obj, probe, corners, batch: Batch):
    R, C = probe.shape
    psi = cupy.empty((batch.n, R, C), np.complex64)
    kernel("exit_waves")((batch.n, math.ceil(R * C / THREADS)), (THREADS,),
                         (obj, np.int64(obj.shape[1]), probe, np.int32(R), np.int32(C), corners, np.int64(batch.first), psi))
    return psi


def fft2(psi):
    return cupyx.scipy.fft.fft2(psi, overwrite_x=True)


def ifft2(far):
    return cupyx.scipy.fft.ifft2(far, norm="forward", overwrite_x=True)


MEASURED = {np.dtype(np.float32): "float", np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short",
            np.dtype(np.uint32): "unsigned int"}  # amplitudes, or counts whose square roots the kernel takes


def measured_ctype(measured) -> str:
    """The kernels' type of the measured patterns; ValueError for one they do not take."""
    if measured.dtype not in MEASURED:
        raise ValueError(f"measured patterns are float32 amplitudes or uint8/16/32 counts, got {measured.dtype}")
    return MEASURED[measured.dtype]


def project(far, measured, center: tuple[int, int], scale: float):
    n, R, C = far.shape
    measured_type = measured_ctype(measured)
    blocks = (n, math.ceil(R * C / THREADS))
    partial = cupy.empty(blocks[0] * blocks[1], np.float64)
    kernel(f"project<{measured_type}>")(
        blocks, (THREADS,), (far, cupy.ascontiguousarray(measured), np.int32(R), np.int32(C), np.int32(center[0] % R),
                             np.int32(center[1] % C), np.float32(scale), partial))
    return partial.sum()


def probe_sums(obj, probe, updated, corners, batch: Batch, numerator, denominator) -> None:
    R, C = probe.shape
    groups = math.ceil(batch.n / PER_GROUP)
    top = cupy.empty((groups, R * C), np.complex64)
    bottom = cupy.empty((groups, R * C), np.float32)
    kernel("probe_sums")((math.ceil(R * C / THREADS), groups), (THREADS,),
                         (obj, np.int64(obj.shape[1]), probe, updated, np.int32(R), np.int32(C), corners, np.int64(batch.first),
                          np.int64(batch.n), np.int32(PER_GROUP), top, bottom))
    add_group_sums(top, bottom, numerator, denominator)


def add_group_sums(top, bottom, numerator, denominator) -> None:
    """The probe's sums of each group of positions, added to its running numerator and denominator."""
    numerator += top.sum(axis=0).reshape(numerator.shape)
    denominator += bottom.sum(axis=0).reshape(denominator.shape)


def object_update(obj, probe, updated, corners, batch: Batch, step: float, floor: float) -> None:
    R, C = probe.shape
    row0, row1, col0, col1 = batch.box
    kernel("object_update")((math.ceil((col1 - col0) / TILE_COLS), math.ceil((row1 - row0) / TILE_ROWS)), (THREADS,),
                            (obj, np.int64(obj.shape[1]), np.int64(row0), np.int64(row1), np.int64(col0), np.int64(col1), probe, updated,
                             np.int32(R), np.int32(C), corners, np.int64(batch.first), np.int64(batch.n), np.float32(step), np.float32(floor)))
