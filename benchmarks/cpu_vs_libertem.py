"""CPU: virtual images, sum pattern and centre of mass of one HDF5 file: qgpu-dask against LiberTEM and NumPy.

In one run, on the same uint16 HDF5 file, for three queries (a 2-mask virtual image: BF disk and ADF
annulus; the sum pattern; the centre of mass):

- LiberTEM, through ``ctx.run_udf``, which reads the file again on every run (page cache warm), for
  several executors: ``ApplyMasksUDF`` with uint32 masks, ``SumUDF(dtype=uint64)``, and ``CoMUDF`` with
  its centre set to the bright-field disk centre qgpu-dask uses;
- NumPy: h5py read of the whole dataset plus ``np.tensordot`` with uint32 masks (the virtual image), and
  the exact references of the other two;
- qgpu-dask: ``svc.load`` once in the default layout (what layout="auto" picks, named with its
  reason in the JSON) and once compressed (layout="compressed"), then ``acq.virtual_images``,
  ``acq.reduce(op="sum")`` and ``acq.center_of_mass()`` on the resident acquisition, with 1 and with 2
  CPU workers;
- a series (issue 23): the file held compressed ``--series`` times under distinct names (the engine
  shares nothing between residents), its 2-mask virtual image asked with one ``series.virtual_images``,
  against LiberTEM running the same ``ApplyMasksUDF`` on the file that many times.

Integer results are checked with ``==`` against NumPy and LiberTEM. The centre of mass (float64) is
checked with ``==`` against a NumPy float64 reference computed the same way from exact int64 moment
images (and the centre NumPy finds in the exact mean pattern); LiberTEM's (float32 masks) is compared by
its largest deviation from that reference, with its ``cy, cx`` set to that centre so the two conventions
agree. Times are medians after a warm-up; GB/s is file bytes over time. Targets (issue 21): the default
layout >= 10x LiberTEM for every query, the compressed virtual image >= 1x; (issue 23) the compressed
series >= 2x LiberTEM on its files.

LiberTEM is a benchmark dependency only (never a project one): install it in a separate environment::

    python3 -m venv /tmp/ltvenv
    /tmp/ltvenv/bin/pip install libertem && /tmp/ltvenv/bin/pip install -e .
    /tmp/ltvenv/bin/python benchmarks/cpu_vs_libertem.py
    python benchmarks/cpu_vs_libertem.py --small   # seconds: a tiny file, few repeats; LiberTEM if importable

The result goes to ``benchmarks/results/cpu_vs_libertem.json`` (``cpu_vs_libertem_small.json`` with
``--small``), or where QGPU_DASK_RESULTS points.
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

import dask.config
import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import record
from timing import timed

import qgpu_dask as qd
from qgpu_dask.io.synthetic import crystal, crystal_geometry
from qgpu_dask.phase import calibration
from qgpu_dask.service.shard import Shard

SHAPES = {"full": ((64, 64), (128, 128)), "small": ((8, 8), (32, 32))}
DATASET = "/data"
TARGET_RATIO = 10.0  # the default layout's queries against LiberTEM
COMPRESSED_TARGET = 1.0  # the compressed layout's virtual image against LiberTEM
SERIES_TARGET = 2.0  # the compressed series' virtual image against LiberTEM on each of its files
QUERIES = ("virtual_image", "sum_pattern", "center_of_mass")
ENV_KEYS = ("OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_CACHE_DIR")
# As this process started: Dask's LocalCluster later sets OMP/MKL/OPENBLAS_NUM_THREADS=1 in os.environ.
ENV_AT_START = {k: os.environ.get(k) for k in ENV_KEYS}


# -- inputs ------------------------------------------------------------------


def make_file(path: Path, dose: float, scan: tuple[int, int], det: tuple[int, int]) -> dict:
    """Write the synthetic crystal as a contiguous uint16 HDF5 dataset unless ``path`` exists; describe it."""
    made = False
    seconds = None
    if not path.exists():
        t0 = time.perf_counter()
        data = crystal(scan, det, "uint16", dose=dose, seed=0)
        with h5py.File(path, "w") as f:
            f.create_dataset(DATASET.lstrip("/"), data=data)
        seconds = time.perf_counter() - t0
        made = True
    with h5py.File(path, "r") as f:
        ds = f[DATASET]
        shape, dtype, chunks = ds.shape, str(ds.dtype), ds.chunks
    if tuple(shape) != scan + det or dtype != "uint16":
        raise SystemExit(f"{path}: dataset {DATASET} is {shape} {dtype}, expected {scan + det} uint16")
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


def make_masks(det: tuple[int, int]) -> dict[str, np.ndarray]:
    """BF disk and ADF annulus (bool) matching the synthetic crystal's geometry."""
    g = crystal_geometry(det)
    return {
        "bf_disk": qd.masks.disk(det, g.center, g.bf_radius),
        "adf_annulus": qd.masks.annulus(det, g.center, g.adf_inner, g.adf_outer),
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


def libertem_runs(info: dict, masks: dict[str, np.ndarray], center: tuple[float, float], specs: list[str], repeats: int,
                  n_series: int) -> dict:
    """Each query timed per executor spec: ``ApplyMasksUDF`` (uint32 masks; its summary is the spec's own),
    ``SumUDF(dtype=uint64)`` and ``CoMUDF`` centred on ``center``, and the virtual image of a series: the
    UDF run on the file ``n_series`` times; the results as NumPy arrays under "arrays"."""
    from libertem.api import Context
    from libertem.udf.com import CoMUDF
    from libertem.udf.masks import ApplyMasksUDF
    from libertem.udf.sum import SumUDF

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
            udfs = {
                "virtual_image": (ApplyMasksUDF(mask_factories=[mask_factory(m) for m in masks.values()], mask_dtype=np.uint32),
                                  lambda res: np.moveaxis(np.asarray(res["intensity"].data), -1, 0)),
                "sum_pattern": (SumUDF(dtype=np.uint64), lambda res: np.asarray(res["intensity"].data)),
                "center_of_mass": (CoMUDF.with_params(cy=center[0], cx=center[1]),
                                   lambda res: np.moveaxis(np.asarray(res["raw_shifts"].data), -1, 0)),
            }
            queries, arrays = {}, {}
            for query, (udf, result) in udfs.items():
                times, res = timed(lambda udf=udf: ctx.run_udf(dataset=ds, udf=udf), repeats)
                arrays[query] = result(res)
                queries[query] = {**summary(times, info["file_bytes"]), "result_dtype": str(arrays[query].dtype), "times_s": times}
            masks_udf = udfs["virtual_image"][0]
            series_times, _ = timed(lambda: [ctx.run_udf(dataset=ds, udf=masks_udf) for _ in range(n_series)], repeats)
            runs[spec] = {
                **{k: v for k, v in queries["virtual_image"].items()},
                "series_virtual_image": summary(series_times, info["file_bytes"] * n_series),
                "executor": type(ctx.executor).__name__,
                "context_start_s": start_s,
                "load_s": load_s,
                "queries": queries,
                "arrays": arrays,
            }
            print(f"  libertem {spec:<12} " + "  ".join(f"{q} {queries[q]['median_s'] * 1e3:7.1f} ms" for q in QUERIES)
                  + f"  ({runs[spec]['executor']})")
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


def references(data: np.ndarray, images: np.ndarray) -> tuple[dict[str, np.ndarray], tuple[float, float]]:
    """The exact NumPy answer of each query, and the bright-field disk centre the centre of mass is taken from:
    the sum pattern in uint64; the centre of mass in float64 from exact int64 moment images (total, row and
    column moments) and the centre of the float64 mean pattern (exact sum / count), as qgpu-dask computes it."""
    pattern = data.sum(axis=(0, 1), dtype=np.uint64)
    center, _ = calibration.bright_field_disk(pattern.astype(np.float64) / (data.shape[0] * data.shape[1]))
    rows = data.sum(axis=3, dtype=np.int64)  # (scan_rows, scan_cols, det_rows)
    cols = data.sum(axis=2, dtype=np.int64)
    moments = np.stack([rows.sum(axis=2), rows @ np.arange(data.shape[2]), cols @ np.arange(data.shape[3])])
    return {"virtual_image": images, "sum_pattern": pattern, "center_of_mass": calibration.center_of_mass(moments, center)}, center


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


def query_times(acq, stack: list[np.ndarray], repeats: int, nbytes: int) -> tuple[dict, dict]:
    """(summary per query, result per query) of one resident acquisition through the public API."""
    calls = {"virtual_image": lambda: acq.virtual_images(stack), "sum_pattern": lambda: acq.reduce(op="sum"),
             "center_of_mass": lambda: acq.center_of_mass()}
    queries, arrays = {}, {}
    for query, call in calls.items():
        times, arrays[query] = timed(call, repeats, warmup=3)
        queries[query] = {**summary(times, nbytes), "result_dtype": str(arrays[query].dtype), "times_s": times}
    return queries, arrays


def qgpu_run(info: dict, masks: dict[str, np.ndarray], n_workers: int, repeats: int, n_series: int) -> dict:
    """Load the file twice into a local CPU service, in the default layout and compressed; time each query on
    each, and for the default layout a no-op call and the kernel on the worker; then the file ``n_series``
    times compressed, a series, and its virtual image in one call."""
    from qgpu_dask.resident.masks import mask_weights

    stack = list(masks.values())
    layouts: dict[str, Any] = {}
    with qd.Service.local(n_workers=n_workers, dashboard_address=":0") as svc:
        for layout, representation in (("default", "auto"), ("compressed", "compressed")):
            t0 = time.perf_counter()
            acq = svc.load(info["path"], dataset=info["dataset"], name=layout, layout=representation)
            load_s = time.perf_counter() - t0
            record = acq.info()
            queries, arrays = query_times(acq, stack, repeats, info["file_bytes"])
            layouts[layout] = {"layout": record["layout"], "layout_reason": record.get("layout_reason"), "nbytes": record["nbytes"],
                               "ratio": record["raw_bytes"] / record["nbytes"], "load_s": load_s,
                               "load_gb_per_s": info["file_bytes"] / load_s / 1e9, "queries": queries, "arrays": arrays}
            if layout == "default":
                pings, _ = timed(lambda: svc.router.call(acq.owner, Shard.ping).result(), repeats, warmup=3)
                noops, _ = timed(lambda: svc.submit(noop, acq).result(), repeats, warmup=3)
                weights = mask_weights(np.stack(stack), acq.det_shape, acq.dtype)
                worker = svc.submit(worker_kernel, acq, weights, repeats).result()
            acq.release()
            print(f"  qgpu    {n_workers} worker(s) {layout:<10} " + "  ".join(f"{q} {queries[q]['median_s'] * 1e3:7.2f} ms" for q in QUERIES)
                  + f"  ({record['layout']}; load {load_s:.2f} s)")
        names = [f"series{i}" for i in range(n_series)]
        series = svc.load([info["path"]] * n_series, dataset=info["dataset"], name=names, layout="compressed", progress=False)
        series_times, series_images = timed(lambda: series.virtual_images(stack), repeats, warmup=3)
        held = {"files": n_series, **summary(series_times, info["file_bytes"] * n_series), "arrays": {"virtual_image": series_images}}
        for acq in series:
            acq.release()
        print(f"  qgpu    {n_workers} worker(s) compressed series of {n_series}: virtual image {held['median_s'] * 1e3:7.2f} ms")
    default = layouts["default"]
    vi = default["queries"]["virtual_image"]
    out = {
        **{k: v for k, v in vi.items()},
        "n_workers": n_workers,
        "load_s": default["load_s"],
        "load_gb_per_s": default["load_gb_per_s"],
        "ping_median_s": statistics.median(pings),
        "submit_noop_median_s": statistics.median(noops),
        "accumulator": str(weights.acc_dtype),
        "span_pixels": int(weights.weights.shape[1]),
        **worker,
        "layouts": layouts,
        "series": held,
    }
    print(f"  qgpu    {n_workers} worker(s): ping {out['ping_median_s'] * 1e3:.2f} ms, no-op query {out['submit_noop_median_s'] * 1e3:.2f} ms, "
          f"VI kernel on worker {out['kernel_median_s'] * 1e3:.2f} ms, {out['numba_threads']} Numba threads")
    return out


def local_kernel(data: np.ndarray, masks: dict[str, np.ndarray], repeats: int) -> dict:
    """``mask_sums`` in this process on a NumPy array of the same shape (no service around it)."""
    import numba

    from qgpu_dask.resident.cpu.dense import mask_sums
    from qgpu_dask.resident.masks import mask_weights

    flat = np.ascontiguousarray(data).reshape(data.shape[0] * data.shape[1], -1)
    weights = mask_weights(np.stack(list(masks.values())), data.shape[2:], data.dtype)
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
    """``d`` without its arrays (kept out of the JSON), nested dicts stripped too."""
    return {k: strip(v) if isinstance(v, dict) else v for k, v in d.items() if not isinstance(v, np.ndarray) and k != "arrays"}


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shapes and every element ``==`` (NaN where the other has NaN: a pattern without counts)."""
    return bool(a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


def compare(ref: dict, lt: dict, ours: dict) -> tuple[dict, dict]:
    """(``==`` checks, LiberTEM's largest centre-of-mass deviation from the reference per spec)."""
    equal: dict[str, bool] = {}
    deviation: dict[str, float] = {}
    for s, r in lt.items():
        for q in ("virtual_image", "sum_pattern"):
            equal[f"libertem[{s}] {q} == numpy"] = same(r["arrays"][q], ref[q])
        deviation[s] = float(np.nanmax(np.abs(r["arrays"]["center_of_mass"] - ref["center_of_mass"])))
    for n, run in ours.items():
        for layout, held in run["layouts"].items():
            for q in QUERIES:
                got = held["arrays"][q]
                equal[f"qgpu[{n}] {layout} {q} == numpy"] = bool(got.dtype == ref[q].dtype or q == "center_of_mass") and same(got, ref[q])
                if q != "center_of_mass":
                    for s, r in lt.items():
                        equal[f"qgpu[{n}] {layout} {q} == libertem[{s}]"] = same(got, r["arrays"][q].astype(got.dtype))
        images = run["series"]["arrays"]["virtual_image"]
        want = ref["virtual_image"]
        equal[f"qgpu[{n}] compressed series virtual_image == numpy"] = bool(
            images.dtype == want.dtype and len(images) == run["series"]["files"] and all(same(im, want) for im in images))
    return equal, deviation


def table(lt: dict, ours: dict) -> dict:
    """Per query: LiberTEM's best executor, each qgpu-dask layout's best worker count, ratios and targets."""
    out = {}
    for q in QUERIES:
        row: dict[str, Any] = {}
        if lt:
            spec = min(lt, key=lambda s: lt[s]["queries"][q]["median_s"])
            row["libertem"] = {"executor": spec, "median_s": lt[spec]["queries"][q]["median_s"]}
        for layout in ("default", "compressed"):
            n = min(ours, key=lambda n: ours[n]["layouts"][layout]["queries"][q]["median_s"])
            held = ours[n]["layouts"][layout]
            row[layout] = {"layout": held["layout"], "workers": n, "median_s": held["queries"][q]["median_s"]}
            if lt:
                row[layout]["libertem_over"] = row["libertem"]["median_s"] / row[layout]["median_s"]
        out[q] = row
    return out


def series_table(lt: dict, ours: dict) -> dict:
    """The compressed series' virtual image at its best worker count, against LiberTEM's best executor on its files."""
    n = min(ours, key=lambda n: ours[n]["series"]["median_s"])
    row: dict[str, Any] = {"files": ours[n]["series"]["files"], "compressed": {"workers": n, "median_s": ours[n]["series"]["median_s"]}}
    if lt:
        spec = min(lt, key=lambda s: lt[s]["series_virtual_image"]["median_s"])
        row["libertem"] = {"executor": spec, "median_s": lt[spec]["series_virtual_image"]["median_s"]}
        row["libertem_over"] = row["libertem"]["median_s"] / row["compressed"]["median_s"]
    return row


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison, print a table, write the JSON; return the results."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="a tiny file and few repeats: seconds on 2 cores (what CI runs); results as cpu_vs_libertem_small.json")
    p.add_argument("--file", type=Path, default=None, help="HDF5 file to use (created when missing; default: one in the temp folder per size)")
    p.add_argument("--dose", type=float, default=2000.0, help="electrons per probe position of a new file")
    p.add_argument("--repeats", type=int, default=None, help="timed qgpu-dask queries per cluster (default 30; 3 with --small)")
    p.add_argument("--baseline-repeats", type=int, default=None, help="timed LiberTEM and NumPy runs (default 7; 2 with --small)")
    p.add_argument("--libertem", default=None,
                   help="LiberTEM executors: default (Context()), or make_with specs like dask:2, inline, threads:2 "
                        "(default inline,threads:2,default,dask:2, also with --small: the fields the docs' tables read)")
    p.add_argument("--workers", default="1,2", help="qgpu-dask worker counts to try")
    p.add_argument("--series", type=int, default=4, help="acquisitions of the compressed series (the file held that many times)")
    p.add_argument("--keep-omp-env", action="store_true", help="leave OMP_NUM_THREADS unset (see below)")
    args = p.parse_args(argv)
    size = "small" if args.small else "full"
    scan, det = SHAPES[size]
    repeats = args.repeats or (3 if args.small else 30)
    baseline_repeats = args.baseline_repeats or (2 if args.small else 7)
    specs = [s for s in (args.libertem or "inline,threads:2,default,dask:2").split(",") if s]
    path = args.file or Path(tempfile.gettempdir()) / ("qgpu_cpu_vs_libertem_small.h5" if args.small else "qgpu_cpu_vs_libertem.h5")
    load_before = os.getloadavg()
    # LiberTEM's Numba code (OpenMP threading layer) in this process fights OpenBLAS's
    # threads for the cores unless OMP_NUM_THREADS is set: its inline executor then
    # took ~2 s instead of ~0.18 s here. Starting a Dask LocalCluster (LiberTEM's
    # Context() or ours) sets it anyway, so set it up front: the baseline does not
    # depend on the order of the runs. Our workers get it from Dask's nanny regardless.
    omp_set = "OMP_NUM_THREADS" not in os.environ and not args.keep_omp_env
    if omp_set:
        os.environ["OMP_NUM_THREADS"] = "1"
    dask.config.set({"qgpu.cpu": True})  # a comparison of CPU workers, also on a GPU node (the nannies hand it on)

    info = make_file(path, args.dose, scan, det)
    masks = make_masks(det)
    print(f"file {info['path']}: {info['shape']} {info['dtype']}, {info['file_bytes'] / 1e6:.1f} MB, chunks {info['chunks']}")
    print("masks: " + ", ".join(f"{k} {int(m.sum())} px" for k, m in masks.items()))

    others: dict[str, dict] = {}
    skipped = []
    with Others(others, "numpy"):
        numpy = numpy_run(info, masks, baseline_repeats)
    data = numpy.pop("data")
    ref, center = references(data, numpy.pop("images"))
    info["max_count"] = int(data.max())
    info["mean_counts_per_frame"] = float(data.sum(dtype=np.uint64)) / (scan[0] * scan[1])
    try:
        import libertem  # noqa: F401
    except ImportError as e:
        print(f"  libertem not importable ({e}): NumPy baseline only")
        skipped.append(f"LiberTEM (not importable: {e})")
        lt = {}
    else:
        with Others(others, "libertem"):
            lt = libertem_runs(info, masks, center, specs, baseline_repeats, args.series)
    ours = {}
    for n in (int(n) for n in args.workers.split(",")):
        with Others(others, f"qgpu[{n}]"):
            ours[n] = qgpu_run(info, masks, n, repeats, args.series)
    with Others(others, "mask_sums_in_process"):
        kernel = local_kernel(data, masks, repeats)
    print(f"  mask_sums in this process {kernel['median_s'] * 1e3:.2f} ms  (by Numba threads: "
          + ", ".join(f"{t}: {s * 1e3:.2f} ms" for t, s in kernel["by_threads_median_s"].items()) + ")")

    equal, deviation = compare(ref, lt, ours)
    queries = table(lt, ours)
    series = series_table(lt, ours)
    best_lt = min(lt, key=lambda s: lt[s]["median_s"]) if lt else None
    best_ours = min(ours, key=lambda n: ours[n]["median_s"])
    q = ours[best_ours]["median_s"]
    ratios: dict[str, Any] = {"numpy_over_qgpu": numpy["median_s"] / q}
    targets: dict[str, Any] = {}
    if best_lt is not None:
        ratios["libertem_over_qgpu"] = lt[best_lt]["median_s"] / q
        ratios["libertem_over_qgpu_by_workers"] = {n: lt[best_lt]["median_s"] / r["median_s"] for n, r in ours.items()}
        ratios["target"] = TARGET_RATIO
        ratios["target_met"] = ratios["libertem_over_qgpu"] >= TARGET_RATIO
        targets = {f"default {query} >= {TARGET_RATIO:g}x LiberTEM": queries[query]["default"]["libertem_over"] >= TARGET_RATIO for query in QUERIES}
        targets[f"compressed virtual_image >= {COMPRESSED_TARGET:g}x LiberTEM"] = queries["virtual_image"]["compressed"]["libertem_over"] >= COMPRESSED_TARGET
        targets[f"compressed series virtual_image >= {SERIES_TARGET:g}x LiberTEM"] = series["libertem_over"] >= SERIES_TARGET
    default_layout = ours[best_ours]["layouts"]["default"]

    results = {
        "small": args.small,
        "skipped": skipped,
        "file": info,
        "masks": {k: {"pixels": int(m.sum()), "dtype_sent": "bool"} for k, m in masks.items()},
        "com_center": list(center),
        "com_compared": "qgpu-dask == a NumPy float64 reference from exact int64 moment images and the mean pattern's "
                        "bright-field centre; LiberTEM CoMUDF (cy, cx = that centre) by its largest deviation from it",
        "default_layout": {"layout": default_layout["layout"], "layout_reason": default_layout["layout_reason"]},
        "queries": queries,
        "series": series,
        "targets": targets,
        "all_targets_met": bool(targets) and all(targets.values()),
        "libertem_com_max_deviation_px": deviation,
        "libertem": {s: strip(r) for s, r in lt.items()},
        "libertem_baseline": best_lt,
        "numpy": strip(numpy),
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
    out = record.write("cpu_vs_libertem_small" if args.small else "cpu_vs_libertem", results)

    print(f"\ndefault layout: {default_layout['layout']} ({default_layout['layout_reason']})")
    print(f"{'query':<16}{'LiberTEM ms':>20}{'default ms':>14}{'x':>8}{'compressed ms':>16}{'x':>8}")
    for query, row in queries.items():
        lt_cell = f"{row['libertem']['median_s'] * 1e3:.1f} ({row['libertem']['executor']})" if lt else "-"
        cells = [f"{row[k]['median_s'] * 1e3:.2f}" for k in ("default", "compressed")]
        x = [f"{row[k]['libertem_over']:.1f}x" if lt else "-" for k in ("default", "compressed")]
        print(f"{query:<16}{lt_cell:>20}{cells[0]:>14}{x[0]:>8}{cells[1]:>16}{x[1]:>8}")
    lt_series = f"{series['libertem']['median_s'] * 1e3:.1f} ({series['libertem']['executor']})" if lt else "-"
    x_series = f"{series['libertem_over']:.1f}x" if lt else "-"
    print(f"{'series of ' + str(series['files']):<16}{lt_series:>20}{'':>14}{'':>8}{series['compressed']['median_s'] * 1e3:>16.2f}{x_series:>8}")
    for target, met in targets.items():
        print(f"target {target}: {'met' if met else 'NOT met'}")
    for s, d in deviation.items():
        print(f"LiberTEM[{s}] centre of mass: largest deviation from the float64 reference {d:.2e} px")
    for n, r in ours.items():
        print(f"qgpu-dask load, {n} worker(s): " + ", ".join(f"{k} {v['load_s']:.2f} s" for k, v in r["layouts"].items()))
    print(f"NumPy / qgpu-dask (virtual image): {ratios['numpy_over_qgpu']:.1f}x")
    bad = [k for k, v in equal.items() if not v]
    print(f"all results equal: {results['all_equal']}" + (f" (not: {bad})" if bad else "") + f"   -> {out}")
    return results


if __name__ == "__main__":
    main()
