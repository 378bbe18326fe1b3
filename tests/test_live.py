"""Live acquisitions: frames appended in uneven pieces and queried between appends, against NumPy on the
received part with ==; a detector simulator streaming a file over loopback to the owner; bad appends and
broken streams keep what arrived."""

from __future__ import annotations

import hashlib
import io
import socket
import subprocess
import sys
import threading
import time

import h5py
import hdf5plugin
import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.io.simulator import serve
from qgpu_dask.io.source import Source
from qgpu_dask.io.wire import header_line
from qgpu_dask.resident.compressed import CompressedCounts
from qgpu_dask.resident.dense import DenseCounts
from qgpu_dask.resident.live import PROBE, LiveCounts

from conftest import BACKENDS
from qgpu_dask.samples import write_arina

PIECES = (1, 7, 300, 5, 700, 0, 3, 2000)  # across the probe (256 frames) and several codec blocks


@pytest.fixture(scope="module")
def counts():
    rng = np.random.default_rng(7)
    data = rng.poisson(0.4, (37, 41, 9, 11)).astype(np.uint16)  # 1517 positions: the last block short
    data.reshape(-1)[rng.integers(0, data.size, 50)] = 900  # escapes
    return data


def module_for(backend: str):
    if backend == "gpu":
        import cupy

        return cupy
    return np


def expected_images(flat: np.ndarray, masks: np.ndarray, received: int) -> np.ndarray:
    want = np.einsum("fij,mij->mf", flat.astype(np.int64), masks.astype(np.int64))
    want[:, received:] = 0
    return want


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["dense", "compressed"])
def test_appends_in_uneven_pieces_answer_exactly_between_them(counts, backend, layout):
    rng = np.random.default_rng(3)
    flat = counts.reshape(-1, *counts.shape[2:])
    live = LiveCounts("live", counts.shape, counts.dtype, layout, module_for(backend))
    masks = rng.random((2, *counts.shape[2:])) < 0.4
    assert (live.virtual_images(masks) == 0).all()
    received = 0
    for n in PIECES:
        n = min(n, flat.shape[0] - received)
        assert live.append(module_for(backend).asarray(flat[received : received + n]) if n % 2 else flat[received : received + n]) == received + n
        received += n
        assert live.received == received and live.complete == (received == flat.shape[0])
        assert (live.virtual_images(masks).reshape(2, -1) == expected_images(flat, masks, received)).all()
        roi = rng.random(counts.shape[:2]) < 0.5
        chosen = np.flatnonzero(roi.ravel())
        chosen = chosen[chosen < received]
        assert (live.reduce(roi, "sum") == flat[chosen].sum(axis=0, dtype=np.uint64)).all()
        if chosen.size:
            assert (live.reduce(roi, "max") == flat[chosen].max(axis=0)).all()
            assert (live.reduce(roi, "mean") == flat[chosen].sum(axis=0, dtype=np.uint64) / chosen.size).all()
        else:
            with pytest.raises(ValueError, match="no received scan position"):
                live.reduce(roi, "max")
        row, col = divmod(max(received - 1, 0), counts.shape[1])
        assert (live.frame(row, col) == (counts[row, col] if received else 0)).all()
    finished = live.finished()
    assert type(finished) is (DenseCounts if layout == "dense" else CompressedCounts)
    assert finished.checksum() == live.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
    assert (qd.device.to_host(finished.counts_flat()) == flat.reshape(flat.shape[0], -1)).all()
    if layout == "compressed":
        finished.check()
        assert finished.nbytes < finished.raw_bytes / 2


