"""Mask weights for exact virtual images: validation and the accumulator dtype.

A stack of masks becomes integer or float64 weights over the detector rows the
masks touch (the span), in the dtype their exact sum needs: uint32 when
``max count x sum of weights`` fits, else uint64; int64 for signed data or
negative weights; float64 for float data or float masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class MaskWeights:
    """Masks ready for a kernel: ``weights[m, j]`` applies to flat detector pixel ``span_start + j``."""

    span_start: int
    weights: np.ndarray  # (n_masks, span_len), C order, in ``acc_dtype``
    acc_dtype: np.dtype

    @property
    def n_masks(self) -> int:
        return self.weights.shape[0]


def as_mask_stack(masks, det_shape: tuple[int, int]) -> np.ndarray:
    """(n_masks, det_rows, det_cols) from one 2-D mask, a list of them or a 3-D stack; checks shapes."""
    if isinstance(masks, (list, tuple)):
        if not masks:
            raise ValueError("no masks given")
        arrays = [np.asarray(m) for m in masks]
        for i, m in enumerate(arrays):
            if m.shape != tuple(det_shape):
                raise ValueError(f"mask {i} has shape {m.shape}, but the detector is {tuple(det_shape)}")
        stack = np.stack(arrays)
    else:
        stack = np.asarray(masks)
        if stack.ndim == 2:
            stack = stack[None]
        if stack.ndim != 3 or stack.shape[1:] != tuple(det_shape):
            raise ValueError(f"mask has shape {np.asarray(masks).shape}, but the detector is {tuple(det_shape)}")
    if stack.shape[0] == 0:
        raise ValueError("no masks given")
    if stack.dtype.kind not in "biuf":
        raise ValueError(f"mask dtype {stack.dtype} is not bool, integer or float")
    return stack


def count_bound(dtype: np.dtype) -> int:
    """Largest absolute count a value of ``dtype`` can hold (integer data)."""
    info = np.iinfo(dtype)
    return max(int(info.max), -int(info.min))


def largest_abs_sum(span: np.ndarray) -> int:
    """max over masks of sum |w|, exactly (int64 where it cannot overflow, Python ints otherwise)."""
    if span.dtype == np.bool_:
        return int(span.sum(axis=1).max())
    if int(span.min()) > -INT64_MAX and int(np.abs(span).max()) <= INT64_MAX // span.shape[1]:
        return int(np.abs(span.astype(np.int64)).sum(axis=1).max())
    return max(int(np.abs(row[row != 0].astype(object)).sum()) for row in span)


def mask_weights(masks, det_shape: tuple[int, int], data_dtype) -> MaskWeights:
    """Validate ``masks`` against the detector and choose the exact accumulator for ``data_dtype``."""
    data_dtype = np.dtype(data_dtype)
    stack = as_mask_stack(masks, det_shape)
    flat = stack.reshape(stack.shape[0], -1)
    if stack.dtype.kind == "f" and not np.isfinite(flat).all():
        bad = int(np.flatnonzero(~np.isfinite(flat).all(axis=1))[0])
        raise ValueError(f"mask {bad} has NaN or infinite weights")
    nonzero = flat != 0
    empty = np.flatnonzero(~nonzero.any(axis=1))
    if empty.size:
        raise ValueError(f"mask {int(empty[0])} is all zero: it selects no detector pixel")
    rows = np.flatnonzero(nonzero.reshape(stack.shape).any(axis=(0, 2)))
    cols = det_shape[1]
    span_start, span_stop = int(rows[0]) * cols, (int(rows[-1]) + 1) * cols
    span = flat[:, span_start:span_stop]

    if stack.dtype.kind == "f" or data_dtype.kind == "f":
        acc = np.dtype(np.float64)
    else:
        if stack.dtype == np.uint64 and int(span.max()) > INT64_MAX:
            raise ValueError("mask weights above 2**63 - 1 are not supported")
        signed = data_dtype.kind == "i" or (stack.dtype.kind == "i" and int(span.min()) < 0)
        weight_total = largest_abs_sum(span)
        bound = count_bound(data_dtype) * weight_total
        if signed:
            if bound > INT64_MAX:
                raise ValueError(f"mask weights too large: sums could reach {bound}, beyond int64")
            acc = np.dtype(np.int64)
        elif bound <= UINT32_MAX:
            acc = np.dtype(np.uint32)
        elif bound <= UINT64_MAX:
            acc = np.dtype(np.uint64)
        else:
            raise ValueError(f"mask weights too large: sums could reach {bound}, beyond uint64")
    return MaskWeights(span_start, np.ascontiguousarray(span, dtype=acc), acc)


def line_weights(masks: MaskWeights, det_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the masks whose weight at (row, col) is ``a[row] + b[col]``, their a (k, det_rows), their b (k, det_cols)),
    int64, for integer weights: such a mask's sum over a frame is that of a over its row sums plus b over its
    column sums (moments, row or column bands, the whole detector), exact in wrapping arithmetic."""
    rows, cols = det_shape
    w = masks.weights.astype(np.int64).reshape(masks.n_masks, -1, cols)  # weights fit int64 (mask_weights refuses more)
    first, n_rows = masks.span_start // cols, w.shape[1]
    a = w[:, :, 0]
    b = w[:, 0, :] - w[:, :1, 0]
    fits = (w == a[:, :, None] + b[:, None, :]).all(axis=(1, 2))
    if n_rows < rows:  # the zero rows outside the span leave b no room but 0
        fits &= ~b.any(axis=1)
    which = np.flatnonzero(fits)
    full = np.zeros((which.size, rows), dtype=np.int64)
    full[:, first : first + n_rows] = a[which]
    return which, full, b[which]
