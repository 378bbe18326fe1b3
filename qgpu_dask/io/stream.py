"""Frame streams: frames as a detector sends them while it scans, over a network, to the worker that holds
the live acquisition (``svc.ingest``), never through the client.

The wire format ``qgpu-frames-1`` (plain TCP): the sender writes one header line, UTF-8 JSON ending in
``\\n``, ``{"format": "qgpu-frames-1", "scan_shape": [rows, cols], "det_shape": [rows, cols], "dtype":
"uint16"}``, then frames back to back, each ``det_rows * det_cols`` counts of that dtype, little-endian, C
order, scan positions in C order; it closes the connection after the last frame. A stream that ends inside
a frame is an error (the complete frames before it are kept). ``serve`` replays an acquisition file this
way at a given frame rate (``qgpu-dask simulate``).

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

from .source import Source, open_reader

FORMAT = "qgpu-frames-1"
HEADER_LIMIT = 1 << 16  # the longest header line a source reads


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
            frame_bytes = det_shape[0] * det_shape[1] * np.dtype(dtype).itemsize
            while True:
                buffer = np.empty((self.frames_per_read, *det_shape), np.dtype(dtype).newbyteorder("<"))
                got, stalled = read_into(conn, memoryview(buffer).cast("B"))
                whole, rest = divmod(got, frame_bytes)
                if whole:
                    sent += whole
                    yield buffer[:whole].astype(np.dtype(dtype), copy=False)
                if stalled:
                    raise ValueError(f"the stream from {self.describe()} sent nothing for {self.timeout_s:g} s after {sent} whole frames")
                if got < buffer.nbytes:  # the sender closed the stream
                    if rest:
                        raise ValueError(f"the stream from {self.describe()} stopped inside a frame: after {sent} whole frames, "
                                         f"{rest} of the next frame's {frame_bytes} bytes came")
                    return


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
    theirs = (tuple(header.get("det_shape", ())), str(header.get("dtype")))
    if theirs != (tuple(det_shape), str(dtype)):
        raise ValueError(f"the stream from {where} sends {theirs[0]} {theirs[1]} frames, the acquisition holds "
                         f"{tuple(det_shape)} {dtype}")


def header_line(scan_shape, det_shape, dtype) -> bytes:
    return (json.dumps({"format": FORMAT, "scan_shape": list(scan_shape), "det_shape": list(det_shape), "dtype": str(np.dtype(dtype))}) + "\n").encode()


def serve(source: Source, port: int, rate_hz: float | None = None, host: str = "127.0.0.1", listener: socket.socket | None = None,
          limit: int | None = None) -> int:
    """Replay ``source`` (any file ``svc.load`` reads) as a ``qgpu-frames-1`` stream to the first client that
    connects to ``host``:``port`` (or on ``listener``, already listening), at about ``rate_hz`` frames per
    second (None: as fast as it goes), stopping after ``limit`` frames if given; returns the frames sent."""
    reader = open_reader(source)
    own = listener is None
    if own:
        listener = socket.create_server((host, port))
    try:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(header_line(reader.shape[:2], reader.shape[2:], reader.dtype))
            sent, start = 0, time.perf_counter()
            for _, frames in reader.blocks():
                if limit is not None:
                    frames = frames[: max(0, limit - sent)]
                for chunk in np.array_split(frames, max(1, len(frames) // 64)) if rate_hz else [frames]:
                    if len(chunk) == 0:
                        continue
                    conn.sendall(np.ascontiguousarray(chunk, chunk.dtype.newbyteorder("<")).data)
                    sent += len(chunk)
                    if rate_hz:
                        time.sleep(max(0.0, start + sent / rate_hz - time.perf_counter()))
                if limit is not None and sent >= limit:
                    break
            return sent
    finally:
        reader.close()
        if own:
            listener.close()
