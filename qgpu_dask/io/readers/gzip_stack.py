"""HDF5 stacks stored one gzip chunk per frame, inflated on several cores.

HDF5 inflates a dataset's chunks one after another on the reading thread.
When every frame is its own deflate chunk (optionally byte-shuffled first),
this reader takes the stored bytes straight from the file
(``stored_chunks``, one read per block) and inflates them with zlib in a
thread pool (zlib releases the GIL), so several cores
work; the next block inflates while the last one is being copied.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np

from ..source import Source
from .base import BLOCK_BYTES, Format, frames_per_block
from .hdf5 import HDF5Reader, choose_dataset, is_hdf5, open_hdf5
from .stored_chunks import StoredChunks

DEFLATE = h5py.h5z.FILTER_DEFLATE
SHUFFLE = h5py.h5z.FILTER_SHUFFLE
PIPELINES = ((DEFLATE,), (SHUFFLE, DEFLATE))
INFLATE_THREADS = 8  # at most: one thread reads the stored chunks for all of them
FRAMES_PER_TASK = 8  # chunks handed to a thread at once, so pool overhead stays small against inflating


def frame_filters(dataset: h5py.Dataset) -> tuple[int, ...] | None:
    """The filter pipeline of a 3-D/4-D dataset stored one deflate (or shuffle + deflate) chunk per frame,
    every chunk written, in native byte order; None for any other layout (HDF5 reads it)."""
    if not dataset.dtype.isnative or dataset.ndim not in (3, 4) or dataset.chunks != (1,) * (dataset.ndim - 2) + dataset.shape[-2:]:
        return None
    plist = dataset.id.get_create_plist()
    filters = tuple(plist.get_filter(i)[0] for i in range(plist.get_nfilters()))
    if filters not in PIPELINES:
        return None
    if dataset.id.get_num_chunks() != int(np.prod(dataset.shape[:-2])):
        return None  # unwritten chunks read as the fill value: left to HDF5
    return filters


def is_gzip_stack(dataset: h5py.Dataset) -> bool:
    """Whether :class:`GzipStackReader` can read ``dataset`` (one gzip chunk per frame)."""
    return frame_filters(dataset) is not None


def holds_stack(path: Path, dataset: str | None) -> bool:
    """Whether the HDF5 file at ``path`` has ``dataset`` (or its only 3-D/4-D dataset) stored one gzip chunk
    per frame; a dataset HDF5Reader would refuse is left to it, to name what is wrong."""
    if not is_hdf5(path):
        return False
    with open_hdf5(path) as f:
        try:
            name = choose_dataset(f, dataset, path)
        except (KeyError, ValueError):
            return False
        return is_gzip_stack(f[name])


def finished(start: int, block: np.ndarray, tasks: list[Future]) -> tuple[int, np.ndarray]:
    """(start, block) once every task filling it is done; a task's error is raised here."""
    for task in tasks:
        task.result()
    return start, block


class GzipStackReader:
    """A dataset of one gzip chunk per frame, opened by :class:`HDF5Reader` (which picks it and checks its shape)."""

    kind = "hdf5 gzip stack"

    def __init__(self, reader: HDF5Reader, threads: int | None = None):
        filters = frame_filters(reader.dataset)
        if filters is None:
            raise ValueError(f"dataset {reader.dataset.name!r} of {str(reader.path)!r} is not stored one gzip chunk per frame")
        self.reader = reader
        self.dataset = reader.dataset
        self.shape = reader.shape
        self.dtype = reader.dtype
        self.where = f"{str(reader.path)!r}, dataset {reader.dataset.name!r}"
        self.deflate_bit = 1 << filters.index(DEFLATE)
        self.shuffle_bit = 1 if filters[0] == SHUFFLE else 0
        self.threads = threads or min(INFLATE_THREADS, os.cpu_count() or 1)
        self.stored = StoredChunks(self.dataset, self.where)

    @property
    def compression(self) -> str:
        return self.reader.compression

    def unfilter(self, frame: int, filter_mask: int, stored: np.ndarray, out: np.ndarray) -> None:
        """Undo the filters a chunk went through (those ``filter_mask`` does not mark skipped) into ``out``."""
        data = stored
        inflated = not filter_mask & self.deflate_bit
        if inflated:
            try:
                data = zlib.decompress(stored, bufsize=out.nbytes)
            except zlib.error as e:
                raise ValueError(f"{self.where}: frame {frame}: chunk does not inflate ({e})") from None
        if len(data) != out.nbytes:
            held = "inflates to" if inflated else "is stored unfiltered as"
            raise ValueError(f"{self.where}: frame {frame}: chunk {held} {len(data)} bytes, expected {out.nbytes}")
        source = np.frombuffer(data, np.uint8)
        target = out.reshape(-1).view(np.uint8)
        if filter_mask & self.shuffle_bit or not self.shuffle_bit:
            target[:] = source
        else:  # shuffle stored byte 0 of every element, then byte 1, ...
            target.reshape(-1, self.dtype.itemsize)[:] = source.reshape(self.dtype.itemsize, -1).T

    def unfilter_all(self, first: int, chunks: list[tuple[int, np.ndarray]], out: np.ndarray) -> None:
        for k, (filter_mask, stored) in enumerate(chunks):
            self.unfilter(first + k, filter_mask, stored, out[k])

    def submit(self, pool: ThreadPoolExecutor, start: int, stop: int) -> tuple[int, np.ndarray, list[Future]]:
        """Read the stored chunks of frames ``start .. stop`` and hand them to the pool to fill a new block."""
        block = np.empty((stop - start, *self.shape[2:]), self.dtype)
        data, starts, ends, masks = self.stored.read(start, stop)
        tasks = []
        for first in range(0, stop - start, FRAMES_PER_TASK):
            last = min(first + FRAMES_PER_TASK, stop - start)
            chunks = [(int(masks[k]), data[starts[k] : ends[k]]) for k in range(first, last)]
            tasks.append(pool.submit(self.unfilter_all, start + first, chunks, block[first:last]))
        return start, block, tasks

    def frames(self, start: int, n: int) -> np.ndarray:
        """Frames start .. start + n, inflated from their stored chunks."""
        out = np.empty((n, *self.shape[2:]), self.dtype)
        data, starts, ends, masks = self.stored.read(start, start + n)
        self.unfilter_all(start, [(int(masks[k]), data[starts[k] : ends[k]]) for k in range(n)], out)
        return out

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        n_frames = self.shape[0] * self.shape[1]
        step = frames_per_block(self.shape, self.dtype, block_bytes)
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="qgpu-inflate")
        try:
            pending = None
            for start in range(0, n_frames, step):
                following = self.submit(pool, start, min(start + step, n_frames))
                if pending is not None:
                    yield finished(*pending)
                pending = following
            if pending is not None:
                yield finished(*pending)
        finally:
            pool.shutdown(cancel_futures=True)

    def close(self) -> None:
        self.stored.close()
        self.reader.close()


def open_stack(path: Path, source: Source) -> GzipStackReader:
    reader = HDF5Reader(path, source.dataset, source.scan_shape)
    try:
        return GzipStackReader(reader)
    except BaseException:
        reader.close()
        raise


FORMAT = Format("gzip_stack", holds_stack, open_stack, "an HDF5 file")
