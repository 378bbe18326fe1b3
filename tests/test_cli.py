"""The command line: `qgpu-dask info` against a running cluster, and the demo at a tiny size."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import qgpu_dask as qd
from qgpu_dask.cli import main
from processes import free_ports


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
    assert main(["info", "--scheduler-file", str(typo)]) == 2  # a bad argument
    assert capsys.readouterr().err == f"qgpu-dask info: --scheduler-file: {missing}\n"
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


def command(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """``qgpu-dask argv`` run as its own process (this checkout's package), in ``cwd``."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-m", "qgpu_dask.cli", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def refused(done: subprocess.CompletedProcess, *named: str) -> str:
    """The one line a refused command printed on stderr, checked: exit status 2, nothing on stdout, no traceback,
    every string of ``named`` in it."""
    line = done.stderr.strip()
    assert done.returncode == 2 and len(line.splitlines()) == 1 and not done.stdout, (done.returncode, done.stdout, done.stderr)
    assert all(n in line for n in named), line
    return line


def test_bad_arguments_are_one_line_and_start_nothing(tmp_path, scheduler_file, rng):
    """Each bad argument is one line on stderr naming it and what to do, exit status 2, and nothing started: no
    cluster, no folder, no port taken, no file read whole (these printed tracebacks)."""
    line = refused(command("demo", "--scan", "0", "0", "--out", "out", cwd=tmp_path), "--scan", "0")
    assert "give" in line and not (tmp_path / "out").exists()
    refused(command("demo", "--det", "16", "-4", "--out", "out", cwd=tmp_path), "--det", "-4")
    refused(command("demo", "--dose", "0", "--out", "out", cwd=tmp_path), "--dose")
    assert not (tmp_path / "out").exists()

    port = free_ports(1)[0]
    refused(command("simulate", "nope.h5", "--port", str(port), cwd=tmp_path), "nope.h5", "no such file")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))  # the port was not left taken: it binds again
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        refused(command("view", "--scheduler-file", str(scheduler_file), "--port", str(port), cwd=tmp_path), "--port", str(port), "in use")
        np.save(tmp_path / "scan.npy", rng.integers(0, 9, (2, 2, 4, 4), dtype=np.uint16))
        refused(command("simulate", "scan.npy", "--port", str(port), cwd=tmp_path), "--port", str(port), "in use")
    refused(command("view", "--scheduler-file", str(scheduler_file), "--port", "-5", cwd=tmp_path), "--port", "-5", "0 to 65535")

    big = qd.samples.write_hdf5(tmp_path / "big.h5", np.zeros((2, 2, 4, 4), np.uint16))
    os.truncate(big, 2**30)  # 1 GiB (sparse): it must not be read to learn that it is not a scheduler file
    refused(command("info", "--scheduler-file", str(big), cwd=tmp_path), "--scheduler-file", repr(str(big)), "not a scheduler file",
            "not 1.00 GiB")  # refused by its size
    refused(command("info", "--scheduler-file", "typo.json", cwd=tmp_path), "--scheduler-file", "'typo.json'", "no scheduler file")
