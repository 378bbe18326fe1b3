"""Zarr arrays (v2 or v3 stores on disk): an array store, or one array of a group at any depth: the only
3-D/4-D one, or the one ``dataset`` names (a HyperSpy .zspy keeps its data at Experiments/__unnamed__/data)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import zarr

from ..source import Source
from .base import BLOCK_BYTES, Format, array_blocks, array_frames, as_4d, native_order

METADATA = ("zarr.json", ".zarray", ".zgroup")  # v3, v2 array, v2 group


def is_store(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is a directory holding Zarr metadata."""
    return path.is_dir() and any((path / name).exists() for name in METADATA)


def stack_arrays(group: zarr.Group) -> list[str]:
    """Paths of the 3-D and 4-D arrays of a Zarr group, at any depth: the arrays an acquisition can be."""
    return sorted(path for path, node in group.members(max_depth=None) if isinstance(node, zarr.Array) and node.ndim in (3, 4))


class ZarrReader:
    """A Zarr array as an acquisition."""

    kind = "zarr"

    def __init__(self, path: Path, dataset: str | None, scan_shape):
        node = zarr.open(str(path), mode="r")
        if isinstance(node, zarr.Group):
            stacks = stack_arrays(node)
            if dataset is None:
                if len(stacks) != 1:
                    raise ValueError(f"{str(path)!r} is a Zarr group: give dataset= (3-D/4-D arrays found: {stacks or 'none'})")
                dataset = stacks[0]
            try:
                node = node[dataset.strip("/")]
            except KeyError:
                raise KeyError(f"Zarr group {str(path)!r} has no array {dataset!r} (3-D/4-D arrays: {stacks or 'none'})") from None
        if not isinstance(node, zarr.Array):
            raise ValueError(f"{str(path)!r}: {dataset!r} is not a Zarr array")
        self.array = node
        self.dtype = native_order(node.dtype)
        self.shape = as_4d(node.shape, scan_shape, f"Zarr array {str(path)!r}")

    @property
    def compression(self) -> str:
        codecs = getattr(self.array, "compressors", None) or ()
        return "+".join(type(c).__name__ for c in codecs) or "none"

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        return array_blocks(self.array, self.shape, block_bytes)

    def frames(self, start: int, n: int) -> np.ndarray:
        return array_frames(self.array, self.shape, start, n)

    def close(self) -> None:
        self.array = None


def open_store(path: Path, source: Source) -> ZarrReader:
    return ZarrReader(path, source.dataset, source.scan_shape)


FORMAT = Format("zarr", is_store, open_store, "a Zarr store")
