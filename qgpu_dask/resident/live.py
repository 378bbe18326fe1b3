"""Acquisitions that grow while they are queried: frames arrive in scan order (from a detector stream, the
client or worker-side code) and every query answers exactly for the scan positions received so far.

A live acquisition is held as parts covering the received frames [0, received): dense, one part (the
counts written into the acquisition's zeroed array); compressed, the coded scan blocks (one
``CompressedCounts`` over every complete codec block) and the frames of the block still filling, kept
dense until it completes. The compressed model and block are chosen from the first PROBE frames (held
dense until then), or at once from a sample of frames spread over the scan (``Coding``: a load from a
file that can read any frames, admitted by the bytes the sample's coding makes it expect), with every
symbol of every pixel's alphabets given a nonzero frequency, so later blocks may hold any count. Queries
see frames not received yet as zeros (a virtual image is 0 there); reductions take only received positions.
Once every frame is in, ``finished()`` is the plain dense or compressed resident, which the shard then holds
instead.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import numpy as np

from ..device import held_memory, synchronize, use_own_stream
from ..formats import codec
from ..formats.groups import Geometry
from .base import Resident, kernels_for
from .compressed import MODEL_KEYS, CompressedCounts, check_layout, chosen_model
from .groups import GroupIndex, centered_geometry, index_piece, worst_bytes
from .cpu.dense import sum_dtype
from .dense import DenseCounts
from .masks import MaskWeights
from .sparse import SparseCounts, SparseFrames

PROBE = codec.MIN_BLOCK  # frames a compressed live acquisition holds dense before it chooses its model
APPEND_BYTES = 2**30  # counts a load appends at a time at most, so the payload room its coding sizes is enough (on an H200
# a 10000-frame Arina data file per append coded 0.69 s an acquisition against 0.85 s at 512 MiB: more blocks per launch)
MARGIN = 1.1  # payload room over what a sample's coding gives, before the payload grows (by GROWTH)
GROWTH = 1.25  # a full payload grows to this many times its size, or as much as the frames appended need
DENSE_FRAMES = 256  # frames of a sparse piece made dense at a time (256 MiB of 512 x 512 uint32)
LIVE_LAYOUTS = ("compressed", "dense", "sparse")  # how a live acquisition may hold its counts
CHOOSERS = ThreadPoolExecutor(2, thread_name_prefix="qgpu-model", initializer=use_own_stream)  # models chosen beside the appends


def tail_frames(n_frames: int) -> int:
    """Frames a compressed live acquisition holds dense at most: the largest block a model may choose."""
    return min(n_frames, codec.MAX_BLOCK)


def append_frames(shape, dtype, block: int) -> int:
    """The most frames a load appends at a time: APPEND_BYTES of counts, or an eighth of a smaller scan (at least
    a block), so the room kept for coding an append stays small beside what the acquisition holds."""
    n_frames, frame_bytes = shape[0] * shape[1], shape[2] * shape[3] * np.dtype(dtype).itemsize
    return max(1, min(APPEND_BYTES // frame_bytes, max(block, n_frames // 8)))


def worst_coded_bytes(n_frames: int, frame_len: int, dtype) -> int:
    """The most that coding ``n_frames`` held frames can write: every frame raw, plus a padding byte per stream."""
    return n_frames * frame_len * np.dtype(dtype).itemsize + (n_frames // codec.MIN_BLOCK + 1) * frame_len


def start_bytes(shape, dtype, layout: str) -> int:
    """Device bytes a new live acquisition takes before any frame arrives: dense, all of it; compressed, the
    block being filled and the frame totals (the coded streams grow as blocks complete)."""
    n_frames, frame_len, itemsize = shape[0] * shape[1], shape[2] * shape[3], np.dtype(dtype).itemsize
    if layout == "dense":
        return n_frames * frame_len * itemsize
    if layout == "sparse":
        return SparseCounts.start_bytes(shape, dtype)
    return tail_frames(n_frames) * frame_len * itemsize + 8 * n_frames


@dataclass(frozen=True)
class Coding:
    """The model, scan block and group geometry a compressed acquisition is coded with, chosen from sample frames
    spread over its scan, and the bytes per frame its sample took coded (streams and group index): what the
    acquisition is expected to hold, known before any of it is read."""

    block: int
    model: dict
    geometry: Geometry
    frame_bytes: float

    @classmethod
    def chosen(cls, sample, det_shape: tuple[int, int], xp: ModuleType) -> "Coding":
        """The coding of ``sample`` (n, det_rows, det_cols) frames, coded once to measure it (on ``xp``'s device)."""
        flat = xp.asarray(sample).reshape(len(sample), -1)
        block, model, _ = chosen_model(flat, every_symbol=True)
        geometry = centered_geometry(flat, det_shape)
        streams = kernels_for(xp, "compressed").encode(flat, block, *(model[k] for k in MODEL_KEYS))
        piece = index_piece(flat, geometry, xp)
        nbytes = int(streams.block_base[-1]) + sum(int(a.nbytes) for a in piece[:3])
        return cls(block, model, geometry, nbytes / len(flat))

    def expected_bytes(self, shape) -> int:
        """Bytes a resident of ``shape`` coded this way is expected to hold: every frame at its sample's coded
        bytes, the stream index and block bases, the frame totals and the model."""
        n_frames, frame_len = shape[0] * shape[1], shape[2] * shape[3]
        n_blocks = -(-n_frames // self.block)
        fixed = n_blocks * frame_len * 4 + (n_blocks + 1) * 8 + 8 * n_frames + sum(int(a.nbytes) for a in self.model.values())
        return int(n_frames * self.frame_bytes) + fixed

    def payload_room(self, shape, dtype) -> int:
        """The payload a load coded this way starts with: MARGIN over the expected streams, and room to code the
        block still filling and an append (``append_frames``) after it, so only a load past MARGIN grows it."""
        n_frames, frame_len = shape[0] * shape[1], shape[2] * shape[3]
        held = min(n_frames, self.block + append_frames(shape, dtype, self.block))
        return int(MARGIN * n_frames * self.frame_bytes) + worst_coded_bytes(held, frame_len, dtype)

    def reserved_bytes(self, shape, dtype) -> int:
        """What a load coded this way reserves: the payload it starts with, the rest of what it is expected to
        hold, the block still filling, and the payload's copy without its room made as it ends."""
        n_frames = shape[0] * shape[1]
        held = min(n_frames, self.block) * shape[2] * shape[3] * np.dtype(dtype).itemsize
        return self.expected_bytes(shape) + self.payload_room(shape, dtype) + held


def model_of(sample, det_shape: tuple[int, int]) -> tuple[int, dict, Geometry]:
    """(block, model, group geometry) of a live acquisition's first frames ``sample`` (n, frame_len), chosen
    as every later count stays codable; on a GPU, ready on any stream once returned."""
    block, model, _ = chosen_model(sample, every_symbol=True)
    geometry = centered_geometry(sample, det_shape)
    if not isinstance(sample, np.ndarray):
        synchronize()
    return block, model, geometry


class LiveCounts(Resident):
    """A growing acquisition of a fixed ``shape``: ``append`` the next scan positions, query at any time."""

    def __init__(self, name: str, shape, dtype, layout: str, xp: ModuleType, coding: Coding | None = None):
        """``coding``: the model a compressed one is coded with from its first frame (a load from a file, from
        frames spread over its scan), its payload made with MARGIN room over the bytes expected; without it,
        the model comes from the first PROBE frames received."""
        super().__init__(name, shape, dtype, xp)
        check_layout(layout, self.dtype, LIVE_LAYOUTS)
        self.layout = layout
        self.received = 0
        self.lock = threading.RLock()
        if layout == "dense":
            with held_memory():
                self.flat = xp.zeros((self.n_frames, self.frame_len), self.dtype)
            return
        if layout == "sparse":
            self.sparse = SparseCounts(name, shape, dtype, xp)
            self.sparse.room = lambda nbytes: self.room(nbytes)
            return
        held = tail_frames(self.n_frames) if coding is None else min(self.n_frames, coding.block)
        self.tail = xp.zeros((held, self.frame_len), self.dtype)  # frames not coded yet
        self.coded = 0  # frames in complete, coded blocks
        self.block = 0  # chosen with the model
        self.model: dict | None = None
        self.choosing: Future | None = None  # the model being chosen from the first frames, while more come
        self.index = self.base = None
        self.geometry = None  # of the group index, centred with the model's choice
        self.group_pieces: list[tuple] = []  # the coded blocks' group index pieces
        self.payload = xp.zeros(0 if coding is None else coding.payload_room(shape, self.dtype), np.uint8)
        self.payload_bytes = 0
        with held_memory():
            self.totals = xp.zeros(self.n_frames, np.uint64)
        if coding is not None:
            self.use(coding.block, coding.model, coding.geometry)
        self.view: CompressedCounts | None = None  # the coded blocks, made again when more are coded
        self.room: Callable[[int], None] = lambda nbytes: None  # raises if nbytes more do not fit (the shard's budget)

    # -- growing ---------------------------------------------------------------

    @property
    def complete(self) -> bool:
        return self.received == self.n_frames

    def append(self, frames) -> int:
        """Add ``frames`` (n, det_rows, det_cols) of this dtype, the next n scan positions in C order (host or
        device array); returns the positions received. ValueError, with nothing added, for a wrong shape or
        dtype or frames past the scan. A sparse one also takes ``SparseFrames`` (a detector's non-zeros), which
        the others make dense first."""
        xp = self.xp
        if self.layout == "sparse":
            with self.lock:
                self.received = self.sparse.append(frames)
                return self.received
        if isinstance(frames, SparseFrames):
            with self.lock:
                for piece in frames.pieces(DENSE_FRAMES):
                    self.append(piece.dense(self.det_shape, self.dtype, xp, self.received))
                return self.received
        frames = self.checked_frames(frames)
        n = int(frames.shape[0])
        with self.lock:
            self.check_to_come(self.received, n)
            flat = xp.asarray(frames).reshape(n, self.frame_len)
            if self.layout == "dense":
                self.flat[self.received : self.received + n] = flat
                self.received += n
                return self.settled(self.received)
            self.make_room(n)
            self.totals[self.received : self.received + n] = flat.sum(axis=1, dtype=np.uint64)
            done = 0
            while done < n:
                whole = self.whole_blocks(n - done)
                if whole:  # straight from the frames given: no copy into the tail
                    self.code_blocks(flat[done : done + whole])
                    self.received += whole
                    self.coded += whole
                    done += whole
                    continue
                at = self.received - self.coded
                take = min(n - done, self.tail.shape[0] - at)
                self.tail[at : at + take] = flat[done : done + take]
                self.received += take
                done += take
                self.code_complete_blocks()
            return self.settled(self.received)

    def whole_blocks(self, n: int) -> int:
        """Frames of the next ``n`` that are whole blocks (the scan's short last one too) to code without the
        tail: 0 unless the tail is empty and the model chosen."""
        if self.model is None or self.received > self.coded:
            return 0
        return n if self.received + n == self.n_frames else n - n % self.block

    def make_room(self, n: int) -> None:
        """Grow the payload, before any frame is added, to hold the most that coding ``n`` more frames can
        write (every held frame raw, plus a padding byte per stream), so an append either fits or changes
        nothing; the budget is asked for that growth and for the most their group index pieces can take (held
        apart from the payload)."""
        held = self.received + n - self.coded
        worst = worst_coded_bytes(held, self.frame_len, self.dtype)
        size = self.payload.size
        if self.payload_bytes + worst > size:
            size = max(int(GROWTH * size), self.payload_bytes + worst)
        self.room(size - self.payload.size + worst_bytes(self.det_shape, held))
        if size > self.payload.size:
            grown = self.xp.zeros(size, np.uint8)
            grown[: self.payload_bytes] = self.payload[: self.payload_bytes]
            self.payload = grown

    def code_complete_blocks(self) -> None:
        """Once PROBE frames are in (or all of them), have the model chosen from them in a thread of its own
        (CHOOSERS) while later frames fill the tail, and take it once it is there, the tail is full or the scan
        is complete; then code every complete block of the tail (and the last, short block once the scan is
        complete). A 256 x 256 detector's model took 0.26 s of an H200 host's time, 4096 frames arrived in 0.15 s."""
        held = self.received - self.coded
        if self.model is None:
            if held < min(PROBE, self.n_frames):
                return
            if self.choosing is None:
                sample = self.tail[:held].copy()
                if self.xp is not np:
                    synchronize()  # the copy is made before another stream reads it
                self.choosing = CHOOSERS.submit(model_of, sample, self.det_shape)
            if not (self.choosing.done() or self.complete or held == self.tail.shape[0]):
                return
            self.use(*self.choosing.result())
        whole = held if self.complete else held - held % self.block
        if whole:
            self.code_blocks(self.tail[:whole])
            self.coded += whole
            if held > whole:  # what is left after them moves to the front
                self.tail[: held - whole] = self.tail[whole:held].copy()

    def use(self, block: int, model: dict, geometry: Geometry) -> None:
        """Code with ``model`` in scan blocks of ``block`` frames and index with ``geometry`` from now on."""
        self.block, self.model, self.geometry = block, model, geometry
        n_blocks = -(-self.n_frames // block)
        with held_memory():
            self.index = self.xp.zeros((n_blocks, self.frame_len), np.uint32)
            self.base = self.xp.zeros(n_blocks + 1, np.uint64)

    def code_blocks(self, flat) -> None:
        """Code consecutive scan blocks (whole ones, the scan's last one shorter) with the model in one pass,
        their streams written behind the others (make_room left space for them)."""
        streams = kernels_for(self.xp, "compressed").encode(flat, self.block, *(self.model[k] for k in MODEL_KEYS),
                                                            out=self.payload[self.payload_bytes :])
        b, k = self.coded // self.block, len(streams.block_base) - 1
        size = streams.payload.size
        self.index[b : b + k] = streams.index
        self.base[b + 1 : b + k + 1] = streams.block_base[1:] + np.uint64(self.payload_bytes)
        self.group_pieces.append(index_piece(flat, self.geometry, self.xp))
        self.payload_bytes += size
        self.view = None

    def coded_part(self) -> CompressedCounts | None:
        """The complete coded blocks as a compressed resident of ``coded`` frames (made once per block count)."""
        if self.coded == 0:
            return None
        if self.view is None:
            self.view = CompressedCounts(self.name, (self.coded, 1, *self.det_shape), self.dtype, self.block, self.model,
                                         self.coded_streams(), {}, self.coded_groups(), checked=False)
        return self.view

    def coded_streams(self) -> dict:
        """The streams of the ``coded`` frames' blocks, as ``CompressedCounts`` holds them."""
        n_blocks = -(-self.coded // self.block)
        return {"index": self.index[:n_blocks], "block_base": self.base[: n_blocks + 1], "payload": self.payload[: self.payload_bytes],
                "totals": self.totals[: self.coded]}

    def coded_groups(self) -> GroupIndex:
        """The group index of the ``coded`` frames' blocks."""
        return GroupIndex.joined(self.geometry, self.group_pieces, self.xp)

    def parts(self) -> list[tuple[int, Resident]]:
        """(first frame, resident) covering the frames received so far, in order, that a query may read
        while appends go on: the coded blocks and a dense acquisition's received frames are never written
        again (a grown payload is a new array), and the block still filling is copied. The copy and a new
        coded view's tables are made before the lock is let go (another thread's stream may use the view)."""
        with self.lock:
            if self.layout == "dense":
                return [(0, self.dense_part(self.flat[: self.received]))] if self.received else []
            if self.layout == "sparse":
                return [(0, self.sparse)] if self.received else []  # its frames past the received ones hold no count
            parts = []
            coded = self.coded_part()
            if coded is not None:
                parts.append((0, coded))
            if self.received > self.coded:
                parts.append((self.coded, self.dense_part(self.tail[: self.received - self.coded].copy())))
            return self.settled(parts)

    def dense_part(self, flat) -> DenseCounts:
        return DenseCounts(self.name, flat, (flat.shape[0], 1, *self.det_shape))

    def finished(self, index: bool = True) -> Resident:
        """The plain resident of a complete acquisition (checked, as one loaded from a file); a dense one with
        its index unless ``index`` is False (the budget has no room for it). What it keeps is made in the held
        pool (``device.held_memory``): on a GPU the payload is copied there without its room, even where none is
        left, and a group index of one piece is copied too (``GroupIndex.joined`` keeps the piece's arrays)."""
        with self.lock, held_memory():
            if not self.complete:
                raise ValueError(f"live acquisition {self.name!r} has {self.received} of {self.n_frames} positions")
            if self.layout == "dense":
                dense = DenseCounts(self.name, self.flat, self.shape)
                return dense.indexed() if index else dense
            if self.layout == "sparse":
                self.sparse.room = lambda nbytes: None  # it grows no more: the budget's check lets this acquisition go
                return self.sparse.finished()
            on_device = self.xp is not np
            if self.payload.size > self.payload_bytes or on_device:  # the budget asked for the copy
                self.room(self.payload_bytes)
                self.payload = self.payload[: self.payload_bytes].copy()
            if on_device and len(self.group_pieces) == 1:
                *arrays, n = self.group_pieces[0]
                self.group_pieces = [(*(a.copy() for a in arrays), n)]
            return CompressedCounts(self.name, self.shape, self.dtype, self.block, self.model, self.coded_streams(), {},
                                    self.coded_groups())  # all coded

    # -- the resident interface ----------------------------------------------------

    @property
    def nbytes(self) -> int:
        if self.layout == "dense":
            return int(self.flat.nbytes)
        if self.layout == "sparse":
            return self.sparse.nbytes
        held = (self.tail, self.payload, self.totals, self.index, self.base, *((self.model or {}).values()),
                *(a for piece in self.group_pieces for a in piece[:3]))
        return int(sum(a.nbytes for a in held if a is not None))

    def prepare_mask_sums(self, masks: MaskWeights):
        def run():
            out = self.xp.zeros((masks.n_masks, self.n_frames), masks.acc_dtype)
            for first, part in self.parts():
                out[:, first : first + part.n_frames] = part.prepare_mask_sums(masks)()
            return self.settled(out)

        return run

    nothing_selected = "the roi selects no received scan position"

    def selected(self, roi) -> np.ndarray:
        """The received scan positions ``roi`` selects."""
        indices = super().selected(roi)
        with self.lock:
            return indices[indices < self.received]

    def parts_holding(self, indices):
        """(part, its own indices) for each part that holds some of the scan positions ``indices``."""
        for first, part in self.parts():
            mine = indices[(indices >= first) & (indices < first + part.n_frames)] - first
            if mine.size:
                yield part, mine

    def roi_sum(self, indices):
        total = self.xp.zeros(self.frame_len, sum_dtype(self.dtype))
        for part, mine in self.parts_holding(indices):
            total += part.roi_sum(mine).astype(total.dtype, copy=False)
        return self.settled(total)

    def roi_max(self, indices):
        best = None
        for part, mine in self.parts_holding(indices):
            got = part.roi_max(mine).astype(self.dtype, copy=False)
            best = got if best is None else self.xp.maximum(best, got)
        return self.settled(best)

    def frames_flat(self, lo: int, hi: int):
        if not 0 <= lo <= hi <= self.n_frames:
            raise IndexError(f"frames [{lo}, {hi}) are not inside [0, {self.n_frames})")
        out = self.xp.zeros((hi - lo, self.frame_len), self.dtype)
        for first, part in self.parts():
            a, b = max(lo, first), min(hi, first + part.n_frames)
            if a < b:
                out[a - lo : b - lo] = part.frames_flat(a - first, b - first)
        return self.settled(out)

    def frame_flat(self, index: int):
        return self.frames_flat(index, index + 1)[0]

    def counts_flat(self):
        return self.frames_flat(0, self.n_frames)

    def pixel_images(self, indices: np.ndarray):
        out = self.xp.zeros((len(indices), self.n_frames), np.float32)
        for first, part in self.parts():
            out[:, first : first + part.n_frames] = part.pixel_images(indices)
        return self.settled(out)

    @property
    def data(self):
        """The counts received so far in a new 4-D device array (zeros for positions still to come)."""
        return self.counts_flat().reshape(self.shape)

    def describe(self) -> dict:
        return {**super().describe(), "live": True}
