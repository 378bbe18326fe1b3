"""Bitshuffle-LZ4 chunks decoded on the GPU (kernels/bitshuffle_lz4.cu), the twin of
``bitshuffle_lz4.decompress_stored``: the same frames, and the same ``ChunkError`` for the first malformed
chunk. The chunks' bytes go to the device as they are (about 9 times fewer bytes than the counts at low
dose), so a frame stream costs the host its socket reads alone."""

from __future__ import annotations

import cupy
import numpy as np

from .. import compile
from ..device import uploaded
from . import bitshuffle_lz4
from .bitshuffle_lz4 import HEADER_BYTES, ChunkError, message, target

CTYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int"}
THREADS = 32  # one warp a chunk
DEFINES = compile.defines(  # the constants kernels/bitshuffle_lz4.cu takes from Python
    OK=bitshuffle_lz4.OK,
    HEADER_SHORT=bitshuffle_lz4.HEADER_SHORT,
    TOTAL_SIZE=bitshuffle_lz4.TOTAL_SIZE,
    BLOCK_SIZE=bitshuffle_lz4.BLOCK_SIZE,
    SIZE_FIELD_CUT=bitshuffle_lz4.SIZE_FIELD_CUT,
    BLOCK_PAST_END=bitshuffle_lz4.BLOCK_PAST_END,
    LENGTH_CUT=bitshuffle_lz4.LENGTH_CUT,
    LITERALS_PAST_INPUT=bitshuffle_lz4.LITERALS_PAST_INPUT,
    LITERALS_PAST_OUTPUT=bitshuffle_lz4.LITERALS_PAST_OUTPUT,
    OFFSET_CUT=bitshuffle_lz4.OFFSET_CUT,
    OFFSET_ZERO=bitshuffle_lz4.OFFSET_ZERO,
    OFFSET_BEFORE_START=bitshuffle_lz4.OFFSET_BEFORE_START,
    MATCH_PAST_OUTPUT=bitshuffle_lz4.MATCH_PAST_OUTPUT,
    WRONG_LENGTH=bitshuffle_lz4.WRONG_LENGTH,
    TRAILING_MISSING=bitshuffle_lz4.TRAILING_MISSING,
    EXTRA_BYTES=bitshuffle_lz4.EXTRA_BYTES,
    HEADER_BYTES=bitshuffle_lz4.HEADER_BYTES,
)


def scratch_bytes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, frame_bytes: int) -> int:
    """Shared memory a warp needs for the largest block any chunk's header names (headers too short are the
    kernel's to report)."""
    whole = starts[ends - starts >= HEADER_BYTES]
    if not whole.size:
        return 8
    block = np.zeros(whole.size, np.uint32)
    for k in range(8, 12):  # the big-endian block size field of every header, a byte at a time
        block = (block << np.uint32(8)) | data[whole + k]
    return max(8, int(min(int(block.max()), frame_bytes)))


def decompress_stored(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, out: cupy.ndarray) -> None:
    """Decode chunk i, data[starts[i]:ends[i]] (host bytes), into out[i] (a C-contiguous CuPy array of
    uint8, uint16 or uint32 frames); ChunkError naming the first malformed chunk (the others are decoded)."""
    errors = outcomes(data, starts, ends, out)
    bad = errors[:, 0].nonzero()[0]
    if bad.size:
        index = int(bad[0])
        code, block, a, b, c = (int(v) for v in errors[index].get())
        raise ChunkError(index, message(code, block, a, b, c))


def outcomes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, out: cupy.ndarray) -> cupy.ndarray:
    """Decode every chunk as ``decompress_stored`` does; (n, 5) int64 on the device: per chunk 0, or the
    error code, block and details ``bitshuffle_lz4.decode_chunk`` returns for it."""
    n = len(starts)
    size = out.dtype.itemsize
    if size not in CTYPES or out.dtype.kind not in "ui":
        raise ValueError(f"the GPU decodes uint8, uint16 or uint32 frames, not {out.dtype}")
    if not out.flags.c_contiguous or out.ndim < 1 or out.shape[0] != n or len(ends) != n:
        raise ValueError(f"out has shape {out.shape}, expected {n} C-contiguous frames first")
    errors = cupy.zeros((n, 5), np.int64)
    if n == 0:
        return errors
    starts = np.ascontiguousarray(starts, np.int64)
    ends = np.ascontiguousarray(ends, np.int64)
    if starts.min() < 0 or ends.max() > len(data) or (ends < starts).any():
        raise ValueError(f"chunk bounds fall outside the {len(data)} bytes given")
    count = out[0].size
    scratch = scratch_bytes(data, starts, ends, count * size)
    limit = compile.limits(cupy.cuda.Device().id)[1]
    if scratch > limit:
        raise ValueError(f"bitshuffle blocks of {scratch} bytes do not fit a GPU block's {limit} bytes of shared memory")
    kernel = compile.kernel("bitshuffle_lz4.cu", f"decode<{CTYPES[size]}>", DEFINES)
    kernel((n,), (THREADS,), (uploaded(data), cupy.asarray(starts), cupy.asarray(ends), np.int64(n), target(out.reshape(n, -1)),
                              np.int64(count), np.int64(scratch), errors), shared_mem=scratch)
    return errors
