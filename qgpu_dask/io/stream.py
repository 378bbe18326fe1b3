"""Frame streams: frames as a detector sends them while it scans, over a network, to the worker that holds
the live acquisition (``svc.ingest``), never through the client.

The wire format ``qgpu-frames-1`` (plain TCP): the sender writes one header line, UTF-8 JSON ending in
``\\n``, ``{"format": "qgpu-frames-1", "scan_shape": [rows, cols], "det_shape": [rows, cols], "dtype":
"uint16", "compression": "none"}``, then the frames, scan positions in C order, and closes the connection
after the last one. With ``"compression": "none"`` (the default when absent) a frame is ``det_rows *
det_cols`` counts of that dtype, little-endian, C order, frames back to back; with ``"bitshuffle-lz4"`` a
frame is a uint32 little-endian byte count and that many bytes of one HDF5 bitshuffle-LZ4 chunk (filter
32008, as DECTRIS detectors write and send them: about 9 times fewer bytes on the wire at low dose),
decoded on the receiving worker's cores. A stream that ends inside a frame is an error (the complete frames
before it are kept). ``serve`` replays an acquisition file this way at a given frame rate (``qgpu-dask
simulate``; ``compressed`` sends an Arina/Eiger master's stored chunks as they are).

A real detector plugs in as another source with the same method, ``frames(det_shape, dtype)`` yielding
(n, det_rows, det_cols) arrays: for a DECTRIS detector, a ZeroMQ pull socket on its stream interface,
decoding each image message (CBOR, bitshuffle-LZ4 as ``formats.bitshuffle_lz4`` decodes) into a frame.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..formats.bitshuffle_lz4 import ChunkError, decompress_stored
from .source import Source, open_reader

FORMAT = "qgpu-frames-1"
COMPRESSIONS = ("none", "bitshuffle-lz4")
HEADER_LIMIT = 1 << 16  # the longest header line a source reads
READ_BYTES = 1 << 22  # bytes asked of the socket at a time for a stream of chunks


@dataclass(frozen=True)
class TcpSource:
    """A ``qgpu-frames-1`` stream served at ``host``:``port``: what a worker connects to and reads frames
    from, ``frames_per_read`` at a time."""

    host: str
    port: int
    frames_per_read: int = 256
    timeout_s: float = 30.0

    def describe(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def frames(self, det_shape: tuple[int, int], dtype) -> Iterator[np.ndarray]:
        """The stream's frames, (n, det_rows, det_cols) arrays; ValueError if nothing listens there, its
        header does not match ``det_shape`` and ``dtype``, it ends inside a frame, or it sends nothing for
        ``timeout_s``."""
        try:
            conn = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as err:
            raise ValueError(f"no frame stream at {self.describe()}: {err}") from None
        sent = 0
        with conn:
            reader = conn.makefile("rb", buffering=0)
            try:
                header = read_header(reader, self.describe())
            except TimeoutError:
                raise ValueError(f"the stream from {self.describe()} sent no header for {self.timeout_s:g} s") from None
            check_header(header, det_shape, np.dtype(dtype), self.describe())
            if header.get("compression", "none") == "bitshuffle-lz4":
                yield from self.chunked_frames(conn, det_shape, np.dtype(dtype))
                return
            frame_bytes = det_shape[0] * det_shape[1] * np.dtype(dtype).itemsize
            while True:
                buffer = np.empty((self.frames_per_read, *det_shape), np.dtype(dtype).newbyteorder("<"))
                got, stalled = read_into(conn, memoryview(buffer).cast("B"))
                whole, rest = divmod(got, frame_bytes)
                if whole:
                    sent += whole
                    yield buffer[:whole].astype(np.dtype(dtype), copy=False)
                self.check_end(stalled, got < buffer.nbytes, sent, f"{rest} of the next frame's {frame_bytes} bytes" if rest else "")
                if got < buffer.nbytes:
                    return

    def check_end(self, stalled: bool, closed: bool, sent: int, partial: str) -> None:
        """ValueError for a stream gone quiet, or closed with ``partial`` (the bytes of a frame cut short) left."""
        if stalled:
            raise ValueError(f"the stream from {self.describe()} sent nothing for {self.timeout_s:g} s after {sent} whole frames")
        if closed and partial:
            raise ValueError(f"the stream from {self.describe()} stopped inside a frame: after {sent} whole frames, {partial} came")

    def chunked_frames(self, conn: socket.socket, det_shape: tuple[int, int], dtype: np.dtype) -> Iterator[np.ndarray]:
        """Frames sent as length-prefixed bitshuffle-LZ4 chunks, decoded ``frames_per_read`` at a time on
        every core."""
        pending = bytearray()
        sent = 0
        while True:
            try:
                piece = conn.recv(READ_BYTES)
                stalled = False
            except TimeoutError:
                piece, stalled = b"", True
            pending += piece
            starts, ends, used = complete_chunks(pending)
            if starts and (len(starts) >= self.frames_per_read or not piece):
                frames = np.empty((len(starts), *det_shape), dtype)
                try:
                    decompress_stored(np.frombuffer(pending, np.uint8), np.array(starts), np.array(ends), frames)
                except ChunkError as err:
                    raise ValueError(f"the stream from {self.describe()} sent a malformed frame {sent + err.index}: {err.problem}") from None
                del pending[:used]
                sent += len(starts)
                yield frames
            self.check_end(stalled, not piece, sent, f"{len(pending)} bytes of the next" if pending else "")
            if not piece:  # the sender closed the stream
                return


def complete_chunks(pending: bytearray) -> tuple[list[int], list[int], int]:
    """(starts, ends) of the whole length-prefixed chunks at the front of ``pending``, and the bytes they take."""
    starts, ends, at = [], [], 0
    while len(pending) - at >= 4:
        n = int.from_bytes(pending[at : at + 4], "little")
        if len(pending) - at - 4 < n:
            break
        starts.append(at + 4)
        ends.append(at + 4 + n)
        at += 4 + n
    return starts, ends, at


def read_into(conn: socket.socket, view: memoryview) -> tuple[int, bool]:
    """Fill ``view`` from ``conn``: (bytes read, whether the sender went quiet for the socket's timeout); fewer
    bytes than asked when the sender closed or went quiet."""
    got = 0
    while got < len(view):
        try:
            n = conn.recv_into(view[got:])
        except TimeoutError:
            return got, True
        if n == 0:
            break
        got += n
    return got, False


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


def check_header(header: dict, det_shape: tuple[int, int], dtype: np.dtype, where: str) -> None:
    """ValueError unless the stream's frames are what the acquisition holds."""
    if header.get("compression", "none") not in COMPRESSIONS:
        raise ValueError(f"the stream from {where} sends {header['compression']!r} frames; readable: {', '.join(COMPRESSIONS)}")
    theirs = (tuple(header.get("det_shape", ())), str(header.get("dtype")))
    if theirs != (tuple(det_shape), str(dtype)):
        raise ValueError(f"the stream from {where} sends {theirs[0]} {theirs[1]} frames, the acquisition holds "
                         f"{tuple(det_shape)} {dtype}")


def header_line(scan_shape, det_shape, dtype, compression: str = "none") -> bytes:
    return (json.dumps({"format": FORMAT, "scan_shape": list(scan_shape), "det_shape": list(det_shape), "dtype": str(np.dtype(dtype)),
                        "compression": compression}) + "\n").encode()


UNIT = 64  # frames sent at a time (the pace is kept per unit)


def serve(source: Source, port: int, rate_hz: float | None = None, host: str = "127.0.0.1", listener: socket.socket | None = None,
          limit: int | None = None, compressed: bool = False) -> int:
    """Replay ``source`` (any file ``svc.load`` reads) as a ``qgpu-frames-1`` stream to the first client that
    connects to ``host``:``port`` (or on ``listener``, already listening), at about ``rate_hz`` frames per
    second (None: as fast as it goes), stopping after ``limit`` frames if given; returns the frames sent.
    ``compressed`` sends the stored bitshuffle-LZ4 chunks of an Arina/Eiger master as they are."""
    reader = open_reader(source)
    own = listener is None
    try:
        if compressed and getattr(reader, "compression", None) != "bitshuffle-lz4":
            raise ValueError(f"{source.path!r}: a compressed stream replays an Arina/Eiger master stored bitshuffle-LZ4, one chunk "
                             f"per frame; this file is {getattr(reader, 'kind', 'another format')}")
        if own:
            listener = socket.create_server((host, port))
        conn, _ = listener.accept()
        with conn:
            conn.sendall(header_line(reader.shape[:2], reader.shape[2:], reader.dtype, "bitshuffle-lz4" if compressed else "none"))
            sent, start = 0, time.perf_counter()
            for unit in (stored_units(reader) if compressed else raw_units(reader)):
                k = len(unit) if limit is None else min(len(unit), limit - sent)
                if k <= 0:
                    break
                conn.sendall(b"".join(unit[:k]) if compressed else np.ascontiguousarray(unit[:k], unit.dtype.newbyteorder("<")).data)
                sent += k
                if rate_hz:
                    time.sleep(max(0.0, start + sent / rate_hz - time.perf_counter()))
            return sent
    finally:
        reader.close()
        if own and listener is not None:
            listener.close()


def raw_units(reader) -> Iterator[np.ndarray]:
    """The reader's frames, UNIT at a time."""
    for _, frames in reader.blocks():
        for lo in range(0, len(frames), UNIT):
            yield frames[lo : lo + UNIT]


def stored_units(reader) -> Iterator[list[bytes]]:
    """An Arina/Eiger master's stored chunks as wire messages (byte count, chunk), UNIT at a time."""
    for stack in reader.stacks:
        for lo in range(0, stack.frames, UNIT):
            data, starts, ends, masks = stack.stored.read(lo, min(lo + UNIT, stack.frames))
            if (masks & 1).any():
                raise ValueError(f"{stack.where}: frame {lo + int(np.flatnonzero(masks & 1)[0])} is stored without its filter: "
                                 f"it cannot be sent as a bitshuffle-LZ4 chunk")
            yield [int(e - s).to_bytes(4, "little") + data[s:e].tobytes() for s, e in zip(starts, ends)]
