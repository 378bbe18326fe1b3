"""Quantum Detectors Merlin: .mib / .hdr files of every pixel type and counter depth, checked against LiberTEM's
own reader, loaded through the service; the data port ingested live from LiberTEM-live's Merlin simulator
(a separate process, started and stopped here by its PID) and from a server here that breaks the stream."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

import qgpu_dask as qd
from merlin_files import encoded, write_mib
from processes import Started, free_ports, serve
from qgpu_dask.formats import merlin
from qgpu_dask.io.registry import detect_format, open_reader
from qgpu_dask.io.source import Source
from qgpu_dask.samples import merlin_frame_header as frame_header
from qgpu_dask.samples import merlin_hdr as hdr_text

CASES = {  # pixel, depth, chips, layout, shape (rows, cols, det), largest count
    "U08": ("U08", 6, 1, "1x1", (3, 4, 24, 40), 63),
    "U16": ("U16", 12, 1, "1x1", (3, 4, 32, 48), 4095),
    "U32": ("U32", 24, 1, "1x1", (2, 3, 16, 20), 2**24 - 1),
    "R1": ("R64", 1, 1, "1x1", (2, 2, 256, 256), 1),
    "R6": ("R64", 6, 1, "1x1", (2, 2, 256, 256), 63),
    "R12": ("R64", 12, 1, "1x1", (2, 2, 256, 256), 4095),
    "R24": ("R64", 24, 1, "1x1", (1, 3, 256, 256), 2**24 - 1),
    "R1-quad": ("R64", 1, 4, "2x2", (1, 2, 512, 512), 1),
    "R6-quad": ("R64", 6, 4, "2x2", (1, 2, 512, 512), 63),
    "R12-quad-gaps": ("R64", 12, 4, "2x2G", (1, 2, 512, 512), 4095),
}


def counts_for(rng, case: str) -> np.ndarray:
    pixel, depth, chips, layout, shape, top = CASES[case]
    dtype = merlin.RAW[depth] if pixel == "R64" else merlin.COUNTS[pixel]
    return rng.integers(0, top + 1, shape).astype(dtype)


def libertem_frames(hdr: Path, raw_one_bit: bool) -> np.ndarray:
    """Every frame of the acquisition, as LiberTEM's MIB reader gives it (inline executor)."""
    pytest.importorskip("libertem")
    from libertem.api import Context
    from libertem.io.dataset.base.backend_buffered import BufferedBackend
    from libertem.udf import UDF

    class Frames(UDF):
        def get_result_buffers(self):
            return {"frames": self.buffer(kind="nav", extra_shape=tuple(self.meta.dataset_shape.sig), dtype=np.uint64)}

        def process_frame(self, frame):
            self.results.frames[:] = frame

    ctx = Context.make_with("inline")
    # LiberTEM's default (mapped) backend cannot read 1-bit raw files; its buffered one can
    dataset = ctx.load("mib", path=str(hdr), **({"io_backend": BufferedBackend()} if raw_one_bit else {}))
    return ctx.run_udf(dataset, Frames())["frames"].data


def read_all(reader) -> np.ndarray:
    frames = np.concatenate([block for _, block in reader.blocks(block_bytes=1 << 18)])
    return frames.reshape(reader.shape)


@pytest.mark.parametrize("case", CASES)
def test_files_read_as_libertem_reads_them(tmp_path, rng, case):
    """Every pixel type and counter depth, one chip and quads, several files: our reader == the counts written
    == LiberTEM's reader of the same files."""
    pixel, depth, chips, layout, shape, _ = CASES[case]
    counts = counts_for(rng, case)
    # LiberTEM reads a 24-bit raw file's first frame only right: one frame a file there
    files = shape[0] * shape[1] if depth == 24 and pixel == "R64" else 2
    hdr = write_mib(tmp_path, "scan", counts, pixel, depth, chips, layout, files=files)
    assert detect_format(hdr).name == detect_format(tmp_path / "scan_1.mib").name == "merlin"
    reader = open_reader(Source(str(hdr)))
    assert reader.shape == counts.shape and reader.dtype == counts.dtype
    assert (read_all(reader) == counts).all()
    assert (libertem_frames(hdr, pixel == "R64" and depth == 1) == counts).all()


