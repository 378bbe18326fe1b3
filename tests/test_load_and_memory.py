"""Many client threads at once, and memory: placement by free budget, refusal before allocation, release.

The full load test (8 threads x 500 queries, with latencies) is
``benchmarks/reliability.py``; here a shorter run of the same kind of mix.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.resident.dense import DenseCounts

DET = (16, 12)


def test_mixed_queries_from_eight_threads(svc, names, rng):
    arrays = [rng.poisson(0.5 + i, (6, 7) + DET).astype(np.uint16) for i in range(4)]
    acqs = [svc.put(a, name=names(), layout="dense" if i % 2 else "auto") for i, a in enumerate(arrays)]
    series = qd.Series(svc, acqs)
    masks = [qd.masks.disk(DET, (8, 6), r) for r in (2, 4, 6)]
    images = [[(a.astype(np.uint64) * m).sum(axis=(2, 3)) for m in masks] for a in arrays]
    roi = np.zeros((6, 7), bool)
    roi[1:4, 2:6] = True
    wrong, errors = [], []

    def client(seed: int) -> None:
        r = np.random.default_rng(seed)
        for _ in range(40):
            i, m = int(r.integers(4)), int(r.integers(3))
            kind = r.integers(5)
            try:
                if kind == 0:
                    ok = (acqs[i].virtual_image(masks[m]) == images[i][m]).all()
                elif kind == 1:
                    ok = (acqs[i].frame(2, 3) == arrays[i][2, 3]).all()
                elif kind == 2:
                    ok = (acqs[i].reduce(roi, "max") == arrays[i][roi].max(axis=0)).all()
                elif kind == 3:
                    ok = (series.virtual_images(masks[m]) == np.stack([im[m] for im in images])).all()
                else:
                    ok = (series.reduce(op="sum", total=True) == sum(a.sum(axis=(0, 1), dtype=np.uint64) for a in arrays)).all()
            except Exception as err:  # noqa: BLE001 - every error fails the test
                errors.append(repr(err))
                continue
            if not ok:
                wrong.append(int(kind))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and wrong == []


def test_a_load_goes_where_it_fits(svc, names):
    """Budget 256 MiB a shard: with one shard nearly full, the next acquisition is placed on another."""
    shards = sorted(s["worker"] for s in svc.info()["shards"])
    filler = svc.put(np.zeros((200, 1, 1024, 512), np.uint16), name=names(), worker=shards[0])
    try:
        other = svc.put(np.ones((100, 1, 1024, 512), np.uint16), name=names())
        assert other.owner != shards[0]
        assert (other.reduce(op="max") == 1).all()
        other.release()
    finally:
        filler.release()


def test_release_returns_the_memory(svc, names):
    shards = sorted(s["worker"] for s in svc.info()["shards"])
    before = {s["worker"]: s for s in svc.info()["shards"]}[shards[1]]
    acq = svc.put(np.ones((128, 1, 1024, 512), np.uint16), name=names(), worker=shards[1], layout="dense")
    held = {s["worker"]: s for s in svc.info()["shards"]}[shards[1]]
    assert held["resident_bytes"] - before["resident_bytes"] == 128 * 2**20 + DenseCounts.index_bytes(acq.shape, acq.dtype)  # counts and index
    acq.release()
    after = {s["worker"]: s for s in svc.info()["shards"]}[shards[1]]
    assert after["resident_bytes"] == before["resident_bytes"] and after["reserved_bytes"] == 0
    if after["device"]["kind"] == "cuda":  # CuPy's pool handed the blocks back to the GPU
        assert held["pool_bytes"] - after["pool_bytes"] >= 0.9 * 128 * 2**20


def test_a_coded_load_is_admitted_by_its_expected_size_and_refused_cleanly_once_it_outgrows_it(svc, names, rng, tmp_path):
    """A shard with less free than the raw counts holds a compressed load that its sample says will fit; a file
    whose sampled frames are quiet and the rest loud outgrows that and is refused, nothing of it left behind."""
    from qgpu_dask.io.load import sample_runs

    shape = (256, 256, 32, 32)
    n = shape[0] * shape[1]
    quiet = rng.poisson(0.1, shape).astype(np.uint16)
    loud = quiet.reshape(n, 32, 32).copy()
    sampled = np.zeros(n, bool)
    for start, length in sample_runs(n):
        sampled[start : start + length] = True
    loud[~sampled] = rng.poisson(40.0, (int((~sampled).sum()), 32, 32))
    np.save(tmp_path / "quiet.npy", quiet)
    np.save(tmp_path / "loud.npy", loud.reshape(shape))
    shard = sorted(s["worker"] for s in svc.info()["shards"])[0]

    def mine() -> dict:
        return {s["worker"]: s for s in svc.info()["shards"]}[shard]

    free = mine()["budget"] - mine()["resident_bytes"]
    filler = svc.put(np.zeros(((free - 80 * 2**20) // 2**20, 1, 1024, 512), np.uint16), name=names(), worker=shard, layout="dense")
    try:
        before = mine()
        left = before["budget"] - before["resident_bytes"]
        assert left < quiet.nbytes  # the raw counts would not fit
        acq = svc.load(tmp_path / "quiet.npy", name=names(), worker=shard, layout="compressed", progress=False)
        assert acq.checksum() == hashlib.sha256(quiet.tobytes()).hexdigest()
        held = mine()
        name = names()
        with pytest.raises(ValueError, match=r"loud\.npy.*outgrew the .* reserved for it from a sample of its frames: it needs"):
            svc.load(tmp_path / "loud.npy", name=name, worker=shard, layout="compressed", progress=False)
        after = mine()
        assert name not in svc and after["resident_bytes"] == held["resident_bytes"] and after["reserved_bytes"] == 0
        assert acq.checksum() == hashlib.sha256(quiet.tobytes()).hexdigest()
        acq.release()
    finally:
        filler.release()


def test_shards_sharing_a_gpu_share_its_memory():
    """Three shards on one GPU with the default budget (each 100 B here) hold 100 B in all; a given budget stands alone."""
    from qgpu_dask.service.placement import free_bytes, place

    def shard(uuid: str, given: bool = False) -> dict:
        return {"budget": 100, "budget_given": given, "device": {"kind": "cuda", "uuid": uuid}}

    state = {
        "shards": {"a": shard("gpu0"), "b": shard("gpu0"), "c": shard("gpu0"), "d": shard("gpu1"), "e": shard("gpu1", given=True)},
        "acquisitions": {"x": {"owner": "a", "nbytes": 60, "state": "ready"},
                         "y": {"owner": "e", "nbytes": 30, "state": "lost", "target": "d"}},  # being re-homed onto d
    }
    assert free_bytes(state) == {"a": 40, "b": 40, "c": 40, "d": 70, "e": 100}
    assert place([50, 45], state) == ["e", "d"]
    state["shards"]["e"]["budget"] = 0
    with pytest.raises(ValueError, match="acquisition 1 needs 45 B, more than fits on any shard"):
        place([50, 45], state)
    state["shards"]["e"]["budget"] = 100
    state["shards"]["d"]["budget"] = 0
    with pytest.raises(ValueError, match="acquisition 2 needs 30 B"):  # 40 B left on gpu0 in all, not 40 B a shard
        place([100, 30, 30], state)
