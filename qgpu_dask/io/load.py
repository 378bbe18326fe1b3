"""Stream a source into a resident block by block, never holding the whole acquisition on the host."""

from __future__ import annotations

from types import ModuleType

from ..resident.base import check_dtype
from ..resident.dense import DenseCounts
from .source import BLOCK_BYTES, Reader, Source, open_reader


def inspect(source: Source) -> dict:
    """Shape, dtype and raw bytes of a source, checked, without reading its counts."""
    reader = open_reader(source)
    try:
        dtype = check_dtype(reader.dtype)
        shape = reader.shape
    finally:
        reader.close()
    n = shape[0] * shape[1] * shape[2] * shape[3]
    return {"shape": shape, "dtype": str(dtype), "raw_bytes": n * dtype.itemsize}


def read_dense(name: str, reader: Reader, xp: ModuleType | None = None, block_bytes: int = BLOCK_BYTES) -> DenseCounts:
    """A DenseCounts filled from ``reader`` in blocks."""
    resident = DenseCounts.empty(name, reader.shape, check_dtype(reader.dtype), xp)
    for start, frames in reader.blocks(block_bytes):
        resident.write(start, frames)
    return resident
