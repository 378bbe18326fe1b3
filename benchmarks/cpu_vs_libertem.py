"""CPU: two virtual images (BF disk, ADF annulus) of one HDF5 file: qgpu-dask against LiberTEM and NumPy.

In one run, on the same uint16 HDF5 file:

- LiberTEM: ``ApplyMasksUDF`` with uint32 masks through ``ctx.run_udf``, which
  reads the file again on every run (page cache warm), for several executors;
- NumPy: h5py read of the whole dataset plus ``np.tensordot`` with uint32 masks;
- qgpu-dask: ``svc.load`` once, then ``acq.virtual_images([bf, adf])`` on the
  resident acquisition, with 1 and with 2 CPU workers.

Every result is checked with ``==`` against the others. Times are medians
after a warm-up run; GB/s is file bytes over time. LiberTEM is a benchmark
dependency only (never a project one): install it in a separate environment::

    python3 -m venv /tmp/ltvenv
    /tmp/ltvenv/bin/pip install libertem && /tmp/ltvenv/bin/pip install -e .
    /tmp/ltvenv/bin/python benchmarks/cpu_vs_libertem.py

The result goes to ``benchmarks/results/cpu_vs_libertem.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import record
from timing import timed

import qgpu_dask as qd
from qgpu_dask.io.synthetic import crystal, crystal_geometry

SCAN = (64, 64)
DET = (128, 128)
DATASET = "/data"
TARGET_RATIO = 10.0
ENV_KEYS = ("OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_CACHE_DIR")
# As this process started: Dask's LocalCluster later sets OMP/MKL/OPENBLAS_NUM_THREADS=1 in os.environ.
ENV_AT_START = {k: os.environ.get(k) for k in ENV_KEYS}


# -- inputs ------------------------------------------------------------------


def make_file(path: Path, dose: float) -> dict:
    """Write the synthetic crystal as a contiguous uint16 HDF5 dataset unless ``path`` exists; describe it."""
    made = False
    seconds = None
    if not path.exists():
        t0 = time.perf_counter()
        data = crystal(SCAN, DET, "uint16", dose=dose, seed=0)
        with h5py.File(path, "w") as f:
            f.create_dataset(DATASET.lstrip("/"), data=data)
        seconds = time.perf_counter() - t0
        made = True
    with h5py.File(path, "r") as f:
        ds = f[DATASET]
        shape, dtype, chunks = ds.shape, str(ds.dtype), ds.chunks
    if tuple(shape) != SCAN + DET or dtype != "uint16":
        raise SystemExit(f"{path}: dataset {DATASET} is {shape} {dtype}, expected {SCAN + DET} uint16")
    return {
        "path": str(path),
        "dataset": DATASET,
        "shape": list(shape),
        "dtype": dtype,
        "chunks": chunks,
        "file_bytes": path.stat().st_size,
        "data_bytes": int(np.prod(shape)) * 2,
        "created": made,
        "create_s": seconds,
        "dose": dose if made else None,
    }


def make_masks() -> dict[str, np.ndarray]:
    """BF disk and ADF annulus (bool) matching the synthetic crystal's geometry."""
    g = crystal_geometry(DET)
    return {
        "bf_disk": qd.masks.disk(DET, g.center, g.bf_radius),
        "adf_annulus": qd.masks.annulus(DET, g.center, g.adf_inner, g.adf_outer),
    }


# -- timing ------------------------------------------------------------------


def others_cpu() -> dict[int, float]:
    """CPU seconds (user + system) so far of every process outside this run (this process and its children)."""
    import psutil

    me = psutil.Process()
    ours = {me.pid} | {c.pid for c in me.children(recursive=True)}
    out = {}
    for proc in psutil.process_iter(["cpu_times"]):
        t = proc.info["cpu_times"]
        if proc.pid not in ours and t is not None:
            out[proc.pid] = t.user + t.system
    return out


class Others:
    """CPU that other processes took while a phase ran: the machine is shared, so a busy neighbour shows here."""

    def __init__(self, log: dict, phase: str):
        self.log, self.phase = log, phase

    def __enter__(self) -> "Others":
        self.before, self.t0 = others_cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self.t0
        used = sum(v - self.before.get(pid, 0.0) for pid, v in others_cpu().items())
        share = used / (wall * (os.cpu_count() or 1))
        self.log[self.phase] = {"cpu_s": round(used, 3), "wall_s": round(wall, 3), "share_of_cores": round(share, 4)}
        if share > 0.05:
            print(f"  ! other processes took {share:.0%} of the cores during {self.phase}: its times are suspect")


