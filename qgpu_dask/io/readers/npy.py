"""NumPy .npy files, memory-mapped so a block is read only when it is copied."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from ..source import Source
from .base import BLOCK_BYTES, Format, array_blocks, array_frames, as_4d, native_order

MAGIC = b"\x93NUMPY"


def is_npy(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is a file starting with the NumPy magic."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


class NpyReader:
    """A .npy array (3-D stack or 4-D) as an acquisition."""

    kind = "npy"
    compression = "none"

    def __init__(self, path: Path, scan_shape):
        try:
            self.array = np.load(path, mmap_mode="r")
        except ValueError as e:
            raise ValueError(f"{str(path)!r} is not a readable .npy array: {e}") from None
        self.dtype = native_order(self.array.dtype)
        self.shape = as_4d(self.array.shape, scan_shape, f"array in {str(path)!r}")

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        return array_blocks(self.array, self.shape, block_bytes)

    def frames(self, start: int, n: int) -> np.ndarray:
        return array_frames(self.array, self.shape, start, n)

    def close(self) -> None:
        self.array = None


def open_array(path: Path, source: Source) -> NpyReader:
    return NpyReader(path, source.scan_shape)


FORMAT = Format("npy", is_npy, open_array, "a .npy array")
