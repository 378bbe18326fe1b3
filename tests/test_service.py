"""The service end to end on a real cluster: files, series across workers, futures, submit, clients."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import h5py
import numpy as np
import pytest
import zarr
from distributed import Client

import qgpu_dask as qd
from conftest import make_service


def counts(rng, shape=(5, 6, 8, 10), dtype=np.uint16):
    return rng.integers(0, 3000, shape, dtype=dtype)


def test_load_hdf5_npy_zarr(svc, names, rng, tmp_path):
    data = counts(rng)
    mask = qd.masks.disk((8, 10), (4, 5), 3)
    ref = (data.astype(np.uint32) * mask).sum(axis=(2, 3))

    with h5py.File(tmp_path / "scan.h5", "w") as f:
        f.create_dataset("/entry/data", data=data, chunks=(1, 6, 8, 10), compression="gzip")
        f["stack"] = data.reshape(30, 8, 10)
    np.save(tmp_path / "scan.npy", data)
    z = zarr.create_array(str(tmp_path / "scan.zarr"), shape=(30, 8, 10), chunks=(7, 8, 10), dtype=data.dtype)
    z[:] = data.reshape(30, 8, 10)

    loaded = [
        svc.load(tmp_path / "scan.h5", dataset="/entry/data", name=names()),
        svc.load(tmp_path / "scan.h5", dataset="stack", scan_shape=(5, 6), name=names()),
        svc.load(str(tmp_path / "scan.npy"), name=names()),
        svc.load(tmp_path / "scan.zarr", scan_shape=(5, 6), name=names()),
    ]
    for acq in loaded:
        assert acq.shape == data.shape and acq.dtype == data.dtype
        assert acq.owner in svc.state()["shards"]
        assert (acq.virtual_image(mask) == ref).all()
        assert (acq.frame(2, 3) == data[2, 3]).all()
        assert acq.info()["source"]["path"].endswith(("scan.h5", "scan.npy", "scan.zarr"))


def test_name_defaults_to_file_stem(svc, rng, tmp_path):
    data = counts(rng)
    np.save(tmp_path / "stem_named.npy", data)
    acq = svc.load(tmp_path / "stem_named.npy")
    try:
        assert acq.name == "stem_named"
        assert svc["stem_named"].owner == acq.owner
    finally:
        acq.release()


def test_series_spread_and_assembled(svc, rng, tmp_path):
    datas = [counts(rng) for _ in range(6)]
    paths = []
    for i, d in enumerate(datas):
        paths.append(tmp_path / f"series{i}.h5")
        with h5py.File(paths[-1], "w") as f:
            f["data"] = d
    series = svc.load(paths, dataset="/data", name=[f"ser{i}" for i in range(6)], progress=False)
    try:
        assert isinstance(series, qd.Series) and len(series) == 6
        owners = [a.owner for a in series]
        assert len(set(owners)) == 3 and all(owners.count(o) == 2 for o in set(owners))
        mask = qd.masks.annulus((8, 10), (4, 5), 1, 4)
        images = series.virtual_images(mask)
        assert images.shape == (6, 5, 6)
        ref = np.stack([(d.astype(np.uint32) * mask).sum(axis=(2, 3)) for d in datas])
        assert (images == ref).all()
        stacked = series.virtual_images([mask, ~mask])
        assert stacked.shape == (6, 2, 5, 6) and (stacked[:, 0] == ref).all()

        roi = rng.random((5, 6)) < 0.5
        roi[1, 1] = True
        sums = series.reduce(roi, "sum")
        assert (sums == np.stack([d[roi].sum(axis=0, dtype=np.uint64) for d in datas])).all()
        everything = np.stack(datas)
        assert (series.reduce(roi, "sum", total=True) == everything[:, roi].sum(axis=(0, 1), dtype=np.uint64)).all()
        assert (series.reduce(roi, "max", total=True) == everything[:, roi].max(axis=(0, 1))).all()
        mean = series.reduce(roi, "mean", total=True)
        assert (mean == everything[:, roi].reshape(-1, 8, 10).mean(axis=0, dtype=np.float64)).all()
        assert series[2:4].names == ["ser2", "ser3"]
    finally:
        series.release()
    assert "ser0" not in svc


def test_many_futures_in_flight(svc, names, rng):
    data = counts(rng)
    acqs = [svc.put(data + i, name=names()) for i in range(3)]
    mask = qd.masks.disk((8, 10), (4, 5), 2.5)
    futures = [(i, a.virtual_image(mask, wait=False)) for i in range(4) for a in acqs]
    frames = [a.frame(1, 2, wait=False) for a in acqs]
    reductions = [a.reduce(None, "mean", wait=False) for a in acqs]
    assert all(isinstance(f, qd.QueryFuture) for _, f in futures)
    for j, a in enumerate(acqs):
        ref = ((data + j).astype(np.uint32) * mask).sum(axis=(2, 3))
        for i, f in futures[j::3]:
            assert (f.result() == ref).all()
        assert (frames[j].result() == data[1, 2] + j).all()
        assert (reductions[j].result() == (data + j).mean(axis=(0, 1), dtype=np.float64)).all()


def test_concurrent_threads(svc, names, rng):
    data = counts(rng)
    acq = svc.put(data, name=names())
    mask = qd.masks.disk((8, 10), (4, 5), 3)
    ref = (data.astype(np.uint32) * mask).sum(axis=(2, 3))
    errors: list[BaseException] = []

    def worker():
        try:
            for _ in range(20):
                assert (acq.virtual_image(mask) == ref).all()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_submit_runs_next_to_the_data(svc, names, rng):
    data = counts(rng)
    acq = svc.put(data, name=names())

    def per_row_max(resident, offset):
        xp = resident.xp
        return xp.asarray(resident.data).max(axis=(1, 2, 3)) + offset

    fut = svc.submit(per_row_max, acq, 7)
    result = fut.result()
    assert isinstance(result, np.ndarray)
    assert (result == data.max(axis=(1, 2, 3)) + 7).all()
    assert svc.submit(lambda r: r.shape, acq.name).result() == data.shape


def test_info_and_lookup(svc, names, rng):
    data = counts(rng)
    acq = svc.put(data, name=names())
    info = svc.info()
    assert len(info["shards"]) == 3
    shard = next(s for s in info["shards"] if s["worker"] == acq.owner)
    assert acq.name in shard["acquisitions"] and shard["resident_bytes"] >= data.nbytes
    assert shard["budget"] == 256 * 2**20
    assert shard["device"]["kind"] in ("cpu", "cuda")
    entry = next(a for a in info["acquisitions"] if a["name"] == acq.name)
    assert entry["owner"] == acq.owner and entry["state"] == "ready"
    assert acq.name in repr(info)
    same = svc[acq.name]
    assert same.shape == acq.shape and same.owner == acq.owner and same.dtype == acq.dtype
    assert svc.client is not None


def test_second_client_sees_the_same_acquisitions(svc, names, rng):
    data = counts(rng)
    acq = svc.put(data, name=names())
    mask = qd.masks.disk((8, 10), (4, 5), 3)
    other = qd.Service.connect(svc.client.scheduler.address)
    try:
        theirs = other[acq.name]
        assert theirs.owner == acq.owner
        assert (theirs.virtual_image(mask) == acq.virtual_image(mask)).all()
    finally:
        other.close()
    assert (acq.virtual_image(mask) == (data.astype(np.uint32) * mask).sum(axis=(2, 3))).all()
    with Client(svc.client.scheduler.address) as client:
        attached = qd.Service(client)
        assert acq.name in attached


def test_connect_by_scheduler_file(svc, names, rng, scheduler_file):
    data = counts(rng)
    acq = svc.put(data, name=names())
    with qd.Service.connect(scheduler_file=scheduler_file) as other:
        assert (other[acq.name].frame(0, 0) == data[0, 0]).all()
    assert (acq.frame(0, 0) == data[0, 0]).all()


def test_local_default_cluster_and_context_manager(rng):
    """The embedded default: LocalCUDACluster where CuPy sees a GPU (one worker per GPU), else CPU processes."""
    data = counts(rng)
    with qd.Service.local(dashboard_address=":0") as svc:
        shards = svc.info()["shards"]
        assert len(shards) >= 1
        assert {s["device"]["kind"] for s in shards} == ({"cuda"} if qd.device.has_gpu() else {"cpu"})
        acq = svc.put(data, name="local")
        assert (acq.reduce(op="sum") == data.sum(axis=(0, 1), dtype=np.uint64)).all()
    assert svc.client.status == "closed"
    closed = re.escape("this service is closed (svc.close(), or the end of its with block): "
                       "start another with qd.Service.local() or qd.Service.connect(...)")
    for call in (lambda: acq.frame(0, 0), lambda: acq.reduce(op="sum"), lambda: svc.put(data), svc.info, lambda: svc["local"],
                 acq.release):
        with pytest.raises(RuntimeError, match=closed):
            call()
    svc.close()  # a second close does nothing


UNGUARDED = """
import qgpu_dask as qd