def summary(times: list[float], nbytes: int) -> dict:
    """Median, min and max seconds, and GB/s at the median."""
    med = statistics.median(times)
    return {"median_s": med, "min_s": min(times), "max_s": max(times), "n": len(times), "gb_per_s": nbytes / med / 1e9}


# -- the three contenders ---------------------------------------------------------


def mask_factory(mask: np.ndarray) -> Callable[[], np.ndarray]:
    """A LiberTEM mask factory returning ``mask`` as uint32 (small, so cheap to pickle)."""
    weights = mask.astype(np.uint32)
    return lambda: weights


def libertem_runs(info: dict, masks: dict[str, np.ndarray], specs: list[str], repeats: int) -> dict:
    """``ApplyMasksUDF`` (uint32 masks) timed per executor spec; the images as (n_masks, rows, cols)."""
    from libertem.api import Context
    from libertem.udf.masks import ApplyMasksUDF

    runs: dict[str, Any] = {}
    for spec in specs:
        t0 = time.perf_counter()
        if spec == "default":
            ctx = Context()
        else:
            name, _, cpus = spec.partition(":")
            ctx = Context.make_with(name, cpus=int(cpus)) if cpus else Context.make_with(name)
        start_s = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            ds = ctx.load("hdf5", path=info["path"], ds_path=info["dataset"])
            load_s = time.perf_counter() - t0
            udf = ApplyMasksUDF(mask_factories=[mask_factory(m) for m in masks.values()], mask_dtype=np.uint32)
            times, res = timed(lambda: ctx.run_udf(dataset=ds, udf=udf), repeats)
            data = np.asarray(res["intensity"].data)
            images = np.moveaxis(data, -1, 0)
            runs[spec] = {
                **summary(times, info["file_bytes"]),
                "executor": type(ctx.executor).__name__,
                "context_start_s": start_s,
                "load_s": load_s,
                "result_dtype": str(data.dtype),
                "times_s": times,
                "images": images,
            }
            print(f"  libertem {spec:<12} {runs[spec]['median_s'] * 1e3:8.1f} ms  ({runs[spec]['executor']}, result {data.dtype})")
        finally:
            ctx.close()
    return runs


def numpy_run(info: dict, masks: dict[str, np.ndarray], repeats: int) -> dict:
    """h5py read of the whole dataset plus ``np.tensordot`` with uint32 masks."""
    stack = np.stack(list(masks.values())).astype(np.uint32)

    def read() -> np.ndarray:
        with h5py.File(info["path"], "r") as f:
            return f[info["dataset"]][()]

    def once() -> tuple[np.ndarray, np.ndarray]:
        data = read()
        return np.tensordot(stack, data, axes=((1, 2), (2, 3))), data

    times, (images, data) = timed(once, repeats)
    t_read, _ = timed(read, repeats)
    t_dot, _ = timed(lambda: np.tensordot(stack, data, axes=((1, 2), (2, 3))), repeats)
    out = {**summary(times, info["file_bytes"]), "read_median_s": statistics.median(t_read),
           "tensordot_median_s": statistics.median(t_dot), "result_dtype": str(images.dtype), "times_s": times}
    print(f"  numpy   read+tensordot {out['median_s'] * 1e3:8.1f} ms  (read {out['read_median_s'] * 1e3:.1f}, tensordot {out['tensordot_median_s'] * 1e3:.1f})")
    return {**out, "images": images, "data": data}


def noop(resident) -> None:
    """Nothing, on the shard's query thread: the round trip of a query without its work."""


def worker_kernel(resident, weights, repeats: int) -> dict:
    """Runs on the shard: the Numba kernel alone on the resident, and the worker's Numba threading."""
    import numba

    run = resident.prepare_mask_sums(weights)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {
        "kernel_median_s": statistics.median(times[1:]),
        "numba_threads": numba.get_num_threads(),
        "numba_threading_layer": numba.threading_layer(),
        "worker_env": {k: os.environ.get(k) for k in ENV_KEYS},
    }


