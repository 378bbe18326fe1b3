"""SHA-256 of many ranges of one device buffer at once (kernels/sha256.cu, one thread a range).

A saved container's arrays are checked where a reopen copied them, in device memory: the host's cores only
read the file (hashing it there took as long as reading it). The twin is ``hashlib.sha256`` of each range
(``container.leaf_digests``), the same digests."""

from __future__ import annotations

import cupy
import numpy as np

from .. import compile

THREADS = 128  # ranges a CUDA block
DEFINES = compile.defines()  # the kernel takes no constant from Python


def range_digests(data: cupy.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """(n, 32) uint8 on the host: the SHA-256 of ``data[starts[i] : starts[i] + lengths[i]]`` for each i
    (``data`` a flat uint8 device array; the work queued on this thread's stream, which must have passed
    every copy into ``data``)."""
    starts = np.ascontiguousarray(starts, np.uint64)
    lengths = np.ascontiguousarray(lengths, np.uint64)
    n = starts.size
    if data.dtype != np.uint8 or data.ndim != 1 or lengths.shape != starts.shape:
        raise ValueError(f"range digests need flat uint8 data and one length a start, got {data.dtype} {data.shape},"
                         f" {starts.shape} starts and {lengths.shape} lengths")
    if n and int((starts + lengths).max()) > data.size:
        raise ValueError(f"a range ends past the {data.size} bytes given")
    out = cupy.empty((n, 32), np.uint8)
    if n:
        kernel = compile.kernel("sha256.cu", "sha256_ranges", DEFINES)
        kernel((-(-n // THREADS),), (THREADS,), (data, cupy.asarray(starts), cupy.asarray(lengths), np.int64(n), out))
    return out.get()
