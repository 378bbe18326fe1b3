"""CPU kernels (Numba) for dense counts: the twins of kernels/dense.cu.

Contract shared with ``qgpu_dask.resident.cuda.dense`` (same arguments, same
bits for integer results):

- ``mask_sums(data, span_start, weights) -> out`` (and
  ``prepare_mask_sums(...) -> run``, the same with the per-mask work done once): ``data`` is (n_frames,
  frame_len) C-contiguous in the native dtype; ``weights`` is (n_masks,
  span_len) C-contiguous in the accumulator dtype (uint32, uint64, int64 or
  float64); ``out[m, f] = sum_j weights[m, j] * data[f, span_start + j]`` over the
  nonzero weights (a masked-out NaN or inf count does not reach the sum),
  (n_masks, n_frames) in the accumulator dtype. The caller has proven that no
  partial sum can overflow it. The CUDA twin also takes NumPy weights.
- ``roi_reduce(data, indices, op) -> out``: ``indices`` is a non-empty int64
  NumPy array of frame indices; ``op`` "sum" gives (frame_len,) uint64 for unsigned
  data, int64 for signed, float64 for floats; "max" gives the native dtype,
  starting from the first selected frame.
- ``index_sums(data, det_cols) -> (lines, pattern, peak)`` for integer data: each frame's sums over
  its detector rows then its columns (n_frames, det_rows + det_cols) and the sum of every frame
  (frame_len,), in ``sum_dtype``, and the per-pixel max (frame_len,), native.
- ``line_sums(lines, weights) -> out``: ``out[m, f] = sum_j weights[m, j] * lines[f, j]`` for
  (n_masks, n_lines) weights of the lines' dtype, wrapping, (n_masks, n_frames).
"""

from __future__ import annotations

import types
from typing import Callable

import numba
import numpy as np


def mask_sums_loop(data, span_start, weights, starts, stops, out, floats):
    n_frames = data.shape[0]
    n_masks = weights.shape[0]
    for f in numba.prange(n_frames):
        for m in range(n_masks):
            a, b = starts[m], stops[m]  # this mask's own nonzero range inside the span
            w = weights[m, a:b]
            row = data[f, span_start + a : span_start + b]
            acc = weights[m, 0] * 0
            if floats:  # a zero weight leaves its pixel out, NaN and inf counts included
                for j in range(b - a):
                    if w[j] != 0:
                        acc += w[j] * row[j]
            else:
                for j in range(b - a):
                    acc += w[j] * row[j]
            out[m, f] = acc


@numba.njit(cache=True, inline="always")
def chunk_bounds(n, c, n_chunks):
    """[lo, hi) of chunk ``c`` when ``n`` selected frames are split into ``n_chunks`` nearly equal chunks."""
    return n * c // n_chunks, n * (c + 1) // n_chunks


def roi_sum_loop(data, indices, partial):
    n_chunks, frame_len = partial.shape
    n = indices.shape[0]
    for c in numba.prange(n_chunks):
        lo, hi = chunk_bounds(n, c, n_chunks)
        acc = partial[c]
        for i in range(lo, hi):
            row = data[indices[i]]
            for p in range(frame_len):
                acc[p] += row[p]


def roi_max_loop(data, indices, partial):
    n_chunks, frame_len = partial.shape
    n = indices.shape[0]
    for c in numba.prange(n_chunks):
        lo, hi = chunk_bounds(n, c, n_chunks)
        acc = partial[c]
        acc[:] = data[indices[lo]]
        for i in range(lo + 1, hi):
            row = data[indices[i]]
            for p in range(frame_len):
                v = row[p]
                if v > acc[p] or v != v:  # v != v: NaN propagates, as in NumPy
                    acc[p] = v


def index_loop(data, det_cols, lines, pattern, peak):
    n_chunks, frame_len = pattern.shape
    n = data.shape[0]
    det_rows = frame_len // det_cols
    for c in numba.prange(n_chunks):
        lo, hi = chunk_bounds(n, c, n_chunks)
        acc, top = pattern[c], peak[c]
        if hi > lo:
            top[:] = data[lo]
        for f in range(lo, hi):
            frame = data[f]
            line = lines[f]
            for r in range(det_rows):
                s = line[r]
                for k in range(det_cols):
                    p = r * det_cols + k
                    v = frame[p]
                    s += v
                    line[det_rows + k] += v
                    acc[p] += v
                    if v > top[p]:
                        top[p] = v
                line[r] = s


def line_sums_loop(lines, weights, out):
    n_masks, n_lines = weights.shape
    for f in numba.prange(lines.shape[0]):
        row = lines[f]
        for m in range(n_masks):
            w = weights[m]
            acc = w[0] * 0
            for j in range(n_lines):
                acc += w[j] * row[j]
            out[m, f] = acc


PARALLEL_BYTES = 2**20


