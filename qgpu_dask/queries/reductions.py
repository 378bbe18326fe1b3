"""Exact reductions over scan positions (sum, mean, max patterns), single frames and checksums of the counts."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..device import use_own_stream
from ..resident import Resident, combine_parts, finish_reduce
from ..resident.base import REDUCE_OPS
from .base import Context, Query, ordered, register

HASHERS = os.cpu_count() or 1  # acquisitions of a series hashed at a time


@register
class Reduce(Query):
    """Per detector pixel over a bool scan ROI (None: all), one pattern per acquisition (n, det_rows,
    det_cols): "sum" (uint64; int64 signed), "mean" (float64), "max" (native); ``total``: one pattern,
    the exact reduction over the whole series (partials added on each shard, then here)."""

    name = "reduce"
    inline = True

    def __init__(self, series, roi=None, op: str = "sum", total: bool = False):
        if op not in REDUCE_OPS:
            raise ValueError(f"unknown reduce op {op!r}: use one of {', '.join(REDUCE_OPS)}")
        series.same("scan_shape")
        series.same("det_shape")
        if total:
            series.same("dtype")
        self.roi, self.op, self.total = roi, op, bool(total)

    def arguments(self) -> tuple:
        return self.roi, self.op, self.total

    @staticmethod
    def run(ctx: Context, residents: list[Resident], roi, op: str, total: bool) -> list[tuple[np.ndarray, int]]:
        """Exact partials (pattern, frame count) per resident, or one combined partial with ``total``."""
        parts = [r.reduce_parts(roi, op) for r in residents]
        return [combine_parts(parts, op)] if total else parts

    def merge(self, replies: list, positions: list[list[int]]) -> np.ndarray:
        if self.total:
            return finish_reduce(*combine_parts([reply[0] for reply in replies], self.op), self.op)
        return np.stack([finish_reduce(*part, self.op) for part in ordered(replies, positions)])

    def single(self, result: np.ndarray) -> np.ndarray:
        return result if self.total else result[0]


@register
class Frame(Query):
    """The diffraction pattern at scan position (row, col) of every acquisition, native dtype."""

    name = "frame"
    inline = True

    @staticmethod
    def reads(residents: list[Resident], row: int, col: int) -> int:
        return sum(r.frame_len * r.dtype.itemsize for r in residents)

    @staticmethod
    def run(ctx: Context, residents: list[Resident], row: int, col: int) -> list[np.ndarray]:
        return [r.frame(row, col) for r in residents]

    def assemble(self, parts: list) -> np.ndarray:
        return np.stack(parts) if len(parts) > 1 else parts[0][None]  # one acquisition's: no copy


@register
class Checksum(Query):
    """SHA-256 hex digest of each acquisition's counts (C order, native dtype, 4-D shape), the same for
    every reader and layout (``Resident.checksum``); on the load thread: it reads everything. A series'
    acquisitions are hashed side by side on HASHERS threads (SHA-256 runs at about 2 GB/s on one core)."""

    name = "checksum"
    thread = "load"
    long = True

    @staticmethod
    def run(ctx: Context, residents: list[Resident]) -> list[str]:
        with ThreadPoolExecutor(max(1, min(HASHERS, len(residents))), thread_name_prefix="qgpu-checksum", initializer=use_own_stream) as pool:
            return list(pool.map(lambda r: r.checksum(), residents))
