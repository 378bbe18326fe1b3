"""A file's byte ranges read in pieces side by side: from the page cache where it holds them, and, where
the ``qgpu.direct-reads`` setting asks for it, the rest straight from the drive.

Bytes the page cache holds are copied out of it by plain positional reads, several GB/s a thread. With
direct reads on, bytes it does not hold are read with direct I/O (``O_DIRECT``): the drive's pages land in
the buffer, with no copy through the cache and no readahead that evicts what is cached. A plain read that
may not wait for the drive (``RWF_NOWAIT``, readahead off for it) returns what is cached, and the rest of the
piece is read direct. Where the filesystem refuses direct I/O (tmpfs on older kernels, some network
filesystems) or the platform lacks it, every piece is read plainly.

Direct reads are off unless asked for: on the development VM's virtual disk a cold Arina data file read
block by block came in at 0.56-0.73 GB/s direct against 1.16-1.36 GB/s plain (the kernel's readahead keeps
that disk busy between blocks; direct pieces of 4 MiB on 8 threads do not), although a single 1 GB read
with every piece in flight at once was faster direct (2.25 against 1.87 GB/s). Whether an NVMe drive gains,
as quantem's direct reads do, is to be measured there before it becomes the default.
"""

from __future__ import annotations

import errno
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from ...config import setting

ALIGN = 4096  # direct reads start and end at multiples of this in the file and in memory (a page: any logical block size)
READ_PIECE = 4 * 2**20  # bytes of a range one thread reads (a multiple of ALIGN)
READERS = ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="qgpu-read")  # shared by every open file
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024  # pieces one scattered read fills
DIRECT = getattr(os, "O_DIRECT", 0)
NOWAIT = getattr(os, "RWF_NOWAIT", 0)


def new_memory(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, np.uint8)


