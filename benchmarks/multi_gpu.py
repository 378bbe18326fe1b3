"""Series queries, loads and a worker loss on 1, 2, ..., G GPUs (one dask-cuda worker per GPU): weak scaling.

Per representation (``--runs dense:6 compressed:8``: that many acquisitions per GPU, all loaded from one
HDF5 file, one disk mask) and per G: time of a series virtual image (median) and its weak-scaling
efficiency against G = 1 (same work per GPU, so ideally the same time), the series load's throughput
against reading the file in this process, the no-op round trip of every shard and one acquisition's
virtual image end to end. With ``--kill REPRESENTATION``, at the largest G the worker of the last GPU is
SIGKILLed and the time until its acquisitions are held again (re-homed on the others) is measured.
Without GPUs it runs the same on CPU workers (a dry run).

    NCCL_NVLS_ENABLE=0 python benchmarks/multi_gpu.py --scan 512 512 --det 192 192 --runs dense:6
    NCCL_NVLS_ENABLE=0 python benchmarks/multi_gpu.py --scan 512 512 --det 192 192 --runs compressed:8 --kill compressed
    python benchmarks/multi_gpu.py --small     # seconds, on 2 CPU workers without GPUs: what CI runs
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
from distributed import Client, LocalCluster

import qgpu_dask as qd
from qgpu_dask.device import cupy_or_none
from qgpu_dask.service.shard import Shard

import record
from reliability import kill_and_recover
from timing import median_ms, write_counts


def cluster_of(gpus: int):
    """One worker per GPU on GPUs 0..gpus-1 (LocalCUDACluster), or that many CPU workers."""
    if cupy_or_none() is not None:
        from dask_cuda import LocalCUDACluster

        return LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(gpus)), dashboard_address=":0")
    return LocalCluster(n_workers=gpus, threads_per_worker=1, dashboard_address=":0")


def file_read_gbps(path: Path) -> float:
    """Reading the file's dataset in this process (page cache as it is), GB/s: the load's baseline."""
    t0 = time.perf_counter()
    with h5py.File(path, "r") as f:
        d = f["data"]
        for r in range(0, d.shape[0], 16):
            d[r : r + 16]
    return path.stat().st_size / 1e9 / (time.perf_counter() - t0)


def scaling_run(path: Path, g: int, n: int, representation: str, mask, repeat: int, kill: bool) -> dict:
    """Load ``n`` acquisitions on ``g`` GPUs, check and time the queries, optionally kill the last worker."""
    cluster = cluster_of(g)
    with qd.Service(Client(cluster, direct_to_workers=True), cluster=cluster) as svc:
        t0 = time.perf_counter()
        series = svc.load([path] * n, dataset="/data", name=[f"s{i}" for i in range(n)], layout=representation, progress=False)
        load_s = time.perf_counter() - t0
        counts_bytes = int(np.prod(series[0].shape)) * series[0].dtype.itemsize
        images = series.virtual_images(mask)
        assert all((im == images[0]).all() for im in images), "series images differ"
        owners = sorted({a.owner for a in series})
        run = {
            "acquisitions": n,
            "shards": len(owners),
            "series_query_ms": median_ms(lambda: series.virtual_images(mask), repeat),
            "single_query_ms": median_ms(lambda: series[0].virtual_image(mask), 5 * repeat),
            "load_s": load_s,
            "load_GBps": n * counts_bytes / 1e9 / load_s,  # of counts, whatever the resident's layout
            "resident_bytes": sum(a["nbytes"] for a in svc.state()["acquisitions"].values()),
            "ping_p50_ms_per_shard": [median_ms(lambda o=o: svc.router.call(o, Shard.ping).result(), 200) for o in owners],
        }
        if kill:
            victim = series[n - 1].owner
            run["kill"] = kill_and_recover(svc, victim, len(owners))
            after = series.virtual_images(mask)
            run["kill"]["exact_after"] = all((im == images[0]).all() for im in after)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scan", type=int, nargs=2, default=(64, 64))
    parser.add_argument("--det", type=int, nargs=2, default=(64, 64))
    parser.add_argument("--runs", nargs="+", default=["dense:8", "compressed:8"], help="REPRESENTATION:ACQUISITIONS_PER_GPU")
    parser.add_argument("--kill", default=None, help="representation whose largest-G run ends with a worker kill")
    parser.add_argument("--gpus", type=int, default=None, help="largest G (default: every GPU, or 2 CPU workers)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--file", type=Path, default=Path(tempfile.gettempdir()) / "qgpu-multi-gpu.h5", help="kept and reused when its shape matches")
    args = record.parse(parser, small={"scan": (8, 8), "det": (16, 16), "runs": ["dense:6", "compressed:6"], "kill": "compressed", "repeat": 2,
                                       "file": Path(tempfile.gettempdir()) / "qgpu-multi-gpu-small.h5"})
    cp = cupy_or_none()
    max_g = args.gpus or (cp.cuda.runtime.getDeviceCount() if cp is not None else 2)
    scan, det = tuple(args.scan), tuple(args.det)
    runs = [(r.split(":")[0], int(r.split(":")[1])) for r in args.runs]
    results: dict = {"device": "cuda" if cp is not None else "cpu", "acquisition_shape": scan + det, "gpus": max_g, "representations": {}}
    if not args.file.exists() or h5py.File(args.file, "r")["data"].shape != scan + det:
        write_counts(args.file, scan, det)
    results["file_read_GBps"] = file_read_gbps(args.file)
    mask = qd.masks.disk(det, (det[0] / 2, det[1] / 2), det[0] / 6)
    for representation, per_gpu in runs:
        by_g: dict = {}
        for g in range(1, max_g + 1):
            run = scaling_run(args.file, g, per_gpu * g, representation, mask, args.repeat, args.kill == representation and g == max_g)
            run["weak_scaling_efficiency"] = by_g[1]["series_query_ms"] / run["series_query_ms"] if by_g else 1.0
            run["load_over_file_read"] = run["load_GBps"] / results["file_read_GBps"]
            by_g[g] = run
            print(f"{representation} G={g}: {run['acquisitions']} acquisitions on {run['shards']} shard(s): "
                  f"series query {run['series_query_ms']:.2f} ms (efficiency {run['weak_scaling_efficiency']:.2f}), "
                  f"one query {run['single_query_ms']:.2f} ms, load {run['load_GBps']:.2f} GB/s "
                  f"({run['load_over_file_read']:.2f} x file read), ping {max(run['ping_p50_ms_per_shard']):.3f} ms", flush=True)
            if "kill" in run:
                print(f"kill: {run['kill']}", flush=True)
        results["representations"][f"{representation}:{per_gpu}"] = by_g
    name = "_".join(r for r, _ in runs)
    path = record.write(f"multi_gpu_{results['device']}_x{max_g}_{name}", results)
    print(f"file read in this process: {results['file_read_GBps']:.2f} GB/s; wrote {path}")


if __name__ == "__main__":
    main()
