"""ASI Timepix3 sparse frames: ingested live from LiberTEM-live's Timepix3 simulator (a separate process,
started and stopped here by its PID) and from servers here that send streams written by hand, broken ones
among them."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

import qgpu_dask as qd
from conftest import mock_frames
from processes import free_ports, serve


def test_ingest_from_libertem_live_simulator(svc, names, tpx_sim):
    """The simulator sends its mock scan again and again on one connection: one acquisition takes a scan, a
    series of three the next three; every frame equal to what the mock is made of."""
    port = tpx_sim(4, 6)  # 512 x 512 uint32 frames: 24 MiB of counts a scan
    expected = hashlib.sha256(mock_frames(24).tobytes()).hexdigest()
    acq = svc.create(names(), scan_shape=(4, 6), det_shape=(512, 512), dtype="uint32")
    assert svc.ingest(qd.TimepixSource("127.0.0.1", port, frames_per_read=10), acq, progress=False) == {"frames": 24, "received": 24}
    assert acq.checksum() == expected
    series = svc.create([names() for _ in range(3)], scan_shape=(4, 6), det_shape=(512, 512), dtype="uint32")
    result = svc.ingest(qd.TimepixSource("127.0.0.1", port), series, progress=False)
    assert result == {"frames": 72, "received": [24] * 3}
    assert series.checksum() == [expected] * 3


def header(tag: int, body: bytes = b"") -> bytes:
    return (bytes([tag]) + body).ljust(32, b"\0")


def acquisition_start(scan, det, indptr=4, indices=4, sequence=1, fmt=0) -> bytes:
    return header(0, struct.pack("<BBHHBHHBI", 7, fmt, *scan, indptr, *det, indices, sequence))


def chunk(frames: np.ndarray, values=3, indptr=np.uint32, indices=np.uint32, pad: int = 0) -> bytes:
    """An array chunk of ``frames`` (n, pixels): its header and payload (``pad`` bytes between the parts)."""
    rows, cols = np.nonzero(frames)
    pointers = np.searchsorted(rows, np.arange(len(frames) + 1)).astype(indptr).tobytes() + b"\xee" * pad
    at_values = len(pointers) + cols.size * np.dtype(indices).itemsize + pad
    body = pointers + cols.astype(indices).tobytes() + b"\xee" * pad + frames[rows, cols].astype({2: "<u1", 3: "<u2", 4: "<u4"}[values]).tobytes()
    return header(2, struct.pack("<BIIII", values, len(frames), cols.size, len(pointers), at_values)) + body


def stream(frames: np.ndarray, scan, det, per_chunk: int = 5, **kwargs) -> bytes:
    flat = frames.reshape(-1, det[0] * det[1])
    chunks = b"".join(chunk(flat[i : i + per_chunk], **kwargs) for i in range(0, len(flat), per_chunk))
    return acquisition_start(scan, det) + header(1, struct.pack("<IQ", 1, 0)) + chunks + header(3) + header(4)


def test_chunks_of_every_width_and_padding(svc, names, rng):
    """Values of 8, 16 and 32 bits, 16-bit row pointers and indices, padding between the parts, scan metadata:
    every frame equal."""
    counts = rng.poisson(0.3, (3, 4, 8, 12)).astype(np.uint16)
    flat = counts.reshape(12, -1)
    data = (acquisition_start((3, 4), (8, 12), indptr=3, indices=3) + header(1, struct.pack("<IQ", 1, 5)) + b'{"a":'
            + chunk(flat[:5], values=2, indptr=np.uint16, indices=np.uint16, pad=3)
            + chunk(flat[5:9], values=3, indptr=np.uint16, indices=np.uint16)
            + chunk(flat[9:], values=4, indptr=np.uint16, indices=np.uint16, pad=8) + header(3) + header(4))
    acq = svc.create(names(), scan_shape=(3, 4), det_shape=(8, 12), dtype="uint16")
    svc.ingest(qd.TimepixSource("127.0.0.1", serve(data), frames_per_read=2), acq, progress=False)
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()


def test_broken_streams_keep_the_frames_before(svc, names, rng):
    """A cut connection, another shape, a scan of another length, frames past the scan, a pixel outside the
    frame, a count too large, an unknown header: errors naming the frame; the frames before it are kept and
    the acquisition is completed by a new ingest."""
    counts = rng.poisson(0.5, (3, 4, 8, 12)).astype(np.uint16)
    whole = stream(counts, (3, 4), (8, 12))
    acq = svc.create(names(), scan_shape=(3, 4), det_shape=(8, 12), dtype="uint16")
    flat = counts.reshape(12, -1)
    cut = whole[: 64 + len(chunk(flat[:5])) + 40]  # inside the chunk of frames 5 to 9
    with pytest.raises(ValueError, match=r"closed at frame 5 \(\d+ of \d+ bytes came\)"):
        svc.ingest(qd.TimepixSource("127.0.0.1", serve(cut), timeout_s=10), acq, progress=False)
    assert acq.received == 5
    other = svc.create(names(), scan_shape=(3, 4), det_shape=(12, 8), dtype="uint16")
    with pytest.raises(ValueError, match=r"sends frames of \(8, 12\), the acquisition holds \(12, 8\)"):
        svc.ingest(qd.TimepixSource("127.0.0.1", serve(whole), timeout_s=10), other, progress=False)
    longer = svc.create(names(), scan_shape=(4, 4), det_shape=(8, 12), dtype="uint16")
    with pytest.raises(ValueError, match=r"its scan of \(3, 4\) is 12 frames, the acquisition holds 16"):
        svc.ingest(qd.TimepixSource("127.0.0.1", serve(whole), timeout_s=10), longer, progress=False)
    past = acquisition_start((2, 4), (8, 12)) + header(1, struct.pack("<IQ", 1, 0)) + chunk(flat[:5]) + chunk(flat[5:])
    short = svc.create(names(), scan_shape=(2, 4), det_shape=(8, 12), dtype="uint16")
    with pytest.raises(ValueError, match=r"a chunk of frames 5 to 11 goes past the scan's 8 frames"):
        svc.ingest(qd.TimepixSource("127.0.0.1", serve(past), timeout_s=10), short, progress=False)
    assert short.received == 5
    outside = bytearray(acquisition_start((2, 4), (8, 12)) + header(1, struct.pack("<IQ", 1, 0)) + chunk(flat[:8]))
    first_index = 64 + 32 + 9 * 4  # the first index, after the chunk header and 9 row pointers
    outside[first_index : first_index + 4] = struct.pack("<I", 96)
    eight = svc.create(names(), scan_shape=(2, 4), det_shape=(8, 12), dtype="uint16")
    with pytest.raises(ValueError, match=r"frame \d has a pixel index 96 outside its 96 pixels"):
        svc.ingest(qd.TimepixSource("127.0.0.1", serve(bytes(outside)), timeout_s=10), eight, progress=False)
    narrow = svc.create(names(), scan_shape=(1, 2), det_shape=(8, 12), dtype="uint8")
    big = np.zeros((2, 96), np.uint16)
    big[1, 3] = 300
    with pytest.raises(ValueError, match=r"frame 1 has a count of 300, more than the acquisition's uint8 holds"):
        svc.ingest(qd.TimepixSource("127.0.0.1", serve(stream(big, (1, 2), (8, 12), values=3)), timeout_s=10), narrow, progress=False)
    with pytest.raises(ValueError, match=r"expected an acquisition start, got a header of unknown type 9"):
        svc.ingest(qd.TimepixSource("127.0.0.1", serve(header(9) + whole), timeout_s=10), narrow, progress=False)
    with pytest.raises(ValueError, match="no Timepix3 stream at tcp://127.0.0.1:"):
        svc.ingest(qd.TimepixSource("127.0.0.1", free_ports(1)[0], timeout_s=5), narrow, progress=False)
    rest = (acquisition_start((1, 7), (8, 12)) + header(1, struct.pack("<IQ", 1, 0)) + chunk(counts.reshape(12, -1)[5:]) + header(3)
            + header(4))
    svc.ingest(qd.TimepixSource("127.0.0.1", serve(rest), timeout_s=10), acq, progress=False)
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
