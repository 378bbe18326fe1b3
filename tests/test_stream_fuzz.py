"""Damaged detector streams, fuzzed (hypothesis): each protocol's receiver (our wire, raw and bitshuffle-LZ4;
a Merlin's data port; an ASI Timepix3 server; DECTRIS stream v1 and stream2) is fed a valid stream with random
damage: cut short, bits flipped, frames reordered, duplicated or dropped. It ends with every frame or with a
ValueError, after handing on frames of the right shape, never more than the scan holds; never another
exception, never a hang. A stream only cut short hands on exactly the frames before the cut. The receivers run
here in the test's process: a worker's ingest runs these same ones (tests/test_live.py and the protocols' own
tests show a worker keeping the frames before an error and staying usable)."""

from __future__ import annotations

import os
import struct
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qgpu_dask as qd
from merlin_files import encoded
from processes import serve
from qgpu_dask.io.wire import header_line
from qgpu_dask.samples import merlin_frame_header, merlin_hdr, write_dectris_series
from test_dectris import stream2_series
from test_live import hdf5plugin_chunk, message
from test_merlin import mpx
from test_timepix import acquisition_start, chunk
from test_timepix import header as timepix_header

SCAN, DET = (2, 3), (8, 12)
FRAMES = np.random.default_rng(61).poisson(2.0, (SCAN[0] * SCAN[1], *DET)).astype(np.uint16)
TIMEOUT_S = 1.0  # a stream that stops sending: the receiver's quiet limit, short so that each example is quick


@dataclass
class Stream:
    """A protocol's valid stream as its parts: ``head`` (bytes or messages before the frames), one entry of
    ``frames`` per frame (bytes, or a list of messages), ``tail``; sent as bytes (TCP) or messages (ZeroMQ)."""

    head: list[bytes]
    frames: list[list[bytes]]
    tail: list[bytes]


def wire(compression: str) -> Stream:
    head = [header_line(SCAN, DET, np.uint16, compression)]
    if compression == "none":
        return Stream(head, [[frame.astype("<u2").tobytes()] for frame in FRAMES], [])
    return Stream(head, [[message([hdf5plugin_chunk(frame)])] for frame in FRAMES], [])  # a message a frame


def merlin() -> Stream:
    pixels, size = encoded(FRAMES, "U16", 12, 1)
    head = [mpx(merlin_hdr(len(FRAMES), SCAN[1], 12, 1, SCAN))]
    return Stream(head, [[mpx(merlin_frame_header(k + 1, size, "U16", 12) + p.tobytes())] for k, p in enumerate(pixels)], [])


def timepix() -> Stream:
    flat = FRAMES.reshape(len(FRAMES), -1)
    start = acquisition_start(SCAN, DET) + timepix_header(1, struct.pack("<IQ", 1, 0))
    return Stream([start], [[chunk(flat[k : k + 1])] for k in range(len(flat))], [timepix_header(3) + timepix_header(4)])


def dectris_v1() -> Stream:
    """The series ``samples.write_dectris_series`` records, its length-prefixed parts read back: the header and
    configuration, four parts a frame, the end."""
    with tempfile.TemporaryDirectory() as tmp:
        recorded = write_dectris_series(Path(tmp) / "series.bin", FRAMES, series=3).read_bytes()
    parts, at = [], 0
    while at < len(recorded):
        (n,), at = struct.unpack_from("<q", recorded, at), at + 8
        parts.append(recorded[at : at + n])
        at += n
    return Stream(parts[:2], [parts[2 + 4 * k : 6 + 4 * k] for k in range(len(FRAMES))], parts[2 + 4 * len(FRAMES) :])


def dectris_stream2() -> Stream:
    pytest.importorskip("cbor2")
    messages = stream2_series(None, FRAMES, "raw", series=3)  # raw images need no folder
    return Stream(messages[:1], [[m] for m in messages[1:-1]], messages[-1:])


PROTOCOLS = {"wire-raw": lambda: wire("none"), "wire-bitshuffle-lz4": lambda: wire("bitshuffle-lz4"), "merlin": merlin,
             "timepix": timepix, "dectris-v1": dectris_v1, "dectris-stream2": dectris_stream2}
BUILT: dict[str, Stream] = {}


def built(protocol: str) -> Stream:
    if protocol not in BUILT:
        BUILT[protocol] = PROTOCOLS[protocol]()
    return BUILT[protocol]


