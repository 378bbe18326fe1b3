"""Blocks of consecutive frames from a resident, decoded ahead of their consumer: the feed of iterative
reconstructions that run where the data is.

``feed(resident, block_scans, amplitude, depth)`` yields device arrays (scans_in_block, det_rows, det_cols)
of consecutive scan positions in C order: the native counts, or float32 sqrt(counts) (the amplitudes a
ptychographic update compares with). Blocks are cut from spans of frames made at once: one block for a
dense resident; for a compressed one, whole codec blocks of every pixel, as many as fill the GPU with
streams to decode (at most SPAN_BYTES a span), so its consumer never holds a dense copy of the acquisition
and the decoder runs at full width. Spans are made at least ``depth`` blocks ahead: on a GPU on a stream of
their own (the consumer's stream waits for each span, the maker waits until the consumer's work on a
buffer is done before reusing it, decode errors are raised before a span is handed out), on a CPU by a
background thread. A yielded block is valid until the next one is asked for."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np

SPAN_BYTES = 2**31  # the most one span of decoded frames may hold (the feed holds ahead + 1 of them)


def check_count(value, what: str, least: int) -> int:
    """``value`` as an int; ValueError naming ``what`` unless it is an integer >= ``least``."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
        raise ValueError(f"{what} must be an integer >= {least}, got {value!r}")
    return int(value)


def check_feed(block_scans, depth, amplitude) -> tuple[int, int, bool]:
    block_scans, depth = check_count(block_scans, "block_scans", 1), check_count(depth, "depth", 0)
    if not isinstance(amplitude, (bool, np.bool_)):
        raise ValueError(f"amplitude must be True or False, got {amplitude!r}")
    return block_scans, depth, bool(amplitude)


def spans(n_frames: int, size: int) -> list[tuple[int, int]]:
    """(lo, hi) of each span: ``size`` frames, the last one shorter."""
    return [(lo, min(lo + size, n_frames)) for lo in range(0, n_frames, size)]


def span_frames(block_scans: int, grain: tuple[int, int], frame_bytes: int) -> int:
    """Frames made at once: whole blocks; as many of the resident's grain units as fill the device (``grain``
    = (unit, units)), whole units where blocks and units share a short common multiple; at most SPAN_BYTES
    (but one block or unit at least)."""
    unit, units = grain
    whole = math.lcm(block_scans, unit)
    step = whole if whole <= max(block_scans, unit * units) else block_scans
    return step * max(1, min(-(-unit * units // step), SPAN_BYTES // (step * frame_bytes)))


def feed(resident, block_scans: int = 512, amplitude: bool = True, depth: int = 2) -> Iterator:
    """The resident's frames in blocks of ``block_scans`` consecutive scan positions, made ``depth`` ahead."""
    block_scans, depth, amplitude = check_feed(block_scans, depth, amplitude)
    span = span_frames(block_scans, resident.feed_grain, resident.frame_len * (4 if amplitude else resident.dtype.itemsize))
    ahead = -(-depth // (span // block_scans))  # spans made ahead: at least `depth` blocks
    maker = host_feed if resident.xp is np else device_feed
    for made in maker(resident, spans(resident.n_frames, span), amplitude, ahead):
        for lo in range(0, made.shape[0], block_scans):
            yield made[lo : lo + block_scans].reshape(-1, *resident.det_shape)


def host_feed(resident, parts: list[tuple[int, int]], amplitude: bool, ahead: int) -> Iterator[np.ndarray]:
    """Spans made by a background thread, ``ahead`` of the one in use."""
    make = lambda lo, hi: resident.feed_frames(lo, hi, amplitude)[0]  # the CPU decoders raise at once
    if ahead == 0:
        for lo, hi in parts:
            yield make(lo, hi)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="feed") as pool:
        queued = deque(pool.submit(make, lo, hi) for lo, hi in parts[: ahead + 1])
        for lo, hi in parts[ahead + 1 :]:
            made = queued.popleft().result()
            queued.append(pool.submit(make, lo, hi))
            yield made
        while queued:
            yield queued.popleft().result()


def device_feed(resident, parts: list[tuple[int, int]], amplitude: bool, ahead: int) -> Iterator:
    """On the GPU: span i is made on the feed's stream into buffer i % (ahead + 1), after the consumer's stream
    has finished with that buffer's previous span; the consumer's stream waits for it, and its decode errors
    are raised before it is handed out."""
    cupy = resident.xp
    consumer = cupy.cuda.get_current_stream()
    maker = cupy.cuda.Stream(non_blocking=True)
    slots = ahead + 1
    buffers = [None] * slots  # each slot's last span, whose memory the next one reuses
    done = [None] * slots
    ready = [cupy.cuda.Event(disable_timing=True) for _ in range(slots)]
    free = [None] * slots  # the consumer's event after its use of each buffer

    def make(i: int) -> None:
        slot = i % slots
        lo, hi = parts[i]
        if free[slot] is not None:
            maker.wait_event(free[slot])
        reuse = buffers[slot] is not None and buffers[slot].shape[0] >= hi - lo
        with maker:
            buffers[slot], done[slot] = resident.feed_frames(lo, hi, amplitude, buffers[slot][: hi - lo] if reuse else None)
            ready[slot].record(maker)

    for i in range(min(slots, len(parts))):
        make(i)
    for i in range(len(parts)):
        slot = i % slots
        done[slot]()
        consumer.wait_event(ready[slot])
        yield buffers[slot]
        free[slot] = consumer.record()
        if i + slots < len(parts):
            make(i + slots)


class ShardSeries(Sequence):
    """The residents of one shard that belong to a series, in series order, with ``positions``: their
    places in the whole series. What ``svc.submit(fn, series)`` hands ``fn`` on each shard."""

    def __init__(self, residents: list, positions: list[int]):
        self.residents = list(residents)
        self.positions = list(positions)

    def __getitem__(self, index):
        return self.residents[index]

    def __len__(self) -> int:
        return len(self.residents)

    def feed(self, block_scans: int = 512, amplitude: bool = True, depth: int = 2) -> Iterator[tuple[int, object]]:
        """(position in the series, block) for every block of every resident here, in series order
        (``Resident.feed``; each acquisition's feed starts when the previous one's ends)."""
        check_feed(block_scans, depth, amplitude)
        for position, resident in zip(self.positions, self.residents):
            for block in resident.feed(block_scans, amplitude, depth):
                yield position, block