@pytest.mark.parametrize("layout", ["dense", "compressed"])
def test_bad_appends_change_nothing(counts, layout):
    flat = counts.reshape(-1, *counts.shape[2:])
    live = LiveCounts("live", counts.shape, counts.dtype, layout, np)
    live.append(flat[:PROBE + 10])
    before = live.virtual_images(np.ones((1, *counts.shape[2:]), bool))
    for frames, word in ((flat[:3, :8], "frames must be"), (flat[:3].astype(np.uint32), "uint32"), (flat[0], "frames must be"),
                         (np.concatenate([flat] * 2), "would pass the scan")):
        with pytest.raises(ValueError, match=word):
            live.append(frames)
        assert live.received == PROBE + 10
        assert (live.virtual_images(np.ones((1, *counts.shape[2:]), bool)) == before).all()
    with pytest.raises(ValueError, match="has 266 of"):
        live.finished()
    with pytest.raises(ValueError, match="unsigned integer"):
        LiveCounts("f", counts.shape, np.float32, "compressed", np)
    with pytest.raises(ValueError, match="unknown layout"):
        LiveCounts("f", counts.shape, np.uint16, "zip", np)


def test_a_model_from_the_first_frames_codes_any_later_count(counts):
    """The probe sees few counts; later blocks hold counts and runs it never saw."""
    flat = counts.reshape(-1, *counts.shape[2:]).copy()
    flat[:PROBE] = 0
    flat[PROBE:] = np.random.default_rng(1).poisson(30.0, flat[PROBE:].shape)
    live = LiveCounts("live", counts.shape, counts.dtype, "compressed", np)
    for lo in range(0, flat.shape[0], 500):
        live.append(flat[lo : lo + 500])
    finished = live.finished()
    finished.check()
    assert (finished.counts_flat() == flat.reshape(flat.shape[0], -1)).all()


@pytest.fixture(scope="module")
def acquisition_file(tmp_path_factory, counts):
    path = tmp_path_factory.mktemp("live") / "scan.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=counts, chunks=(1, counts.shape[1], *counts.shape[2:]))
    return path


def listening() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0))


def test_a_live_acquisition_through_the_service(svc, names, counts):
    flat = counts.reshape(-1, *counts.shape[2:])
    workers = sorted(svc.client.scheduler_info()["workers"])
    acqs = [svc.create(names("live"), counts.shape[:2], counts.shape[2:], "uint16", layout=r, worker=w)
            for r, w in zip(("compressed", "dense"), workers[:2])]
    assert [a.owner for a in acqs] == workers[:2] and all(a.received == 0 for a in acqs)
    mask = np.zeros(counts.shape[2:], bool)
    mask[2:6, 3:8] = True
    received = 0
    for n in (5, 600, 1, 900, 11):
        for acq in acqs:
            if n == 11:  # bad appends first: nothing changes
                with pytest.raises(ValueError, match="20 frames would pass the scan of 1517 positions"):
                    acq.append(flat[:20])
                with pytest.raises(ValueError, match="frames must be"):
                    acq.append(flat[:2, :3])
            assert acq.append(flat[received : received + n]) == received + n
        received += n
        for acq in acqs:
            assert acq.received == received
            assert (acq.virtual_image(mask).ravel() == expected_images(flat, mask[None], received)[0]).all()
            assert (acq.reduce(op="sum") == flat[:received].sum(axis=0, dtype=np.uint64)).all()
    for acq in acqs:  # logged once when made and once when its last position arrived ("loaded" twice before)
        assert [e["event"] for e in svc.state()["events"] if e.get("name") == acq.name] == ["created", "completed"]
    loaded = svc.put(counts, name=names("loaded"))
    optics = qd.Optics(300e3, 20.0, 1.0, det_sampling_mrad=4.0, rotation_deg=0.0, flip=False, bf_center_px=(4.0, 5.0))
    for acq in acqs:  # complete: held as if loaded from a file
        assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
        assert (acq.ssb(optics) == loaded.ssb(optics)).all()
        totals = svc.submit(lambda r: [int(b.sum()) for b in r.feed(500, amplitude=False)], acq).result()
        assert sum(totals) == int(counts.sum(dtype=np.uint64))
        with pytest.raises(ValueError, match="is not live: it was loaded, or all its 1517 scan positions have arrived"):
            acq.append(flat[:1])
        acq.release()
    loaded.release()


