"""What every export writer shares: the Calibration it records, the Counts it writes (a resident's name, shape
and dtype, and its counts as host blocks of whole scan rows, so the file never passes through memory whole:
the owner sends them to the writer's own process, ``process.py``), the HDF5 counts dataset
(one bitshuffle-LZ4 chunk a frame, HDF5 filter 32008, as DECTRIS detectors write them), and the move of a
finished file or store onto its name (written under ``<name>.partial``, so a failed export leaves nothing)."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import h5py
import hdf5plugin
import numpy as np

from ...formats.container import unwritable

BLOCK_BYTES = 64 * 2**20  # counts written at a time


@dataclass(frozen=True)
class Calibration:
    """What an export says of the axes and the beam: scan step (nm), detector pixel (mrad, None: not known),
    beam energy (keV), convergence semi-angle (mrad)."""

    scan_step_nm: float
    det_sampling_mrad: float | None
    energy_keV: float
    semiangle_mrad: float


@dataclass(frozen=True)
class Counts:
    """What a writer writes: the acquisition's name, 4-D shape and dtype, and ``blocks``, its counts as host
    arrays of ``rows`` whole scan rows each (the last one shorter), in order."""

    name: str
    shape: tuple[int, int, int, int]
    dtype: np.dtype
    rows: int
    blocks: Iterator[np.ndarray]


def node_name(counts: Counts) -> str:
    """The acquisition's name as one HDF5/Zarr node ("/" would nest groups; HyperSpy writes it as "-" too)."""
    return counts.name.replace("/", "-")


def rows_per_block(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Whole scan rows written at a time: about BLOCK_BYTES of counts, at least one row."""
    _, cols, det_rows, det_cols = shape
    return max(1, BLOCK_BYTES // (cols * det_rows * det_cols * np.dtype(dtype).itemsize))


def block_bounds(scan_rows: int, rows: int) -> list[tuple[int, int]]:
    """The scan rows (lo, hi) of each block of ``rows``, in order."""
    return [(lo, min(scan_rows, lo + rows)) for lo in range(0, scan_rows, rows)]


def write_counts(counts: Counts, out) -> None:
    """Copy the counts into ``out`` (an h5py dataset or Zarr array of their 4-D shape), block by block."""
    _, cols, det_rows, det_cols = counts.shape
    for (lo, hi), block in zip(block_bounds(counts.shape[0], counts.rows), counts.blocks, strict=True):
        out[lo:hi] = block.reshape(hi - lo, cols, det_rows, det_cols)


def hdf5_counts(group: h5py.Group, name: str, counts: Counts) -> h5py.Dataset:
    """An empty dataset for the counts in ``group``: one bitshuffle-LZ4 chunk a frame."""
    det_rows, det_cols = counts.shape[2:]
    return group.create_dataset(name, counts.shape, counts.dtype, chunks=(1, 1, det_rows, det_cols),
                                **hdf5plugin.Bitshuffle(nelems=0, cname="lz4"))


def remove(path: Path) -> None:
    """Delete a file or a directory tree, if there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def written_in_place(path: Path) -> Iterator[Path]:
    """Yield ``<path>.partial`` to write; once written, move it onto ``path`` (an old directory store there is
    renamed aside first and then removed, since a rename cannot replace a full directory); on an error remove
    it. An OSError names ``path``, not the partial file."""
    partial = path.with_name(path.name + ".partial")
    try:
        remove(partial)
        try:
            yield partial
            if partial.is_dir() and path.is_dir():
                old = path.with_name(path.name + ".replaced")
                remove(old)
                os.replace(path, old)
                os.replace(partial, path)
                remove(old)
            else:
                os.replace(partial, path)
        finally:
            remove(partial)
    except OSError as err:
        raise unwritable(err, path) from None

