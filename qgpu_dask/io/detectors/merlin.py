"""A Quantum Detectors Merlin's data port (TCP, 6342 by default): the acquisition header (HDR), then MQ1 frames,
each in an MPX message (``formats.merlin``).

The receiver reads the header, then whole frame messages in batches straight into host buffers (pinned ones
bound for the GPU), checks each batch's framing and frame numbers at once, and decodes the pixels on the
acquisition's device (counts of every depth, raw one-chip and quad readouts). It stops after the frames the
header announces (a continuous acquisition, which announces 0, runs until the detector closes the port).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator

import numpy as np

from ...formats import merlin
from ..batches import AHEAD, host_buffers, prefetched
from ..stream import Records, SeriesSource, check_reading, read_exactly

DATA_PORT = 6342


@dataclass(frozen=True)
class MerlinSource(SeriesSource):
    """A Merlin detector's data port at ``host``:``data_port``, read ``frames_per_read`` frames at a time."""

    host: str
    data_port: int = DATA_PORT
    frames_per_read: int = 256
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        check_reading(self)

    def describe(self) -> str:
        return f"merlin://{self.host}:{self.data_port}"

    def series(self, det_shape: tuple[int, int], dtype, counts: list[int | None], xp: ModuleType = np) -> Iterator[tuple[int, object]]:
        """(k, frames) of ``len(counts)`` consecutive acquisitions on one connection to the data port, the k-th
        of ``counts[k]`` frames (None: as its header announces), read ahead in a thread of their own;
        ValueError naming the acquisition and frame if nothing listens, a header or frame is malformed, the
        frames are not ``det_shape`` ``dtype``, an acquisition announces another frame count, a frame is
        missing, or the port closes or goes quiet inside an acquisition (the frames before it handed on first)."""
        headers: list[merlin.FrameHeader] = []
        for k, batch in prefetched(self.batches(tuple(det_shape), np.dtype(dtype), host_buffers(xp), list(counts), headers), AHEAD):
            pixels = batch[:, merlin.MPX_BYTES + headers[k].data_offset :]
            yield k, merlin.decode(pixels if xp is np else xp.asarray(pixels), headers[k])

    def batches(self, det_shape: tuple[int, int], dtype: np.dtype, buffer, counts: list[int | None], headers: list) -> Iterator[tuple[int, np.ndarray]]:
        """(k, whole frame messages of acquisition k) as they come, (n, message bytes) uint8 in ``buffer``s,
        their framing checked; each acquisition's first frame header is put in ``headers``."""
        try:
            conn = socket.create_connection((self.host, self.data_port), timeout=self.timeout_s)
        except OSError as err:
            raise ValueError(f"no Merlin data port at {self.describe()}: {err}") from None
        with conn:
            for k, count in enumerate(counts):
                for whole in self.acquisition(conn, det_shape, dtype, buffer, count, len(counts) > 1, headers, self.where(k, len(counts))):
                    yield k, whole

    def acquisition(self, conn: socket.socket, det_shape: tuple[int, int], dtype: np.dtype, buffer, count: int | None, series: bool,
                    headers: list, where: str) -> Iterator[np.ndarray]:
        """One acquisition's frame messages (its HDR read first), ``count`` of them where given."""
        fields = merlin.parse_hdr(self.message(conn, 0, where))
        announced = merlin.hdr_frames(fields)
        if announced == 0 and series:
            raise ValueError(f"{where} runs a continuous acquisition (its header announces 0 frames): it is one acquisition,"
                             " not a series; ingest it into one")
        if count is not None and announced not in (0, count):
            raise ValueError(f"{where} announces {announced} frames, the acquisition holds {count}")
        first = self.message(conn, 0, where)
        h = merlin.parse_frame_header(first, f"{where}, frame 0")
        if h.det_shape != det_shape or h.dtype != dtype:
            raise ValueError(f"{where} sends {h.det_shape} {h.dtype} frames ({h.pixel}, {h.layout}), the acquisition holds {det_shape} {dtype}")
        headers.append(h)
        size = merlin.MPX_BYTES + len(first)
        prefix = f"MPX,{len(first) + 1:010d},".encode()
        start = buffer(size)[:size]
        start[: merlin.MPX_BYTES] = np.frombuffer(prefix, np.uint8)
        start[merlin.MPX_BYTES :] = np.frombuffer(first, np.uint8)
        yield start.reshape(1, size)
        total = announced or count
        sent, expected = 1, prefix + merlin.MAGIC
        for whole in (ended := Records(conn, size, self.frames_per_read, buffer, self.timeout_s, None if total is None else total - 1)):
            bad = first_bad(whole, expected, h.seq + sent)
            if bad is not None:
                k, problem = bad
                if k:
                    yield whole[:k]
                raise ValueError(f"{where}: frame {sent + k} {problem}")
            sent += len(whole)
            yield whole
        if ended.end == "stalled":
            raise ValueError(f"{where} sent nothing for {self.timeout_s:g} s after {sent} frames")
        if ended.end == "closed" and (announced or ended.carried):
            raise ValueError(f"{where} closed inside frame {sent} (of {announced or 'a continuous acquisition'}):"
                             f" {ended.carried} of its {size} bytes came")

    def message(self, conn: socket.socket, frame: int, where: str) -> bytes:
        """One MPX message's payload."""
        prefix = read_exactly(conn, merlin.MPX_BYTES, self.timeout_s, where, frame, "a message's ")
        return read_exactly(conn, merlin.mpx_length(prefix, f"{where}, frame {frame}"), self.timeout_s, where, frame, "a message's ")


def first_bad(whole: np.ndarray, expected: bytes, seq: int) -> tuple[int, str] | None:
    """The first frame message of ``whole`` (numbered ``seq`` ..) whose MPX prefix and MQ1 magic are not
    ``expected`` (a message of another size, or lost framing) or whose number is not the next (a frame lost),
    and what is wrong with it; None if all are right."""
    head = np.frombuffer(expected, np.uint8)
    bad = np.flatnonzero((whole[:, : head.size] != head).any(axis=1))
    digits = whole[:, merlin.MPX_BYTES + 4 : merlin.MPX_BYTES + 10].astype(np.int64) - ord("0")
    numbers = digits @ (10 ** np.arange(5, -1, -1))
    wrong = np.flatnonzero(numbers != seq + np.arange(len(whole)))
    if bad.size and (not wrong.size or bad[0] <= wrong[0]):
        k = int(bad[0])
        return k, f"is not an MQ1 frame of the first one's size: it starts {whole[k, :24].tobytes()!r}"
    if wrong.size:
        k = int(wrong[0])
        return k, f"is numbered {int(numbers[k])}, expected {seq + k} (a frame was lost, or a new acquisition began)"
    return None
