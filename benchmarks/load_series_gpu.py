"""A series of Arina masters loaded into one shard through the public API (issue 24's measure), with its baselines.

1. K distinct masters (default 4) of Poisson counts (default 512 x 512 x 192 x 192 uint16 at 0.3 counts per
   pixel, a bright-field disk as in series_gpu), bitshuffle-LZ4 frames in data files of 10000 frames as the
   detector writes them, each read once so the files sit in the page cache.
2. Baselines in the same run, as GB/s of counts: the data files' stored bytes read in one thread and on
   every core (what any reader must at least do), and h5py + hdf5plugin decoding one master in one thread.
3. Cold start: after the series, in a fresh one-worker cluster (``Service.local``), the first ``svc.load`` of a
   master, then a warm load of the same file; reported is the difference (target <= 2 s: kernels compiled once
   per machine, read from the caches by the next processes). The run's first cluster's first load is kept too
   (on a bare machine it pays every compile).
4. Series: ``svc.load`` of N masters (default 64: file i % K under distinct names) as one list call into that
   shard; per acquisition and GB/s of counts over the series (targets <= 0.5 s and >= 40 GB/s). Every
   acquisition's checksum is held ``==`` to h5py's of its file.
   With ``--fill``, the shard is then filled: ``svc.stream`` of FILL_MAX more, which holds those before the first
   that fits no more and names it (target: >= 120 held on the H200, every checksum h5py's).
5. Saved form: one resident saved (``acq.save``) and loaded again REOPENS times; GB/s of file at the median (target >= 10).
6. Lost worker: ``--rehome`` masters (default 6) on one of two worker processes, their node-local copies written;
   the worker is SIGKILLed; seconds until all are held again (target <= 10 s), and their checksums.

Results: ``benchmarks/results/load_series_gpu.json`` (``_small`` with ``--small``) via record.py. On CPU workers
(``DASK_QGPU__CPU=True``, or no GPU) the same run measures the CPU path.

    python benchmarks/load_series_gpu.py                           # the H200: 64 loads of 19.3 GB of counts each
    python benchmarks/load_series_gpu.py --acquisitions 8          # a reduced run
    python benchmarks/load_series_gpu.py --fill                    # and how many the GPU holds
    DASK_QGPU__CPU=True python benchmarks/load_series_gpu.py --small   # seconds: what CI runs (filled, in a 3 MiB budget)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import record
from compressed import mark
from load_arina import best, read_with_h5py, write_master

import qgpu_dask as qd

TARGETS = {"series_s_per_acquisition_max": 0.5, "series_s_per_acquisition_stretch": 0.25, "series_GBps_min": 40.0,
           "series_GBps_stretch": 80.0, "saved_reopen_GBps_min": 10.0, "cold_minus_warm_s_max": 2.0, "held_acquisitions_min": 120,
           "rehome_s_max": 10.0, "rehome_s_stretch": 3.0}
FILL_MAX = 256  # acquisitions a fill streams after the series, more than any GPU holds; it stops at the first that does not fit
BF_RADIUS, BF_FRACTION = 30.0, 0.6  # at 192 x 192, as series_gpu's counts
REOPENS = 3  # reopens of the saved form, the median reported (each names a new acquisition)


def bf_means(det: tuple[int, int], dose: float) -> np.ndarray:
    """Per-pixel Poisson means: ``BF_FRACTION`` of a frame's counts inside the bright-field disk, as series_gpu's."""
    inside = qd.masks.disk(det, (det[0] * 0.49, det[1] * 0.51), BF_RADIUS * min(det) / 192)
    pixels = det[0] * det[1]
    return dose * pixels * np.where(inside, BF_FRACTION / inside.sum(), (1 - BF_FRACTION) / (pixels - inside.sum()))


def baselines(master: Path, files: list[Path], shape: tuple[int, ...], counts_bytes: int, repeats: int) -> dict:
    """Stored bytes read in one thread and on every core, and h5py + hdf5plugin in one thread, as GB/s of counts."""
    sizes = [p.stat().st_size for p in files]
    buffers = [np.empty(s, np.uint8) for s in sizes]

    def read_one(i: int) -> None:
        with open(files[i], "rb", buffering=0) as f:
            f.readinto(memoryview(buffers[i]))

    def one_thread():
        for i in range(len(files)):
            read_one(i)

    pieces = ThreadPoolExecutor(os.cpu_count() or 1)

    def every_core():
        list(pieces.map(read_one, range(len(files))))

    out = np.empty((shape[0] * shape[1], *shape[2:]), np.uint16)

    def h5py_read():
        read_with_h5py(master, out)

    one_thread()  # into the page cache
    t_one, t_all, t_h5 = best(one_thread, repeats), best(every_core, repeats), best(h5py_read, repeats)
    pieces.shutdown()
    return {"file_bytes": sum(sizes), "raw_read_1_thread_GBps": counts_bytes / t_one / 1e9, "raw_read_all_threads_GBps": counts_bytes / t_all / 1e9,
            "raw_read_1_thread_file_GBps": sum(sizes) / t_one / 1e9, "h5py_hdf5plugin_1_thread_GBps": counts_bytes / t_h5 / 1e9}


def first_and_warm(svc, master: Path, layout: str) -> tuple[float, float]:
    """Seconds of the first ``svc.load`` of ``master`` in this cluster (released) and of a warm load after it
    (kept, as "warm")."""
    t0 = time.perf_counter()
    svc.load(master, name="cold", layout=layout, progress=False).release()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    svc.load(master, name="warm", layout=layout, progress=False)
    return first, time.perf_counter() - t0


def fill(svc, masters: list[Path], held: list, layout: str) -> str:
    """Stream FILL_MAX more of the masters onto the shard (``svc.stream`` holds those before the first that fits
    no more, then refuses it and the rest by name), appending them to ``held``; the words of the refusal."""
    first = len(held)
    names = [f"f{first + j}" for j in range(FILL_MAX)]
    try:
        for acq in svc.stream([masters[(first + j) % len(masters)] for j in range(FILL_MAX)], name=names, layout=layout,
                              progress=False):
            held.append(acq)
            if len(held) % 8 == 0:
                shard = svc.info()["shards"][0]
                print(f"held: {len(held)}, {shard['resident_bytes'] / 1e9:.1f} GB; CuPy's pool {shard['pool_bytes'] / 1e9:.1f} GB", flush=True)
    except ValueError as err:
        return str(err)
    return f"none: all {FILL_MAX} more were held"


def rehome(masters: list[Path], digests: list[str], n: int) -> dict:
    """Issue 24's lost worker: ``n`` masters loaded compressed onto one of two worker processes (sharing the
    machine's GPU), their node-local copies written; that worker is SIGKILLed and the seconds until every acquisition is held
    again on the survivor are taken, with where each came from and its checksum against h5py's."""
    from distributed import Client, LocalCluster
    from reliability import kill_and_recover

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    with qd.Service(Client(cluster, direct_to_workers=True), cluster=cluster) as svc:
        svc.ensure_shards()
        victim = sorted(svc.state()["shards"])[0]
        names = [f"r{i}" for i in range(n)]
        svc.load([masters[i % len(masters)] for i in range(n)], name=names, worker=victim, layout="compressed", progress=False)
        t0 = time.perf_counter()
        while not all("local" in svc.state()["acquisitions"][m] for m in names):
            if time.perf_counter() - t0 > 300:
                raise RuntimeError("the node-local copies were not all written within 300 s (copies turned off?)")
            time.sleep(0.1)
        copies_s = time.perf_counter() - t0
        back = kill_and_recover(svc, victim, 2)
        sources = {e.get("source", "?") for e in svc.state()["events"] if e["event"] == "rehomed" and e.get("name") in names}
        sums = qd.Series(svc, [svc[m] for m in names]).checksum()
    return {"acquisitions": n, "copies_written_s": copies_s, "seconds_to_rehomed": back["seconds_to_rehomed"],
            "restored_from": sorted(sources), "lost": back["lost"],
            "checksums_equal": all(s == digests[i % len(digests)] for i, s in enumerate(sums))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, nargs=2, default=(512, 512))
    ap.add_argument("--det", type=int, nargs=2, default=(192, 192))
    ap.add_argument("--dose", type=float, default=0.3)
    ap.add_argument("--acquisitions", type=int, default=64, help="N, masters loaded as one series")
    ap.add_argument("--distinct", type=int, default=4, help="K, distinct masters the N are loaded from")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each baseline")
    ap.add_argument("--layout", default="auto", help="layout asked of every load")
    ap.add_argument("--rehome", type=int, default=6, help="acquisitions held on a worker that is then SIGKILLed (0: skip)")
    ap.add_argument("--fill", action="store_true", help="after the series, stream more until the shard refuses one (issue 24's "
                                                          "'held on one H200'); every one is checksummed")
    ap.add_argument("--budget", default=None, help="the shard's budget (default: its device's share), e.g. '2 MiB' for a quick fill")
    args = record.parse(ap, small={"scan": (16, 16), "det": (24, 24), "acquisitions": 4, "distinct": 2, "repeats": 1, "rehome": 2,
                                   "fill": True, "budget": "3 MiB"})
    scan, det = tuple(args.scan), tuple(args.det)
    shape, n = scan + det, args.acquisitions
    counts_bytes = int(np.prod(shape)) * 2
    folder = Path(tempfile.mkdtemp(prefix="qgpu-load-series-"))
    try:
        masters, digests, files = [], [], []
        for k in range(args.distinct):
            master, data_files, digest = write_master(folder, scan, det, args.dose, seed=k, stem=f"m{k}", mean=bf_means(det, args.dose))
            masters.append(master)
            digests.append(digest)
            files.append(data_files)
        print(f"{args.distinct} masters of {shape} uint16, {counts_bytes / 1e9:.2f} GB of counts each", flush=True)
        base = baselines(masters[0], files[0], shape, counts_bytes, args.repeats)

        with qd.Service.local(n_workers=1, dashboard_address=":0", budget=args.budget) as svc:
            first_ever, _ = first_and_warm(svc, masters[0], args.layout)  # on a bare machine: the compiles fill the caches
            warm_acq = svc["warm"]
            layout = warm_acq.info()["layout"]
            saved = folder / "saved.qgpu"
            warm_acq.save(saved)
            warm_acq.release()
            saved_bytes = saved.stat().st_size
            os.sync()  # the reopens read the page cache, not racing the save's writeback
            reopens = []
            for k in range(REOPENS):  # each timed to its return, released after
                t0 = time.perf_counter()
                reopened = svc.load(saved, name=f"reopened-{k}", progress=False)
                reopens.append(time.perf_counter() - t0)
                reopened.release()
            reopen = float(np.median(reopens))
            print(f"saved form reopened: {saved_bytes / reopen / 1e9:.2f} GB/s of file ({saved_bytes / 1e9:.2f} GB)", flush=True)

            t0 = time.perf_counter()
            series = svc.load([masters[i % args.distinct] for i in range(n)], name=[f"s{i}" for i in range(n)], layout=args.layout,
                              progress=False)
            seconds = time.perf_counter() - t0
            print(f"series of {n}: {seconds:.1f} s", flush=True)
            held_acqs = list(series)
            refusal = fill(svc, masters, held_acqs, args.layout) if args.fill else None
            t0 = time.perf_counter()
            sums = qd.Series(svc, held_acqs).checksum()
            checksum_s = time.perf_counter() - t0
            exact = all(s == digests[int(a.name[1:]) % args.distinct] for a, s in zip(held_acqs, sums))  # s<i>, f<i>: master i % K
            held = sum(a.info()["nbytes"] for a in held_acqs[:n])
            shard = svc.info()["shards"][0]
            budget, pool = shard["budget"], {"resident_bytes": shard["resident_bytes"], "pool_bytes": shard["pool_bytes"]}

        with qd.Service.local(n_workers=1, dashboard_address=":0", budget=args.budget) as svc:
            cold, warm = first_and_warm(svc, masters[1 % args.distinct], args.layout)  # a fresh cluster, the caches filled
        lost_worker = rehome(masters, digests, args.rehome) if args.rehome else None
        per_acq = seconds / n
        results = {
            "shape": list(shape), "dtype": "uint16", "dose": args.dose, "acquisitions": n, "distinct": args.distinct, "layout": layout,
            "counts_bytes": counts_bytes, "targets": TARGETS, "baselines": base,
            "cold_start": {"first_s": cold, "warm_s": warm, "cold_minus_warm_s": cold - warm, "first_in_first_cluster_s": first_ever},
            "series": {"s": seconds, "s_per_acquisition": per_acq, "GBps": counts_bytes * n / seconds / 1e9, "held_bytes": held,
                       "raw_over_held": counts_bytes * n / held, "checksums_equal": exact,
                       "over_raw_read_all_threads": base["raw_read_all_threads_GBps"] / (counts_bytes / per_acq / 1e9)},
            "saved_reopen": {"file_bytes": saved_bytes, "s": reopen, "s_each": reopens, "GBps": saved_bytes / reopen / 1e9},
            "held": {"acquisitions": len(held_acqs), "filled": bool(args.fill), "refusal": refusal, "budget_bytes": budget, **pool,
                     "checksums_equal": exact, "checksum_s": checksum_s},
            "rehome": lost_worker,
        }
        t = TARGETS
        lines = [
            f"raw read of the stored bytes: {base['raw_read_1_thread_GBps']:.2f} GB/s of counts in 1 thread, "
            f"{base['raw_read_all_threads_GBps']:.2f} on every core; h5py + hdf5plugin {base['h5py_hdf5plugin_1_thread_GBps']:.2f} (1 thread)",
            f"cold start (a fresh cluster): first load {cold:.2f} s, warm {warm:.2f} s, difference {cold - warm:.2f} s "
            f"(the run's first cluster: first load {first_ever:.2f} s)  "
            f"<= {t['cold_minus_warm_s_max']} {mark(cold - warm <= t['cold_minus_warm_s_max'])}",
            f"series of {n} ({layout}): {seconds:.1f} s, {per_acq:.3f} s per acquisition  <= {t['series_s_per_acquisition_max']} "
            f"{mark(per_acq <= t['series_s_per_acquisition_max'])}; {results['series']['GBps']:.1f} GB/s of counts  "
            f">= {t['series_GBps_min']} {mark(results['series']['GBps'] >= t['series_GBps_min'])}",
            f"saved form reopened: {results['saved_reopen']['GBps']:.2f} GB/s of file  >= {t['saved_reopen_GBps_min']} "
            f"{mark(results['saved_reopen']['GBps'] >= t['saved_reopen_GBps_min'])}",
            f"held on one shard ({'filled until refused' if args.fill else 'not filled'}): {len(held_acqs)} acquisitions, "
            f"checksums equal to h5py's: {exact} ({checksum_s:.0f} s to hash)"
            + (f"  >= {t['held_acquisitions_min']} {mark(len(held_acqs) >= t['held_acquisitions_min'])}" if args.fill else ""),
        ]
        if lost_worker:
            lines.append(f"a worker's {args.rehome} acquisitions back after SIGKILL: {lost_worker['seconds_to_rehomed']:.2f} s "
                         f"(from {', '.join(lost_worker['restored_from'])})  <= {t['rehome_s_max']} "
                         f"{mark(lost_worker['seconds_to_rehomed'] <= t['rehome_s_max'])}; checksums equal: {lost_worker['checksums_equal']}")
        path = record.write("load_series_gpu", results)
        return record.reported(path, lines, {"checksums_equal": exact and (lost_worker is None or lost_worker["checksums_equal"])})
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
