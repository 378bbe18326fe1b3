"""The resident interface: what every layout (dense, compressed) answers, exactly.

A layout implements four kernels over flat frames (``mask_sums``,
``roi_sum``, ``roi_max``, ``frame_flat``); this base turns user arguments into
kernel arguments and kernel results into the shapes users see, so every
layout validates and shapes results the same way.
"""

from __future__ import annotations

import hashlib
import importlib
from abc import ABC, abstractmethod
from types import ModuleType
from typing import Any, Callable

import numpy as np

from ..device import synchronize, to_host
from . import feed
from .masks import MaskWeights, mask_weights

CHECKSUM_BYTES = 64 * 2**20  # counts hashed per copy to the host
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in ("uint8", "uint16", "uint32", "int8", "int16", "int32", "float32", "float64"))
REDUCE_OPS = ("sum", "mean", "max")


def kernels_for(xp: ModuleType, layout: str) -> ModuleType:
    """The kernels of ``layout`` ("dense", "compressed") for an array module: ``cuda.<layout>`` (CuPy and
    kernels/*.cu) for CuPy, ``cpu.<layout>`` (Numba) for NumPy; imported on first use, so CPU processes
    never import CuPy."""
    return importlib.import_module(f"{__package__}.{'cpu' if xp is np else 'cuda'}.{layout}")


def check_dtype(dtype) -> np.dtype:
    """The acquisition dtype in native byte order (counts stored big- or little-endian are held native), or
    ValueError naming the supported ones."""
    dtype = np.dtype(dtype)
    native = dtype.newbyteorder("=")
    if native not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise ValueError(f"dtype {dtype} is not supported (supported: {names}, in either byte order)")
    return native