def qgpu_run(info: dict, masks: dict[str, np.ndarray], n_workers: int, repeats: int) -> dict:
    """Load once into a local CPU service, then time ``virtual_images``, a no-op call, and the kernel on the worker."""
    from qgpu_dask.resident.masks import mask_weights

    stack = list(masks.values())
    with qd.Service.local(n_workers=n_workers, dashboard_address=":0") as svc:
        t0 = time.perf_counter()
        acq = svc.load(info["path"], dataset=info["dataset"], name="scan")
        load_s = time.perf_counter() - t0
        times, images = timed(lambda: acq.virtual_images(stack), repeats, warmup=3)
        pings, _ = timed(lambda: svc.call(acq.owner, "ping").result(), repeats, warmup=3)
        noops, _ = timed(lambda: svc.submit(noop, acq).result(), repeats, warmup=3)
        weights = mask_weights(np.stack(stack), acq.det_shape, acq.dtype)
        worker = svc.submit(worker_kernel, acq, weights, repeats).result()
    out = {
        **summary(times, info["file_bytes"]),
        "n_workers": n_workers,
        "load_s": load_s,
        "load_gb_per_s": info["file_bytes"] / load_s / 1e9,
        "ping_median_s": statistics.median(pings),
        "submit_noop_median_s": statistics.median(noops),
        "accumulator": str(weights.acc_dtype),
        "span_pixels": int(weights.weights.shape[1]),
        **worker,
        "result_dtype": str(images.dtype),
        "times_s": times,
    }
    print(f"  qgpu    {n_workers} worker(s)      {out['median_s'] * 1e3:8.2f} ms  (ping {out['ping_median_s'] * 1e3:.2f}, no-op query {out['submit_noop_median_s'] * 1e3:.2f}, "
          f"kernel on worker {out['kernel_median_s'] * 1e3:.2f}, {out['numba_threads']} Numba threads; load {load_s:.2f} s)")
    return {**out, "images": images}


def local_kernel(data: np.ndarray, masks: dict[str, np.ndarray], repeats: int) -> dict:
    """``mask_sums`` in this process on a NumPy array of the same shape (no service around it)."""
    import numba

    from qgpu_dask.resident.cpu.dense import mask_sums
    from qgpu_dask.resident.masks import mask_weights

    flat = np.ascontiguousarray(data).reshape(SCAN[0] * SCAN[1], DET[0] * DET[1])
    weights = mask_weights(np.stack(list(masks.values())), DET, data.dtype)
    times, _ = timed(lambda: mask_sums(flat, weights.span_start, weights.weights), repeats, warmup=2)
    one = {}
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        numba.set_num_threads(threads)
        t, _ = timed(lambda: mask_sums(flat, weights.span_start, weights.weights), repeats)
        one[str(threads)] = statistics.median(t)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    return {"median_s": statistics.median(times), "by_threads_median_s": one, "numba_threading_layer": numba.threading_layer()}


# -- main --------------------------------------------------------------------------


