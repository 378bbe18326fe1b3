"""The stored chunks of an HDF5 dataset chunked one frame per chunk, read straight from its file.

``read_direct_chunk`` costs an HDF5 call per frame under h5py's global lock,
which at 65536 frames took longer than decoding them on 16 cores. Here the
chunk index is taken once (``chunk_index``: byte offset, size and filter mask
of every chunk, with no Python per chunk), and a block of frames, whose chunks
writers store one after another, comes in as one read of the file's bytes
(``file_bytes``: pieces read side by side, direct from the drive where the
page cache does not hold them), which releases the GIL so decoders keep
running. The offsets HDF5 reports are absolute file positions (a user block
included).
"""

from __future__ import annotations

from typing import Callable

import h5py
import numpy as np

from .chunk_index import chunk_table
from .file_bytes import FileBytes, new_memory

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
            self.file = FileBytes(self.dataset.file.filename)
        except OSError as err:
            raise ValueError(f"{self.where}: its file cannot be opened for reading ({err})") from None

    def read(self, lo: int, hi: int, buffer: Callable[[int], np.ndarray] = new_memory
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The stored bytes of frames lo:hi as (bytes, starts, ends, filter masks), the bytes in memory from
        ``buffer(nbytes)`` (pinned memory, for a GPU to decode them): frame lo + k is bytes[starts[k]:ends[k]].
        ValueError naming the frame when the file ends inside its chunk."""
        if self.file is None:
            self.open()
        offsets = self.offsets[lo:hi]
        sizes = self.sizes[lo:hi]
        first = int(offsets.min())
        span = int((offsets + sizes).max()) - first
        need = int(sizes.sum())
        if span <= SPAN_SLACK * need:  # one read of the span, in pieces side by side (``FileBytes``)
            data, got = self.file.read(first, span, buffer)
            starts = offsets - first
        else:  # chunks scattered through the file: one read each
            data = buffer(need)
            starts = np.zeros(hi - lo, np.int64)
            np.cumsum(sizes[:-1], out=starts[1:])
            got = need
            for k in range(hi - lo):
                piece = memoryview(data[starts[k] : starts[k] + sizes[k]]).cast("B")
                if self.file.read_plain(int(offsets[k]), piece) < piece.nbytes:
                    got = int(starts[k])
                    break
        ends = starts + sizes
        cut = np.flatnonzero(ends > got)
        if cut.size:
            k = int(cut[0])
            raise ValueError(f"{self.where}: the file ends inside the chunk of frame {lo + k} "
                             f"(it needs bytes up to {int(offsets[k] + sizes[k])})")
        return data, starts, ends, self.masks[lo:hi]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
