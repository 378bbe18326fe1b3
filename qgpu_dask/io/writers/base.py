"""What every export writer shares: the Calibration it records, the loop that writes a resident's counts a
block of whole scan rows at a time (so the file never passes through memory whole), the HDF5 counts dataset
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

from ...device import to_host
from ...formats.container import unwritable
from ...resident.base import Resident

BLOCK_BYTES = 64 * 2**20  # counts written at a time


@dataclass(frozen=True)
class Calibration:
    """What an export says of the axes and the beam: scan step (nm), detector pixel (mrad, None: not known),
    beam energy (keV), convergence semi-angle (mrad)."""

    scan_step_nm: float
    det_sampling_mrad: float | None
    energy_keV: float
    semiangle_mrad: float


def node_name(resident: Resident) -> str:
    """The resident's name as one HDF5/Zarr node ("/" would nest groups; HyperSpy writes it as "-" too)."""
    return resident.name.replace("/", "-")


def rows_per_block(resident: Resident) -> int:
    """Whole scan rows written at a time: about BLOCK_BYTES of counts, at least one row."""
    _, cols, det_rows, det_cols = resident.shape
    return max(1, BLOCK_BYTES // (cols * det_rows * det_cols * resident.dtype.itemsize))


def write_counts(resident: Resident, out) -> None:
    """Copy the resident's counts into ``out`` (an h5py dataset or Zarr array of its 4-D shape), a block of
    ``rows_per_block`` scan rows at a time, decoded from any layout."""
    rows, cols, det_rows, det_cols = resident.shape
    per = rows_per_block(resident)
    for lo in range(0, rows, per):
        hi = min(rows, lo + per)
        out[lo:hi] = to_host(resident.frames_flat(lo * cols, hi * cols)).reshape(hi - lo, cols, det_rows, det_cols)


def hdf5_counts(group: h5py.Group, name: str, resident: Resident) -> h5py.Dataset:
    """An empty dataset for the resident's counts in ``group``: one bitshuffle-LZ4 chunk a frame."""
    det_rows, det_cols = resident.shape[2:]
    return group.create_dataset(name, resident.shape, resident.dtype, chunks=(1, 1, det_rows, det_cols),
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

