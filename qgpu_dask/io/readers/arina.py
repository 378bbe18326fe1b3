"""DECTRIS Arina / Eiger HDF5 masters: frames in linked data files, one bitshuffle-LZ4 chunk per frame.

A master holds ``/entry/data/data_000001``, ``data_000002``, ... (external
links to the data files), each a (frames, rows, cols) stack chunked one frame
per chunk with the Bitshuffle filter (HDF5 filter 32008) and LZ4. The reader
reads the stored chunks straight from the data files (``stored_chunks``: no
HDF5 filter, one read per block of frames) and decompresses a block of them at
once with our own decoder in parallel threads, which gives hdf5plugin's bytes
exactly; stacks stored otherwise are read through HDF5 as they are.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import h5py
import hdf5plugin  # noqa: F401  (registers the Bitshuffle filter for stacks read through HDF5)
import numpy as np

from ...formats.bitshuffle_lz4 import ChunkError, decompress_stored
from ..batches import Chunks
from ..source import Source
from .base import BLOCK_BYTES, Format, ScanShapeNeeded, as_4d, frames_per_block, native_order
from .hdf5 import filter_pipeline, is_hdf5, open_hdf5
from .stored_chunks import StoredChunks

BITSHUFFLE = 32008
LZ4 = 2  # the last Bitshuffle filter option: 2 = LZ4 (3 = zstd is left to HDF5 and hdf5plugin)
DATA_GROUP = "/entry/data"


def is_master(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is an HDF5 file with the Arina/Eiger master layout (``/entry/data/data_000001``) and
    ``dataset`` asks for its frames (None or ``/entry/data``; another dataset is read as plain HDF5)."""
    if dataset not in (None, DATA_GROUP) or not is_hdf5(path):
        return False
    with open_hdf5(path) as f:
        group = f.get(DATA_GROUP)
        return isinstance(group, h5py.Group) and "data_000001" in group


def scan_shape_of(n_frames: int, given) -> tuple[int, int]:
    """The scan shape: as given, else square when the frame count is a square; ValueError otherwise."""
    if given is not None:
        return tuple(int(s) for s in given)
    side = math.isqrt(n_frames)
    if side * side == n_frames:
        return side, side
    raise ScanShapeNeeded(f"{n_frames} frames do not make a square scan: give scan_shape=(rows, cols)", n_frames)


class Stack:
    """One linked data file's frames."""

    def __init__(self, master: Path, name: str, dataset: h5py.Dataset):
        self.name = name
        self.dataset = dataset
        self.frames = dataset.shape[0]
        filters = [code for code, _ in filter_pipeline(dataset)]
        plist = dataset.id.get_create_plist()
        lz4 = filters == [BITSHUFFLE] and tuple(plist.get_filter(0)[2])[-1:] == (LZ4,)
        self.lz4_frames = dataset.chunks == (1, *dataset.shape[1:]) and lz4 and dataset.dtype.isnative  # else HDF5 decodes and swaps
        self.where = f"{str(master)!r} ({name})"
        self.stored = StoredChunks(dataset, f"{self.where}, data file {dataset.file.filename!r}")


