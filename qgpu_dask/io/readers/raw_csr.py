"""LiberTEM's raw_csr layout: event data as a CSR matrix of one row a frame, in three flat files that a TOML
descriptor names, with their dtypes and the scan and detector shapes::

    [params]
    filetype = "raw_csr"
    nav_shape = [512, 512]
    sig_shape = [516, 516]

    [raw_csr]
    indptr_file = "rowind.dat"
    indptr_dtype = "<i4"
    indices_file = "coords.dat"
    indices_dtype = "<i4"
    data_file = "values.dat"
    data_dtype = "<i4"

The files are memory-mapped; a block of frames is made dense from its rows (``SparseFrames.dense``), whose
row pointers, pixels and counts are checked as it is, naming the frame.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from ...resident.sparse import SparseFrames
from ..source import Source
from .base import BLOCK_BYTES, Format, frame_blocks
from .descriptor import data_file, descriptor, dtype_of, shape_of, table

FILETYPE = "raw_csr"
PARTS = ("indptr", "indices", "data")


def is_raw_csr(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is a TOML descriptor of ``filetype = "raw_csr"``."""
    return descriptor(path, FILETYPE) is not None


class RawCsrReader:
    """A raw_csr acquisition: its frames made dense block by block (``scan_shape``, if given, must hold the
    descriptor's frames)."""

    kind = "raw_csr"
    compression = "sparse CSR"

    def __init__(self, path: Path, scan_shape: tuple[int, int] | None):
        where = str(path)
        conf = descriptor(path, FILETYPE)
        files = table(conf, FILETYPE, [f"{part}_{what}" for part in PARTS for what in ("file", "dtype")], where)
        self.parts = {}
        for part in PARTS:
            name = data_file(path, files[f"{part}_file"], f"{part} file")
            dtype = dtype_of(files[f"{part}_dtype"], f"{part}_dtype", where)
            if part != "data" and dtype.kind not in "iu":
                raise ValueError(f"{where!r}: {part}_dtype {dtype} is not an integer type")
            self.parts[part] = np.memmap(name, dtype, "r") if name.stat().st_size else np.zeros(0, dtype)
        indptr, indices, data = (self.parts[p] for p in PARTS)
        if len(indptr) < 2 or len(indices) != len(data) or int(indptr[0]) != 0 or int(indptr[-1]) != len(indices):
            raise ValueError(f"{where!r}: {len(indptr)} row pointers, {len(indices)} indices and {len(data)} values are not a CSR"
                             " matrix (row pointers from 0 to the non-zeros, one value an index)")
        self.shape = shape_of(conf["params"], scan_shape, len(indptr) - 1, where)
        self.dtype = data.dtype.newbyteorder("=")
        self.where = where

    def frames(self, start: int, n: int) -> np.ndarray:
        """Frames start .. start + n made dense, (n, det rows, det cols)."""
        indptr, indices, data = (self.parts[p] for p in PARTS)
        pointers = np.asarray(indptr[start : start + n + 1], np.int64)
        a, b = int(pointers[0]), int(pointers[-1])
        piece = SparseFrames(pointers - a, np.asarray(indices[a:b]), np.asarray(data[a:b], self.dtype))
        try:
            return piece.dense(self.shape[2:], self.dtype, np, start)
        except ValueError as err:
            raise ValueError(f"{self.where!r}: {err}") from None

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        return frame_blocks(self.frames, self.shape, self.dtype, block_bytes)

    def close(self) -> None:
        self.parts = {}


def open_raw_csr(path: Path, source: Source) -> RawCsrReader:
    return RawCsrReader(path, source.scan_shape)


FORMAT = Format(FILETYPE, is_raw_csr, open_raw_csr, "a raw_csr descriptor (.toml)")