def test_bad_live_arguments(svc, names):
    with pytest.raises(ValueError, match="unknown layout"):
        svc.create(names("bad"), (4, 4), (8, 8), "uint16", layout="zip")
    with pytest.raises(ValueError, match="unsigned integer"):
        svc.create(names("bad"), (4, 4), (8, 8), "float32", layout="compressed")
    with pytest.raises(ValueError, match="scan_shape and det_shape"):
        svc.create(names("bad"), (4, 4, 2), (8, 8))
    with pytest.raises(ValueError, match="needs"):
        svc.create(names("bad"), (4096, 4096), (256, 256), "uint32", layout="dense")
    assert not [a for a in svc.acquisitions() if a.name.startswith("bad")]
    for bad in ({"frames_per_read": 0}, {"timeout_s": 0}):
        with pytest.raises(ValueError, match="at least 1 frame at a time and waits a positive time"):
            qd.TcpSource("127.0.0.1", 5555, **bad)


def test_the_simulator_streams_a_file_to_the_owner_over_loopback(svc, names, counts, acquisition_file):
    acq = svc.create(names("ingest"), counts.shape[:2], counts.shape[2:], "uint16")
    server = listening()
    port = server.getsockname()[1]
    sender = threading.Thread(target=serve, args=(Source(str(acquisition_file), "data"), server, 20000.0))
    sender.start()
    try:
        result = svc.ingest(qd.TcpSource("127.0.0.1", port, frames_per_read=100), acq, progress=False)
    finally:
        sender.join(30)
        server.close()
    assert result == {"frames": counts.shape[0] * counts.shape[1], "received": counts.shape[0] * counts.shape[1]}
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
    assert acq.info()["layout"] == "compressed" and not acq.info()["live"]
    acq.release()


def test_a_stream_that_stops_inside_a_frame_keeps_the_frames_before(svc, names, counts):
    flat = counts.reshape(-1, *counts.shape[2:])
    acq = svc.create(names("broken"), counts.shape[:2], counts.shape[2:], "uint16", layout="dense")
    server = listening()
    port = server.getsockname()[1]

    def broken():
        conn, _ = server.accept()
        with conn:
            conn.sendall(header_line(counts.shape[:2], counts.shape[2:], counts.dtype))
            conn.sendall(flat[:300].tobytes() + flat[300].tobytes()[:51])

    sender = threading.Thread(target=broken)
    sender.start()
    with pytest.raises(ValueError, match="stopped inside a frame: after 300 whole frames, 51 of the next"):
        svc.ingest(qd.TcpSource("127.0.0.1", port, frames_per_read=64), acq, progress=False)
    sender.join(30)
    server.close()
    assert acq.received == 300
    mask = np.ones(counts.shape[2:], bool)
    assert (acq.virtual_image(mask).ravel() == expected_images(flat, mask[None], 300)[0]).all()
    acq.append(flat[300:])  # the rest from elsewhere: complete
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
    acq.release()


def test_a_stream_of_other_frames_is_refused(svc, names, counts):
    acq = svc.create(names("other"), counts.shape[:2], counts.shape[2:], "uint16")
    server = listening()
    port = server.getsockname()[1]

    def other():
        conn, _ = server.accept()
        with conn:
            conn.sendall(header_line(counts.shape[:2], (9, 12), "uint16"))

    sender = threading.Thread(target=other)
    sender.start()
    with pytest.raises(ValueError, match=r"sends \(9, 12\) uint16 frames, the acquisition holds \(9, 11\) uint16"):
        svc.ingest(qd.TcpSource("127.0.0.1", port), acq, progress=False)
    sender.join(30)
    server.close()
    assert acq.received == 0
    acq.release()


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


def simulator(path, port: int, *options: str) -> subprocess.Popen:
    """``qgpu-dask simulate path --port port *options`` in a process of its own, once it listens."""
    process = subprocess.Popen([sys.executable, "-m", "qgpu_dask.cli", "simulate", str(path), "--port", str(port), *options],
                               stdout=subprocess.PIPE, text=True)
    assert "serving" in process.stdout.readline()
    return process


