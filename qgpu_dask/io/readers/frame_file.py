"""Frames of one shape and dtype at a fixed stride in one file: the bulk of most detector formats once their
header is parsed (EMPAD .raw, NanoMegas .blo, MRC, DigitalMicrograph stacks, TIA .ser, raw binary).

Frame k's record starts at ``offset + k * stride``: ``head`` bytes (a format's frame header, checked by the
format where it says how), then the counts, rows of ``det_shape[1]`` counts one after the other, in the
file's byte order; the bytes after the counts (an EMPAD frame's metadata rows) are skipped. A block is read
on several threads (``FileBytes``) straight into the frames the load is given where the rows lie in order
(past headers and gaps by scattered reads), else through memory kept from block to block and put in order
there, in native byte order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from .base import BLOCK_BYTES, frame_blocks, native_order
from .file_bytes import READ_PIECE, READERS, FileBytes


def bottom_up(frames: np.ndarray, out: np.ndarray) -> None:
    """Frames stored last row first, put in order."""
    out[...] = frames[:, ::-1]


class StoredFrames:
    """What every reader of stored frames shares once it can copy frames into memory it is given
    (``frames_into``): frames anywhere, and blocks of whole scan rows, into new memory or memory given."""

    shape: tuple[int, int, int, int]
    dtype: np.dtype

    def frames_into(self, out: np.ndarray, start: int) -> np.ndarray:
        raise NotImplementedError

    def frames(self, start: int, n: int) -> np.ndarray:
        """Frames start .. start + n, (n, det rows, det cols) in native byte order."""
        return self.frames_into(np.empty((n, *self.shape[2:]), self.dtype), start)

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        return self.blocks_into(lambda start, n: np.empty((n, *self.shape[2:]), self.dtype), block_bytes)

    def blocks_into(self, target: Callable[[int, int], np.ndarray], block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        return frame_blocks(lambda start, n: self.frames_into(target(start, n), start), self.shape, self.dtype, block_bytes)


class FrameFile(StoredFrames):
    """The frames of an acquisition of ``shape`` (scan rows, scan cols, det rows, det cols) stored as ``dtype``
    (any byte order) in ``path``, frame k's record at ``offset + k * stride`` (``stride``: the record's bytes
    where records follow each other with nothing between), its counts ``head`` bytes in; ``check(heads,
    first)``, where given, raises ValueError naming the frame whose header (``heads``: (n, head) uint8, of
    frames first ..) is wrong. A frame stored otherwise than as the detector's rows (``stored``: its (rows,
    cols) in the file) is put in order by ``arrange(stored frames, out)`` (``bottom_up``, a format's own
    unfolding). ``kind`` names the format for ``qd.inspect`` and errors. ValueError naming the
    file, its size and the first frame it lacks when it is too short for every frame."""

    compression = "none"

    def __init__(self, kind: str, path: Path, shape: tuple[int, int, int, int], dtype, offset: int, stride: int | None = None,
                 head: int = 0, check: Callable[[np.ndarray, int], None] | None = None, stored: tuple[int, int] | None = None,
                 arrange: Callable[[np.ndarray, np.ndarray], None] | None = None):
        self.kind, self.path = kind, path
        self.shape = tuple(int(s) for s in shape)
        self.stored = np.dtype(dtype)
        self.dtype = native_order(self.stored)
        self.rows, self.cols = stored or self.shape[2:]
        self.frame_bytes = self.rows * self.cols * self.stored.itemsize
        self.head, self.check, self.arrange = int(head), check, arrange
        self.offset, self.stride = int(offset), int(stride or self.head + self.frame_bytes)
        self.as_held = self.stride == self.frame_bytes and not self.head and check is None and arrange is None and self.stored == self.dtype
        self.memory = np.empty(0, np.uint8)  # the records of a block, read (kept for the next block)
        if self.stride < self.head + self.frame_bytes:
            raise ValueError(f"{str(path)!r}: frames {self.stride} bytes apart cannot hold {self.head + self.frame_bytes} bytes each")
        n = self.shape[0] * self.shape[1]
        size = path.stat().st_size
        if self.end_of(n) > size:
            raise ValueError(f"{str(path)!r} is {size} bytes, too short for the {n} frames of its {kind} header ({self.end_of(n)} bytes):"
                             f" frame {self.whole(size - self.offset)} is the first missing (truncated?)")
        self.file = FileBytes(str(path))

    def end_of(self, n: int) -> int:
        """The byte after the first ``n`` frames."""
        return self.offset + (n - 1) * self.stride + self.head + self.frame_bytes if n else self.offset

    def whole(self, nbytes: int) -> int:
        """Whole frames in the first ``nbytes`` from a record's start."""
        record = self.head + self.frame_bytes
        return 0 if nbytes < record else (nbytes - record) // self.stride + 1

    def check_got(self, start: int, got: int, span: int) -> None:
        """ValueError naming the first frame not read where ``got`` of the ``span`` bytes from frame ``start`` came."""
        if got < span:
            self.cut_at(start + self.whole(got))

    def cut_at(self, frame: int) -> None:
        raise ValueError(f"{str(self.path)!r} ended at frame {frame} while being read (cut after it was opened?)")

    def heads(self, start: int, n: int) -> np.ndarray:
        """The headers of frames start .. start + n, (n, head) uint8, read without the frames."""
        heads = np.empty((n, self.head), np.uint8)
        whole = self.file.read_heads(self.offset + start * self.stride, self.stride, heads)
        if whole < n:
            self.cut_at(start + whole)
        return heads

    def frames_into(self, out: np.ndarray, start: int) -> np.ndarray:
        """Frames start .. start + len(out) copied into ``out`` (n, det rows, det cols) in native byte order, their
        headers checked first where the format checks them."""
        n = len(out)
        if self.as_held and out.flags.c_contiguous:  # the file holds the frames as they are held: read straight into them
            self.check_got(start, self.file.read_into(self.offset + start * self.stride, out), n * self.frame_bytes)
            return out
        if self.arrange is None and out.flags.c_contiguous:  # each frame's rows in order: read into them, past the rest
            heads = np.empty((n, self.head), np.uint8) if self.head else None
            whole = self.file.read_records(self.offset + start * self.stride, self.stride, out.reshape(n, -1).view(np.uint8), heads)
            if whole < n:
                self.cut_at(start + whole)
            if self.check is not None:
                self.check(heads, start)
            if self.stored != self.dtype:
                out.byteswap(inplace=True)  # the file's byte order, made native
            return out
        return self.through_memory(out, start)

    def through_memory(self, out: np.ndarray, start: int) -> np.ndarray:
        """Frames start .. start + len(out) read into memory kept from block to block (its pages faulted in once)
        and put in order into ``out``, READ_PIECE bytes of records a thread: each reads its records, checks
        their headers and copies their frames, while the others read theirs."""
        n, size = len(out), self.stored.itemsize
        if self.memory.size < self.end_of(n) - self.offset:
            self.memory = np.empty(self.end_of(n) - self.offset, np.uint8)
        group = max(1, READ_PIECE // self.stride)

        def part(lo: int) -> None:
            hi = min(n, lo + group)
            span = self.end_of(hi - lo) - self.offset
            raw = self.memory[lo * self.stride : lo * self.stride + span]
            self.check_got(start + lo, self.file.read_plain(self.offset + (start + lo) * self.stride, memoryview(raw)), span)
            if self.check is not None:
                self.check(np.ndarray((hi - lo, self.head), np.uint8, raw, 0, (self.stride, 1)), start + lo)
            frames = np.ndarray((hi - lo, self.rows, self.cols), self.stored, raw, self.head, (self.stride, self.cols * size, size))
            if self.arrange is None:
                out[lo:hi] = frames
            else:
                self.arrange(frames, out[lo:hi])

        for _ in READERS.map(part, range(0, n, group)):  # the first error, of the first frames, is raised
            pass
        return out

    def close(self) -> None:
        self.file.close()


class FrameFiles(StoredFrames):
    """An acquisition of ``shape`` whose frames run on from file to file (a TVIPS series' _000, _001, ...):
    ``parts``, one FrameFile each, in order; the scan's frame 0 is their frame ``first`` (frames before it were
    recorded before the scan began). ValueError naming the files when they hold too few frames."""

    compression = "none"

    def __init__(self, kind: str, parts: list[FrameFile], shape: tuple[int, int, int, int], first: int = 0):
        self.kind, self.parts, self.first = kind, parts, int(first)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = parts[0].dtype
        self.starts = np.cumsum([0] + [p.shape[0] * p.shape[1] for p in parts])
        need = self.first + self.shape[0] * self.shape[1]
        if need > self.starts[-1]:
            names = ", ".join(repr(p.path.name) for p in parts)
            raise ValueError(f"{kind} files {names} hold {self.starts[-1]} frames; the scan {self.shape[:2]} from frame {self.first} needs {need}")

    def frames_into(self, out: np.ndarray, start: int) -> np.ndarray:
        at, done = start + self.first, 0
        while done < len(out):
            k = int(np.searchsorted(self.starts, at, side="right")) - 1
            n = min(len(out) - done, int(self.starts[k + 1]) - at)
            self.parts[k].frames_into(out[done : done + n], at - int(self.starts[k]))
            at, done = at + n, done + n
        return out

    def close(self) -> None:
        for part in self.parts:
            part.close()
