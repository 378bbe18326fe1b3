"""A DECTRIS detector's stream interface (v1) ingested live from LiberTEM-live's DECTRIS simulator (a separate
process replaying a dump this test records from known frames, armed through its REST API, started and stopped
here by its PID): every frame equal to those written, bad series refused naming the frame."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import qgpu_dask as qd
from processes import Started
from qgpu_dask.samples import write_dectris_series as write_dump


@pytest.fixture
def dectris_sim(tmp_path):
    """Start LiberTEM-live's DECTRIS simulator on a dump (a function of its path, giving (zmq port, REST port));
    stopped by its PID."""
    pytest.importorskip("libertem_live")
    pytest.importorskip("zmq")
    program = Path(sys.executable).with_name("libertem-live-dectris-sim")
    if not program.exists():
        pytest.skip("libertem-live-dectris-sim is not installed beside this Python (pip install 'libertem-live[sim]')")
    started = Started(tmp_path)

    def ports(text: str) -> tuple[int, int] | None:
        zmq_port = re.search(r"listening on tcp://127\.0\.0\.1:(\d+)", text)
        rest_port = re.search(r"API server listening on \('127\.0\.0\.1', (\d+)\)", text)
        return (int(zmq_port.group(1)), int(rest_port.group(1))) if zmq_port and rest_port else None

    yield lambda dump: started.start([str(program), str(dump), "--port", "0", "--zmqport", "0"], ports, "dectris-sim")
    started.close()


def arm(rest_port: int) -> dict:
    """The detector armed through the SIMPLON REST API: the series starts."""
    request = urllib.request.Request(f"http://127.0.0.1:{rest_port}/detector/api/1.8.0/command/arm", method="PUT", data=b"{}",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


@pytest.mark.parametrize("lz4", [False, True], ids=["bs16-lz4", "lz4"])
def test_ingest_from_libertem_live_dectris_simulator(svc, names, rng, tmp_path, dectris_sim, lz4):
    """Bitshuffle-LZ4 blobs (decoded on the owner's device) and plain LZ4 blocks (on its cores): every frame equal."""
    counts = rng.poisson(rng.uniform(0.1, 30, (48, 64)), (6, 8, 48, 64)).astype(np.uint16)
    zmq_port, rest_port = dectris_sim(write_dump(tmp_path / "series.dump", counts.reshape(-1, 48, 64), lz4=lz4))
    assert arm(rest_port) == {"sequence id": 7}
    acq = svc.create(names(), scan_shape=(6, 8), det_shape=(48, 64), dtype="uint16")
    result = svc.ingest(qd.DectrisSource("127.0.0.1", zmq_port, frames_per_read=10, timeout_s=60), acq, progress=False)
    assert result == {"frames": 48, "received": 48}
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()


def test_consecutive_series_into_a_series_of_acquisitions(svc, names, rng, tmp_path, dectris_sim):
    """Two arms, two DECTRIS series on one stream: a series of two live acquisitions takes one each, every
    frame equal, each held as loaded once complete."""
    counts = rng.poisson(1.5, (4, 5, 16, 24)).astype(np.uint16)
    zmq_port, rest_port = dectris_sim(write_dump(tmp_path / "series.dump", counts.reshape(-1, 16, 24)))
    series = svc.create([names(), names()], scan_shape=(4, 5), det_shape=(16, 24), dtype="uint16")
    future = svc.ingest(qd.DectrisSource("127.0.0.1", zmq_port, frames_per_read=8, timeout_s=60), series, wait=False)
    arm(rest_port)
    while series[0].received < 20 and not future.done():
        time.sleep(0.05)
    arm(rest_port)
    assert future.result(120) == {"frames": 40, "received": [20, 20]}
    assert series.checksum() == [hashlib.sha256(counts.tobytes()).hexdigest()] * 2
    assert not any(a.info()["live"] for a in series)


def test_bad_series_refused_naming_why(svc, names, rng, tmp_path, dectris_sim):
    """Frames of another shape or dtype are refused before any is appended; a detector that sends nothing is
    named after the wait; the acquisition takes the series afterwards."""
    counts = rng.poisson(2.0, (2, 3, 16, 24)).astype(np.uint16)
    zmq_port, rest_port = dectris_sim(write_dump(tmp_path / "series.dump", counts.reshape(-1, 16, 24)))
    other = svc.create(names(), scan_shape=(2, 3), det_shape=(24, 16), dtype="uint16")
    arm(rest_port)
    with pytest.raises(ValueError, match=r"sends frames of \(16, 24\), the acquisition holds \(24, 16\)"):
        svc.ingest(qd.DectrisSource("127.0.0.1", zmq_port, timeout_s=30), other, progress=False)
    wide = svc.create(names(), scan_shape=(2, 3), det_shape=(16, 24), dtype="uint32")
    arm(rest_port)
    with pytest.raises(ValueError, match=r"frame 0 is uint16 encoded 'bs16-lz4<'; the acquisition holds uint32"):
        svc.ingest(qd.DectrisSource("127.0.0.1", zmq_port, timeout_s=30), wide, progress=False)
    acq = svc.create(names(), scan_shape=(2, 3), det_shape=(16, 24), dtype="uint16")
    with pytest.raises(ValueError, match=r"sent nothing for 2 s"):
        svc.ingest(qd.DectrisSource("127.0.0.1", zmq_port, timeout_s=2), acq, progress=False)  # not armed: no series
    assert acq.received == 0
    arm(rest_port)
    svc.ingest(qd.DectrisSource("127.0.0.1", zmq_port, timeout_s=30), acq, progress=False)
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
