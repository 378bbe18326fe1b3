"""HDF5 datasets (any filter h5py and hdf5plugin decode), read in blocks of scan rows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import h5py
import hdf5plugin  # noqa: F401  (registers Bitshuffle/LZ4 and other filters with HDF5)
import numpy as np

from ..source import Source
from .base import BLOCK_BYTES, Format, array_blocks, array_frames, as_4d, native_order

SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_hdf5(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is a file with the HDF5 signature: at 0, or after a user block at 512, 1024, 2048, ..."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        head, offset = f.read(8), 0
        while len(head) == 8:
            if head == SIGNATURE:
                return True
            offset = 512 if offset == 0 else offset * 2
            f.seek(offset)
            head = f.read(8)
    return False


def open_hdf5(path: Path) -> h5py.File:
    """The HDF5 file at ``path`` open for reading; where HDF5 cannot open it, the error names the file and what
    is wrong: ValueError for one cut short (HDF5 says only "truncated file: eof = ..."), an OSError naming it
    otherwise."""
    try:
        return h5py.File(path, "r")
    except OSError as err:
        cut = re.search(r"truncated file: eof = (\d+),.*stored_eof = (\d+)", str(err))
        if cut:
            raise ValueError(f"{str(path)!r} is cut short: {cut[1]} bytes of the {cut[2]} its HDF5 header gives (copied in part, "
                             "or still being written): copy it whole again") from None
        raise OSError(err.errno, f"HDF5 cannot open it ({err})", str(path)) from None


def filter_pipeline(dataset: h5py.Dataset) -> list[tuple[int, str]]:
    """(filter id, short name) of each filter a dataset's chunks pass through, in order."""
    plist = dataset.id.get_create_plist()
    pipeline = []
    for i in range(plist.get_nfilters()):
        code, _, _, name = plist.get_filter(i)
        pipeline.append((int(code), name.decode(errors="replace").split(";")[0].strip() or str(code)))
    return pipeline


def list_datasets(f: h5py.File) -> list[str]:
    """Paths of every dataset in the file, for error messages."""
    found: list[str] = []
    f.visititems(lambda name, obj: found.append("/" + name) if isinstance(obj, h5py.Dataset) else None)
    return found


def choose_dataset(f: h5py.File, dataset: str | None, path: Path) -> str:
    """``dataset`` if the file has that dataset, or the path of its only 3-D/4-D one when None; ValueError or
    KeyError listing the datasets otherwise."""
    names = list_datasets(f)
    if dataset is None:
        candidates = [n for n in names if f[n].ndim in (3, 4)]
        if len(candidates) != 1:
            raise ValueError(f"{str(path)!r}: give dataset= (3-D/4-D datasets found: {candidates or 'none'})")
        dataset = candidates[0]
    if dataset not in f or not isinstance(f[dataset], h5py.Dataset):
        raise KeyError(f"{str(path)!r} has no dataset {dataset!r} (datasets: {', '.join(names) or 'none'})")
    return dataset


class HDF5Reader:
    """One dataset of an HDF5 file as a 4-D acquisition."""

    kind = "hdf5"

    def __init__(self, path: Path, dataset: str | None, scan_shape):
        self.path = path
        self.file = open_hdf5(path)
        try:
            dataset = choose_dataset(self.file, dataset, path)
            self.dataset = self.file[dataset]
            self.dtype = native_order(self.dataset.dtype)
            self.shape = as_4d(self.dataset.shape, scan_shape, f"dataset {dataset!r} of {str(path)!r}")
        except BaseException:
            self.file.close()
            raise

    @property
    def compression(self) -> str:
        return "+".join(name for _, name in filter_pipeline(self.dataset)) or "none"

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        return array_blocks(self.dataset, self.shape, block_bytes)

    def frames(self, start: int, n: int) -> np.ndarray:
        return array_frames(self.dataset, self.shape, start, n)

    def close(self) -> None:
        self.file.close()


def open_dataset(path: Path, source: Source) -> HDF5Reader:
    return HDF5Reader(path, source.dataset, source.scan_shape)


FORMAT = Format("hdf5", is_hdf5, open_dataset, "an HDF5 file")
