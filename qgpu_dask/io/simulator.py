"""The detector simulator: an acquisition file replayed as a ``qgpu-frames-1`` stream (``io.wire``) at a
given frame rate, as a detector sends its frames while it scans (``qgpu-dask simulate``); ``compressed``
sends an Arina/Eiger master's stored bitshuffle-LZ4 chunks as they are."""

from __future__ import annotations

import itertools
import socket
import time
from typing import Callable, Iterator

import numpy as np

from .readers.arina import ArinaReader
from .readers.base import Reader
from .registry import open_reader
from .source import Source
from .wire import header_line

PACE = 64  # frames sent at a time, one message of chunks (the rate is kept per message)
READ = 1024  # frames read from the file at a time


def serve(source: Source, listener: socket.socket, rate_hz: float | None = None, compressed: bool = False,
          ready: Callable[[], None] | None = None) -> tuple[int, float]:
    """Replay ``source`` (any file ``svc.load`` reads) as a ``qgpu-frames-1`` stream to the first client that
    connects to ``listener`` (listening, left open), at about ``rate_hz`` frames per second (None: as fast as
    it goes); returns the frames sent and the seconds from the client's connection to the last of them (the
    rate a detector kept, not counting the wait for a client). ``compressed`` sends the stored bitshuffle-LZ4 chunks of an
    Arina/Eiger master as they are. ``ready()`` is called once the file's first frames are read, before the
    client is taken (a detector's start does not wait for files)."""
    reader = open_reader(source)
    try:
        if compressed and reader.compression != "bitshuffle-lz4":
            raise ValueError(f"{source.path!r}: a compressed stream replays an Arina/Eiger master stored bitshuffle-LZ4, one chunk "
                             f"per frame; this file is {reader.kind}")
        messages = chunk_messages(reader) if compressed else raw_messages(reader)
        first = next(messages, None)
        if ready is not None:
            ready()
        conn, _ = listener.accept()
        with conn:
            conn.sendall(header_line(reader.shape[:2], reader.shape[2:], reader.dtype, "bitshuffle-lz4" if compressed else "none"))
            sent, start = 0, time.perf_counter()
            for n, pieces in itertools.chain([first] if first else [], messages):
                send_all(conn, pieces)
                sent += n
                if rate_hz:
                    time.sleep(max(0.0, start + sent / rate_hz - time.perf_counter()))
            return sent, time.perf_counter() - start
    finally:
        reader.close()


def raw_messages(reader: Reader) -> Iterator[tuple[int, list[memoryview]]]:
    """The reader's frames as the stream sends them, PACE at a time: (frames, their bytes)."""
    for _, frames in reader.blocks():
        frames = np.ascontiguousarray(frames, frames.dtype.newbyteorder("<"))
        for lo in range(0, len(frames), PACE):
            part = frames[lo : lo + PACE]
            yield len(part), [memoryview(part).cast("B")]


def chunk_messages(reader: ArinaReader) -> Iterator[tuple[int, list[memoryview]]]:
    """An Arina/Eiger master's stored chunks as the stream sends them, PACE frames a message, READ frames
    read at a time: (frames, the message's pieces: views of what was read, nothing copied). Every data
    file's chunk index is taken first (a detector does not pause between files)."""
    for stack in reader.stacks:
        stack.stored.open()
    for stack in reader.stacks:
        for lo in range(0, stack.frames, READ):
            data, starts, ends, masks = stack.stored.read(lo, min(lo + READ, stack.frames))
            if (masks & 1).any():
                raise ValueError(f"{stack.where}: frame {lo + int(np.flatnonzero(masks & 1)[0])} is stored without its filter: "
                                 f"it cannot be sent as a bitshuffle-LZ4 chunk")
            for a in range(0, len(starts), PACE):
                b = min(a + PACE, len(starts))
                head = np.concatenate([[b - a], ends[a:b] - starts[a:b]]).astype("<u4")
                runs = [a, *(np.flatnonzero(starts[a + 1 : b] != ends[a : b - 1]) + a + 1).tolist(), b]  # chunks back to back
                body = [memoryview(data[starts[i] : ends[j - 1]]) for i, j in zip(runs[:-1], runs[1:])]
                yield b - a, [memoryview(head).cast("B"), *body]


def send_all(conn: socket.socket, pieces: list[memoryview]) -> None:
    """Send ``pieces`` one after another in as few system calls as the kernel allows (gathered, not joined)."""
    first = 0
    while first < len(pieces):
        n = conn.sendmsg(pieces[first : first + 1024])  # IOV_MAX
        while first < len(pieces) and n >= len(pieces[first]):
            n -= len(pieces[first])
            first += 1
        if n:
            pieces[first] = pieces[first][n:]