def versions() -> dict:
    """Versions of the packages this benchmark compares and runs on."""
    out = {}
    for pkg in ("libertem", "qgpu-dask", "dask", "distributed", "numba", "numpy", "h5py", "scipy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def strip(d: dict) -> dict:
    """``d`` without its arrays (kept out of the JSON)."""
    return {k: v for k, v in d.items() if not isinstance(v, np.ndarray)}


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison, print a table, write the JSON; return the results."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", type=Path, default=Path(tempfile.gettempdir()) / "qgpu_cpu_vs_libertem.h5",
                   help="HDF5 file to use (created when missing)")
    p.add_argument("--dose", type=float, default=2000.0, help="electrons per probe position of a new file")
    p.add_argument("--repeats", type=int, default=30, help="timed qgpu-dask queries per cluster")
    p.add_argument("--baseline-repeats", type=int, default=7, help="timed LiberTEM and NumPy runs")
    p.add_argument("--libertem", default="inline,threads:2,default,dask:2",
                   help="LiberTEM executors: default (Context()), or make_with specs like dask:2, inline, threads:2")
    p.add_argument("--workers", default="1,2", help="qgpu-dask worker counts to try")
    p.add_argument("--keep-omp-env", action="store_true", help="leave OMP_NUM_THREADS unset (see below)")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    # LiberTEM's Numba code (OpenMP threading layer) in this process fights OpenBLAS's
    # threads for the cores unless OMP_NUM_THREADS is set: its inline executor then
    # took ~2 s instead of ~0.18 s here. Starting a Dask LocalCluster (LiberTEM's
    # Context() or ours) sets it anyway, so set it up front: the baseline does not
    # depend on the order of the runs. Our workers get it from Dask's nanny regardless.
    omp_set = "OMP_NUM_THREADS" not in os.environ and not args.keep_omp_env
    if omp_set:
        os.environ["OMP_NUM_THREADS"] = "1"

    info = make_file(args.file, args.dose)
    masks = make_masks()
    print(f"file {info['path']}: {info['shape']} {info['dtype']}, {info['file_bytes'] / 1e6:.1f} MB, chunks {info['chunks']}")
    print("masks: " + ", ".join(f"{k} {int(m.sum())} px" for k, m in masks.items()))

    others: dict[str, dict] = {}
    try:
        import libertem  # noqa: F401
    except ImportError as e:
        print(f"  libertem not importable ({e}): NumPy baseline only")
        lt = {}
    else:
        with Others(others, "libertem"):
            lt = libertem_runs(info, masks, [s for s in args.libertem.split(",") if s], args.baseline_repeats)
    with Others(others, "numpy"):
        ref = numpy_run(info, masks, args.baseline_repeats)
    data = ref.pop("data")
    info["max_count"] = int(data.max())
    info["mean_counts_per_frame"] = float(data.sum(dtype=np.uint64)) / (SCAN[0] * SCAN[1])
    ours = {}
    for n in (int(n) for n in args.workers.split(",")):
        with Others(others, f"qgpu[{n}]"):
            ours[n] = qgpu_run(info, masks, n, args.repeats)
    with Others(others, "mask_sums_in_process"):
        kernel = local_kernel(data, masks, args.repeats)
    print(f"  mask_sums in this process {kernel['median_s'] * 1e3:.2f} ms  (by Numba threads: "
          + ", ".join(f"{t}: {s * 1e3:.2f} ms" for t, s in kernel["by_threads_median_s"].items()) + ")")

    # Exactness: every result equal to every other, element by element.
    equal = {f"libertem[{s}] == numpy": bool(np.array_equal(r["images"], ref["images"])) for s, r in lt.items()}
    for n, r in ours.items():
        equal[f"qgpu[{n}] == numpy"] = bool(r["images"].dtype == ref["images"].dtype and (r["images"] == ref["images"]).all())
        for s, l in lt.items():
            equal[f"qgpu[{n}] == libertem[{s}]"] = bool(r["images"].shape == l["images"].shape and (r["images"] == l["images"]).all())

    best_lt = min(lt, key=lambda s: lt[s]["median_s"]) if lt else None
    best_ours = min(ours, key=lambda n: ours[n]["median_s"])
    q = ours[best_ours]["median_s"]
    ratios = {"numpy_over_qgpu": ref["median_s"] / q}
    if best_lt is not None:
        ratios["libertem_over_qgpu"] = lt[best_lt]["median_s"] / q
        ratios["libertem_over_qgpu_by_workers"] = {n: lt[best_lt]["median_s"] / r["median_s"] for n, r in ours.items()}
        ratios["target"] = TARGET_RATIO
        ratios["target_met"] = ratios["libertem_over_qgpu"] >= TARGET_RATIO

    results = {
        "file": info,
        "masks": {k: {"pixels": int(m.sum()), "dtype_sent": "bool"} for k, m in masks.items()},
        "libertem": {s: strip(r) for s, r in lt.items()},
        "libertem_baseline": best_lt,
        "numpy": strip(ref),
        "qgpu": {str(n): strip(r) for n, r in ours.items()},
        "qgpu_best_workers": best_ours,
        "mask_sums_in_process": kernel,
        "ratios": ratios,
        "equal": equal,
        "all_equal": all(equal.values()),
        "versions": versions(),
        "env_at_start": ENV_AT_START,
        "omp_num_threads_set_by_benchmark": omp_set,
        "env_at_end": {k: os.environ.get(k) for k in ENV_KEYS},
        "loadavg_before_after": [list(load_before), list(os.getloadavg())],
        "other_processes_cpu": others,
    }
    path = record.write("cpu_vs_libertem", results)

    rows = [(f"LiberTEM {s} ({r['executor']})", r["median_s"], r["gb_per_s"]) for s, r in lt.items()]
    rows.append(("NumPy h5py read + tensordot", ref["median_s"], ref["gb_per_s"]))
    rows += [(f"qgpu-dask query, {n} worker(s)", r["median_s"], r["gb_per_s"]) for n, r in ours.items()]
    print(f"\n{'what':<44}{'median ms':>11}{'GB/s':>9}")
    for what, s, g in rows:
        print(f"{what:<44}{s * 1e3:>11.2f}{g:>9.2f}")
    for n, r in ours.items():
        print(f"qgpu-dask load, {n} worker(s): {r['load_s']:.2f} s ({r['load_gb_per_s']:.2f} GB/s)")
    if best_lt is not None:
        print(f"LiberTEM ({best_lt}) / qgpu-dask ({best_ours} worker(s)): {ratios['libertem_over_qgpu']:.1f}x "
              f"(target >= {TARGET_RATIO:.0f}x: {'met' if ratios['target_met'] else 'NOT met'})")
    print(f"NumPy / qgpu-dask: {ratios['numpy_over_qgpu']:.1f}x")
    print(f"all results equal: {results['all_equal']}   -> {path}")
    return results


if __name__ == "__main__":
    main()
