"""Client round trip of tiny queries, large replies with and without the handoff through /dev/shm, and a
series query on 2 shards against 1.

Calls go through the shard's local lane (``service/lane.py``). Baselines measured in the same run: the same
calls through Dask's comm (the worker's ``actor_execute``, as the client sends them when it has no lane), a
plain ``client.submit`` round trip and a call of the same shard actor through Dask's public ``Actor``
handle (which goes through the scheduler's proxy unless the client is direct).

    python benchmarks/service_overhead.py              # CPU workers (or GPU: shards share GPU 0)
    python benchmarks/service_overhead.py --scan 256 256 --det 192 192   # GPU machine: 4.8 GB acquisitions
    python benchmarks/service_overhead.py --small      # seconds: what CI runs
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import dask.config
import numpy as np
from distributed import Client, LocalCluster
from distributed.actor import Actor

import qgpu_dask as qd
from qgpu_dask.device import has_gpu
from qgpu_dask.service.calls import call_shard
from qgpu_dask.service.handoff import token
from qgpu_dask.service.shard import Shard, shard_key

import record
from timing import latencies, median_ms, write_counts


def service(n_workers: int) -> qd.Service:
    """Plain worker processes: on a GPU machine they all share GPU 0 (multi-GPU code on one card)."""
    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=":0")
    return qd.Service(Client(cluster, direct_to_workers=True), cluster=cluster)


def round_trips(n: int) -> dict:
    with service(1) as svc:
        owner = next(iter(svc.state()["shards"]))
        tiny = svc.put(np.ones((4, 4, 16, 16), np.uint16), name="tiny")
        mask = qd.masks.disk((16, 16), (8, 8), 4)
        proxied = Client(svc.client.scheduler.address, direct_to_workers=False)
        actor = Actor(Shard, owner, shard_key(owner))
        actor._client, actor._future = proxied, None
        router = svc.router

        def through_dask(method: str, *args, **kwargs):
            return router.on_loop(call_shard(router.pool, owner, shard_key(owner), method, *args, **kwargs)).result()

        result = {
            "noop_shard_call": latencies(lambda: router.call(owner, Shard.ping).result(), n),
            "baseline_noop_through_dask_comm": latencies(lambda: through_dask("ping"), n),
            "frame_ask": latencies(lambda: router.call(owner, Shard.ask, "frame", ["tiny"], 1, 2, handoff=token()).result(), n),
            "baseline_frame_ask_through_dask_comm": latencies(lambda: through_dask("ask", "frame", ["tiny"], 1, 2, handoff=token()), n),
            "tiny_virtual_image": latencies(lambda: tiny.virtual_image(mask), n),
            "tiny_frame": latencies(lambda: tiny.frame(1, 2), n),
            "baseline_actor_via_scheduler_proxy": latencies(lambda: actor.ping().result(), n),
            "baseline_client_submit": latencies(lambda: svc.client.submit(int, 1, pure=False).result(), n // 4),
        }
        proxied.close()
    result["lane_over_dask_comm"] = {"noop": result["noop_shard_call"]["p50_ms"] / result["baseline_noop_through_dask_comm"]["p50_ms"],
                                     "frame_ask": result["frame_ask"]["p50_ms"] / result["baseline_frame_ask_through_dask_comm"]["p50_ms"]}
    return result


def counts(resident) -> np.ndarray:
    """The resident's counts as they are held: a reply of its bytes that costs nothing to make."""
    return resident.flat


def large_replies(mib: list[int], repeat: int) -> dict:
    """Median ms of ``svc.submit`` returning 1, 16, 64 MiB from a shard on this host: handed over through /dev/shm
    (the default) and inline through Dask's TCP comm (the ``qgpu.handoff`` setting False), alternately in the same run."""
    out = {}
    with service(1) as svc:
        for size in mib:
            acq = svc.put(np.ones((size, 16, 128, 128), np.uint32), name=f"reply{size}", layout="dense")
            svc.submit(counts, acq).result()
            times: dict[str, list[float]] = {"handoff": [], "inline": []}
            for _ in range(repeat):
                for how, switch in (("handoff", True), ("inline", False)):
                    with dask.config.set({"qgpu.handoff": switch}):
                        times[how].append(median_ms(lambda: svc.submit(counts, acq).result(), 1, warmup=0))
            out[f"{size}_MiB"] = {f"{how}_ms": statistics.median(t) for how, t in times.items()}
            acq.release()
    return out


