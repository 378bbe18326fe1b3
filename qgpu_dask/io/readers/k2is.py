"""Gatan K2 IS acquisitions: ``<name>.gtg`` (a DigitalMicrograph DM4 tag file; the scan as ``SI Dimensions``,
``Size Y`` x ``Size X``, where the STEMx unit recorded one) and eight sector files ``<name>*.bin``, sorted by
name: sector s holds detector columns 256 s .. 256 s + 255 of every frame. Either file is the path to give.

A sector file is a run of 0x5758-byte blocks: a 40-byte big-endian header, then 930 x 16 counts of 12 bits,
two in three bytes (the first in byte 0 and the low half of byte 1, the second in the high half of byte 1 and
byte 2). The header holds the sync word 0xFFFF0055 (bytes 0-3, the format's signature), flags (byte 9; bit 0:
recorded with the shutter open), a block counter (bytes 16-19, alike for the blocks the sectors record at
once), the sector's width and height (20-23: 256, 1860), the frame id (24-27), the block's pixel range in its
sector (28-35) and its size (36-39). A frame is 32 blocks in each sector, one after the other: block k = 16 y
+ x holds rows 930 y .. 930 y + 929, columns 16 (15 - x) .. 16 (15 - x) + 15 of its sector (LiberTEM reads
them by this order, not by their pixel ranges); frames are 1860 x 2048 uint16.

A sector file may start and end part way through a frame, each at a block of its own. As LiberTEM (0.16) does,
the sectors are put in step at the first block counter all of them hold (the largest of their first blocks'
counters), and, where the 32 blocks from there do not all carry one frame id, at the next frame in every
sector; the frames after are whole where every sector holds their 32 blocks. The scan begins at the first
frame recorded with the shutter open or, where the .gtg gives the scan, one frame before it (the camera sets
the flag a frame late, as LiberTEM corrects); the frames before it are dropped, and whole frames after the
scan's last are not read. Without SI Dimensions (or without a .gtg) ``scan_shape`` is needed (given, it is
taken over the .gtg's); there LiberTEM also skips, past the shutter frame, as many frames as came before it
(its default ``sync_offset``), which this reader does not. Every block read is checked: its sync word, and one frame id for a frame's blocks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import numba
import numpy as np

from ..source import Source
from .base import Format, ScanShapeNeeded
from .dm import is_dm
from .file_bytes import READ_PIECE, READERS, FileBytes
from .frame_file import StoredFrames

SYNC = 0xFFFF0055
BLOCK, HEAD = 0x5758, 40  # bytes of a block and of its header
BLOCK_ROWS = 930  # a block is 930 rows of 16 counts
FRAME_BLOCKS = 32  # blocks of a frame in each sector: 2 rows of 16
SECTORS, SECTOR_COLS = 8, 256
DET = (2 * BLOCK_ROWS, SECTORS * SECTOR_COLS)
SECTOR_FRAME = FRAME_BLOCKS * BLOCK  # bytes of one frame in a sector file
HEADER = np.dtype({"names": ["sync", "flags", "counter", "width", "height", "frame"],
                   "formats": [">u4", "u1", ">u4", ">u2", ">u2", ">u4"], "offsets": [0, 9, 16, 20, 22, 24], "itemsize": HEAD})
SHUTTER = 1  # the flags' bit of a block recorded with the shutter open
SCAN_TAGS = (".SI Dimensions.Size Y", ".SI Dimensions.Size X")
LOOK = 256  # headers read at a time where a block or frame is looked for


def first_head(path: Path) -> np.void | None:
    """The header of ``path``'s first block where it is a K2 IS sector file (the sync word, a sector's width and
    height, a whole block), else None."""
    if not path.is_file() or path.stat().st_size < BLOCK:
        return None
    with open(path, "rb") as f:
        head = np.frombuffer(f.read(HEAD), HEADER)[0]
    return head if head["sync"] == SYNC and (head["width"], head["height"]) == (SECTOR_COLS, DET[0]) else None


def is_k2is(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is a K2 IS sector file or a .gtg tag file (a DM4 file named so)."""
    return first_head(path) is not None or (path.suffix.lower() == ".gtg" and is_dm(path))