def test_scan_shape_from_header_or_argument(tmp_path, rng):
    counts = counts_for(rng, "U16")
    hdr = write_mib(tmp_path, "a", counts, scan_in_header=False)  # frames per trigger (a scan row) give the shape
    assert open_reader(Source(str(hdr))).shape == counts.shape
    alone = tmp_path / "a_1.mib"
    assert open_reader(Source(str(alone))).shape == counts.shape  # its .hdr found beside it
    flat = (1, 12)
    assert open_reader(Source(str(alone), scan_shape=flat)).shape == (*flat, *counts.shape[2:])
    (tmp_path / "a.hdr").unlink()
    with pytest.raises(ValueError, match="3-D stack of 12 frames: give scan_shape"):
        open_reader(Source(str(alone)))


@pytest.mark.parametrize("layout", ["compressed", "dense"])
def test_load_through_the_service(svc, names, rng, tmp_path, layout):
    counts = counts_for(rng, "U16")
    hdr = write_mib(tmp_path, "run3", counts, files=3)
    info = qd.inspect(hdr)
    assert tuple(info["shape"]) == counts.shape and info["dtype"] == "uint16" and info["format"] == "merlin mib"
    acq = svc.load(hdr, name=names(), layout=layout, progress=False)
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
    assert (acq.frame(2, 3) == counts[2, 3]).all()


def test_damaged_files_refused(svc, names, rng, tmp_path):
    """A file cut inside a frame, a frame whose header is overwritten, a pixel type not read: a clear error naming
    the file and frame, nothing left resident, the service usable."""
    counts = counts_for(rng, "U16")
    refused = [names("cut"), names("damaged")]
    hdr = write_mib(tmp_path, "cut", counts)
    mib = tmp_path / "cut_1.mib"
    raw = mib.read_bytes()
    frame_bytes = len(raw) // 12
    mib.write_bytes(raw[: 7 * frame_bytes + 100])
    with pytest.raises(ValueError, match=r"holds 7 whole frames, the scan \(3, 4\) needs 12; .*cut_1.mib' ends 100 bytes into frame 8"):
        svc.load(hdr, name=refused[0], progress=False)
    damaged = bytearray(raw)
    damaged[5 * frame_bytes : 5 * frame_bytes + 4] = b"XXXX"
    mib.write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match=r"cut_1.mib': frame 5 of the file \(scan position 5\) has no MQ1 header"):
        svc.load(hdr, name=refused[1], progress=False)
    wide = tmp_path / "wide.mib"
    wide.write_bytes(frame_header(1, (4, 4), "U64", 24) + bytes(128))
    with pytest.raises(ValueError, match=r"Merlin pixel type 'U64' is not read \(readable: U08, U16, U32, R64\)"):
        qd.inspect(wide, scan_shape=(1, 1))
    assert not [n for n in refused if n in svc]
    acq = svc.put(counts, name=names("after"))
    assert (acq.frame(1, 1) == counts[1, 1]).all()


# -- the data port ------------------------------------------------------------


@pytest.fixture
def mib_sim(tmp_path):
    """Start LiberTEM-live's Merlin simulator on a .hdr (a function of the .hdr path, giving its data port); stopped by its PID."""
    pytest.importorskip("libertem_live")
    program = Path(sys.executable).with_name("libertem-live-mib-sim")
    if not program.exists():
        pytest.skip("libertem-live-mib-sim is not installed beside this Python (pip install 'libertem-live[sim]')")
    started = Started(tmp_path)

    def start(hdr: Path) -> int:
        data, control, trigger = free_ports(3)
        command = [str(program), str(hdr), "--host", "127.0.0.1", "--data-port", str(data), "--control-port", str(control),
                   "--trigger-port", str(trigger)]
        return started.start(command, lambda text: data if f"{data})" in text and "listening" in text else None, "merlin-sim")

    yield start
    started.close()


@pytest.mark.parametrize("case", ["U16", "R12-quad-gaps"])
def test_ingest_from_libertem_live_simulator(svc, names, rng, tmp_path, mib_sim, case):
    """The simulator replays a .mib as a Merlin sends it (HDR, then MPX-framed MQ1 frames, again and again): the
    acquisition's frames equal those written, the stream is closed after the frames the header announces."""
    pixel, depth, chips, layout, shape, _ = CASES[case]
    counts = counts_for(rng, case)
    port = mib_sim(write_mib(tmp_path, "live", counts, pixel, depth, chips, layout))
    acq = svc.create(names(), scan_shape=shape[:2], det_shape=shape[2:], dtype=counts.dtype)
    result = svc.ingest(qd.MerlinSource("127.0.0.1", data_port=port, timeout_s=90), acq, progress=False)
    assert result == {"frames": shape[0] * shape[1], "received": shape[0] * shape[1]}
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()