@st.composite
def damage(draw) -> tuple:
    """What is done to the stream: (kind, arguments) with positions as fractions of the stream or frame count."""
    kind = draw(st.sampled_from(["cut", "flip", "swap", "duplicate", "drop"]))
    if kind == "cut":
        return kind, draw(st.floats(0, 1, exclude_max=True))
    if kind == "flip":
        return kind, draw(st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)), min_size=1, max_size=8))
    return kind, draw(st.integers(0, len(FRAMES) - 1)), draw(st.integers(0, len(FRAMES) - 1))


def damaged(stream: Stream, how: tuple) -> tuple[list[bytes], int | None]:
    """The damaged stream's messages (or byte pieces), and for a cut the frames wholly before it (else None)."""
    kind = how[0]
    frames = [list(f) for f in stream.frames]
    if kind in ("swap", "duplicate", "drop"):
        i, j = how[1], how[2]
        if kind == "swap":
            frames[i], frames[j] = frames[j], frames[i]
        elif kind == "duplicate":
            frames.insert(j, list(frames[i]))
        else:
            del frames[i]
    parts = stream.head + [m for f in frames for m in f] + stream.tail
    if kind == "flip":
        whole = bytearray(b"".join(parts))
        for at, bit in how[1]:
            whole[int(at * len(whole))] ^= 1 << bit
        edges = np.cumsum([0] + [len(p) for p in parts])
        parts = [bytes(whole[a:b]) for a, b in zip(edges[:-1], edges[1:])]
    if kind != "cut":
        return parts, None
    total = sum(map(len, parts))
    cut = int(how[1] * total)
    before, kept, out, seen = len(b"".join(stream.head)), 0, [], 0
    for part in parts:
        if seen + len(part) > cut:
            out.append(part[: cut - seen])
            break
        out.append(part)
        seen += len(part)
    for f in stream.frames:  # frames wholly before the cut
        before += sum(map(len, f))
        if before > cut:
            break
        kept += 1
    return out, kept


def pushed(parts: list[bytes]) -> tuple[int, threading.Event]:
    """A ZeroMQ PUSH socket on loopback sending ``parts``, in a thread that owns it (ZeroMQ sockets are not
    shared between threads) until it is done or the returned event is set; its port."""
    import zmq

    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDTIMEO, 50)
    port = push.bind_to_random_port("tcp://127.0.0.1")
    done = threading.Event()

    def run() -> None:
        with push:
            for part in parts:
                while not done.is_set():
                    try:
                        push.send(part)
                        break
                    except zmq.Again:
                        continue
            done.wait(30)

    threading.Thread(target=run, daemon=True).start()
    return port, done


def source_for(protocol: str, parts: list[bytes]):
    if protocol.startswith("wire"):
        return qd.TcpSource("127.0.0.1", serve(b"".join(parts)), frames_per_read=2, timeout_s=TIMEOUT_S), None
    if protocol == "merlin":
        return qd.MerlinSource("127.0.0.1", serve(b"".join(parts)), frames_per_read=2, timeout_s=TIMEOUT_S), None
    if protocol == "timepix":
        return qd.TimepixSource("127.0.0.1", serve(b"".join(parts)), frames_per_read=2, timeout_s=TIMEOUT_S), None
    pytest.importorskip("zmq")
    port, done = pushed(parts)
    return qd.DectrisSource("127.0.0.1", port, frames_per_read=2, timeout_s=TIMEOUT_S), done


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
@settings(max_examples=int(os.environ.get("QGPU_DASK_FUZZ_EXAMPLES", 25)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(how=damage())
def test_a_damaged_stream_ends_in_frames_or_a_value_error(protocol, how):
    stream = built(protocol)
    parts, kept = damaged(stream, how)
    source, sender_done = source_for(protocol, parts)
    got, error = [], None
    try:
        for block in source.frames(DET, np.uint16):
            block = block.dense(DET, np.uint16, np) if hasattr(block, "dense") else np.asarray(block)  # a Timepix3's are sparse
            assert block.shape[1:] == DET and block.dtype == np.uint16
            got.append(block)
    except ValueError as err:
        error = str(err)
    finally:
        if sender_done is not None:
            sender_done.set()
    received = np.concatenate(got) if got else np.zeros((0, *DET), np.uint16)
    assert len(received) <= len(FRAMES)
    assert error is None or error.strip()
    if kept is not None:  # cut short: exactly the frames before the cut, then an error (none where the cut left whole frames only)
        assert len(received) >= kept and (received[:kept] == FRAMES[:kept]).all()
        assert (received == FRAMES[: len(received)]).all()
        assert error is not None or len(received) == len(FRAMES)
    if how[0] in ("swap", "duplicate", "drop") and error is None and how[1] != how[2]:
        assert len(received) == len(FRAMES)  # a protocol without frame numbers cannot tell: every frame slot is filled
