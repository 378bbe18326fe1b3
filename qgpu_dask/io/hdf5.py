"""HDF5 datasets (any filter h5py and hdf5plugin decode), read in blocks of scan rows."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import h5py
import hdf5plugin  # noqa: F401  (registers Bitshuffle/LZ4 and other filters with HDF5)
import numpy as np

from .frames import array_blocks, native_order
from .source import BLOCK_BYTES, as_4d


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


class HDF5Reader:
    """One dataset of an HDF5 file as a 4-D acquisition."""

    kind = "hdf5"

    def __init__(self, path: Path, dataset: str | None, scan_shape):
        self.path = path
        self.file = h5py.File(path, "r")
        try:
            names = list_datasets(self.file)
            if dataset is None:
                candidates = [n for n in names if self.file[n].ndim in (3, 4)]
                if len(candidates) != 1:
                    raise ValueError(f"{str(path)!r}: give dataset= (3-D/4-D datasets found: {candidates or 'none'})")
                dataset = candidates[0]
            if dataset not in self.file or not isinstance(self.file[dataset], h5py.Dataset):
                raise KeyError(f"{str(path)!r} has no dataset {dataset!r} (datasets: {', '.join(names) or 'none'})")
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

    def close(self) -> None:
        self.file.close()