class FileBytes:
    """One file open for positional reads (threads share it): plainly, and direct where the filesystem allows."""

    def __init__(self, path: str):
        self.plain = os.open(path, os.O_RDONLY)
        self.direct_fd = None
        if DIRECT and NOWAIT and setting("direct-reads"):
            try:
                self.direct_fd = os.open(path, os.O_RDONLY | DIRECT)
            except OSError:  # EINVAL: this filesystem does not do direct I/O
                pass
        self.direct = self.direct_fd is not None  # cleared if direct reads are refused after all
        if self.direct:  # a plain read that finds its pages uncached must not start readahead beside the direct read
            os.posix_fadvise(self.plain, 0, 0, os.POSIX_FADV_RANDOM)
        self.direct_bytes = 0  # bytes that came in by direct reads (what the page cache did not hold)

    def read(self, position: int, nbytes: int, buffer: Callable[[int], np.ndarray] = new_memory) -> tuple[np.ndarray, int]:
        """The bytes position .. position + nbytes in memory from ``buffer(size)`` (uint8; a few pages more than
        asked, so the pages around the range fit), and how many of them the file has (fewer where it ends)."""
        memory = buffer(nbytes + 3 * ALIGN)
        lead = position % ALIGN
        start = -memory.ctypes.data % ALIGN  # memory index of the page that holds byte ``position``
        first = position - lead
        end = -(-(position + nbytes) // ALIGN) * ALIGN
        view = memoryview(memory).cast("B")[start : start + end - first]  # file bytes first .. end
        pieces = range(first, end, READ_PIECE)

        def piece(at: int) -> tuple[int, int]:
            return self.read_piece(view, first, max(at, position), min(at + READ_PIECE, position + nbytes), min(at + READ_PIECE, end))

        got = 0
        for at, (n, direct) in zip(pieces, READERS.map(piece, pieces) if len(pieces) > 1 else map(piece, pieces)):
            self.direct_bytes += direct
            lo = max(at, position)
            got = lo - position + n
            if n < min(at + READ_PIECE, position + nbytes) - lo:
                break
        return memory[start + lead : start + lead + nbytes], got

    def read_into(self, position: int, out: np.ndarray) -> int:
        """Fill ``out`` (a C-contiguous array: the memory a load is given) with the file's bytes from
        ``position`` by plain reads, READ_PIECE bytes a thread; the bytes read (fewer where the file ends)."""
        view = memoryview(out.reshape(-1).view(np.uint8))
        pieces = range(0, view.nbytes, READ_PIECE)
        got = 0
        for at, n in zip(pieces, READERS.map(lambda at: self.read_plain(position + at, view[at : at + READ_PIECE]), pieces)):
            got = at + n
            if n < min(READ_PIECE, view.nbytes - at):
                break
        return got

    def read_records(self, position: int, stride: int, frames: np.ndarray, heads: np.ndarray | None) -> int:
        """Records of ``stride`` bytes from ``position`` read straight into the memory given: each its header
        (``heads[k]``; None: records have none), its frame (``frames[k]``, uint8 rows) and the rest skipped, by
        scattered reads of up to IOV_MAX pieces on several threads; how many whole records came (fewer where
        the file ends)."""
        n, size = frames.shape
        head = 0 if heads is None else heads.shape[1]
        gap = stride - head - size
        sink = np.empty(max(gap, 0), np.uint8)  # what lies between frames, read and dropped (by every thread)
        per = max(1, IOV_MAX // ((head > 0) + 1 + (gap > 0)))

        def part(lo: int) -> int:
            hi = min(n, lo + per)
            pieces = []
            for k in range(lo, hi):
                pieces += [heads[k], frames[k]] if head else [frames[k]]
                if gap and k < hi - 1:
                    pieces.append(sink)
            got = os.preadv(self.plain, pieces, position + lo * stride)
            if got == (hi - lo - 1) * stride + head + size:
                return hi - lo
            return 0 if got < head + size else (got - head - size) // stride + 1  # the file ended

        whole = 0
        for lo, got in zip(range(0, n, per), READERS.map(part, range(0, n, per))):
            whole = lo + got
            if got < min(per, n - lo):
                break
        return whole

    def read_heads(self, position: int, stride: int, heads: np.ndarray) -> int:
        """The headers of records ``stride`` bytes apart from ``position`` into the rows of ``heads``, one small
        read each (not the records between them); how many came whole (fewer where the file ends)."""
        for k in range(len(heads)):
            if os.preadv(self.plain, [heads[k]], position + k * stride) < heads.shape[1]:
                return k
        return len(heads)

    def read_piece(self, view: memoryview, first: int, lo: int, hi: int, page_end: int) -> tuple[int, int]:
        """Fill file bytes lo .. hi of ``view`` (which holds file bytes from ``first``, a page boundary): what the
        page cache holds plainly, the rest by direct reads of whole pages up to ``page_end``; (bytes of lo .. hi
        read: fewer where the file ends, bytes read direct)."""
        if not self.direct:
            return self.read_plain(lo, view[lo - first : hi - first]), 0
        try:
            got = os.preadv(self.plain, [view[lo - first : hi - first]], lo, NOWAIT)
        except BlockingIOError:  # nothing of it is cached
            got = 0
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self.direct = False  # the page cache cannot be asked: plain reads from now on
            return self.read_plain(lo, view[lo - first : hi - first]), 0
        at = (lo + got) // ALIGN * ALIGN
        direct = 0
        while lo + got < hi:
            try:
                n = os.preadv(self.direct_fd, [view[at - first : page_end - first]], at)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
                self.direct = False  # direct reads refused after all: the rest plainly
                done = max(lo + got, at)
                return done - lo + self.read_plain(done, view[done - first : hi - first]), direct
            direct += n
            at += n
            got = max(got, min(at, hi) - lo)
            if not n or at % ALIGN:  # a short read ends the file
                break
        return got, direct

    def read_plain(self, position: int, view: memoryview) -> int:
        """Fill ``view`` from the file at ``position`` by plain reads; the bytes read (fewer where the file ends)."""
        got = 0
        while got < view.nbytes:
            n = os.preadv(self.plain, [view[got:]], position + got)
            if not n:
                break
            got += n
        return got

    def close(self) -> None:
        os.close(self.plain)
        if self.direct_fd is not None:
            os.close(self.direct_fd)
        self.direct = False