def acquisition_name(path: Path) -> str:
    """What the files of ``path``'s acquisition are named from: the .gtg's stem, a sector file's without its number."""
    return path.stem if path.suffix.lower() == ".gtg" else re.sub(r"\d+$", "", path.stem)


def sector_files(path: Path) -> list[Path]:
    """The eight sector files ``<name>*.bin`` of ``path``'s acquisition, sorted by name (LiberTEM's order);
    ValueError naming what is there otherwise."""
    name, suffix = acquisition_name(path), ".bin" if path.suffix.lower() == ".gtg" else path.suffix
    found = sorted(p for p in path.parent.iterdir() if p.name.startswith(name) and p.name.endswith(suffix) and p.is_file())
    if len(found) != SECTORS:
        raise ValueError(f"{str(path)!r}: a K2 IS acquisition has {SECTORS} sector files {name}*{suffix} beside it, and {len(found)}"
                         f" are there ({', '.join(p.name for p in found) or 'none'}): put all {SECTORS}, and no other file named so, beside it")
    for p in found:
        if first_head(p) is None:
            raise ValueError(f"{str(p)!r} is not a K2 IS sector file (its first block lacks the sync word 0xFFFF0055 or a 256 x 1860"
                             f" sector): only the acquisition's {SECTORS} sector files may be named {name}*{suffix}")
    return found


def recorded_scan(gtg: Path) -> tuple[int, int] | None:
    """The scan (rows, cols) a .gtg records as SI Dimensions; None where it records none, or there is no .gtg."""
    if not gtg.is_file():
        return None
    try:
        from ncempy.io.dm import fileDM
    except ImportError:
        raise ValueError(f"reading {str(gtg)!r} (a K2 IS .gtg) needs ncempy: pip install 'qgpu-dask[formats]'") from None
    with fileDM(str(gtg), on_memory=True) as dm:
        sizes = [dm.allTags.get(tag) for tag in SCAN_TAGS]
    return None if any(s is None for s in sizes) else (int(sizes[0]), int(sizes[1]))


def heads_at(file: FileBytes, position: int, n: int, stride: int = BLOCK) -> np.ndarray:
    """The headers of up to ``n`` blocks ``stride`` bytes apart from byte ``position`` (fewer where the file ends)."""
    raw = np.empty((n, HEAD), np.uint8)
    return raw[: file.read_heads(position, stride, raw)].reshape(-1).view(HEADER)