def in_worker_ms(resident, what: str, mask, repeat: int) -> float:
    """Median ms of a full read (``read``) or the mask kernel (``mask``) timed next to the data.

    On a GPU: CUDA events around the kernel alone (the bandwidth reference); on
    a CPU worker: the wall time of the Numba kernel.
    """
    from qgpu_dask.resident.masks import mask_weights

    weights = mask_weights(mask, resident.det_shape, resident.dtype)
    if resident.xp is np:
        run = (lambda: resident.flat.sum(dtype=np.uint64)) if what == "read" else resident.prepare_mask_sums(weights)
        run()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    import cupy

    from qgpu_dask.resident.cuda import dense

    run = (lambda: dense.read_sum(resident.flat)) if what == "read" else resident.prepare_mask_sums(weights)
    run()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeat):
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def query_vs_read(svc: qd.Service, acq, mask, repeat: int) -> dict:
    """One virtual image through the service against a full read of the same resident, in the same run."""
    query = median_ms(lambda: acq.virtual_image(mask), repeat, warmup=0)
    read = svc.submit(in_worker_ms, acq, "read", mask, repeat).result()
    kernel = svc.submit(in_worker_ms, acq, "mask", mask, repeat).result()
    gb = acq.nbytes / 1e9
    return {
        "acquisition_bytes": acq.nbytes,
        "service_query_ms": query,
        "mask_kernel_ms": kernel,
        "full_read_ms": read,
        "full_read_GBps": gb / read * 1e3,
        "effective_GBps_service": gb / query * 1e3,
        "effective_GBps_kernel": gb / kernel * 1e3,
        "kernel_over_read_bandwidth": read / kernel,
        "service_over_read_bandwidth": read / query,
    }


def series_scaling(scan: tuple[int, int], det: tuple[int, int], n_acq: int, repeat: int) -> dict:
    """One series query over ``n_acq`` dense acquisitions on 1 shard and on 2 shards: median times and ratio
    (dense: the full read it is held to is of the counts as they are)."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_counts(Path(tmp) / "acq.h5", scan, det)
        mask = qd.masks.disk(det, (det[0] / 2, det[1] / 2), det[0] / 6)
        for workers in (1, 2):
            with service(workers) as svc:
                series = svc.load([path] * n_acq, dataset="/data", name=[f"s{i}" for i in range(n_acq)], layout="dense", progress=False)
                first = series.virtual_images(mask)
                out[f"{workers}_shards_ms"] = median_ms(lambda: series.virtual_images(mask), repeat, warmup=0)
                assert (series.virtual_images(mask) == first).all()
                if workers == 1:
                    out["one_query"] = query_vs_read(svc, series[0], mask, repeat)
                out[f"{workers}_shards_owners"] = len({a.owner for a in series})
    out["ratio_1_over_2"] = out["1_shards_ms"] / out["2_shards_ms"]
    out["acquisition_shape"] = scan + det
    out["acquisitions"] = n_acq
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--scan", type=int, nargs=2, default=(64, 64))
    parser.add_argument("--det", type=int, nargs=2, default=(64, 64))
    parser.add_argument("--series", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=20)
    args = record.parse(parser, small={"calls": 40, "scan": (8, 8), "det": (16, 16), "series": 2, "repeat": 3})
    results = {
        "device": "cuda" if has_gpu() else "cpu",
        "round_trip": round_trips(args.calls),
        "large_replies": large_replies([1, 16, 64], args.repeat),
        "series": series_scaling(tuple(args.scan), tuple(args.det), args.series, args.repeat),
    }
    path = record.write(f"service_overhead_{results['device']}", results)
    rt = results["round_trip"]
    for k, v in rt.items():
        if k == "lane_over_dask_comm":
            print(f"lane / Dask comm, p50: no-op {v['noop']:.2f}, frame ask {v['frame_ask']:.2f}")
            continue
        print(f"{k:<38} p50 {v['p50_ms']:7.3f} ms   p95 {v['p95_ms']:7.3f} ms")
    for size, t in results["large_replies"].items():
        print(f"reply of {size:<7} handoff {t['handoff_ms']:7.2f} ms   inline (TCP) {t['inline_ms']:7.2f} ms")
    s = results["series"]
    q = s["one_query"]
    print(
        f"one disk virtual image of {q['acquisition_bytes'] / 1e9:.2f} GB: service {q['service_query_ms']:.3f} ms, "
        f"kernel {q['mask_kernel_ms']:.3f} ms, full read {q['full_read_ms']:.3f} ms "
        f"(kernel {q['kernel_over_read_bandwidth']:.2f}x, service {q['service_over_read_bandwidth']:.2f}x the read bandwidth)"
    )
    print(f"series of {s['acquisitions']} {s['acquisition_shape']}: 1 shard {s['1_shards_ms']:.2f} ms, 2 shards {s['2_shards_ms']:.2f} ms, ratio {s['ratio_1_over_2']:.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
