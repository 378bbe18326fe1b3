"""Node-local copies: a killed worker's compressed acquisitions come back from the copies its shard saved,
a damaged copy falls back to the source file, and a released acquisition leaves no copy behind. Each test
runs its own cluster of worker processes under nannies."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import h5py
import dask.config
import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.service.shard import copies

from conftest import BACKENDS, make_service
from test_recovery import wait_for, worker_pid


@pytest.fixture(params=BACKENDS)
def own(request):
    svc = make_service(request.param, n_workers=2, budget="256 MiB")
    yield svc
    svc.close()


def entry(svc: qd.Service, name: str) -> dict:
    return svc.state()["acquisitions"][name]


def test_rehomed_from_local_copies_or_the_source(own, rng, tmp_path):
    svc = own
    victim = sorted(svc.state()["shards"])[0]
    data = {n: rng.poisson(0.4, (12, 10, 16, 18)).astype(np.uint16) for n in ("good", "damaged", "released")}
    for n, d in data.items():
        with h5py.File(tmp_path / f"{n}.h5", "w") as f:
            f["data"] = d
    acqs = {n: svc.load(tmp_path / f"{n}.h5", dataset="data", name=n, worker=victim, layout="compressed", progress=False) for n in data}
    made = {n: wait_for(lambda n=n: entry(svc, n).get("local"), 60, f"the local copy of {n}") for n in data}
    for n, copy in made.items():
        path = Path(copy["path"])
        assert path.is_file() and copy["host"] == copies.host_of(victim) and path.stat().st_size == copy["bytes"]
        assert copies.holder(path) == worker_pid(svc, victim)

    acqs["released"].release()
    assert not Path(made["released"]["path"]).exists()
    raw = bytearray(Path(made["damaged"]["path"]).read_bytes())
    raw[-8] ^= 0x40  # inside the last array (group_bits): its checksum fails
    Path(made["damaged"]["path"]).write_bytes(bytes(raw))

    os.kill(worker_pid(svc, victim), signal.SIGKILL)
    for n in ("good", "damaged"):
        wait_for(lambda n=n: entry(svc, n)["state"] == "ready" and entry(svc, n)["owner"] != victim and "restored_from" in entry(svc, n),
                 120, f"{n} held again off {victim}")
    restored: dict[str, dict] = {}
    for event in svc.state()["events"]:
        if event["event"] == "rehomed":
            restored.setdefault(event["name"], event)  # the re-home's (a move to the restarted worker may follow)
    assert restored["good"]["source"] == "local copy" and "copy_error" not in restored["good"]
    assert restored["damaged"]["source"] == "source file" and "does not match its checksum" in restored["damaged"]["copy_error"]
    assert not Path(made["damaged"]["path"]).exists()  # the damaged copy went
    assert not Path(made["good"]["path"]).exists()  # taken over: renamed as its new holder's
    assert entry(svc, "good")["source"]["path"] == str(tmp_path / "good.h5")  # the source file stays the record's source

    def settled():  # the nanny's new worker has its shard and a share
        state = svc.state()
        owners = [state["acquisitions"][n]["owner"] for n in ("good", "damaged")]
        return len(state["shards"]) == 2 and len(set(owners)) == 2 and all(state["acquisitions"][n]["state"] == "ready" for n in ("good", "damaged"))

    wait_for(settled, 120, "the restarted worker's shard holding one of the two")
    for n in ("good", "damaged"):
        assert (acqs[n].frame(4, 5) == data[n][4, 5]).all()
        assert acqs[n].checksum() == svc[n].checksum()
        assert (acqs[n].reduce(None, "sum") == data[n].sum(axis=(0, 1), dtype=np.uint64)).all()
        owner = worker_pid(svc, entry(svc, n)["owner"])
        local = wait_for(lambda n=n: (c := entry(svc, n).get("local")) and copies.holder(Path(c["path"])) == owner and c, 60, f"the copy of {n}'s holder")
        assert Path(local["path"]).is_file()
        acqs[n].release()
        assert not Path(local["path"]).exists()


def test_copies_off_and_stale_ones_swept(tmp_path, monkeypatch):
    with dask.config.set({"qgpu.copies": False}):
        assert copies.folder() is None and copies.sweep() == []
    monkeypatch.setitem(dask.config.config["qgpu"], "copies", str(tmp_path))
    assert copies.folder() == tmp_path
    dead, live = tmp_path / "a-999999999-0123456789ab.qgpu", tmp_path / f"b-{os.getpid()}-0123456789ab.qgpu"
    for path in (dead, live):
        path.write_bytes(b"x")
        os.utime(path, (time.time() - 2 * copies.COPY_GRACE,) * 2)
    fresh = tmp_path / "c-999999999-0123456789ab.qgpu"
    fresh.write_bytes(b"x")
    assert copies.sweep() == [dead.name]  # its process is gone and it is old; the live one's and the fresh one stay
    assert live.exists() and fresh.exists()


def test_closing_a_local_cluster_drops_residents_and_copies_first(rng, tmp_path):
    """A closing local cluster's shards drop what they hold before their workers are asked to exit, so a
    worker full of residents and copies exits within its nanny's wait."""
    svc = make_service("cpu", n_workers=1)
    try:
        data = rng.poisson(0.4, (12, 10, 16, 18)).astype(np.uint16)
        with h5py.File(tmp_path / "a.h5", "w") as f:
            f["data"] = data
        svc.load(tmp_path / "a.h5", dataset="data", name="a", layout="compressed", progress=False)
        copy = Path(wait_for(lambda: entry(svc, "a").get("local"), 60, "the local copy of a")["path"])
        assert copy.is_file()
        svc.stop_shards()
        assert svc.info()["shards"][0]["resident_bytes"] == 0 and not copy.exists()
    finally:
        t0 = time.perf_counter()
        svc.close()
    assert time.perf_counter() - t0 < 10