def serial_and_threaded(loop):
    """``loop`` compiled twice: serial for small inputs (starting threads costs more than
    the work, much more with several worker processes on few cores) and threaded.

    The threaded copy gets its own name: Numba's on-disk cache is keyed by the
    function's name, not by ``parallel``, so two compilations under one name
    would load each other's machine code.
    """
    copy = types.FunctionType(loop.__code__, loop.__globals__, loop.__name__ + "_threaded", loop.__defaults__, loop.__closure__)
    copy.__qualname__ = loop.__qualname__ + "_threaded"
    return numba.njit(cache=True, nogil=True)(loop), numba.njit(parallel=True, cache=True, nogil=True)(copy)


mask_sums_kernels = serial_and_threaded(mask_sums_loop)
roi_sum_kernels = serial_and_threaded(roi_sum_loop)
roi_max_kernels = serial_and_threaded(roi_max_loop)
index_kernels = serial_and_threaded(index_loop)
line_sums_kernels = serial_and_threaded(line_sums_loop)


def threaded(nbytes: int) -> int:
    """1 (use the threaded kernel) when ``nbytes`` of input is worth spreading over threads, else 0."""
    return int(nbytes >= PARALLEL_BYTES)


def sum_dtype(dtype: np.dtype) -> np.dtype:
    """Exact sum dtype of a pattern: uint64 for unsigned, int64 for signed, float64 for floats."""
    dtype = np.dtype(dtype)
    if dtype.kind == "u":
        return np.dtype(np.uint64)
    if dtype.kind == "i":
        return np.dtype(np.int64)
    return np.dtype(np.float64)


def mask_sums(data: np.ndarray, span_start: int, weights: np.ndarray) -> np.ndarray:
    return prepare_mask_sums(data, span_start, weights)()


def prepare_mask_sums(data: np.ndarray, span_start: int, weights: np.ndarray) -> Callable[[], np.ndarray]:
    """Everything ``mask_sums`` works out from the weights, done once; ``run()`` computes ``out``."""
    nonzero = weights != 0
    any_nonzero = nonzero.any(axis=1)
    starts = np.where(any_nonzero, nonzero.argmax(axis=1), 0).astype(np.int64)
    stops = np.where(any_nonzero, weights.shape[1] - nonzero[:, ::-1].argmax(axis=1), 0).astype(np.int64)
    kernel = mask_sums_kernels[threaded(data.shape[0] * int((stops - starts).sum()) * data.itemsize)]

    def run() -> np.ndarray:
        out = np.empty((weights.shape[0], data.shape[0]), dtype=weights.dtype)
        if data.shape[0]:
            kernel(data, span_start, weights, starts, stops, out, weights.dtype.kind == "f")
        return out

    return run


def chunk_count(n_selected: int, parallel: int) -> int:
    """How many partial patterns a reduction over ``n_selected`` frames is split into."""
    return max(1, min(n_selected, 4 * numba.get_num_threads())) if parallel else 1


def roi_reduce(data: np.ndarray, indices: np.ndarray, op: str) -> np.ndarray:
    parallel = threaded(len(indices) * data.shape[1] * data.itemsize)
    n_chunks = chunk_count(len(indices), parallel)
    if op == "sum":
        partial = np.zeros((n_chunks, data.shape[1]), dtype=sum_dtype(data.dtype))
        roi_sum_kernels[parallel](data, indices, partial)
        return partial.sum(axis=0, dtype=partial.dtype)
    if op == "max":
        partial = np.empty((n_chunks, data.shape[1]), dtype=data.dtype)
        roi_max_kernels[parallel](data, indices, partial)
        return partial.max(axis=0)
    raise ValueError(f"unknown reduction op {op!r}")


def index_sums(data: np.ndarray, det_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_frames, frame_len = data.shape
    acc = sum_dtype(data.dtype)
    parallel = threaded(data.nbytes)
    n_chunks = chunk_count(n_frames, parallel)
    lines = np.zeros((n_frames, frame_len // det_cols + det_cols), dtype=acc)
    pattern = np.zeros((n_chunks, frame_len), dtype=acc)
    peak = np.empty((n_chunks, frame_len), dtype=data.dtype)
    index_kernels[parallel](data, det_cols, lines, pattern, peak)
    return lines, pattern.sum(axis=0, dtype=acc), peak.max(axis=0)


def line_sums(lines: np.ndarray, weights: np.ndarray) -> np.ndarray:
    out = np.empty((weights.shape[0], lines.shape[0]), dtype=lines.dtype)
    line_sums_kernels[threaded(lines.nbytes)](lines, weights, out)
    return out


def pixel_images(data: np.ndarray, pixels: np.ndarray) -> np.ndarray:
    """(len(pixels), n_frames) float32: the image of each flat detector pixel in int64 ``pixels``."""
    return np.ascontiguousarray(data[:, np.asarray(pixels, dtype=np.int64)].T, dtype=np.float32)
