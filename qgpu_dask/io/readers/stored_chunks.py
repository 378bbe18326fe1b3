"""The stored chunks of an HDF5 dataset chunked one frame per chunk, read straight from its file.

``read_direct_chunk`` costs an HDF5 call per frame under h5py's global lock,
which at 65536 frames took longer than decoding them on 16 cores. Here the
chunk index is taken once (``chunk_index``: byte offset, size and filter mask
of every chunk, with no Python per chunk), and a block of frames, whose chunks writers store one after
another, comes in as one read of the file's bytes (pieces read side by side), which releases the GIL so
decoders keep running. The offsets HDF5 reports are absolute file positions
(a user block included).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import h5py
import numpy as np

from .chunk_index import chunk_table

READ_PIECE = 4 * 2**20  # bytes of a block's span one reader thread reads
READERS = ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="qgpu-read")  # shared by every open file
SPAN_SLACK = 2  # one read of a block's byte span while it is at most this many times the chunks' own bytes


class StoredChunks:
    """Where each frame's chunk lies in the dataset's file, and blocks of them read as stored bytes."""

    def __init__(self, dataset: h5py.Dataset, where: str):
        self.dataset = dataset
        self.where = where
        self.file = None  # the index is taken and the file opened at the first read, so inspecting stays quick

    def open(self) -> None:
        """Take the chunk index (every frame must have a chunk of its own) and open the dataset's file."""
        self.offsets, self.sizes, self.masks, out_of_place = chunk_table(self.dataset)
        n = len(self.offsets)
        missing = np.flatnonzero(self.offsets < 0)
        if missing.size:
            raise ValueError(f"{self.where}: frame {missing[0]} has no stored chunk ({missing.size} of {n} frames are missing)")
        if out_of_place:
            raise ValueError(f"{self.where}: {out_of_place} stored chunk(s) are not one frame's own (a second chunk for a frame, "
                             f"or one outside the dataset's frames)")
        try:
            self.file = open(self.dataset.file.filename, "rb", buffering=0)
        except OSError as err:
            raise ValueError(f"{self.where}: its file cannot be opened for reading ({err})") from None

    def read(self, lo: int, hi: int, buffer: Callable[[int], np.ndarray] = lambda nbytes: np.empty(nbytes, np.uint8)
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The stored bytes of frames lo:hi as (bytes, starts, ends, filter masks), the bytes in ``buffer(nbytes)``
        (pinned memory, for a GPU to decode them): frame lo + k is bytes[starts[k]:ends[k]]. ValueError naming
        the frame when the file ends inside its chunk."""
        if self.file is None:
            self.open()
        offsets = self.offsets[lo:hi]
        sizes = self.sizes[lo:hi]
        first = int(offsets.min())
        span = int((offsets + sizes).max()) - first
        need = int(sizes.sum())
        if span <= SPAN_SLACK * need:
            data = buffer(span)
            got = self.read_at(first, data)
            starts = offsets - first
        else:  # chunks scattered through the file: one read each
            data = buffer(need)
            starts = np.zeros(hi - lo, np.int64)
            np.cumsum(sizes[:-1], out=starts[1:])
            got = need
            for k in range(hi - lo):
                piece = data[starts[k] : starts[k] + sizes[k]]
                if self.read_at(int(offsets[k]), piece) < piece.size:
                    got = int(starts[k])
                    break
        ends = starts + sizes
        cut = np.flatnonzero(ends > got)
        if cut.size:
            k = int(cut[0])
            raise ValueError(f"{self.where}: the file ends inside the chunk of frame {lo + k} "
                             f"(it needs bytes up to {int(offsets[k] + sizes[k])})")
        return data, starts, ends, self.masks[lo:hi]

    def read_at(self, position: int, into: np.ndarray) -> int:
        """Fill ``into`` from the file at ``position``, in pieces of READ_PIECE read side by side (one thread
        reads a page-cached file at a few GB/s); the bytes read (fewer where the file ends)."""
        view = memoryview(into).cast("B")
        starts = range(0, view.nbytes, READ_PIECE)
        if len(starts) < 2:
            return self.read_piece(position, view)
        got = 0
        for start, n in zip(starts, READERS.map(lambda a: self.read_piece(position + a, view[a : a + READ_PIECE]), starts)):
            got = start + n
            if start + n < min(view.nbytes, start + READ_PIECE):
                break
        return got

    def read_piece(self, position: int, view: memoryview) -> int:
        """Fill ``view`` from the file at ``position`` (positional reads: threads share the file); the bytes read."""
        got = 0
        while got < view.nbytes:
            n = os.preadv(self.file.fileno(), [view[got:]], position + got)
            if not n:
                break
            got += n
        return got

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
