"""What every reader is and shares: the Reader protocol, its optional decode-into capability, the Format a
reader module registers, and the shape and block helpers readers use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol, runtime_checkable

import numpy as np

from ..source import Source

BLOCK_BYTES = 64 * 2**20


class Reader(Protocol):
    """An open source: its format (``kind``, as ``qd.inspect`` names it), ``compression``, 4-D shape and
    native dtype, and its frames in blocks."""

    kind: str
    shape: tuple[int, int, int, int]
    dtype: np.dtype

    @property
    def compression(self) -> str:
        """How the file stores the counts ("none", filter names, "bitshuffle-lz4")."""
        ...

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        """(first frame index, frames (n, det_rows, det_cols)) in scan order."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class DecodesInto(Protocol):
    """A reader that decodes into memory it is given (a host resident, or pinned buffers bound for the device),
    so a load copies no block again; ``isinstance(reader, DecodesInto)`` tells."""

    def blocks_into(self, target: Callable[[int, int], np.ndarray], block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        """(first frame, frames) of every block, decoded into ``target(first, n)``, a C-contiguous (n, rows, cols) array."""
        ...


@runtime_checkable
class ReadsFrames(Protocol):
    """A reader that reads any scan positions at little cost (a chunked or mapped file), so a coded load can take
    its model from frames spread over the scan; ``isinstance(reader, ReadsFrames)`` tells."""

    def frames(self, start: int, n: int) -> np.ndarray:
        """Frames start .. start + n, (n, det_rows, det_cols) in native byte order."""
        ...


@runtime_checkable
class SendsChunks(Protocol):
    """A reader of bitshuffle-LZ4 frames that hands on their stored chunks undecoded, for a GPU to decode (about
    9 times fewer bytes than the counts cross to the device at low dose); ``isinstance(reader, SendsChunks)`` tells."""

    def chunk_batches(self, buffer: Callable[[int], np.ndarray], block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, object]]:
        """(first frame, ``batches.Chunks`` or decoded frames) of every block, the stored bytes in ``buffer(nbytes)``."""
        ...

    def where(self, frame: int) -> str:
        """Where the chunk of scan position ``frame`` is stored, for an error about it."""
        ...


@runtime_checkable
class KeepsPositions(Protocol):
    """A reader of a scan whose positions are not a raster's: its frames as one scan row (1, n) in the order
    recorded, and ``positions``, (n, 2) float64 (row, col) of each in scan pixels, which the acquisition keeps
    (``acq.positions``); ``isinstance(reader, KeepsPositions)`` tells."""

    positions: np.ndarray


@dataclass(frozen=True)
class Format:
    """A file format a reader module registers: ``detect(path, dataset)`` tells from the content at ``path``
    (and the dataset asked for, where the format is a layout of one) whether it is this format, ``open(path,
    source)`` opens it; ``what`` names such a file for an error ("a .npy array")."""

    name: str
    detect: Callable[[Path, str | None], bool]
    open: Callable[[Path, Source], Reader]
    what: str


class ScanShapeNeeded(ValueError):
    """A stack of ``frames`` frames whose scan shape cannot be known from the file: ``scan_shape`` is needed."""

    def __init__(self, message: str, frames: int):
        super().__init__(message)
        self.frames = frames

    def __reduce__(self):  # raised on a worker, it is pickled to the client with both arguments
        return type(self), (str(self), self.frames)


def as_4d(shape: tuple[int, ...], scan_shape: tuple[int, int] | None, what: str) -> tuple[int, int, int, int]:
    """The 4-D shape of a 3-D stack (with ``scan_shape``) or a 4-D array; ValueError otherwise."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 4:
        if scan_shape is not None and tuple(scan_shape) != shape[:2]:
            raise ValueError(f"{what} has scan shape {shape[:2]}, but scan_shape={tuple(scan_shape)} was given")
        return shape
    if len(shape) == 3:
        if scan_shape is None:
            raise ScanShapeNeeded(f"{what} is a 3-D stack of {shape[0]} frames: give scan_shape=(rows, cols)", shape[0])
        rows, cols = (int(s) for s in scan_shape)
        if rows * cols != shape[0]:
            raise ValueError(f"scan_shape {(rows, cols)} has {rows * cols} positions, but {what} holds {shape[0]} frames")
        return (rows, cols, shape[1], shape[2])
    raise ValueError(f"{what} is {len(shape)}-D with shape {shape}: an acquisition is a 3-D frame stack or 4-D")


def stack_shape(shape: tuple[int, ...], scan_shape: tuple[int, int] | None, where: str, noun: str, why: str) -> tuple[int, int, int, int]:
    """``as_4d`` of a file's stack; ScanShapeNeeded saying "the N ``noun`` of ``where`` come with ``why``" where
    a 3-D stack has no ``scan_shape``."""
    try:
        return as_4d(shape, scan_shape, where)
    except ScanShapeNeeded as err:
        raise ScanShapeNeeded(f"the {err.frames} {noun} of {where} come with {why}: give scan_shape=(rows, cols)", err.frames) from None


def frames_per_block(shape: tuple[int, int, int, int], dtype: np.dtype, block_bytes: int) -> int:
    """How many whole scan rows of frames fit in ``block_bytes`` (at least one frame), in frames."""
    frame_bytes = shape[2] * shape[3] * np.dtype(dtype).itemsize
    row_frames = shape[1]
    rows = max(1, block_bytes // (frame_bytes * row_frames))
    if rows == 1 and frame_bytes * row_frames > block_bytes:
        return max(1, block_bytes // frame_bytes)
    return rows * row_frames


def native_order(dtype) -> np.dtype:
    """``dtype`` in this machine's byte order: readers hand residents native counts whatever the file holds."""
    return np.dtype(dtype).newbyteorder("=")


def array_blocks(array, shape: tuple[int, int, int, int], block_bytes: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first frame, frames (n, det_rows, det_cols)) blocks of whole scan rows where they fit, in native byte
    order, from any sliceable 3-D or 4-D array (h5py dataset, memmap, Zarr array)."""
    return frame_blocks(lambda start, n: array_frames(array, shape, start, n), shape, array.dtype, block_bytes)


def frame_blocks(frames: Callable[[int, int], np.ndarray], shape: tuple[int, int, int, int], dtype, block_bytes: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first frame, ``frames(first, n)``) of blocks of whole scan rows where they fit (``frames_per_block``)."""
    n_frames = shape[0] * shape[1]
    step = frames_per_block(shape, dtype, block_bytes)
    for start in range(0, n_frames, step):
        yield start, frames(start, min(step, n_frames - start))


def array_frames(array, shape: tuple[int, int, int, int], start: int, n: int) -> np.ndarray:
    """Frames start .. start + n (n, det_rows, det_cols) in native byte order, from any sliceable 3-D or 4-D array."""
    stop, cols = start + n, shape[1]
    if array.ndim == 3:
        block = array[start:stop]
    elif start % cols == 0 and stop % cols == 0:
        block = array[start // cols : stop // cols].reshape(-1, shape[2], shape[3])
    else:
        block = np.stack([array[i // cols, i % cols] for i in range(start, stop)])
    return np.asarray(block, dtype=native_order(block.dtype))