def main():
    return qd.Service.local(n_workers=1, dashboard_address=":0")

{call}
"""


@pytest.mark.parametrize("call, line", [("svc = qd.Service.local(n_workers=1)", 7), ("main()", 7)])
def test_local_in_a_script_without_the_main_guard(tmp_path, call, line):
    """Worker processes import the main script again: Service.local() outside the main guard stops at once, with
    one short message saying what to add, before any worker starts (it was 468 lines of nanny tracebacks)."""
    script = tmp_path / "analysis.py"
    script.write_text(UNGUARDED.format(call=call))
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < 60 and done.returncode == 1  # the import and one check: no worker starts
    lines = done.stderr.strip().splitlines()
    assert len(lines) < 20 and "Nanny" not in done.stderr
    assert lines[-1] == (f"RuntimeError: qd.Service.local() starts worker processes, and each of them runs the main script {str(script)!r} "
                         f'again (line {line} would start another cluster there): put the code that starts it under  '
                         f'if __name__ == "__main__":  (see the README\'s "Use")')


def test_local_in_a_script_under_the_main_guard(tmp_path):
    script = tmp_path / "analysis.py"
    script.write_text(UNGUARDED.format(call='if __name__ == "__main__":\n    with main() as svc:\n'
                                            '        print(int(svc.put(np.ones((2, 3, 4, 4), np.uint8), layout="dense").frame(1, 2).sum()))')
                      .replace("import qgpu_dask as qd", "import numpy as np\nimport qgpu_dask as qd"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "16"


def test_budget_beyond_the_workers_memory_is_cut_with_a_warning():
    """A budget larger than a worker's memory (100 TiB here) holds at most the worker's memory limit, and says so."""
    with pytest.warns(UserWarning, match=r"budget=100\.00 TiB is more than the .* memory limit of worker tcp://.*: its shard holds at most"):
        svc = make_service("cpu", n_workers=1, budget="100 TiB")
    with svc:
        (worker, info), = svc.client.scheduler_info(n_workers=-1)["workers"].items()
        assert svc.info()["shards"][0]["budget"] == info["memory_limit"]
        data = np.arange(2 * 3 * 4 * 4, dtype=np.uint16).reshape(2, 3, 4, 4)
        assert (svc.put(data).frame(1, 2) == data[1, 2]).all()
