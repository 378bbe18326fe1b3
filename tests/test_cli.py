"""The command line: `qgpu-dask info` against a running cluster, and the demo at a tiny size."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import numpy as np
import pytest
from PIL import Image

import qgpu_dask as qd
from qgpu_dask.cli import main


def test_info_prints_shards_and_acquisitions(svc, names, scheduler_file, capsys):
    acq = svc.put(np.ones((2, 3, 4, 4), np.uint8), name=names())
    assert main(["info", "--scheduler-file", str(scheduler_file)]) == 0
    out = capsys.readouterr().out
    assert out.count("tcp://") >= 3 + 1  # three shards and the acquisition's owner
    assert acq.name in out and "2x3x4x4" in out
    assert main(["info", "--address", svc.client.scheduler.address]) == 0
    assert acq.name in capsys.readouterr().out


def test_simulate_rate_counts_from_the_connection(tmp_path, rng, capsys):
    """`qgpu-dask simulate --rate` reports the rate it kept from the client's connection, not from its own start."""
    np.save(tmp_path / "scan.npy", rng.poisson(1.0, (20, 20, 16, 16)).astype(np.uint16))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = threading.Thread(target=main, args=(["simulate", str(tmp_path / "scan.npy"), "--rate", "2000", "--port", str(port)],))
    server.start()
    time.sleep(1.0)  # a detector waits for its client: this must not count
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port))
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the simulator did not start listening"
            time.sleep(0.05)
    with conn:
        received = sum(iter(lambda: len(conn.recv(1 << 20)), 0))
    server.join()
    out = capsys.readouterr().out
    assert received > 400 * 16 * 16 * 2
    rate = float(re.search(r"sent 400 frames in [0-9.]+ s from the client's connection \(([0-9]+) frames/s\)", out).group(1))
    assert 1000 < rate <= 2100


def test_info_and_connect_without_a_scheduler(tmp_path, capsys):
    """A missing scheduler file, or an address where no scheduler listens, is one clear error at once (the Client
    waited 300 s for the file, and 30 s for the address before a 52-line traceback)."""
    started = time.monotonic()
    typo = tmp_path / "typo.json"
    missing = f"no scheduler file {str(typo)!r}: give the file that `dask scheduler --scheduler-file` wrote"
    assert main(["info", "--scheduler-file", str(typo)]) == 1
    assert capsys.readouterr().err == f"qgpu-dask info: {missing}\n"
    with pytest.raises(FileNotFoundError, match=re.escape(missing)):
        qd.Service.connect(scheduler_file=typo)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"  # closed again: nothing listens there
    assert main(["info", "--address", address]) == 1
    assert capsys.readouterr().err == f"qgpu-dask info: no scheduler at {address} (Connection refused): start one (dask scheduler) or check the address\n"
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({"address": address}))
    with pytest.raises(ConnectionError, match=re.escape(f"no scheduler at {address}, the address in {str(stale)!r} (a scheduler that has stopped?)")):
        qd.Service.connect(scheduler_file=stale)
    typo.write_text("{")
    with pytest.raises(ValueError, match=re.escape(f"{str(typo)!r} is not a scheduler file")):
        qd.Service.connect(scheduler_file=typo)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("keep", [False, True])
def test_demo_draws_one_figure_and_cleans_up(tmp_path, capsys, keep):
    out = tmp_path / "demo"
    argv = ["demo", "--scan", "8", "8", "--det", "16", "16", "--workers", "1", "--out", str(out)]
    assert main(argv + ["--keep"] * keep) == 0
    printed = capsys.readouterr().out
    assert "exact against NumPy: yes" in printed
    with Image.open(out / "demo.png") as png:
        assert png.format == "PNG" and png.size == (1350, 840)
    assert sorted(p.name for p in out.glob("*.h5")) == (["crystal-0.h5", "crystal-1.h5"] if keep else [])
    assert ("kept the HDF5 files" if keep else "removed the HDF5 files") in printed


def test_demo_removes_its_files_when_it_fails(tmp_path):
    # A 1 x 1 scan has no top-left quarter: the ROI mean fails after both files were written and loaded.
    out = tmp_path / "demo"
    with pytest.raises(ValueError, match="the roi selects no scan position"):
        main(["demo", "--scan", "1", "1", "--det", "16", "16", "--workers", "1", "--out", str(out)])
    assert list(out.glob("*.h5")) == []