def check_shape(shape) -> tuple[int, int, int, int]:
    """A 4-D acquisition shape (scan_rows, scan_cols, det_rows, det_cols) with no empty axis."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 4:
        raise ValueError(f"an acquisition is 4-D (scan_rows, scan_cols, det_rows, det_cols), got shape {shape}")
    if min(shape) < 1:
        raise ValueError(f"acquisition shape {shape} has an empty axis")
    return shape


def out_of_range(what: str, value: int, axis: str, scan_shape: tuple[int, int]) -> IndexError:
    """The error for ``what`` (a scan index along ``axis``, "row" or "col") at ``value``, outside the scan: it
    names the index and the valid range, the same words wherever a scan position is given."""
    rows, cols = scan_shape
    size = rows if axis == "row" else cols
    return IndexError(f"{what} {value} is out of range: {axis}s are 0 to {size - 1} (a scan of {rows} x {cols})")


def roi_indices(roi, scan_shape: tuple[int, int]) -> np.ndarray:
    """Flat indices (int64, C order) of the scan positions a bool ROI selects; None selects all."""
    n = scan_shape[0] * scan_shape[1]
    if roi is None:
        return np.arange(n, dtype=np.int64)
    roi = np.asarray(roi)
    if roi.dtype != np.bool_:
        raise ValueError(f"roi must be a bool array of the scan shape {scan_shape}, got dtype {roi.dtype}")
    if roi.shape != tuple(scan_shape):
        raise ValueError(f"roi has shape {roi.shape}, but the scan is {tuple(scan_shape)}")
    return np.flatnonzero(roi).astype(np.int64)


class AcquisitionShape:
    """Named views of a 4-D ``shape`` (scan_rows, scan_cols, det_rows, det_cols), for residents and handles."""

    shape: tuple[int, int, int, int]

    @property
    def scan_shape(self) -> tuple[int, int]:
        return tuple(self.shape[:2])

    @property
    def det_shape(self) -> tuple[int, int]:
        return tuple(self.shape[2:])

    @property
    def n_frames(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def frame_len(self) -> int:
        return self.shape[2] * self.shape[3]


class Resident(AcquisitionShape, ABC):
    """One acquisition held in a worker's device memory in a query-ready layout."""

    layout: str = ""

    def __init__(self, name: str, shape, dtype, xp: ModuleType):
        self.name = name
        self.shape = check_shape(shape)
        self.dtype = check_dtype(dtype)
        self.xp = xp

    @property
    def raw_bytes(self) -> int:
        """Bytes of the counts as a dense array."""
        return self.n_frames * self.frame_len * self.dtype.itemsize

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Device bytes this resident holds."""

    @abstractmethod
    def prepare_mask_sums(self, masks: MaskWeights) -> Callable[[], Any]:
        """``run()`` giving (n_masks, n_frames) exact sums in ``masks.acc_dtype`` on the device; the
        preparation (weights on the device, kernel choice) is done here, once."""

    @abstractmethod
    def roi_sum(self, indices):
        """(frame_len,) exact sum over the frames host int64 ``indices`` selects, on the device."""

    @abstractmethod
    def roi_max(self, indices):
        """(frame_len,) max over the selected frames, native dtype, on the device."""

    @abstractmethod
    def counts_flat(self):
        """Every count as a (n_frames, frame_len) device array: the held array, or a decoded copy."""

    @abstractmethod
    def pixel_images(self, indices: np.ndarray):
        """(len(indices), n_frames) float32 C-contiguous device array: the image of each given flat detector
        pixel (host int64 ``indices``), decoding only those pixels."""

    @abstractmethod
    def frame_flat(self, index: int):
        """One frame, (frame_len,) native dtype, on the device (or on the host, where it was made there)."""

    @abstractmethod
    def frames_flat(self, lo: int, hi: int):
        """Frames [lo, hi) as a (hi - lo, frame_len) native-dtype device array: a view of the held counts,
        or only those frames decoded."""

    def settled(self, result):
        """``result`` once this thread's stream has made it: appended frames are in place before the lock lets
        a query see them, and a query's reads are done before what it read may be freed."""
        if self.xp is not np:
            synchronize()
        return result

    def checked_frames(self, frames):
        """``frames`` to append: (n, det_rows, det_cols) of this dtype (NumPy frames of the other byte order made
        native); ValueError for another shape or dtype."""
        if getattr(frames, "ndim", None) != 3 or tuple(frames.shape[1:]) != self.det_shape:
            raise ValueError(f"frames must be (n, {self.det_shape[0]}, {self.det_shape[1]}), got shape {getattr(frames, 'shape', None)}")
        if frames.dtype != self.dtype and frames.dtype.newbyteorder("=") == self.dtype:
            frames = np.asarray(frames, self.dtype)  # NumPy frames of the other byte order
        if frames.dtype != self.dtype:
            raise ValueError(f"frames are {frames.dtype}, the acquisition {self.name!r} holds {self.dtype}")
        return frames

    def check_to_come(self, received: int, n: int) -> None:
        """ValueError unless ``n`` more frames fit after the ``received`` ones."""
        if received + n > self.n_frames:
            raise ValueError(f"{n} frames would pass the scan of {self.n_frames} positions of {self.name!r}: "
                             f"{received} received, {self.n_frames - received} to come")

    feed_grain: tuple[int, int] = (1, 1)
    """(unit, units): frames the feed best makes together come in whole units (a compressed resident's codec
    blocks), ``units`` of them at once fill the device."""

    def feed_frames(self, lo: int, hi: int, amplitude: bool, out=None):
        """Frames [lo, hi) for the feed, (hi - lo, frame_len): the counts (a view where they are held as they
        are), or float32 sqrt(counts) into ``out``; with a ``done()`` that raises if they were malformed, to
        call before they are used (a GPU decode reports only once it is through)."""
        counts = self.frames_flat(lo, hi)
        if amplitude:
            counts = self.xp.sqrt(counts, dtype=np.float32, out=out)
        return counts, lambda: None

    def feed(self, block_scans: int = 512, amplitude: bool = True, depth: int = 2):
        """Blocks of ``block_scans`` consecutive scan positions (C order) as device arrays
        (scans_in_block, det_rows, det_cols): native counts, or float32 sqrt(counts) with ``amplitude``;
        made ``depth`` blocks ahead of the consumer (``resident.feed``). Each block is valid until the next
        is asked for."""
        return feed.feed(self, block_scans, amplitude, depth)

    def virtual_images(self, masks) -> np.ndarray:
        """(n_masks, scan_rows, scan_cols) exact sums of each mask; NumPy."""
        return self.plan_virtual_images(masks)()

    def plan_virtual_images(self, masks) -> "Plan":
        """A ready query: ``plan()`` returns the virtual images of ``masks`` (raw or prepared weights).

        Checking the masks, choosing the accumulator and preparing the kernel
        happen here once; a shard keeps plans for masks users repeat.
        """
        weights = masks if isinstance(masks, MaskWeights) else mask_weights(masks, self.det_shape, self.dtype)
        return Plan(self.prepare_mask_sums(weights), (weights.n_masks, *self.scan_shape))

    def reduce(self, roi=None, op: str = "sum") -> np.ndarray:
        """Per-pixel sum (uint64 / int64 / float64), mean (float64) or max (native) over a scan ROI; NumPy."""
        total, count = self.reduce_parts(roi, op)
        return finish_reduce(total, count, op)

    nothing_selected = "the roi selects no scan position"

    def selected(self, roi) -> np.ndarray:
        """Flat indices of the scan positions a reduction over ``roi`` takes."""
        return roi_indices(roi, self.scan_shape)

    def reduce_parts(self, roi, op: str) -> tuple[np.ndarray, int]:
        """The exact partial result of a reduction (sum or max pattern) and the frame count, for combining."""
        if op not in REDUCE_OPS:
            raise ValueError(f"unknown reduce op {op!r}: use one of {', '.join(REDUCE_OPS)}")
        indices = self.selected(roi)
        if indices.size == 0:
            if op != "sum":
                raise ValueError(f"{self.nothing_selected}: {op} is undefined")
            from .cpu.dense import sum_dtype

            return np.zeros(self.det_shape, dtype=sum_dtype(self.dtype)), 0
        out = self.roi_max(indices) if op == "max" else self.roi_sum(indices)
        return to_host(out).reshape(self.det_shape), int(indices.size)

    def frame(self, row: int, col: int) -> np.ndarray:
        """The diffraction pattern at scan position (row, col), native dtype; NumPy. A negative index is out of
        range (it does not count from the end)."""
        for axis, value in (("row", row), ("col", col)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise IndexError(f"scan {axis} index must be an integer, got {value!r}")
            if not 0 <= value < self.scan_shape[axis == "col"]:
                raise out_of_range(f"scan {axis}", int(value), axis, self.scan_shape)
        return to_host(self.frame_flat(int(row) * self.scan_shape[1] + int(col))).reshape(self.det_shape)

    def checksum(self, chunk_bytes: int = CHECKSUM_BYTES) -> str:
        """SHA-256 hex digest of the logical counts: C order, little-endian native dtype, shape
        (scan_rows, scan_cols, det_rows, det_cols); the same for every reader and layout."""
        digest = hashlib.sha256()
        step = max(1, chunk_bytes // (self.frame_len * self.dtype.itemsize))
        little = self.dtype.newbyteorder("<")
        for start in range(0, self.n_frames, step):
            block = np.ascontiguousarray(to_host(self.frames_flat(start, min(start + step, self.n_frames))), dtype=little)
            digest.update(block.data)
        return digest.hexdigest()

    def describe(self) -> dict:
        """Shape, dtype, layout and bytes, for catalogs and ``acq.info()``."""
        return {
            "name": self.name,
            "shape": self.shape,
            "dtype": str(self.dtype),
            "layout": self.layout,
            "nbytes": self.nbytes,
            "raw_bytes": self.raw_bytes,
        }


class Plan:
    """A prepared virtual-image query: ``plan()`` answers it on the host; ``plan.launch()`` only starts its
    kernels (on the current stream) and returns ``finish()``, which gives the result where it was made (on the
    device, once the stream has run), so a shard can run several residents' plans at once and copy each
    result straight to where its reply goes."""

    def __init__(self, run: Callable, shape: tuple[int, ...]):
        self.run = run
        self.shape = shape

    def launch(self) -> Callable:
        start = getattr(self.run, "launch", None)
        if start is None:
            result = self.run()  # kernels queued on the stream
            return lambda: result.reshape(self.shape)
        finish = start()
        return lambda: finish().reshape(self.shape)

    def __call__(self) -> np.ndarray:
        return to_host(self.launch()())


def combine_parts(parts: list[tuple[np.ndarray, int]], op: str) -> tuple[np.ndarray, int]:
    """One exact partial from several (a series total): sums add, maxima take the larger, counts add."""
    total, count = parts[0]
    for part, n in parts[1:]:
        if op == "max":
            total = np.maximum(total, part)
        else:
            total = total + part
        count += n
    return total, count


def finish_reduce(total: np.ndarray, count: int, op: str) -> np.ndarray:
    """The user's result from an exact partial: sums and maxima as they are, mean = sum / count in float64."""
    if op == "mean":
        return total.astype(np.float64) / count
    return total