def test_series_of_acquisitions_on_one_connection(svc, names, rng, tmp_path, mib_sim):
    """The simulator sends its acquisition again and again on one data connection: a series of three live
    acquisitions takes one each, every frame equal, each held as loaded once complete; an acquisition of
    another frame count is refused naming it, before any of its frames."""
    pixel, depth, chips, layout, shape, _ = CASES["U16"]
    counts = counts_for(rng, "U16")
    port = mib_sim(write_mib(tmp_path, "live", counts, pixel, depth, chips, layout))
    series = svc.create([names() for _ in range(3)], scan_shape=shape[:2], det_shape=shape[2:], dtype=counts.dtype)
    assert isinstance(series, qd.Series) and len({a.owner for a in series}) == 1
    result = svc.ingest(qd.MerlinSource("127.0.0.1", data_port=port, timeout_s=90), series, progress=False)
    assert result == {"frames": 3 * shape[0] * shape[1], "received": [shape[0] * shape[1]] * 3}
    assert series.checksum() == [hashlib.sha256(counts.tobytes()).hexdigest()] * 3
    assert not any(a.info()["live"] for a in series)
    longer = svc.create([names(), names()], scan_shape=(shape[0] + 1, shape[1]), det_shape=shape[2:], dtype=counts.dtype)
    with pytest.raises(ValueError, match=rf"acquisition 1 of 2 announces {shape[0] * shape[1]} frames, the acquisition holds"
                                         rf" {(shape[0] + 1) * shape[1]}"):
        svc.ingest(qd.MerlinSource("127.0.0.1", data_port=port, timeout_s=90), longer, progress=False)
    assert [a.received for a in longer] == [0, 0]


def mpx(payload: bytes) -> bytes:
    return f"MPX,{len(payload) + 1:010d},".encode() + payload


def stream(counts: np.ndarray, numbers: list[int] | None = None, announced: int | None = None) -> bytes:
    frames = counts.reshape(-1, *counts.shape[2:])
    pixels, size = encoded(frames, "U16", 12, 1)
    numbers = numbers or list(range(1, len(frames) + 1))
    head = mpx(hdr_text(len(frames) if announced is None else announced, counts.shape[1], 12, 1, counts.shape[:2]))
    return head + b"".join(mpx(frame_header(k, size, "U16", 12) + p.tobytes()) for k, p in zip(numbers, pixels))


def test_broken_streams_keep_the_frames_before(svc, names, rng):
    """A lost frame, a cut connection, frames of another shape, no detector: errors naming the frame; the frames
    before it are kept and the acquisition can be completed by a new ingest."""
    counts = counts_for(rng, "U16")
    acq = svc.create(names(), scan_shape=(3, 4), det_shape=(32, 48), dtype="uint16")
    lost = serve(stream(counts, numbers=[1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13]))
    with pytest.raises(ValueError, match=r"frame 4 is numbered 6, expected 5 \(a frame was lost"):
        svc.ingest(qd.MerlinSource("127.0.0.1", lost, frames_per_read=2, timeout_s=10), acq, progress=False)
    assert acq.received == 4
    whole = stream(counts)
    cut = serve(whole[: len(whole) - 1000])
    other = svc.create(names(), scan_shape=(3, 4), det_shape=(32, 48), dtype="uint16")
    with pytest.raises(ValueError, match=r"closed inside frame 11 \(of 12\)"):
        svc.ingest(qd.MerlinSource("127.0.0.1", cut, frames_per_read=4, timeout_s=10), other, progress=False)
    assert other.received == 11
    wrong = svc.create(names(), scan_shape=(3, 4), det_shape=(48, 32), dtype="uint16")
    with pytest.raises(ValueError, match=r"sends \(32, 48\) uint16 frames \(U16, 1x1\), the acquisition holds \(48, 32\) uint16"):
        svc.ingest(qd.MerlinSource("127.0.0.1", serve(whole), timeout_s=10), wrong, progress=False)
    with pytest.raises(ValueError, match="no Merlin data port at merlin://127.0.0.1:"):
        svc.ingest(qd.MerlinSource("127.0.0.1", free_ports(1)[0], timeout_s=5), wrong, progress=False)
    rest = counts.reshape(-1, 32, 48)[4:]
    tail = serve(mpx(hdr_text(8, 4, 12)) + b"".join(mpx(frame_header(k + 1, (32, 48), "U16", 12) + p.tobytes())
                                                   for k, p in enumerate(encoded(rest, "U16", 12, 1)[0])))
    svc.ingest(qd.MerlinSource("127.0.0.1", tail, timeout_s=10), acq, progress=False)
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