def first_block(file: FileBytes, position: int, size: int, holds: Callable[[np.ndarray], np.ndarray]) -> int | None:
    """The byte where the first whole block from ``position`` whose header ``holds`` begins; None where none does."""
    while position + BLOCK <= size:
        heads = heads_at(file, position, min(LOOK, (size - position) // BLOCK))
        hits = np.flatnonzero(holds(heads))
        if hits.size:
            return position + int(hits[0]) * BLOCK
        position += len(heads) * BLOCK
    return None


def in_step(files: list[FileBytes], paths: list[Path], sizes: list[int]) -> list[int]:
    """The byte of each sector file where the first frame every sector holds whole begins (LiberTEM's sync)."""
    counter = max(int(heads_at(f, 0, 1)["counter"][0]) for f in files)
    starts = [first_block(f, 0, size, lambda heads: heads["counter"] == counter) for f, size in zip(files, sizes)]
    for p, at in zip(paths, starts):
        if at is None:
            raise ValueError(f"{str(p)!r} holds no block {counter}, where another sector file begins: the sector files are not of one acquisition")
    if any(np.unique(heads_at(f, at, FRAME_BLOCKS)["frame"]).size > 1 for f, at in zip(files, starts)):  # they begin within a frame
        frame = heads_at(files[0], starts[0], 1)["frame"][0]
        starts = [first_block(f, at, size, lambda heads: heads["frame"] != frame) for f, at, size in zip(files, starts, sizes)]
        if None in starts:
            raise ValueError(f"{str(paths[starts.index(None)])!r} holds no frame after frame id {frame}: no frame is whole in every sector")
    return starts


def shutter_opens(files: list[FileBytes], paths: list[Path], starts: list[int], frames: int) -> int:
    """The first of the ``frames`` whole frames from ``starts`` that the shutter was open for, the same in every sector."""
    opened = None
    for lo in range(0, frames, LOOK):
        hits = np.flatnonzero(heads_at(files[0], starts[0] + lo * SECTOR_FRAME, min(LOOK, frames - lo), SECTOR_FRAME)["flags"] & SHUTTER)
        if hits.size:
            opened = lo + int(hits[0])
            break
    if opened is None:
        raise ValueError(f"{str(paths[0])!r}: none of its {frames} whole frames was recorded with the shutter open (bit 0 of a block's"
                         " byte 9): no scan in it")
    for f, p, at in zip(files, paths, starts):
        before = heads_at(f, at + (opened - 1) * SECTOR_FRAME, 1)["flags"][0] & SHUTTER if opened else 0
        if before or not heads_at(f, at + opened * SECTOR_FRAME, 1)["flags"][0] & SHUTTER:
            raise ValueError(f"{str(p)!r}: the shutter opens at another frame than in {paths[0].name} (frame {opened}): the sectors are not in step")
    return opened


@numba.njit(cache=True, nogil=True, inline="always")
def four(a, b, c, d):
    """Four counts as one little-endian 64-bit word of four uint16."""
    return a | b << 16 | c << 32 | d << 48


@numba.njit(cache=True, nogil=True)
def unpack(words: np.ndarray, out: np.ndarray, left: int) -> None:
    """One sector's blocks (frames, 32, BLOCK / 8 little-endian 64-bit words) into its columns ``left`` .. of
    ``out`` (frames, 1860, 2048 / 4 such words, four counts each). A block row's 16 counts are the 192 bits of
    three words, count i at bit 12 i; they are written four to a word and a detector row at a time (its 16
    blocks side by side), about twice as fast as a block and a count at a time on the 2-core machine."""
    mask = np.uint64(0xFFF)
    for f in range(words.shape[0]):
        for y in range(2):
            for r in range(BLOCK_ROWS):
                at, row, o = HEAD // 8 + 3 * r, out[f, y * BLOCK_ROWS + r], left // 4
                for x in range(15, -1, -1):  # block 16 y + x holds columns 16 (15 - x) ..
                    w0, w1, w2 = words[f, 16 * y + x, at], words[f, 16 * y + x, at + 1], words[f, 16 * y + x, at + 2]
                    row[o] = four(w0 & mask, w0 >> 12 & mask, w0 >> 24 & mask, w0 >> 36 & mask)
                    row[o + 1] = four(w0 >> 48 & mask, (w0 >> 60 | w1 << 4) & mask, w1 >> 8 & mask, w1 >> 20 & mask)
                    row[o + 2] = four(w1 >> 32 & mask, w1 >> 44 & mask, (w1 >> 56 | w2 << 8) & mask, w2 >> 4 & mask)
                    row[o + 3] = four(w2 >> 16 & mask, w2 >> 28 & mask, w2 >> 40 & mask, w2 >> 52)
                    o += 4


class K2ISFrames(StoredFrames):
    """The scan of ``shape`` in the sector files ``paths`` (open as ``files``): its frame k is the 32 blocks at
    ``starts[s] + k * SECTOR_FRAME`` of each. A block of frames is read into memory kept from block to block,
    READ_PIECE bytes of one sector a thread: each reads its blocks, checks their headers and unpacks their
    counts into the frames while the others read theirs."""

    kind = "k2is"
    compression = "12-bit packed"

    def __init__(self, paths: list[Path], files: list[FileBytes], starts: list[int], shape: tuple[int, int, int, int]):
        self.paths, self.files, self.starts = paths, files, starts
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(np.uint16)
        self.memory = np.empty(0, np.uint8)  # the blocks of a block of frames, read (kept for the next block)

    def frames_into(self, out: np.ndarray, start: int) -> np.ndarray:
        """Frames start .. start + len(out) unpacked into ``out`` (n, 1860, 2048)."""
        n = len(out)
        span = n * SECTOR_FRAME
        if self.memory.size < SECTORS * span:
            self.memory = np.empty(SECTORS * span, np.uint8)
        group = max(1, READ_PIECE // SECTOR_FRAME)
        ids = np.empty((SECTORS, n), np.int64)

        def part(piece: tuple[int, int]) -> None:
            s, lo = piece
            hi = min(n, lo + group)
            raw = self.memory[s * span + lo * SECTOR_FRAME : s * span + hi * SECTOR_FRAME]
            got = self.files[s].read_plain(self.starts[s] + (start + lo) * SECTOR_FRAME, memoryview(raw))
            if got < raw.size:
                raise ValueError(f"{str(self.paths[s])!r} ended at frame {start + lo + got // SECTOR_FRAME} of the scan while being read"
                                 " (cut after it was opened?)")
            ids[s, lo:hi] = self.frame_ids(raw.reshape(hi - lo, FRAME_BLOCKS, BLOCK), s, start + lo)
            words = raw.view("<u8").reshape(hi - lo, FRAME_BLOCKS, BLOCK // 8)
            unpack(words, out[lo:hi].view("<u8"), s * SECTOR_COLS)  # a view of the frames' rows: never a copy

        for _ in READERS.map(part, [(s, lo) for lo in range(0, n, group) for s in range(SECTORS)]):  # the first error is raised
            pass
        apart = np.flatnonzero((ids != ids[0]).any(axis=0))
        if apart.size:
            k = int(apart[0])
            s = int(np.flatnonzero(ids[:, k] != ids[0, k])[0])
            raise ValueError(f"frame {start + k} of the scan is frame id {ids[0, k]} in {self.paths[0].name} but {ids[s, k]} in"
                             f" {self.paths[s].name}: the sector files are out of step (blocks lost?)")
        return out

    def frame_ids(self, blocks: np.ndarray, s: int, first: int) -> np.ndarray:
        """The frame id of each frame of ``blocks`` (frames first .. of sector ``s``), their headers checked."""
        heads = np.ascontiguousarray(blocks[..., :HEAD]).view(HEADER)[..., 0]
        where = repr(str(self.paths[s]))
        bad = np.argwhere(heads["sync"] != SYNC)
        if bad.size:
            f, k = (int(i) for i in bad[0])
            raise ValueError(f"{where}: the block at byte {self.starts[s] + (first + f) * SECTOR_FRAME + k * BLOCK} (frame {first + f} of the"
                             f" scan) starts 0x{int(heads['sync'][f, k]):08X}, not the sync word 0x{SYNC:08X}: the file is damaged")
        torn = np.flatnonzero((heads["frame"] != heads["frame"][:, :1]).any(axis=1))
        if torn.size:
            f = int(torn[0])
            raise ValueError(f"{where}: the {FRAME_BLOCKS} blocks of frame {first + f} of the scan carry frame ids"
                             f" {sorted(set(heads['frame'][f].tolist()))}: blocks are missing (damaged file?)")
        return heads["frame"][:, 0]

    def close(self) -> None:
        for file in self.files:
            file.close()


def open_k2is(path: Path, source: Source) -> K2ISFrames:
    where = repr(str(path))
    paths = sector_files(path)
    gtg = path if path.suffix.lower() == ".gtg" else path.with_name(acquisition_name(path) + ".gtg")
    recorded = recorded_scan(gtg)
    files = [FileBytes(str(p)) for p in paths]
    try:
        sizes = [p.stat().st_size for p in paths]
        starts = in_step(files, paths, sizes)
        whole = min((size - at) // SECTOR_FRAME for size, at in zip(sizes, starts))
        opened = shutter_opens(files, paths, starts, whole)
        first = opened - 1 if recorded else opened
        if first < 0:
            raise ValueError(f"{where}: the shutter flag is set from the first whole frame, so the frame before it, where the scan"
                             " begins (the camera sets the flag a frame late), is not in the sector files")
        held = whole - first
        scan = source.scan_shape or recorded
        if scan is None:
            why = "its .gtg records no SI Dimensions" if gtg.is_file() else f"no {gtg.name} beside them"
            raise ScanShapeNeeded(f"the {held} frames of {where} come with no scan shape ({why}): give scan_shape=(rows, cols)", held)
        rows, cols = (int(v) for v in scan)
        if rows * cols > held:
            raise ValueError(f"the scan {(rows, cols)} has {rows * cols} positions, but the sector files of {where} hold {held} whole"
                             f" frames from its start (frame {first} of those every sector holds): cut short?")
        return K2ISFrames(paths, files, [at + first * SECTOR_FRAME for at in starts], (rows, cols, *DET))
    except BaseException:
        for file in files:
            file.close()
        raise


FORMAT = Format("k2is", is_k2is, open_k2is, "a Gatan K2 IS acquisition (.gtg or a sector .bin)")
