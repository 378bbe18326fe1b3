"""Blocks of consecutive frames from a resident, decoded ahead of their consumer: the feed of iterative
reconstructions that run where the data is.

``feed(resident, block_scans, amplitude, depth)`` yields device arrays (scans_in_block, det_rows, det_cols)
of consecutive scan positions in C order: the native counts, or float32 sqrt(counts) (the amplitudes a
ptychographic update compares with). A compressed resident decodes only each block's frames, so its
consumer never holds a dense copy of the acquisition. Blocks are made ``depth`` ahead: on a GPU on a
stream of their own (the consumer's stream waits for each block, the maker waits until the consumer's
work on a buffer is done before reusing it), on a CPU by a background thread. A yielded block is valid
until the next one is asked for.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np


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


def spans(n_frames: int, block_scans: int) -> list[tuple[int, int]]:
    """(lo, hi) of each block: ``block_scans`` frames, the last one shorter."""
    return [(lo, min(lo + block_scans, n_frames)) for lo in range(0, n_frames, block_scans)]


def block_of(resident, lo: int, hi: int, amplitude: bool, out=None):
    """Frames [lo, hi) as (hi - lo, det_rows, det_cols): the counts, or float32 sqrt(counts) into ``out``."""
    xp = resident.xp
    counts = resident.frames_flat(lo, hi)
    if amplitude:
        counts = xp.sqrt(counts, dtype=np.float32, out=out)
    return counts.reshape(hi - lo, *resident.det_shape)


def feed(resident, block_scans: int = 512, amplitude: bool = True, depth: int = 2) -> Iterator:
    """The resident's frames in blocks of ``block_scans`` consecutive scan positions, made ``depth`` ahead."""
    block_scans, depth, amplitude = check_feed(block_scans, depth, amplitude)
    parts = spans(resident.n_frames, block_scans)
    if resident.xp is np:
        return host_feed(resident, parts, amplitude, depth)
    return device_feed(resident, parts, amplitude, depth)


def host_feed(resident, parts: list[tuple[int, int]], amplitude: bool, depth: int) -> Iterator[np.ndarray]:
    if depth == 0:
        for lo, hi in parts:
            yield block_of(resident, lo, hi, amplitude)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="feed") as pool:
        ahead = deque(pool.submit(block_of, resident, lo, hi, amplitude) for lo, hi in parts[: depth + 1])
        for lo, hi in parts[depth + 1 :]:
            block = ahead.popleft().result()
            ahead.append(pool.submit(block_of, resident, lo, hi, amplitude))
            yield block
        while ahead:
            yield ahead.popleft().result()


def device_feed(resident, parts: list[tuple[int, int]], amplitude: bool, depth: int) -> Iterator:
    """On the GPU: block i is made on the feed's stream into buffer i % (depth + 1), after the consumer's
    stream has finished with that buffer's previous block; the consumer's stream waits for it."""
    cupy = resident.xp
    consumer = cupy.cuda.get_current_stream()
    maker = cupy.cuda.Stream(non_blocking=True)
    slots = depth + 1
    width = max((hi - lo for lo, hi in parts), default=0)
    buffers = [cupy.empty((width, resident.frame_len), np.float32) if amplitude else None for _ in range(slots)]
    ready = [cupy.cuda.Event(disable_timing=True) for _ in range(slots)]
    free = [None] * slots  # the consumer's event after its use of each buffer
    blocks = [None] * slots

    def make(i: int) -> None:
        slot = i % slots
        lo, hi = parts[i]
        if free[slot] is not None:
            maker.wait_event(free[slot])
        with maker:
            out = buffers[slot][: hi - lo] if amplitude else None
            blocks[slot] = block_of(resident, lo, hi, amplitude, out)
            ready[slot].record(maker)

    for i in range(min(slots, len(parts))):
        make(i)
    for i in range(len(parts)):
        slot = i % slots
        consumer.wait_event(ready[slot])
        yield blocks[slot]
        blocks[slot] = None
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
