"""Reliability under load and faults: mixed queries from client threads, worker kills, memory pressure.

On a cluster of worker processes (on the GPU machine all sharing the one GPU),
acquisitions come from HDF5 files (held compressed), .npy files (dense) and
``svc.put`` (from the scheduler's copy after a loss). Every reply is checked
against NumPy with ``==``. In the same run:

1. the query mix (virtual images, frames, ROI sum/mean/max, series virtual
   images and series totals) from one thread: the unloaded latencies;
2. the same mix from ``--threads`` threads: p50/p95/p99 and their ratio to (1);
3. again under load while a worker process is SIGKILLed ``--kills`` times:
   errors, wrong results, seconds to re-home and GB/s against the first load;
4. memory pressure: a dense load larger than any shard's free budget is refused
   before allocating, queries go on, and releasing returns the memory.

    python benchmarks/reliability.py                            # GPU machine
    python benchmarks/reliability.py --scan 32 32 --det 64 64   # the 2-core CPU machine
    python benchmarks/reliability.py --small                    # seconds: what CI runs
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import h5py
import numpy as np
from distributed import Client, LocalCluster

import qgpu_dask as qd

import record

OPS = ("virtual_image", "frame", "reduce", "series_virtual_images", "series_total")
WEIGHTS = (0.40, 0.25, 0.20, 0.10, 0.05)


class Workload:
    """The acquisitions, their counts and precomputed exact answers, and one query of the mix at a time."""

    def __init__(self, svc: qd.Service, arrays: dict[str, np.ndarray], acqs: dict[str, qd.Acquisition], masks: np.ndarray, rois: list):
        self.svc, self.arrays, self.acqs, self.masks, self.rois = svc, arrays, acqs, masks, rois
        self.names = list(acqs)
        self.series = qd.Series(svc, list(acqs.values()))
        flat = {n: a.reshape(a.shape[0] * a.shape[1], -1) for n, a in arrays.items()}
        scan = next(iter(arrays.values())).shape[:2]
        # float64 products of integers stay exact below 2**53: BLAS speed, exact answers
        self.images = {n: (masks.reshape(len(masks), -1).astype(np.float64) @ f.T.astype(np.float64)).astype(np.uint64).reshape(len(masks), *scan)
                       for n, f in flat.items()}
        self.reductions = {}
        for n, a in arrays.items():
            for k, roi in enumerate(rois):
                chosen = a[roi]
                total = chosen.sum(axis=0, dtype=np.uint64)
                self.reductions[n, k] = {"sum": total, "mean": total.astype(np.float64) / len(chosen), "max": chosen.max(axis=0)}
        self.totals = sum(r["sum"] for (n, k), r in self.reductions.items() if k == 0)

    def run(self, rng: np.random.Generator) -> tuple[str, float, bool]:
        """One query of the mix: (kind, seconds, exact)."""
        op = OPS[rng.choice(len(OPS), p=WEIGHTS)]
        name = self.names[rng.integers(len(self.names))]
        acq, m = self.acqs[name], int(rng.integers(len(self.masks)))
        t0 = time.perf_counter()
        if op == "virtual_image":
            ok = (acq.virtual_image(self.masks[m]) == self.images[name][m]).all()
        elif op == "frame":
            r, c = (int(rng.integers(s)) for s in acq.scan_shape)
            ok = (acq.frame(r, c) == self.arrays[name][r, c]).all()
        elif op == "reduce":
            k, how = int(rng.integers(len(self.rois))), ("sum", "mean", "max")[rng.integers(3)]
            ok = (acq.reduce(self.rois[k], how) == self.reductions[name, k][how]).all()
        elif op == "series_virtual_images":
            ok = all((image == self.images[n][m]).all() for n, image in zip(self.names, self.series.virtual_images(self.masks[m])))
        else:
            ok = (self.series.reduce(self.rois[0], "sum", total=True) == self.totals).all()
        return op, time.perf_counter() - t0, bool(ok)


def drive(work: Workload, threads: int, per_thread: int, seed: int) -> dict:
    """``threads`` client threads, ``per_thread`` queries each: latencies by kind, wrong results and errors."""
    latencies: dict[str, list[float]] = {op: [] for op in OPS}
    wrong, errors, slow = [], [], []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def client(k: int) -> None:
        rng = np.random.default_rng(seed + k)
        for _ in range(per_thread):
            try:
                op, seconds, ok = work.run(rng)
            except Exception as err:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"{type(err).__name__}: {err}")
                continue
            with lock:
                latencies[op].append(seconds)
                if seconds > 1.0:  # (kind, seconds, finished at s into the run): waits on a lost shard, cold workers
                    slow.append((op, round(seconds, 2), round(time.perf_counter() - t0, 2)))
                if not ok:
                    wrong.append(op)

    pool = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    every = np.concatenate([np.asarray(v) for v in latencies.values()]) * 1e3
    summary = {"threads": threads, "queries": threads * per_thread, "wall_s": wall, "queries_per_s": threads * per_thread / wall,
               "wrong": len(wrong), "errors": len(errors), "error_samples": errors[:5],
               "p50_ms": float(np.percentile(every, 50)), "p95_ms": float(np.percentile(every, 95)), "p99_ms": float(np.percentile(every, 99)),
               "max_ms": float(every.max()), "over_1s": len(slow), "slow_samples": sorted(slow, key=lambda x: x[2])[:40]}
    summary["by_kind"] = {op: {"n": len(v), "p50_ms": float(np.percentile(np.asarray(v) * 1e3, 50)) if v else None} for op, v in latencies.items()}
    return summary


def kill_and_recover(svc: qd.Service, victim: str, n_shards: int, timeout: float = 600) -> dict:
    """SIGKILL the worker process at ``victim``; seconds until its acquisitions are held again and until the
    restarted worker holds a share; the bytes re-homed."""
    pid = svc.client.run(os.getpid, workers=[victim])[victim]
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    rehomed = balanced = None
    while time.perf_counter() - t0 < timeout:
        state = svc.state()
        ready = all(a["state"] == "ready" and a["owner"] in state["shards"] for a in state["acquisitions"].values())
        if rehomed is None and ready and victim not in state["shards"]:
            rehomed = time.perf_counter() - t0
        counts = {s: 0 for s in state["shards"]}
        for a in state["acquisitions"].values():
            counts[a["owner"]] = counts.get(a["owner"], 0) + 1
        if rehomed is not None and ready and len(state["shards"]) == n_shards and max(counts.values()) - min(counts.values()) <= 1:
            balanced = time.perf_counter() - t0
            break
        time.sleep(0.05)
    done = next((e for e in reversed(svc.state()["events"]) if e["event"] == "rehome-done"), {})
    lost = sum(1 for a in svc.state()["acquisitions"].values() if a["state"] == "lost")
    return {"victim": victim, "seconds_to_rehomed": rehomed, "seconds_to_balanced": balanced,
            "rehome_s": done.get("seconds"), "rehome_bytes": done.get("bytes"), "rehome_raw_bytes": done.get("raw_bytes"), "lost": lost}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, nargs=2, default=(128, 128))
    ap.add_argument("--det", type=int, nargs=2, default=(128, 128))
    ap.add_argument("--acquisitions", type=int, default=9)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=500, help="per thread")
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--budget", default=None, help="each shard's budget (default: the device's)")
    args = record.parse(ap, small={"scan": (8, 8), "det": (16, 16), "acquisitions": 3, "workers": 2, "threads": 2, "queries": 10,
                                   "kills": 2, "budget": "64 MiB"})
    scan, det = tuple(args.scan), tuple(args.det)
    rng = np.random.default_rng(0)
    cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0")
    results: dict = {"workers": args.workers, "shape": [*scan, *det], "dtype": "uint16", "acquisitions": args.acquisitions}
    with tempfile.TemporaryDirectory() as tmp, qd.Service(Client(cluster, direct_to_workers=True), budget=args.budget, cluster=cluster) as svc:
        results["device"] = svc.info()["shards"][0]["device"]["kind"]
        arrays = {f"acq{i}": rng.poisson(0.2 + 0.3 * i, scan + det).astype(np.uint16) for i in range(args.acquisitions)}
        files = {}
        for i, (name, data) in enumerate(arrays.items()):
            if i % 3 == 0:
                files[name] = Path(tmp) / f"{name}.h5"
                with h5py.File(files[name], "w") as f:
                    f["data"] = data
            elif i % 3 == 1:
                files[name] = Path(tmp) / f"{name}.npy"
                np.save(files[name], data)
        t0 = time.perf_counter()
        acqs = {}
        for suffix, dataset in ((".h5", "data"), (".npy", None)):
            chosen = [n for n, p in files.items() if p.suffix == suffix]
            acqs |= dict(zip(chosen, svc.load([files[n] for n in chosen], dataset=dataset, name=chosen, progress=False)))
        load_s = time.perf_counter() - t0
        for name, data in arrays.items():
            if name not in files:
                acqs[name] = svc.put(data, name=name)
        acqs = {n: acqs[n] for n in arrays}
        loaded_bytes = sum(arrays[n].nbytes for n in files)
        results["first_load"] = {"bytes": loaded_bytes, "s": load_s, "GBps": loaded_bytes / load_s / 1e9}
        masks = np.stack([qd.masks.disk(det, (det[0] / 2, det[1] / 2), r) for r in (det[0] / 8, det[0] / 4)]
                         + [qd.masks.annulus(det, (det[0] / 2, det[1] / 2), det[0] / 4, det[0] / 2.5)]).astype(bool)
        rois = [np.ones(scan, bool), np.arange(scan[0] * scan[1]).reshape(scan) % 3 == 0]
        rois[1][0, 0] = True
        work = Workload(svc, arrays, acqs, masks, rois)
        print(f"{args.acquisitions} acquisitions {scan + det} uint16 on {args.workers} {results['device']} workers; "
              f"first load {results['first_load']['GBps']:.2f} GB/s", flush=True)

        unloaded = drive(work, 1, max(50, args.queries // 2), seed=100)
        loaded_run = drive(work, args.threads, args.queries, seed=200)
        results["unloaded"], results["under_load"] = unloaded, loaded_run
        results["under_load"]["p50_over_unloaded"] = loaded_run["p50_ms"] / unloaded["p50_ms"]
        results["under_load"]["throughput_over_one_thread"] = loaded_run["queries_per_s"] / unloaded["queries_per_s"]
        for label, r in (("1 thread", unloaded), (f"{args.threads} threads", loaded_run)):
            print(f"{label:>10}: {r['queries']} queries, {r['queries_per_s']:.0f}/s, p50 {r['p50_ms']:.2f} ms, "
                  f"p95 {r['p95_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, wrong {r['wrong']}, errors {r['errors']}", flush=True)

        kills = []
        background: dict = {}
        runner = threading.Thread(target=lambda: background.update(drive(work, args.threads, args.queries, seed=300)))
        started = time.perf_counter()
        runner.start()
        for k in range(args.kills):
            time.sleep(1.0)
            victim = sorted(svc.state()["shards"])[k % args.workers]
            at = time.perf_counter() - started
            kills.append(kill_and_recover(svc, victim, args.workers) | {"at_s": at})
            print(f"kill {k + 1}: {kills[-1]}", flush=True)
        runner.join()
        for kill in kills:
            if kill["rehome_s"] and kill["rehome_raw_bytes"]:
                kill["rehome_GBps"] = kill["rehome_raw_bytes"] / kill["rehome_s"] / 1e9  # of counts, like the first load
                kill["rehome_over_first_load"] = kill["rehome_GBps"] / results["first_load"]["GBps"]
        results["faults"] = {"kills": kills, "queries": background}
        print(f"under faults: {background['queries']} queries in {background['wall_s']:.1f} s, wrong {background['wrong']}, "
              f"errors {background['errors']}, p99 {background['p99_ms']:.1f} ms, max {background['max_ms']:.0f} ms, "
              f"{background['over_1s']} over 1 s: {background['slow_samples'][:12]}", flush=True)

        shards = svc.info()["shards"]
        target = min(shards, key=lambda s: s["budget"] - s["resident_bytes"])
        free = target["budget"] - target["resident_bytes"]
        big = Path(tmp) / "too_big.npy"
        frames = int(max(s["budget"] for s in shards) // (det[0] * det[1] * 2)) + scan[1]
        np.lib.format.open_memmap(big, mode="w+", dtype=np.uint16, shape=(frames // scan[1], scan[1], *det)).flush()  # sparse file
        t0 = time.perf_counter()
        try:
            svc.load(big, name="too-big", layout="dense", progress=False)  # zeros: compressed, they would fit
            refused = None
        except ValueError as err:
            refused = str(err)
        refuse_s = time.perf_counter() - t0
        after = {s["worker"]: s for s in svc.info()["shards"]}
        answers = drive(work, 2, 20, seed=400)
        device_before = {s["worker"]: s["device"]["free_bytes"] for s in after.values()}
        held = sum(s["resident_bytes"] for s in after.values())
        for acq in acqs.values():
            acq.release()
        released = {s["worker"]: s for s in svc.info()["shards"]}
        results["memory_pressure"] = {
            "refused": refused is not None, "message": refused, "refuse_s": refuse_s, "smallest_free_before": free,
            "reserved_after_refusal": sum(s["reserved_bytes"] for s in after.values()),
            "queries_after_refusal": {"wrong": answers["wrong"], "errors": answers["errors"], "queries": answers["queries"]},
            "resident_bytes_before_release": held,
            "resident_bytes_after_release": sum(s["resident_bytes"] for s in released.values()),
            "device_free_gained_bytes": sum(released[w]["device"]["free_bytes"] - device_before[w] for w in released),
        }
        results["lost_acquisitions"] = sum(k["lost"] for k in kills)
        print(f"memory: refused {refused is not None} in {refuse_s * 1e3:.0f} ms; after release resident "
              f"{results['memory_pressure']['resident_bytes_after_release']} B, device free +{results['memory_pressure']['device_free_gained_bytes'] / 1e9:.2f} GB "
              f"of {held / 1e9:.2f} GB held", flush=True)
    path = record.write(f"reliability_{results['device']}", results)
    print(f"results: {path}")
    bad = (loaded_run["wrong"] + loaded_run["errors"] + background["wrong"] + background["errors"] + results["lost_acquisitions"]
           + answers["wrong"] + answers["errors"])
    return 0 if bad == 0 and refused is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
