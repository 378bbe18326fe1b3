"""Bitshuffle-LZ4 HDF5 chunks (filter 32008) decoded on the CPU, as DECTRIS Arina/Eiger write them.

A chunk as stored (read from the file at the offset HDF5's chunk index gives)
decodes here to the same bytes h5py + hdf5plugin give, without HDF5's filter
pipeline, so many chunks can be decoded at once in threads (the Numba kernels
release the GIL).

Chunk layout (integers big-endian), checked against hdf5plugin 7::

    0    uint64   uncompressed size of the chunk in bytes (count * itemsize)
    8    uint32   block size in bytes (block elements * itemsize; the block
                  holds a multiple of 8 elements; hdf5plugin's default is
                  8192 bytes)
    12   per block: uint32 compressed size, then that many bytes of an LZ4
         *block* (no frame header) decoding to the block's bit-shuffled bytes
    ...  the count % 8 trailing elements, stored as they are

Full blocks come first; the last block holds the remaining elements rounded
down to a multiple of 8 and is absent when none remain.

A block of n elements of s bytes is shuffled into 8 * s rows of n / 8 bytes:
row 8 * j + b holds bit b (0 = least significant) of byte j (in memory order)
of every element, element 8 * k + i at bit i of the row's byte k.

Every length, offset and copy is bounds-checked: a malformed chunk raises
ValueError and never reads or writes outside its buffers.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

HEADER_BYTES = 12
WILD = 16  # bytes of the fixed-size copies of the LZ4 decoder

# Error codes of the kernels; details (a, b, c) are filled in per code as in MESSAGES.
OK = 0
HEADER_SHORT = 1
TOTAL_SIZE = 2
BLOCK_SIZE = 3
SIZE_FIELD_CUT = 4
BLOCK_PAST_END = 5
LENGTH_CUT = 6
LITERALS_PAST_INPUT = 7
LITERALS_PAST_OUTPUT = 8
OFFSET_CUT = 9
OFFSET_ZERO = 10
OFFSET_BEFORE_START = 11
MATCH_PAST_OUTPUT = 12
WRONG_LENGTH = 13
TRAILING_MISSING = 14
EXTRA_BYTES = 15

MESSAGES = {
    HEADER_SHORT: "chunk is {a} bytes, shorter than the 12-byte bitshuffle header",
    TOTAL_SIZE: "header gives {a} uncompressed bytes, expected {b} ({c} bytes an element)",
    BLOCK_SIZE: "header block size {a} bytes is not a positive multiple of 8 elements of {b} bytes",
    SIZE_FIELD_CUT: "block {block}: its compressed-size field at byte {a} runs past the chunk end ({b} bytes)",
    BLOCK_PAST_END: "block {block}: compressed size {a} at byte {b} runs past the chunk end ({c} bytes)",
    LENGTH_CUT: "LZ4 block {block}: a length runs past the block end ({a} compressed bytes)",
    LITERALS_PAST_INPUT: (
        "LZ4 block {block}: a literal run of {a} bytes at input byte {b} runs past the block end ({c} bytes)"
    ),
    LITERALS_PAST_OUTPUT: (
        "LZ4 block {block}: a literal run of {a} bytes at output byte {b} writes past the block's {c} bytes"
    ),
    OFFSET_CUT: "LZ4 block {block}: a match offset is cut off by the block end ({a} compressed bytes)",
    OFFSET_ZERO: "LZ4 block {block}: match offset 0 at output byte {a}",
    OFFSET_BEFORE_START: "LZ4 block {block}: match offset {a} at output byte {b} points before the output start",
    MATCH_PAST_OUTPUT: "LZ4 block {block}: a match of {a} bytes at output byte {b} writes past the block's {c} bytes",
    WRONG_LENGTH: "LZ4 block {block}: decodes to {a} bytes, expected {b}",
    TRAILING_MISSING: "{a} bytes of trailing elements expected at byte {b}, the chunk has {c} left",
    EXTRA_BYTES: "{a} unexpected bytes after the data (chunk is {b} bytes, data ends at byte {c})",
}

jit = numba.njit(cache=True, nogil=True)

# Unsigned constants: Numba turns uint64 mixed with int64 into float64.
U2 = np.uint64(2)
U3 = np.uint64(3)
U8 = np.uint64(8)
U16 = np.uint64(16)
U24 = np.uint64(24)
S7 = np.uint64(7)
S14 = np.uint64(14)
S28 = np.uint64(28)
M7 = np.uint64(0x00AA00AA00AA00AA)
M14 = np.uint64(0x0000CCCC0000CCCC)
M28 = np.uint64(0x00000000F0F0F0F0)


@jit
def read_be(src, pos, nbytes):
    """Big-endian unsigned integer of nbytes (<= 8) at src[pos:]; the caller checks bounds.

    An int64: 8 bytes with the top bit set wrap to a negative value.
    """
    v = 0
    for t in range(nbytes):
        v = (v << 8) | np.int64(src[pos + t])
    return v


@jit
def copy_bytes(dst, at, src, start, n):
    """dst[at:at + n] = src[start:start + n]; the caller checks bounds.

    Unsigned indices spare Numba's negative-index wraparound, which would
    otherwise keep the loop from vectorizing.
    """
    at = np.uint64(at)
    start = np.uint64(start)
    for t in range(np.uint64(n)):
        dst[at + t] = src[start + t]


@jit
def copy16(dst, at, src, start):
    """dst[at:at + 16] = src[start:start + 16], one fixed-size (branch-free) copy; the caller checks bounds."""
    at = np.uint64(at)
    start = np.uint64(start)
    for t in range(np.uint64(WILD)):
        dst[at + t] = src[start + t]


@jit
def constant(arr, start, n):
    """Whether arr[start:start + n] are all the same byte; the caller checks bounds."""
    start = np.uint64(start)
    value = arr[start]
    for t in range(np.uint64(1), np.uint64(n)):
        if arr[start + t] != value:
            return False
    return True


@jit
def fill(dst, at, n, value):
    """dst[at:at + n] = value; the caller checks bounds."""
    at = np.uint64(at)
    for t in range(np.uint64(n)):
        dst[at + t] = value


@jit
def long_length(src, ip, iend):
    """(length, next input position) of an LZ4 length whose 4-bit field is 15: the bytes that follow
    are added to it up to one below 255; length -1 when the input ends first."""
    length = np.int64(15)
    while True:
        if ip >= iend:
            return np.int64(-1), ip
        more = np.int64(src[ip])
        ip += 1
        length += more
        if more != 255:
            return length, ip


@jit
def lz4_block(src, dst, oend):
    """Decode the LZ4 block src (the whole array) into exactly dst[:oend].

    Short literal runs and matches are copied 16 bytes at a time where src
    and dst have room (the surplus is overwritten by what follows, or lands
    past oend), so give dst 16 bytes of slack for speed.
    Returns (code, a, b, c): OK or the error code with its details.
    """
    iend = src.size
    cap = dst.size
    ip = 0
    op = 0
    while ip < iend:
        token = np.int64(src[ip])
        ip += 1
        lit = token >> 4
        if lit == 15:
            lit, ip = long_length(src, ip, iend)
            if lit < 0:
                return LENGTH_CUT, iend, 0, 0
        if lit > iend - ip:
            return LITERALS_PAST_INPUT, lit, ip, iend
        if lit > oend - op:
            return LITERALS_PAST_OUTPUT, lit, op, oend
        if lit <= WILD and iend - ip >= WILD and cap - op >= WILD:
            copy16(dst, op, src, ip)
        else:
            copy_bytes(dst, op, src, ip, lit)
        ip += lit
        op += lit
        if ip == iend:
            break
        if iend - ip < 2:
            return OFFSET_CUT, iend, 0, 0
        offset = np.int64(src[ip]) | (np.int64(src[ip + 1]) << 8)
        ip += 2
        if offset == 0:
            return OFFSET_ZERO, op, 0, 0
        if offset > op:
            return OFFSET_BEFORE_START, offset, op, 0
        length = token & 15
        if length == 15:
            length, ip = long_length(src, ip, iend)
            if length < 0:
                return LENGTH_CUT, iend, 0, 0
        length += 4
        if length > oend - op:
            return MATCH_PAST_OUTPUT, length, op, oend
        # The match repeats the `offset` bytes before op: a short one far
        # enough back is one fixed-size copy, a repeated constant
        # (long zero runs, coming at offset 2 from hdf5plugin) is a fill.
        # Otherwise copy in steps, each from that period's start: after
        # `done` bytes (a multiple of offset until the last step) the source
        # is done + offset bytes back, so no step overlaps its own output and
        # the copies vectorize.
        if length <= WILD and offset >= WILD and cap - op >= WILD:
            copy16(dst, op, dst, op - offset)
        elif offset < length and constant(dst, op - offset, offset):
            fill(dst, op, length, dst[op - 1])
        else:
            done = 0
            while done < length:
                step = min(done + offset, length - done)
                copy_bytes(dst, op + done, dst, op - offset, step)
                done += step
        op += length
    if op != oend:
        return WRONG_LENGTH, op, oend, 0
    return OK, 0, 0, 0


@jit
def transpose8(x):
    """Transpose the 8x8 bit matrix held in x (bit 8 * row + column)."""
    t = (x ^ (x >> S7)) & M7
    x = x ^ t ^ (t << S7)
    t = (x ^ (x >> S14)) & M14
    x = x ^ t ^ (t << S14)
    t = (x ^ (x >> S28)) & M28
    return x ^ t ^ (t << S28)


@jit
def bit_unshuffle(src, n, itemsize, planes):
    """Undo the bit transpose of one block: src (8 * itemsize rows of n / 8 bytes) to planes.

    planes (uint64, itemsize rows of n / 8 words) gets byte j of element e at
    byte j * n + e, so each group of 8 elements of a row is one 64-bit store.
    Byte planes that are all zero (the high bytes of low counts) are only
    scanned, not transposed.
    """
    nb = np.uint64(n >> 3)
    for j in range(np.uint64(itemsize)):
        row = U8 * j * nb
        seen = np.uint8(0)
        for t in range(U8 * nb):
            seen |= src[row + t]
        if seen == 0:
            for k in range(nb):
                planes[j * nb + k] = 0
            continue
        for k in range(nb):
            p = row + k
            x = np.uint64(0)
            for b in range(U8):
                x |= np.uint64(src[p + b * nb]) << (U8 * b)
            planes[j * nb + k] = transpose8(x)


@jit
def interleave(planes, n, itemsize, dst, first):
    """Byte-transpose planes (itemsize rows of n bytes) into elements first..first+n-1 of dst.

    dst is unsigned integers of itemsize bytes (little-endian host: byte j of
    an element is bits 8j..8j+7 of its value) or, for other item sizes, bytes.
    """
    n = np.uint64(n)
    first = np.uint64(first)
    if dst.itemsize != itemsize:
        size = np.uint64(itemsize)
        for e in range(n):
            for j in range(size):
                dst[(first + e) * size + j] = planes[j * n + e]
    elif itemsize == 1:
        for e in range(n):
            dst[first + e] = planes[e]
    elif itemsize == 2:
        for e in range(n):
            dst[first + e] = planes[e] | (np.uint16(planes[n + e]) << U8)
    elif itemsize == 4:
        for e in range(n):
            dst[first + e] = (
                np.uint32(planes[e])
                | (np.uint32(planes[n + e]) << U8)
                | (np.uint32(planes[U2 * n + e]) << U16)
                | (np.uint32(planes[U3 * n + e]) << U24)
            )
    else:
        for e in range(n):
            v = np.uint64(0)
            for j in range(U8):
                v |= np.uint64(planes[j * n + e]) << (U8 * j)
            dst[first + e] = v


@jit
def decode_chunk(src, dst, itemsize):
    """Decode one chunk (uint8 array) into dst, 1-D C-contiguous, as interleave takes it.

    Returns (code, block, a, b, c): OK or the error code, the block it concerns
    (-1 for none) and the details of MESSAGES.
    """
    dst_bytes = dst.view(np.uint8)
    nbytes = dst_bytes.size
    size = src.size
    if size < HEADER_BYTES:
        return HEADER_SHORT, -1, size, 0, 0
    total = read_be(src, 0, 8)
    if total != nbytes:
        return TOTAL_SIZE, -1, total, nbytes, itemsize
    block_bytes = read_be(src, 8, 4)
    if block_bytes == 0 or block_bytes % (8 * itemsize) != 0:
        return BLOCK_SIZE, -1, block_bytes, itemsize, 0
    count = nbytes // itemsize
    block_elems = block_bytes // itemsize
    n_full = count // block_elems
    last = (count % block_elems) & ~7
    n_blocks = n_full + (1 if last > 0 else 0)
    scratch_bytes = min(block_elems, count) * itemsize
    shuffled = np.empty(scratch_bytes + WILD, np.uint8)
    planes = np.empty(scratch_bytes // 8, np.uint64)
    pos = HEADER_BYTES
    done = 0
    for block in range(n_blocks):
        n = block_elems if block < n_full else last
        if size - pos < 4:
            return SIZE_FIELD_CUT, block, pos, size, 0
        csize = read_be(src, pos, 4)
        pos += 4
        if csize > size - pos:
            return BLOCK_PAST_END, block, csize, pos - 4, size
        code, a, b, c = lz4_block(src[pos : pos + csize], shuffled, n * itemsize)
        if code != OK:
            return code, block, a, b, c
        pos += csize
        bit_unshuffle(shuffled, n, itemsize, planes)
        interleave(planes.view(np.uint8), n, itemsize, dst, done)
        done += n
    rest = nbytes - done * itemsize
    if size - pos < rest:
        return TRAILING_MISSING, -1, rest, pos, size - pos
    if size - pos > rest:
        return EXTRA_BYTES, -1, size - pos - rest, size, pos + rest
    copy_bytes(dst_bytes, done * itemsize, src, pos, rest)
    return OK, -1, 0, 0, 0


@jit
def decode_range(data, starts, ends, first, stop, out, itemsize):
    """Decode chunks first..stop-1 (chunk i is data[starts[i]:ends[i]]) into out[i].

    Stops at the first bad chunk; returns (index or -1, code, block, a, b, c).
    """
    for i in range(first, stop):
        code, block, a, b, c = decode_chunk(data[starts[i] : ends[i]], out[i], itemsize)
        if code != OK:
            return i, code, block, a, b, c
    return -1, OK, -1, 0, 0, 0


def message(code: int, block: int, a: int, b: int, c: int) -> str:
    """The ValueError text of a kernel error code and its details.

    Details are non-negative; a header size with its top bit set comes back
    from the kernel as a negative int64, hence the modulo.
    """
    return MESSAGES[code].format(block=block, a=a % (1 << 64), b=b, c=c)


def target(out: np.ndarray) -> np.ndarray:
    """out viewed as interleave writes it: unsigned integers of its item size, else bytes."""
    size = out.dtype.itemsize
    return out.view(f"u{size}" if size in (1, 2, 4, 8) else np.uint8)


def as_bytes(chunk: np.ndarray | bytes) -> np.ndarray:
    """A raw chunk (bytes-like or array) as a read-only 1-D uint8 array, without copying.

    Always read-only, so the kernels are compiled once per output type.
    """
    arr = chunk if isinstance(chunk, np.ndarray) else np.frombuffer(chunk, np.uint8)
    arr = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    arr.flags.writeable = False
    return arr


class ChunkError(ValueError):
    """A malformed chunk of a batch: ``index`` is its position in the batch, so a reader can name the frame."""

    def __init__(self, index: int, problem: str):
        super().__init__(f"chunk {index}: {problem}")
        self.index = index
        self.problem = problem

    def __reduce__(self):
        return ChunkError, (self.index, self.problem)


def decompress(chunk: np.ndarray | bytes, dtype, count: int) -> np.ndarray:
    """Decode one Bitshuffle-LZ4 chunk holding `count` elements of `dtype`; return them 1-D.

    Gives the bytes h5py + hdf5plugin would; raises ValueError saying what is
    malformed (header, a block's size field, an LZ4 block, trailing bytes).
    """
    dtype = np.dtype(dtype)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    out = np.empty(count, dtype)
    code, block, a, b, c = decode_chunk(as_bytes(chunk), target(out), dtype.itemsize)
    if code != OK:
        raise ValueError(message(code, block, a, b, c))
    return out


def worker_count() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@functools.cache
def thread_pool(pid: int) -> ThreadPoolExecutor:
    """The decoding threads of process `pid`, started once: starting threads costs more than
    decoding a few frames. Keyed by pid, as a forked child inherits none of its parent's threads.
    """
    return ThreadPoolExecutor(worker_count(), thread_name_prefix="bitshuffle-lz4")


def decompress_into(chunks: list, out: np.ndarray, threads: int | None = None) -> None:
    """Decode chunk i into out[i] for every i, in `threads` threads (default: the usable cores).

    The chunks are packed into one buffer for :func:`decompress_stored`.
    """
    views = [as_bytes(c) for c in chunks]
    ends = np.cumsum([v.size for v in views], dtype=np.int64)
    starts = ends - [v.size for v in views]
    data = np.concatenate(views) if views else np.zeros(0, np.uint8)
    decompress_stored(data, starts, ends, out, threads)


def decompress_stored(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, out: np.ndarray, threads: int | None = None) -> None:
    """Decode chunk i, data[starts[i]:ends[i]], into out[i] for every i, in `threads` threads (default: the usable cores).

    out is (n, ...) C-contiguous of the data's dtype; each chunk holds
    out[i].size elements. The chunks are split into contiguous runs, one nogil
    Numba call per run, so the per-chunk cost is a loop step rather than a
    Python call. Raises ValueError naming the first bad chunk ("chunk 17: LZ4
    block 0: ..."); out is then partly written.
    """
    n = len(starts)
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    if out.ndim < 1 or out.shape[0] != n or len(ends) != n:
        raise ValueError(f"out has shape {out.shape}, expected {n} frames first")
    if n == 0:
        return
    data = as_bytes(data)
    starts = np.ascontiguousarray(starts, np.int64)
    ends = np.ascontiguousarray(ends, np.int64)
    if starts.min() < 0 or ends.max() > data.size or (ends < starts).any():
        raise ValueError(f"chunk bounds fall outside the {data.size} bytes given")
    flat = target(out.reshape(n, -1))
    itemsize = out.dtype.itemsize
    threads = max(1, min(threads or worker_count(), n))
    if threads == 1:
        results = [decode_range(data, starts, ends, 0, n, flat, itemsize)]
    else:
        bounds = np.linspace(0, n, threads + 1).astype(np.int64)
        runs = list(zip(bounds[:-1], bounds[1:]))
        pool = thread_pool(os.getpid())
        results = list(pool.map(lambda r: decode_range(data, starts, ends, r[0], r[1], flat, itemsize), runs))
    bad = [r for r in results if r[0] >= 0]
    if bad:
        index, code, block, a, b, c = min(bad)
        raise ChunkError(index, message(code, block, a, b, c))
