"""Damaged detector streams, fuzzed (hypothesis): each protocol's receiver (our wire, raw and bitshuffle-LZ4;
a Merlin's data port; an ASI Timepix3 server; DECTRIS stream v1 and stream2) is fed a valid stream with random
damage: cut short, bits flipped, frames reordered, duplicated or dropped. It ends with every frame or with a
ValueError, after handing on frames of the right shape, never more than the scan holds; never another
exception, never a hang. A stream only cut short hands on exactly the frames before the cut. The receivers run
here in the test's process: a worker's ingest runs these same ones (tests/test_live.py and the protocols' own
tests show a worker keeping the frames before an error and staying usable)."""

from __future__ import annotations

import io
import os
import json
import socket
import struct
import threading
from dataclasses import dataclass

import h5py
import hdf5plugin
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qgpu_dask as qd
from merlin_files import encoded
from qgpu_dask.io.wire import header_line
from qgpu_dask.samples import merlin_frame_header, merlin_hdr

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


def bitshuffle_chunk(frame: np.ndarray) -> bytes:
    """One frame as the bitshuffle-LZ4 chunk HDF5 stores (h5py + hdf5plugin)."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        f.create_dataset("d", data=frame[None], chunks=(1, *frame.shape), **hdf5plugin.Bitshuffle(nelems=0, cname="lz4"))
        return f["d"].id.read_direct_chunk((0, 0, 0))[1]


def wire(compression: str) -> Stream:
    head = [header_line(SCAN, DET, np.uint16, compression)]
    if compression == "none":
        return Stream(head, [[frame.astype("<u2").tobytes()] for frame in FRAMES], [])
    chunks = [bitshuffle_chunk(frame) for frame in FRAMES]  # a message a frame
    return Stream(head, [[struct.pack("<II", 1, len(c)) + c] for c in chunks], [])


def merlin() -> Stream:
    def mpx(payload: bytes) -> bytes:
        return f"MPX,{len(payload) + 1:010d},".encode() + payload

    pixels, size = encoded(FRAMES, "U16", 12, 1)
    head = [mpx(merlin_hdr(len(FRAMES), SCAN[1], 12, 1, SCAN))]
    return Stream(head, [[mpx(merlin_frame_header(k + 1, size, "U16", 12) + p.tobytes())] for k, p in enumerate(pixels)], [])


def timepix() -> Stream:
    def header(tag: int, body: bytes = b"") -> bytes:
        return (bytes([tag]) + body).ljust(32, b"\0")

    def chunk(frames: np.ndarray) -> bytes:
        rows, cols = np.nonzero(frames)
        pointers = np.searchsorted(rows, np.arange(len(frames) + 1)).astype("<u4").tobytes()
        body = pointers + cols.astype("<u4").tobytes() + frames[rows, cols].astype("<u2").tobytes()
        return header(2, struct.pack("<BIIII", 3, len(frames), cols.size, len(pointers), len(pointers) + 4 * cols.size)) + body

    start = header(0, struct.pack("<BBHHBHHBI", 7, 0, *SCAN, 4, *DET, 4, 1)) + header(1, struct.pack("<IQ", 1, 0))
    flat = FRAMES.reshape(len(FRAMES), -1)
    return Stream([start], [[chunk(flat[k : k + 1])] for k in range(len(flat))], [header(3) + header(4)])


def dectris_v1() -> Stream:
    chunks = [bitshuffle_chunk(frame) for frame in FRAMES]
    config = {"trigger_mode": "exte", "ntrigger": len(FRAMES), "nimages": 1, "x_pixels_in_detector": DET[1], "y_pixels_in_detector": DET[0],
              "bit_depth_image": 16, "compression": "bslz4"}
    head = [json.dumps({"htype": "dheader-1.0", "series": 3, "header_detail": "basic"}).encode(), json.dumps(config).encode()]
    frames = [[json.dumps({"htype": "dimage-1.0", "series": 3, "frame": k}).encode(),
               json.dumps({"htype": "dimage_d-1.0", "shape": [DET[1], DET[0]], "type": "uint16", "encoding": "bs16-lz4<", "size": len(c)}).encode(),
               c, json.dumps({"htype": "dconfig-1.0"}).encode()] for k, c in enumerate(chunks)]
    return Stream(head, frames, [json.dumps({"htype": "dseries_end-1.0", "series": 3}).encode()])


def dectris_stream2() -> Stream:
    cbor2 = pytest.importorskip("cbor2")

    def message(value: dict) -> bytes:
        return cbor2.dumps(cbor2.CBORTag(55799, value))

    start = message({"type": "start", "series_id": 3, "series_unique_id": "x", "number_of_images": len(FRAMES), "image_size_x": DET[1],
                     "image_size_y": DET[0], "channels": ["threshold_1"], "image_dtype": "uint16"})
    frames = [[message({"type": "image", "series_id": 3, "image_id": k,
                        "data": {"threshold_1": cbor2.CBORTag(40, [list(DET), cbor2.CBORTag(69, frame.astype("<u2").tobytes())])}})]
              for k, frame in enumerate(FRAMES)]
    return Stream([start], frames, [message({"type": "end", "series_id": 3})])


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


def sent_over_tcp(parts: list[bytes]) -> int:
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        with listener:
            listener.settimeout(30)
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(b"".join(parts))
                except OSError:
                    pass  # the receiver stopped reading: what it refused is its answer

    threading.Thread(target=run, daemon=True).start()
    return listener.getsockname()[1]


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
        return qd.TcpSource("127.0.0.1", sent_over_tcp(parts), frames_per_read=2, timeout_s=TIMEOUT_S), None
    if protocol == "merlin":
        return qd.MerlinSource("127.0.0.1", sent_over_tcp(parts), frames_per_read=2, timeout_s=TIMEOUT_S), None
    if protocol == "timepix":
        return qd.TimepixSource("127.0.0.1", sent_over_tcp(parts), frames_per_read=2, timeout_s=TIMEOUT_S), None
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
