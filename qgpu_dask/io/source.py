"""Sources: where an acquisition's counts come from, and readers that stream them in blocks.

A ``Source`` is a small picklable description (path, dataset, scan shape) that
a shard opens itself, so counts go from the file straight to the owning worker
and an acquisition can be read again from it later. The format is found from
the file's content (HDF5 signature, NumPy magic, Zarr metadata, the saved
resident magic), not its name; only EMPAD .raw files, which have no magic, are
known by their extension and size. A saved resident ("qgpu") is opened whole
by ``io.saved``, not streamed by a reader. HDF5 datasets stored one gzip chunk
per frame are inflated on several cores (``io.gzip_stack``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

import numpy as np

from ..formats.container import is_container

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
NPY_MAGIC = b"\x93NUMPY"
BLOCK_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Source:
    """A file (or Zarr store) holding one acquisition."""

    path: str
    dataset: str | None = None
    scan_shape: tuple[int, int] | None = None

    def describe(self) -> dict:
        return {"path": self.path, "dataset": self.dataset, "scan_shape": self.scan_shape}


class Reader(Protocol):
    """An open source: its 4-D shape and dtype, and its frames in blocks."""

    shape: tuple[int, int, int, int]
    dtype: np.dtype

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        """(first frame index, frames (n, det_rows, det_cols)) in scan order."""
        ...

    def close(self) -> None: ...


def detect_format(path: Path) -> str:
    """'hdf5', 'npy', 'zarr', 'qgpu' (a saved resident) or 'empad' from the content at ``path``; ValueError naming what was found otherwise.

    EMPAD .raw files are bare float32 frames with no magic: a file is taken as
    one when it has none of the other formats' signatures, its name ends
    ``.raw``, and its size is a positive multiple of the 130 x 128 x 4-byte
    frame; a .raw file of any other size is refused, naming its size and the
    frame size.
    """
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {str(path)!r}")
    if path.is_dir():
        if (path / "zarr.json").exists() or (path / ".zarray").exists() or (path / ".zgroup").exists():
            return "zarr"
        raise ValueError(f"{str(path)!r} is a directory but not a Zarr store (no zarr.json or .zarray)")
    if is_container(path):
        return "qgpu"
    with open(path, "rb") as f:
        first = f.read(8)
        if first.startswith(NPY_MAGIC):
            return "npy"
        # HDF5 allows a user block: the signature sits at 0, 512, 1024, 2048, ...
        head, offset = first, 0
        while len(head) == 8:
            if head == HDF5_SIGNATURE:
                return "hdf5"
            offset = 512 if offset == 0 else offset * 2
            f.seek(offset)
            head = f.read(8)
    if path.suffix.lower() == ".raw":
        from .empad import frames_in

        frames_in(path)
        return "empad"
    raise ValueError(
        f"{str(path)!r} is not an HDF5 file, a .npy array, a Zarr store, an EMPAD .raw file or a saved resident (first bytes {first!r})"
    )


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


def frames_per_block(shape: tuple[int, int, int, int], dtype: np.dtype, block_bytes: int) -> int:
    """How many whole scan rows of frames fit in ``block_bytes`` (at least one frame), in frames."""
    frame_bytes = shape[2] * shape[3] * np.dtype(dtype).itemsize
    row_frames = shape[1]
    rows = max(1, block_bytes // (frame_bytes * row_frames))
    if rows == 1 and frame_bytes * row_frames > block_bytes:
        return max(1, block_bytes // frame_bytes)
    return rows * row_frames


def open_reader(source: Source) -> Reader:
    """Open ``source`` with the reader of its format; the shape and dtype are checked here."""
    path = Path(source.path).expanduser()
    fmt = detect_format(path)
    if fmt == "qgpu":
        raise ValueError(f"{str(path)!r} is a saved resident: it is opened whole (io.saved.open_resident), not read frame by frame")
    if fmt == "hdf5":
        from .arina import ArinaReader, is_master
        from .gzip_stack import GzipStackReader, is_gzip_stack
        from .hdf5 import HDF5Reader

        if source.dataset in (None, "/entry/data") and is_master(path):
            return ArinaReader(path, source.scan_shape)
        reader = HDF5Reader(path, source.dataset, source.scan_shape)
        return GzipStackReader(reader) if is_gzip_stack(reader.dataset) else reader
    if fmt == "empad":
        from .empad import EmpadReader

        return EmpadReader(path, source.scan_shape)
    if fmt == "npy":
        from .npy import NpyReader

        return NpyReader(path, source.scan_shape)
    from .zarr_array import ZarrReader

    return ZarrReader(path, source.dataset, source.scan_shape)
