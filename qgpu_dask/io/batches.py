"""Batches of frames on their way into a resident, from a file or a stream: counts, or bitshuffle-LZ4 chunks
still as they were stored or sent (``Chunks``), in host buffers bound for the resident's device (pinned for
a GPU), decoded where the resident is held (``decoded``: on the GPU for CuPy) and read ahead in a thread of
their own (``prefetched``) while the last batch is decoded and appended."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Iterator

import numpy as np

from ..device import synchronize
from ..formats.bitshuffle_lz4 import ChunkError, decompress_stored

AHEAD = 2  # reads waiting for the appends while the next one is read
PINNED_STEP = 16 * 2**20  # pinned buffers come in multiples of this, so CuPy's pool (exact sizes) hands them out again


@dataclass(frozen=True)
class Chunks:
    """Frames still as the bitshuffle-LZ4 chunks they came as: chunk i is data[starts[i]:ends[i]]."""

    data: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)


def host_buffers(xp: ModuleType) -> Callable[[int], np.ndarray]:
    """Host memory for reads that go to ``xp``: fresh arrays for NumPy (the frames are handed on); for CuPy a
    ring of pinned buffers, one being read, AHEAD waiting and one being copied to the device, of sizes in steps
    of PINNED_STEP: the next load's ring takes the same blocks from the pool instead of pinning more."""
    if xp is np:
        return lambda nbytes: np.empty(nbytes, np.uint8)
    ring: list[np.ndarray] = []

    def buffer(nbytes: int) -> np.ndarray:
        if len(ring) < AHEAD + 2 or ring[0].size < nbytes:
            size = -(-(nbytes + nbytes // 4) // PINNED_STEP) * PINNED_STEP  # room for reads of chunks a little longer
            ring.append(np.frombuffer(xp.cuda.alloc_pinned_memory(size), np.uint8, size))
        else:
            ring.append(ring.pop(0))
        if len(ring) > AHEAD + 2:
            ring.pop(0)
        return ring[-1][:nbytes]

    return buffer


def decoded(batch: np.ndarray | Chunks, det_shape: tuple[int, int], dtype: np.dtype, xp: ModuleType) -> tuple[object, ChunkError | None]:
    """A batch's frames as ``xp`` arrays, done with the host buffer they came in, and the ChunkError of its
    first malformed chunk (the frames before it returned) or None."""
    if not isinstance(batch, Chunks):
        if xp is np:
            return batch, None
        frames = xp.asarray(batch)
        synchronize()  # the pinned buffer is read again
        return frames, None
    out = xp.empty((len(batch), *det_shape), dtype)
    try:
        if xp is np:
            decompress_stored(batch.data, batch.starts, batch.ends, out)
        else:
            from ..formats.bitshuffle_lz4_cuda import decompress_stored as on_gpu

            on_gpu(batch.data, batch.starts, batch.ends, out)
    except ChunkError as err:
        return out[: err.index], err
    return out, None


def prefetched(batches: Iterator, depth: int) -> Iterator:
    """``batches``, read up to ``depth`` ahead in a thread of their own (the socket reads go on while the
    caller appends); the reader's error comes after the batches before it; stopping early stops the reader."""
    waiting: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    end = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                waiting.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for batch in batches:
                if not put((batch, None)):
                    return
            put((end, None))
        except BaseException as err:  # handed to the caller, in order
            put((end, err))
        finally:
            batches.close()  # here, once a read waiting on a quiet sender returns: the caller does not wait for it

    threading.Thread(target=read, name="qgpu-stream-read", daemon=True).start()
    try:
        while True:
            batch, err = waiting.get()
            if batch is end:
                if err is not None:
                    raise err
                return
            yield batch
    finally:
        stop.set()
