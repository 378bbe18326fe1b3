"""Frame streams: frames as a detector sends them while it scans, over a network, to the worker that holds
the live acquisition (``svc.ingest``), never through the client.

The stream comes in the wire format ``qgpu-frames-1`` (``io.wire``); chunks of bitshuffle-LZ4 frames are
decoded on the receiving worker's GPU (or cores). The detector simulator that replays a file this way is
``io.simulator`` (``qgpu-dask simulate``).

A real detector plugs in as another ``FrameSource``, with the same method ``frames(det_shape, dtype, xp)``
yielding (n, det_rows, det_cols) arrays of ``xp`` (``io.detectors``: a Merlin's data port). ``Records``
reads fixed-size records (frames, or a detector's frame messages) off a socket in batches.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Iterator, Protocol

import numba
import numpy as np

from .batches import AHEAD, Chunks, decoded, host_buffers, prefetched
from .wire import COMPRESSIONS, FORMAT, MESSAGE_FRAMES

HEADER_LIMIT = 1 << 16  # the longest header line a source reads
READ_BYTES = 1 << 24  # bytes a stream of chunks is read into
LATENCY_S = 0.05  # a read hands on the whole frames it has after this long, full or not (a slow detector is seen live)


class FrameSource(Protocol):
    """What ``svc.ingest`` reads from: a stream of frames (``TcpSource``, a detector's in ``io.detectors``)."""

    def describe(self) -> str: ...

    def frames(self, det_shape: tuple[int, int], dtype, xp: ModuleType = np) -> Iterator:
        """(n, det_rows, det_cols) arrays of ``xp`` as they come; ValueError, after the frames before it, for what went wrong."""
        ...


class SeriesSource(FrameSource, Protocol):
    """A detector's stream that sends acquisition after acquisition on one connection (``svc.ingest`` of a
    series): Merlin's data port, a DECTRIS stream, an ASI Timepix3 server. Sources subclass it for ``frames``
    (the next acquisition: a series of one) and ``where`` (acquisition k of n, for their errors)."""

    def series(self, det_shape: tuple[int, int], dtype, counts: list[int | None], xp: ModuleType = np) -> Iterator[tuple[int, object]]:
        """(k, frames) of ``len(counts)`` consecutive acquisitions, the k-th of ``counts[k]`` frames (None: as
        the detector announces); ValueError naming the acquisition and frame for what went wrong."""
        ...

    def frames(self, det_shape: tuple[int, int], dtype, xp: ModuleType = np) -> Iterator:
        """The next acquisition's frames, (n, det_rows, det_cols) arrays of ``xp``, as many as the detector announces."""
        for _, block in self.series(det_shape, dtype, [None], xp):
            yield block

    def where(self, k: int, n: int) -> str:
        """The source, and which of ``n`` acquisitions is meant (for a series of more than one)."""
        return self.describe() + (f", acquisition {k + 1} of {n}" if n > 1 else "")


def check_reading(source) -> None:
    """ValueError unless ``source`` reads at least one frame at a time and waits a positive time."""
    if source.frames_per_read < 1 or not source.timeout_s > 0:
        raise ValueError(f"a {type(source).__name__} reads at least 1 frame at a time and waits a positive time, got frames_per_read="
                         f"{source.frames_per_read}, timeout_s={source.timeout_s}")


@dataclass(frozen=True)
class TcpSource:
    """A ``qgpu-frames-1`` stream served at ``host``:``port``: what a worker connects to and reads frames
    from, up to ``frames_per_read`` at a time."""

    host: str
    port: int
    frames_per_read: int = 1024
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        check_reading(self)

    def describe(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def frames(self, det_shape: tuple[int, int], dtype, xp: ModuleType = np) -> Iterator:
        """The stream's frames, (n, det_rows, det_cols) arrays of ``xp`` (chunks decoded there: on the GPU
        for CuPy), read ahead in a thread of their own while the caller uses the last; ValueError if nothing
        listens there, its header does not match ``det_shape`` and ``dtype``, it closes before its scan's last
        frame, sends a malformed chunk or more frames than its scan holds (after the whole frames before it) or
        sends nothing for ``timeout_s``. It stops after the scan's last frame."""
        sent, dtype = 0, np.dtype(dtype)
        for batch in prefetched(self.batches(det_shape, dtype, host_buffers(xp)), AHEAD):
            block, bad = decoded(batch, det_shape, dtype, xp)
            if len(block):
                sent += len(block)
                yield block
            if bad is not None:
                raise ValueError(f"the stream from {self.describe()} sent a malformed frame {sent}: {bad.problem}")

    def batches(self, det_shape: tuple[int, int], dtype: np.dtype, buffer: Callable[[int], np.ndarray]) -> Iterator[np.ndarray | Chunks]:
        """The stream as it comes, in host memory from ``buffer(nbytes)`` (uint8 arrays): frames, or Chunks."""
        try:
            conn = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as err:
            raise ValueError(f"no frame stream at {self.describe()}: {err}") from None
        with conn:
            reader = conn.makefile("rb", buffering=0)
            try:
                header = read_header(reader, self.describe())
            except TimeoutError:
                raise ValueError(f"the stream from {self.describe()} sent no header for {self.timeout_s:g} s") from None
            check_header(header, det_shape, dtype, self.describe())
            total = scan_frames(header, self.describe())
            frame_bytes = det_shape[0] * det_shape[1] * dtype.itemsize
            if header.get("compression", "none") == "bitshuffle-lz4":
                yield from self.chunk_batches(conn, frame_bytes, total, buffer)
            else:
                yield from self.raw_batches(conn, det_shape, dtype, frame_bytes, total, buffer)

    def raw_batches(self, conn: socket.socket, det_shape: tuple[int, int], dtype: np.dtype, frame_bytes: int, total: int,
                    buffer) -> Iterator[np.ndarray]:
        """The ``total`` frames sent as their counts, read into ``buffer``s: a full one, or the whole frames that
        came within LATENCY_S."""
        sent = 0
        for whole in (ended := Records(conn, frame_bytes, self.frames_per_read, buffer, self.timeout_s, total)):
            sent += len(whole)
            yield whole.reshape(-1).view(dtype.newbyteorder("<")).reshape(-1, *det_shape).astype(dtype, copy=False)
        self.check_end(ended.end, sent, total, f"{ended.carried} of the next frame's {frame_bytes} bytes" if ended.carried else "")

    def check_end(self, end: str, sent: int, total: int, partial: str) -> None:
        """ValueError for a stream gone quiet (``end`` "stalled"), closed with ``partial`` (the bytes of a frame
        cut short) left, or closed before its scan's ``total`` frames came."""
        if end == "stalled":
            raise ValueError(f"the stream from {self.describe()} sent nothing for {self.timeout_s:g} s after {sent} whole frames")
        if partial:
            raise ValueError(f"the stream from {self.describe()} stopped inside a frame: after {sent} whole frames, {partial} came")
        if sent < total:
            raise ValueError(f"the stream from {self.describe()} closed after {sent} of its scan's {total} frames")

    def chunk_batches(self, conn: socket.socket, frame_bytes: int, total: int, buffer) -> Iterator[Chunks]:
        """The ``total`` frames sent as messages of bitshuffle-LZ4 chunks, whole messages copied into ``buffer``s:
        at least ``frames_per_read`` frames, a full read buffer's, or the whole messages that came within
        LATENCY_S."""
        largest = 3 * frame_bytes + 4096  # far more than the chunk of one frame takes
        pending = np.empty(max(READ_BYTES, 2 * (largest + 8)), np.uint8)
        filled = sent = 0
        end = ""
        since = time.perf_counter()
        while True:
            starts, ends, used, bad, value, long = chunk_bounds(pending, filled, min(self.frames_per_read, total - sent), largest)
            late = time.perf_counter() - since > LATENCY_S
            last = sent + len(starts) >= total
            if len(starts) and (len(starts) >= self.frames_per_read or end or late or last or bad >= 0 or filled == pending.size):
                data = buffer(used)
                data[:] = pending[:used]
                yield Chunks(data, starts[: total - sent], ends[: total - sent])
                if sent + len(starts) > total:
                    raise ValueError(f"the stream from {self.describe()} sent a message past its scan's {total} frames "
                                     f"(frames {sent} to {sent + len(starts) - 1})")
                sent += len(starts)
                if last:
                    return
                pending[: filled - used] = pending[used:filled].copy()
                filled -= used
                since = time.perf_counter()
                continue
            if bad >= 0:
                problem = (f"a chunk of {value} bytes, more than a frame of {frame_bytes} bytes takes" if long
                           else f"a message of {value} frames (1 to {MESSAGE_FRAMES})")
                raise ValueError(f"the stream from {self.describe()} sent a malformed frame {sent + bad}: {problem}")
            if end:
                self.check_end(end, sent, total, f"{filled} bytes of the next" if filled else "")
                return
            if filled == pending.size:  # one message longer than the buffer
                pending = np.concatenate([pending, np.empty_like(pending)])
            conn.settimeout(max(1e-3, LATENCY_S - (time.perf_counter() - since)) if len(starts) else self.timeout_s)
            try:
                n = conn.recv_into(memoryview(pending)[filled:])
                end = "" if n else "closed"
            except TimeoutError:
                end = "" if len(starts) else "stalled"  # whole messages wait: hand them on
            else:
                filled += n


@numba.njit(cache=True, nogil=True)
def le32(pending: np.ndarray, at: int) -> int:
    return np.int64(pending[at]) | (np.int64(pending[at + 1]) << 8) | (np.int64(pending[at + 2]) << 16) | (np.int64(pending[at + 3]) << 24)


@numba.njit(cache=True, nogil=True)
def chunk_bounds(pending: np.ndarray, filled: int, limit: int, largest: int) -> tuple[np.ndarray, np.ndarray, int, int, int, bool]:
    """The whole messages at the front of ``pending[:filled]``, until they hold ``limit`` frames: (starts,
    ends) of their chunks, the bytes they take, and where the first message that cannot be right starts
    (its frame, counted from the first here, -1 if none) with what is wrong: a chunk count of 0 or over
    MESSAGE_FRAMES (the count, False), or a chunk longer than ``largest`` (its length, True; its frame is given)."""
    starts = np.empty(limit + MESSAGE_FRAMES, np.int64)
    ends = np.empty(limit + MESSAGE_FRAMES, np.int64)
    at = k = 0
    while k < limit and filled - at >= 4:
        n = le32(pending, at)
        if n == 0 or n > MESSAGE_FRAMES:
            return starts[:k], ends[:k], at, k, n, False
        if filled - at < 4 + 4 * n:
            break
        body = at + 4 + 4 * n
        for j in range(n):
            size = le32(pending, at + 4 + 4 * j)
            if size > largest:
                return starts[:k], ends[:k], at, k + j, size, True
            starts[k + j] = body
            ends[k + j] = body + size
            body += size
        if body > filled:
            break
        at = body
        k += n
    return starts[:k], ends[:k], at, -1, 0, False


class Records:
    """Records of ``size`` bytes as they come on ``conn``: (n, size) uint8 arrays of ``buffer(nbytes)``, each a
    full read of up to ``per_read`` records (at most ``limit`` in all, if given) or the whole records that came
    within LATENCY_S. Once iterated, ``end`` says how the stream ended ("closed", "stalled", or "" at the limit)
    and ``carried`` how many bytes of a record cut short were left."""

    def __init__(self, conn: socket.socket, size: int, per_read: int, buffer, timeout_s: float, limit: int | None = None):
        self.conn, self.size, self.per_read, self.buffer, self.timeout_s, self.limit = conn, size, per_read, buffer, timeout_s, limit
        self.end, self.carried = "", 0

    def __iter__(self) -> Iterator[np.ndarray]:
        size, got_all, carried = self.size, 0, b""
        while self.limit is None or got_all < self.limit:
            n = self.per_read if self.limit is None else min(self.per_read, self.limit - got_all)
            space = self.buffer(n * size)[: n * size]
            space[: len(carried)] = np.frombuffer(carried, np.uint8)
            got, self.end = read_into(self.conn, memoryview(space)[len(carried) :], size - len(carried), self.timeout_s)
            got += len(carried)
            whole = got // size
            carried = space[whole * size : got].tobytes()
            self.carried = len(carried)
            if whole:
                got_all += whole
                yield space[: whole * size].reshape(whole, size)
            if self.end:
                return


def read_into(conn: socket.socket, view: memoryview, least: int, timeout_s: float) -> tuple[int, str]:
    """Read into ``view`` from ``conn`` until it is full, or holds at least ``least`` bytes and LATENCY_S has
    passed (the sender may be slow or pausing): (bytes read, "" or how the stream ended: "closed" by the
    sender, or "stalled", quiet for ``timeout_s`` before ``least`` bytes came)."""
    got, since = 0, time.perf_counter()
    while got < len(view):
        wait = timeout_s if got < least else LATENCY_S - (time.perf_counter() - since)
        if wait <= 0:
            break
        conn.settimeout(wait)
        try:
            n = conn.recv_into(view[got:])
        except TimeoutError:
            if got < least:
                return got, "stalled"
            break
        if n == 0:
            return got, "closed"
        got += n
    return got, ""


def read_exactly(conn: socket.socket, n: int, timeout_s: float, where: str, frame: int, what: str = "") -> bytearray:
    """``n`` bytes from ``conn`` (not copied again: a Timepix3 chunk is megabytes); ValueError naming ``frame``
    if it closes or goes quiet for ``timeout_s`` first (``what``: whose bytes they are, e.g. "a message's ")."""
    data = bytearray(n)
    got, end = read_into(conn, memoryview(data), n, timeout_s)
    if got < n:
        raise ValueError(f"{where} {'sent nothing for ' + format(timeout_s, 'g') + ' s' if end == 'stalled' else 'closed'}"
                         f" at frame {frame} ({got} of {what}{n} bytes came)")
    return data


def read_header(reader, where: str) -> dict:
    line = reader.readline(HEADER_LIMIT)
    if not line.endswith(b"\n"):
        raise ValueError(f"the stream from {where} sent no {FORMAT} header line")
    try:
        header = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"the stream from {where} has a header that is not JSON: {err}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"the stream from {where} is not {FORMAT}: its header is {line[:200]!r}")
    return header


def scan_frames(header: dict, where: str) -> int:
    """The frames the header's scan announces; ValueError unless its scan_shape is two positive whole numbers."""
    shape = header.get("scan_shape")
    if not (isinstance(shape, list) and len(shape) == 2 and all(type(n) is int and n > 0 for n in shape)):
        raise ValueError(f"the stream from {where} announces a scan_shape of {shape!r}, not two positive whole numbers")
    return shape[0] * shape[1]


def check_header(header: dict, det_shape: tuple[int, int], dtype: np.dtype, where: str) -> None:
    """ValueError unless the stream's frames are what the acquisition holds."""
    if header.get("compression", "none") not in COMPRESSIONS:
        raise ValueError(f"the stream from {where} sends {header['compression']!r} frames; readable: {', '.join(COMPRESSIONS)}")
    theirs = (tuple(header.get("det_shape", ())), str(header.get("dtype")))
    if theirs != (tuple(det_shape), str(dtype)):
        raise ValueError(f"the stream from {where} sends {theirs[0]} {theirs[1]} frames, the acquisition holds "
                         f"{tuple(det_shape)} {dtype}")