def test_two_detectors_stream_to_two_shards_while_a_viewer_queries(svc, names, counts, acquisition_file, tmp_path):
    """The CLI simulator, end to end: every view while frames arrive is exact for the positions received
    before it was asked and 0 past those received after it; then the finished acquisitions save and reload."""
    flat = counts.reshape(-1, *counts.shape[2:])
    workers = sorted(svc.client.scheduler_info()["workers"])
    acqs = [svc.create(names("cam"), counts.shape[:2], counts.shape[2:], "uint16", worker=w) for w in workers[:2]]
    ports = [free_port(), free_port()]
    processes = [simulator(acquisition_file, port, "--dataset", "data", "--rate", "3000") for port in ports]
    futures = [svc.ingest(qd.TcpSource("127.0.0.1", port), acq, wait=False) for port, acq in zip(ports, acqs)]
    mask = np.zeros(counts.shape[2:], bool)
    mask[3:7, 2:9] = True
    truth = expected_images(flat, mask[None], flat.shape[0])[0]
    views = 0
    while not all(f.done() for f in futures) or views < 3:
        before = acqs[0].received
        image = acqs[0].virtual_image(mask).ravel()
        after = acqs[0].received
        assert (image[:before] == truth[:before]).all() and (image[after:] == 0).all()
        differs = np.flatnonzero(image != truth)
        cut = differs[0] if differs.size else image.size  # one moment's received positions: exact, then zeros
        assert (image[cut:] == 0).all()
        views += 1
    assert [f.result()["received"] for f in futures] == [flat.shape[0]] * 2
    for process in processes:
        assert process.wait(30) == 0 and "sent 1517 frames" in process.stdout.read()
    for acq in acqs:
        assert (acq.virtual_image(mask).ravel() == truth).all()
        path = acq.save(tmp_path / f"{acq.name}.qgpu")
        acq.release()
        again = svc.load(path, name=acq.name)
        assert again.info()["layout"] == "compressed" and again.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
        again.release()


def test_worker_side_code_appends_next_to_the_data(svc, names, counts):
    flat = counts.reshape(-1, *counts.shape[2:])
    acq = svc.create(names("side"), counts.shape[:2], counts.shape[2:], "uint16")

    def produce(resident, lo, hi):  # a worker-side producer (a detector's software, say) appends on the owner
        rng = np.random.default_rng(7)
        data = rng.poisson(0.4, (37 * 41, 9, 11)).astype(np.uint16)
        data.reshape(-1)[rng.integers(0, data.size, 50)] = 900
        return resident.append(data[lo:hi])

    assert svc.submit(produce, acq, 0, 1000).result() == 1000
    assert acq.received == 1000 and acq.info()["live"]
    assert svc.submit(produce, acq, 1000, flat.shape[0]).result() == flat.shape[0]
    assert not acq.info()["live"] and acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
    acq.release()


def test_worker_side_code_completes_a_series_of_live_acquisitions(svc, names, counts):
    """Code run on a series' shards appends the last frames: each becomes the plain resident it now is."""
    flat = counts.reshape(-1, *counts.shape[2:])
    acqs = [svc.create(names(f"series{k}"), counts.shape[:2], counts.shape[2:], "uint16") for k in range(3)]
    # each goes on from what it received; the first has coded a block (1024 frames) already, so the shards
    # finishing in parallel find Numba's encoder compiled and cached rather than each compiling it
    for acq, received in zip(acqs, (1100, 500, 500)):
        acq.append(flat[:received])
    series = qd.Series(svc, acqs)

    def finish(part, frames):
        return [resident.append(frames[resident.received :]) for resident in part]

    results = svc.submit(finish, series, flat).result()  # [(positions, what finish returned)] per shard
    assert sorted(p for positions, _ in results for p in positions) == [0, 1, 2]
    assert all(got == [flat.shape[0]] * len(positions) for positions, got in results)
    for acq in acqs:
        assert not acq.info()["live"] and acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
        acq.release()