class ArinaReader:
    """An Arina/Eiger master as a 4-D acquisition (frames of all its data files, in order)."""

    kind = "arina/eiger master"

    def __init__(self, path: Path, scan_shape=None):
        self.path = path
        self.file = open_hdf5(path)
        try:
            group = self.file[DATA_GROUP]
            names = sorted(n for n in group if n.startswith("data_"))
            self.stacks = []
            for name in names:
                try:
                    dataset = group[name]
                except KeyError as err:
                    raise ValueError(f"{str(path)!r}: {DATA_GROUP}/{name} links to a data file that cannot be opened ({err})") from None
                self.stacks.append(Stack(path, name, dataset))
            first = self.stacks[0].dataset
            for stack in self.stacks:
                d = stack.dataset
                if d.ndim != 3 or d.shape[1:] != first.shape[1:] or d.dtype != first.dtype:
                    raise ValueError(f"{stack.where}: frames {d.shape[1:]} {d.dtype} differ from data_000001's {first.shape[1:]} {first.dtype}")
            self.dtype = native_order(first.dtype)
            n_frames = sum(s.frames for s in self.stacks)
            scan = scan_shape_of(n_frames, scan_shape)
            self.shape = as_4d((n_frames, *first.shape[1:]), scan, f"the {len(self.stacks)} data file(s) of {str(path)!r}")
        except BaseException:
            self.file.close()
            raise

    @property
    def compression(self) -> str:
        return "bitshuffle-lz4" if all(s.lz4_frames for s in self.stacks) else "hdf5 filters"

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        """Blocks of whole scan rows where they fit, each in a new array."""
        return self.blocks_into(lambda start, n: np.empty((n, *self.shape[2:]), dtype=self.dtype), block_bytes)

    def read_into(self, out: np.ndarray, block_bytes: int = BLOCK_BYTES) -> None:
        """Every frame straight into ``out`` (n_frames, rows, cols): no block is copied again."""
        for _ in self.blocks_into(lambda start, n: out[start : start + n], block_bytes):
            pass

    def blocks_into(self, target, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        """(first frame, frames) of every block, decoded into ``target(first, n)`` (a C-contiguous
        (n, rows, cols) array). A block is decompressed (on every core) while the next one's stored
        chunks are read and the last one is being used."""
        decoder = ThreadPoolExecutor(1, thread_name_prefix="qgpu-arina")
        try:
            pending = None
            for stack, lo, hi, first in self.block_spans(block_bytes):
                stored = self.fetch(stack, lo, hi)
                out = target(first + lo, hi - lo)
                following = (first + lo, decoder.submit(self.decode, stack, lo, hi, first, stored, out))
                if pending is not None:
                    yield pending[0], pending[1].result()
                pending = following
            if pending is not None:
                yield pending[0], pending[1].result()
        finally:
            decoder.shutdown(wait=True, cancel_futures=True)

    def chunk_batches(self, buffer: Callable[[int], np.ndarray], block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray | Chunks]]:
        """(first frame, batch) of every block, its stored bytes read into ``buffer(nbytes)``: the block's
        chunks as stored (``Chunks``, for the resident's device to decode) where all are bitshuffle-LZ4
        frames, else its frames decoded here (a stack HDF5 reads, or a chunk stored unfiltered)."""
        for stack, lo, hi, first in self.block_spans(block_bytes):
            stored = self.fetch(stack, lo, hi, buffer)
            if stored is not None and not (stored[3] & 1).any():
                yield first + lo, Chunks(*stored[:3])
            else:
                yield first + lo, self.decode(stack, lo, hi, first, stored, np.empty((hi - lo, *self.shape[2:]), self.dtype))

    def block_spans(self, block_bytes: int) -> Iterator[tuple[Stack, int, int, int]]:
        """(data file's stack, lo, hi, its first frame in the scan) of every block: whole scan rows where they
        fit, never across data files."""
        step = frames_per_block(self.shape, self.dtype, block_bytes)
        first = 0
        for stack in self.stacks:
            for lo in range(0, stack.frames, step):
                yield stack, lo, min(lo + step, stack.frames), first
            first += stack.frames

    def where(self, frame: int) -> str:
        """Where frame ``frame`` is stored: the master, its data file and the chunk in it."""
        first = 0
        for stack in self.stacks:
            if frame < first + stack.frames:
                return f"{stack.where}: frame {frame} (chunk {frame - first} of its file)"
            first += stack.frames
        return f"{str(self.path)!r}: frame {frame}"

    def frames(self, start: int, n: int) -> np.ndarray:
        """Frames start .. start + n, decoded from the stored chunks of the data files that hold them."""
        out = np.empty((n, *self.shape[2:]), dtype=self.dtype)
        first = 0
        for stack in self.stacks:
            lo, hi = max(start, first) - first, min(start + n, first + stack.frames) - first
            if lo < hi:
                self.decode(stack, lo, hi, first, self.fetch(stack, lo, hi), out[first + lo - start : first + hi - start])
            first += stack.frames
        return out

    def fetch(self, stack: Stack, lo: int, hi: int, buffer: Callable[[int], np.ndarray] = lambda nbytes: np.empty(nbytes, np.uint8)
              ) -> tuple | None:
        """The stored chunks of frames lo:hi as StoredChunks.read gives them (the bytes in ``buffer(nbytes)``);
        None when HDF5 must read them."""
        if not stack.lz4_frames:
            return None
        return stack.stored.read(lo, hi, buffer)

    def decode(self, stack: Stack, lo: int, hi: int, first: int, stored, out: np.ndarray) -> np.ndarray:
        """Frames lo:hi of one data file into ``out`` (n, rows, cols), from their stored chunks."""
        if stored is None:
            stack.dataset.read_direct(out, np.s_[lo:hi])
            return out
        data, starts, ends, masks = stored
        coded = np.flatnonzero(masks & 1 == 0)
        for k in np.flatnonzero(masks & 1):  # the filter was skipped for this chunk: its bytes are the frame
            raw = data[starts[k] : ends[k]]
            if raw.size != out[k].nbytes:
                raise ValueError(f"{stack.where}: frame {first + lo + k} is stored with {raw.size} bytes, expected {out[k].nbytes}")
            out[k] = raw.view(self.dtype).reshape(out[k].shape)
        if coded.size:
            target = out if coded.size == len(out) else np.empty((coded.size, *out.shape[1:]), dtype=self.dtype)
            try:
                decompress_stored(data, starts[coded], ends[coded], target)
            except ChunkError as err:
                raise ValueError(f"{self.where(first + lo + coded[err.index])}: {err.problem}") from None
            if target is not out:
                out[coded] = target
        return out

    def close(self) -> None:
        for stack in self.stacks:
            stack.stored.close()
        self.file.close()


def open_master(path: Path, source: Source) -> ArinaReader:
    return ArinaReader(path, source.scan_shape)


FORMAT = Format("arina", is_master, open_master, "an HDF5 file")
