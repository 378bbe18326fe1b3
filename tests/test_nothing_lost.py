"""Nothing a detector sent is lost: an export that fails, or whose writer crashes, costs the export only (the
worker and everything it holds stay); a live acquisition keeps a second home as its rows arrive, so a
worker's death does not lose it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import numpy as np
import psutil
import pytest

import qgpu_dask as qd

from conftest import BACKENDS, make_service
from test_recovery import wait_for

DET = (192, 192)
RUNS = int(os.environ.get("QGPU_DASK_FULL_DISK_RUNS", "1"))  # of each layout and acquisition (issue 56 measured 20)


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs: a disk that is really full after the first few frames (mounting needs root with
    CAP_SYS_ADMIN, as CI runs; skipped without)."""
    where = tmp_path / "full"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)], capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"no tmpfs could be mounted here ({mounted.stderr.strip()}): run as root to test a full disk")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)


def worker_pids(svc: qd.Service) -> dict[str, int]:
    return svc.client.run(os.getpid)


def writers(svc: qd.Service) -> list[int]:
    """The export writer processes the workers have running now."""
    def mine() -> list[int]:
        return [c.pid for c in psutil.Process().children() if "qgpu_dask.io.writers.process" in " ".join(c.cmdline())]

    return [pid for pids in svc.client.run(mine).values() for pid in pids]


def counts(rng, rows: int, cols: int) -> np.ndarray:
    return rng.poisson(2.0, (rows * cols, *DET)).astype(np.uint16)


def test_an_export_to_a_full_disk_kills_no_worker_and_loses_nothing(svc, names, rng, full_disk):
    frames = counts(rng, 16, 16)
    live = svc.create(names("live"), scan_shape=(16, 16), det_shape=DET, dtype="uint16")
    live.append(frames[:200])  # still live: no source file, its frames only where the detector sent them
    put = svc.put(frames.reshape(16, 16, *DET), name=names("put"), layout="compressed")
    before = worker_pids(svc)
    for run, suffix in enumerate([".hspy", ".emd", ".zspy"] * 2):
        for acq in (live, put):
            path = full_disk / f"{acq.name}-{run}{suffix}"
            with pytest.raises(ValueError, match=rf"writing the export {re.escape(repr(str(path)))} failed: \[Errno 28\] No space left"):
                acq.export(path)
            assert not list(full_disk.iterdir()), "a failed export leaves nothing behind"
    assert worker_pids(svc) == before, "no worker died"
    assert live.received == 200 and (live.frame(3, 4) == frames[3 * 16 + 4]).all()
    assert (put.frame(15, 15) == frames[-1]).all()
    disk = qd.masks.disk(DET, (96, 96), 30)
    assert (live.virtual_image(disk).ravel()[:200] == (frames[:200] * disk).sum(axis=(1, 2))).all()


def test_a_crashed_export_writer_costs_the_export_only(svc, names, rng, tmp_path):
    frames = counts(rng, 32, 32)  # 75 MB: two blocks, the writer still at work when killed
    acq = svc.put(frames.reshape(32, 32, *DET), name=names())
    before = worker_pids(svc)
    failure: list[BaseException] = []

    def export() -> None:
        try:
            acq.export(tmp_path / "killed.hspy")
        except BaseException as err:
            failure.append(err)

    exporting = threading.Thread(target=export)
    exporting.start()
    deadline = time.monotonic() + 60
    while not (found := writers(svc)) and exporting.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert found, "the export ran in no writer process of its own"
    for pid in found:
        os.kill(pid, 9)  # as a segfault would end it
    exporting.join(60)
    assert failure and isinstance(failure[0], ValueError), failure
    assert "its writer process ended with signal SIGKILL" in str(failure[0]) and "held as before" in str(failure[0])
    assert not list(tmp_path.iterdir()), "the crashed writer's partial file is removed"
    assert worker_pids(svc) == before
    assert (acq.frame(31, 31) == frames[-1]).all()
    again = acq.export(tmp_path / "again.hspy")  # the service stays usable
    import h5py

    with h5py.File(again) as f:
        assert (f[f"Experiments/{acq.name}/data"][...] == frames.reshape(32, 32, *DET)).all()


@pytest.fixture(params=BACKENDS)
def own(request):
    """A cluster of its own: a worker is killed."""
    svc = make_service(request.param, n_workers=2, budget="256 MiB")
    yield svc
    svc.close()


def test_a_live_acquisition_outlives_its_worker(own, rng):
    """Killed mid-scan, a live acquisition comes back from its live copy as live as it was; it then completes and
    keeps a saved copy."""
    frames = counts(rng, 16, 16)
    live = own.create("live-x", scan_shape=(16, 16), det_shape=DET, dtype="uint16")
    live.append(frames[:100])
    live.append(frames[100:200])
    home = live.info()["second_home"]
    assert home.startswith("a node-local live copy (its frames written as they arrive)"), home
    victim = live.owner
    os.kill(own.client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
    wait_for(lambda: (e := own.state()["acquisitions"].get("live-x")) and e["state"] == "ready" and e.get("restored_from"), 120,
             "live-x held again on the survivor")
    entry = own.state()["acquisitions"]["live-x"]
    assert entry["restored_from"] == "live copy" and entry["live"] and entry["owner"] != victim
    again = own["live-x"]
    assert again.received == 200
    assert (again.frame(12, 7) == frames[12 * 16 + 7]).all()
    disk = qd.masks.disk(DET, (96, 96), 30)
    assert (again.virtual_image(disk).ravel()[:200] == (frames[:200] * disk).sum(axis=(1, 2))).all()
    again.append(frames[200:])  # the detector goes on
    assert again.received == 256
    assert (again.virtual_image(disk).ravel() == (frames * disk).sum(axis=(1, 2))).all()
    wait_for(lambda: "live copy" not in own.state()["acquisitions"]["live-x"]["second_home"], 60, "a saved copy in place of the live one")
    assert own.state()["acquisitions"]["live-x"]["second_home"].startswith("a node-local saved copy")
    wait_for(lambda: len(own.state()["shards"]) == 2, 120, "the restarted worker's shard")  # closed once it is up


def test_every_acquisition_says_where_its_second_home_is(svc, names, rng, tmp_path):
    frames = counts(rng, 4, 4)
    put = svc.put(frames.reshape(4, 4, *DET), name=names())
    assert put.info()["second_home"] == "the backup of the put array the scheduler keeps"
    path = tmp_path / "a.h5"
    import h5py

    with h5py.File(path, "w") as f:
        f["d"] = frames.reshape(4, 4, *DET)
    loaded = svc.load(str(path), dataset="d", name=names())
    assert loaded.info()["second_home"].startswith(("its source file", "a node-local saved copy"))
