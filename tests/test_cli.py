"""The command line: `qgpu-dask info` against a running cluster (the demo runs in CI's first command)."""

from __future__ import annotations

import re
import socket
import threading
import time

import numpy as np

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