def test_one_stream_at_a_time_and_a_release_drops_it(svc, names, counts, acquisition_file):
    flat = counts.reshape(-1, *counts.shape[2:])
    acq = svc.create(names("busy"), counts.shape[:2], counts.shape[2:], "uint16")
    port = free_port()
    process = simulator(acquisition_file, port, "--dataset", "data", "--rate", "500")  # 3 s for the whole scan
    future = svc.ingest(qd.TcpSource("127.0.0.1", port, frames_per_read=16), acq, wait=False)
    while acq.received < 32:
        time.sleep(0.02)
    with pytest.raises(ValueError, match="is already ingesting from tcp://127.0.0.1"):
        svc.ingest(qd.TcpSource("127.0.0.1", free_port()), acq, progress=False)
    with pytest.raises(ValueError, match="appends would interleave"):
        acq.append(flat[:1])
    acq.release()
    with pytest.raises(ValueError, match="was released while tcp://127.0.0.1:.* streamed into it"):
        future.result()
    process.kill()
    process.wait(30)
    assert acq.name not in svc


def test_no_stream_and_a_stalled_stream_are_named(svc, names, counts):
    flat = counts.reshape(-1, *counts.shape[2:])
    acq = svc.create(names("quiet"), counts.shape[:2], counts.shape[2:], "uint16", layout="dense")
    port = free_port()
    with pytest.raises(ValueError, match=f"no frame stream at tcp://127.0.0.1:{port}"):
        svc.ingest(qd.TcpSource("127.0.0.1", port), acq, progress=False)
    server = listening()
    done = threading.Event()

    def stalls():
        conn, _ = server.accept()
        with conn:
            conn.sendall(header_line(counts.shape[:2], counts.shape[2:], counts.dtype))
            conn.sendall(flat[:40].tobytes() + flat[40].tobytes()[:7])
            done.wait(30)  # quiet, but open

    sender = threading.Thread(target=stalls)
    sender.start()
    future = svc.ingest(qd.TcpSource("127.0.0.1", server.getsockname()[1], frames_per_read=64, timeout_s=3), acq, wait=False)
    start = time.monotonic()
    while acq.received < 40:  # a read does not wait to fill: what came is appended within LATENCY_S
        time.sleep(0.01)
    assert time.monotonic() - start < 2 and not future.done()
    with pytest.raises(ValueError, match=r"sent nothing for 3 s after 40 whole frames"):
        future.result()
    done.set()
    sender.join(30)
    server.close()
    assert acq.received == 40  # the whole frames of a read cut short are kept
    acq.release()


def test_a_reader_that_stops_early_does_not_wait_for_a_quiet_sender(counts):
    flat = counts.reshape(-1, *counts.shape[2:])
    server = listening()
    done = threading.Event()

    def pauses():
        conn, _ = server.accept()
        with conn:
            conn.sendall(header_line(counts.shape[:2], counts.shape[2:], counts.dtype) + flat[:10].tobytes())
            done.wait(30)  # quiet, but open

    sender = threading.Thread(target=pauses)
    sender.start()
    start = time.monotonic()
    for block in qd.TcpSource("127.0.0.1", server.getsockname()[1], timeout_s=20).frames(counts.shape[2:], np.uint16):
        assert (block == flat[:10]).all()
        break
    assert time.monotonic() - start < 5
    done.set()
    sender.join(30)
    server.close()


@pytest.fixture(scope="module")
def arina_master(tmp_path_factory, counts):
    return write_arina(tmp_path_factory.mktemp("arina"), counts.reshape(-1, *counts.shape[2:]), per_file=600)


def test_a_detector_sends_its_bitshuffle_lz4_chunks(svc, names, counts, arina_master):
    """The stored chunks of an Arina master go over the wire as they are and are decoded on the owner."""
    flat = counts.reshape(-1, *counts.shape[2:])
    server = listening()
    source = Source(str(arina_master), scan_shape=counts.shape[:2])
    sender = threading.Thread(target=serve, args=(source, server), kwargs={"compressed": True})
    sender.start()
    got = np.concatenate(list(qd.TcpSource("127.0.0.1", server.getsockname()[1], frames_per_read=100).frames(counts.shape[2:], np.uint16)))
    sender.join(30)
    server.close()
    assert (got == flat).all()
    acq = svc.create(names("chunks"), counts.shape[:2], counts.shape[2:], "uint16")
    port = free_port()
    process = simulator(arina_master, port, "--compressed", "--scan-shape", *map(str, counts.shape[:2]))
    assert svc.ingest(qd.TcpSource("127.0.0.1", port), acq, progress=False)["received"] == flat.shape[0]
    assert process.wait(30) == 0
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
    acq.release()


