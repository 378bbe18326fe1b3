"""Series queries and loads on 1, 2, ..., G GPUs (one dask-cuda worker per GPU): weak scaling.

8 acquisitions per GPU, all loaded from one HDF5 file, one disk mask; per G:
time of a series virtual image (median), its weak-scaling efficiency against
G = 1 (same work per GPU, so ideally the same time), the series load's
throughput against reading the file in this process, and the no-op round trip
of every shard. Without GPUs it runs the same on CPU workers (a dry run).

    NCCL_NVLS_ENABLE=0 python benchmarks/multi_gpu.py --scan 256 256 --det 192 192
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
from distributed import Client, LocalCluster

import qgpu_dask as qd
from qgpu_dask.device import cupy_or_none

import record
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scan", type=int, nargs=2, default=(64, 64))
    parser.add_argument("--det", type=int, nargs=2, default=(64, 64))
    parser.add_argument("--per-gpu", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=None, help="largest G (default: every GPU, or 2 CPU workers)")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    cp = cupy_or_none()
    max_g = args.gpus or (cp.cuda.runtime.getDeviceCount() if cp is not None else 2)
    scan, det = tuple(args.scan), tuple(args.det)
    results: dict = {"device": "cuda" if cp is not None else "cpu", "acquisition_shape": scan + det, "per_gpu": args.per_gpu, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_counts(Path(tmp) / "acq.h5", scan, det)
        results["file_read_GBps"] = file_read_gbps(path)
        mask = qd.masks.disk(det, (det[0] / 2, det[1] / 2), det[0] / 6)
        reference = None
        for g in range(1, max_g + 1):
            cluster = cluster_of(g)
            with qd.Service(Client(cluster, direct_to_workers=True), cluster=cluster) as svc:
                n = args.per_gpu * g
                t0 = time.perf_counter()
                series = svc.load([path] * n, dataset="/data", name=[f"s{i}" for i in range(n)], progress=False)
                load_s = time.perf_counter() - t0
                images = series.virtual_images(mask)
                reference = images[0] if reference is None else reference
                assert all((im == reference).all() for im in images)
                query = median_ms(lambda: series.virtual_images(mask), args.repeat)
                owners = sorted({a.owner for a in series})
                pings = [median_ms(lambda o=o: svc.call(o, "ping").result(), 200) for o in owners]
                results["runs"][g] = {
                    "acquisitions": n,
                    "shards": len(owners),
                    "series_query_ms": query,
                    "load_s": load_s,
                    "load_GBps": n * series[0].nbytes / 1e9 / load_s,
                    "ping_p50_ms_per_shard": pings,
                }
                print(f"G={g}: {n} acquisitions on {len(owners)} shard(s): series query {query:.2f} ms, "
                      f"load {n * series[0].nbytes / 1e9 / load_s:.2f} GB/s, ping {max(pings):.3f} ms", flush=True)
    base = results["runs"][1]["series_query_ms"]
    for g, run in results["runs"].items():
        run["weak_scaling_efficiency"] = base / run["series_query_ms"]
        run["load_over_file_read"] = run["load_GBps"] / results["file_read_GBps"]
    path = record.write(f"multi_gpu_{results['device']}", results)
    for g, run in results["runs"].items():
        print(f"G={g}: efficiency {run['weak_scaling_efficiency']:.2f}, load/file-read {run['load_over_file_read']:.2f}")
    print(f"file read in this process: {results['file_read_GBps']:.2f} GB/s; wrote {path}")


if __name__ == "__main__":
    main()