def test_chunks_stored_out_of_order_go_out_in_scan_order(tmp_path):
    """A data file whose chunks lie in the file in another order than the frames (written last to first):
    each chunk is sent from where it lies."""
    flat = np.random.default_rng(8).poisson(0.5, (200, 64, 64)).astype(np.uint16)
    with h5py.File(tmp_path / "scan_data_000001.h5", "w") as f:
        d = f.create_dataset("/entry/data/data", shape=flat.shape, dtype=flat.dtype, chunks=(1, *flat.shape[1:]),
                             **hdf5plugin.Bitshuffle(nelems=0, cname="lz4"))
        for i in reversed(range(len(flat))):
            d[i] = flat[i]
    with h5py.File(tmp_path / "scan_master.h5", "w") as f:
        f["/entry/data/data_000001"] = h5py.ExternalLink("scan_data_000001.h5", "/entry/data/data")
        f["/entry/instrument/detector/description"] = "Dectris Arina (test layout)"
    server = listening()
    source = Source(str(tmp_path / "scan_master.h5"), scan_shape=(10, 20))
    sender = threading.Thread(target=serve, args=(source, server), kwargs={"compressed": True})
    sender.start()
    got = np.concatenate(list(qd.TcpSource("127.0.0.1", server.getsockname()[1]).frames(flat.shape[1:], np.uint16)))
    sender.join(30)
    server.close()
    assert (got == flat).all()


def test_malformed_and_cut_chunk_streams(counts, acquisition_file):
    flat = counts.reshape(-1, *counts.shape[2:])
    chunk = hdf5plugin_chunk(flat[0])
    whole = message([chunk])
    for body, word, kept in ((message([chunk, chunk, chunk, chunk[:-5]]), "sent a malformed frame 3: 6 bytes of trailing elements expected", 3),
                             (whole + message([chunk])[:17], "stopped inside a frame: after 1 whole frames, 17 bytes of the next came", 1),
                             (whole + message([chunk])[:4] + (1 << 30).to_bytes(4, "little") + chunk,
                              "sent a malformed frame 1: a chunk of 1073741824 bytes, more than a frame of", 1),
                             (whole + bytes(4) + chunk, r"sent a malformed frame 1: a message of 0 frames \(1 to 4096\)", 1)):
        server = listening()

        def send():
            conn, _ = server.accept()
            with conn:
                conn.sendall(header_line(counts.shape[:2], counts.shape[2:], counts.dtype, "bitshuffle-lz4") + body)

        sender = threading.Thread(target=send)
        sender.start()
        got = []
        with pytest.raises(ValueError, match=word):
            for block in qd.TcpSource("127.0.0.1", server.getsockname()[1]).frames(counts.shape[2:], np.uint16):
                got.append(block)
        assert sum(map(len, got)) == kept and (np.concatenate(got) == flat[0]).all()  # the frames before it come first (each is frame 0)
        sender.join(30)
        server.close()
    with listening() as server, pytest.raises(ValueError, match="replays an Arina/Eiger master"):
        serve(Source(str(acquisition_file), "data"), server, compressed=True)


def message(chunks: list[bytes]) -> bytes:
    """Chunks as one message of a bitshuffle-LZ4 frame stream."""
    return len(chunks).to_bytes(4, "little") + b"".join(len(c).to_bytes(4, "little") for c in chunks) + b"".join(chunks)


def hdf5plugin_chunk(frame: np.ndarray) -> bytes:
    """One frame as the bitshuffle-LZ4 chunk HDF5 stores (written by h5py + hdf5plugin, read back as stored)."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        f.create_dataset("d", data=frame[None], chunks=(1, *frame.shape), **hdf5plugin.Bitshuffle(nelems=0, cname="lz4"))
        return f["d"].id.read_direct_chunk((0, 0, 0))[1]
