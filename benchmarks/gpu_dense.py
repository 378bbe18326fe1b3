"""GPU dense-kernel benchmark: virtual images and scan-ROI reductions against one plain full read.

Builds a 512 x 512 x 192 x 192 uint16 acquisition on the GPU (19.3 GB, filled
with random counts: a bright disk over a dim background), then times with CUDA
events (median of many runs, after warm-up):

- ``read_sum``: a plain full read of the array, the bandwidth reference;
- one off-centre disk mask, 3 masks at once (BF disk, ABF and ADF annuli), 8
  concentric rings at once and a full-detector mask: kernel time, effective bandwidth (array bytes / time) and
  the ratio to the full read (>= 0.85 is the goal); also the whole query call
  (weight compaction and its one synchronisation included);
- the scan-ROI sum and max over the whole scan, against the full read;
- CuPy references: gather + uint64 sum for the disk, ``sum(axis=0, dtype=uint64)``.

``--check`` holds every timed output to a CuPy reference with ``==``.
``--small`` runs a 16 x 16 x 16 x 16 smoke size; without a CUDA device it
builds the mask sets only and says what it skipped. Results go to
``benchmarks/results/gpu_dense.json`` (or ``$QGPU_DASK_RESULTS``) via record.py.

    python benchmarks/gpu_dense.py --check
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import record  # noqa: E402
from timing import event_times  # noqa: E402

from qgpu_dask.device import cupy_or_none  # noqa: E402

cupy = cupy_or_none()
FILL = None if cupy is None else cupy.ElementwiseKernel(
    "uint64 seed, int64 offset, int64 frame_len, int32 cols, float32 cy, float32 cx, float32 r2",
    "uint16 out",
    """
    unsigned long long k = (unsigned long long)(i + offset);
    unsigned long long x = k * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27; x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    long long pix = (i + offset) % frame_len;
    float dr = (float)(pix / cols) - cy, dc = (float)(pix % cols) - cx;
    float lam = (dr * dr + dc * dc <= r2) ? 40.0f : 0.35f;
    float u = ((float)(x >> 40) + 0.5f) * (1.0f / 16777216.0f);
    float v = -lam * logf(u);
    out = (unsigned short)fminf(v, 65535.0f);
    """,
    "qgpu_fill_counts",
)


def make_data(scan: int, det: int, seed: int = 12345) -> cupy.ndarray:
    """(scan*scan, det*det) uint16 random counts built on the GPU, chunk by chunk (no host copy)."""
    n, length = scan * scan, det * det
    data = cupy.empty((n, length), dtype=cupy.uint16)
    step = max(1, (1 << 29) // length)
    c = det / 2 - 0.5
    for f0 in range(0, n, step):
        part = data[f0 : f0 + step]
        FILL(np.uint64(seed), np.int64(f0 * length), np.int64(length), np.int32(det), np.float32(c), np.float32(c), np.float32((det / 6) ** 2), part)
    cupy.cuda.get_current_stream().synchronize()
    return data


def disk(det: int, cy: float, cx: float, r: float) -> np.ndarray:
    yy, xx = np.mgrid[:det, :det]
    return (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r


def annulus(det: int, cy: float, cx: float, r0: float, r1: float) -> np.ndarray:
    return disk(det, cy, cx, r1) & ~disk(det, cy, cx, r0)


def span_weights(masks: list[np.ndarray]) -> tuple[int, np.ndarray]:
    """Weights (uint64, the exact accumulator) over the detector rows the masks touch."""
    stack = np.stack(masks)
    cols = stack.shape[2]
    rows = np.flatnonzero(stack.any(axis=(0, 2)))
    start, stop = int(rows[0]) * cols, (int(rows[-1]) + 1) * cols
    return start, np.ascontiguousarray(stack.reshape(len(masks), -1)[:, start:stop].astype(np.uint64))


def reference_mask_sums(data: cupy.ndarray, masks: list[np.ndarray], chunk: int = 8192) -> cupy.ndarray:
    """CuPy reference: gather each mask's pixels, uint64 sum, frames in chunks."""
    out = cupy.empty((len(masks), data.shape[0]), dtype=cupy.uint64)
    for m, mask in enumerate(masks):
        idx = cupy.asarray(np.flatnonzero(mask.ravel()))
        for f0 in range(0, data.shape[0], chunk):
            out[m, f0 : f0 + chunk] = data[f0 : f0 + chunk][:, idx].sum(axis=1, dtype=cupy.uint64)
    return out


def mask_cases(det: int) -> dict[str, list[np.ndarray]]:
    """The timed mask sets: an off-centre BF disk, BF + ABF + ADF, 8 rings, the full detector."""
    c = det / 2 - 0.5
    bf = disk(det, c + 0.07 * det, c - 0.05 * det, det * 0.17)  # arbitrary, off-centre
    abf = annulus(det, c, c, det * 0.17, det * 0.30)
    adf = annulus(det, c, c, det * 0.33, det * 0.5)
    full = np.ones((det, det), bool)
    rings = [annulus(det, c, c, det * 0.06 * k, det * 0.06 * (k + 1)) for k in range(8)]
    return {"disk": [bf], "three_masks": [bf, abf, adf], "eight_rings": rings, "full_detector": [full]}


def without_gpu(scan: int, det: int) -> int:
    """No CUDA device: the mask sets and their spans only (every kernel and timing here needs CUDA); say so."""
    spans = {}
    for name, masks in mask_cases(det).items():
        start, w = span_weights(masks)
        spans[f"mask_{name}"] = {"n_masks": len(masks), "span_pixels": int(w.shape[1]), "span_fraction": w.shape[1] / det**2}
    skipped = ["every kernel and CuPy reference (CUDA only: no CUDA device or DASK_QGPU__CPU=True)"]
    path = record.write("gpu_dense", {"shape": [scan, scan, det, det], "dtype": "uint16", "device": None, **spans, "skipped": skipped})
    print("skipped:", *skipped, f"\nmask spans: {spans}\nresults: {path}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="hold every timed output to a CuPy reference")
    ap.add_argument("--reps", type=int, default=30, help="timed repetitions per case")
    ap.add_argument("--variants", action="store_true", help="also time the other load flavours (kernels/dense.cu QGPU_LOAD)")
    ap.add_argument("--scan", type=int, default=512, help="scan side")
    ap.add_argument("--det", type=int, default=192, help="detector side")
    args = record.parse(ap, small={"scan": 16, "det": 16, "reps": 3, "check": True})
    scan, det, reps = args.scan, args.det, args.reps
    if cupy is None:
        return without_gpu(scan, det)
    from qgpu_dask.resident.cuda import dense

    t0 = time.perf_counter()
    data = make_data(scan, det)
    fill_s = time.perf_counter() - t0
    nbytes = data.nbytes
    frame_bytes = data.shape[1] * data.itemsize
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    print(f"data {scan}x{scan}x{det}x{det} uint16 = {nbytes / 1e9:.2f} GB, filled in {fill_s:.2f} s; "
          f"mean count {float(data[:64].mean()):.2f}", flush=True)

    cases = mask_cases(det)
    bf = cases["disk"][0]

    results: dict = {
        "shape": [scan, scan, det, det],
        "dtype": "uint16",
        "bytes": nbytes,
        "load_variant": dense.LOAD_VARIANTS[dense.LOAD_VARIANT],
        "device": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
    }
    checks: dict = {}
    rows = []

    def run_read() -> dict:
        r = event_times(lambda: dense.read_sum(data), reps)
        r["TBps"] = nbytes / r["median_ms"] / 1e9
        return r

    read = run_read()
    results["read_sum"] = read
    rows.append(("read_sum (full read)", read["median_ms"], read["TBps"], 1.0))
    if args.check:
        checks["read_sum"] = int(dense.read_sum(data).get()) == int(data.sum(dtype=cupy.uint64).get())

    for name, masks in cases.items():
        start, w = span_weights(masks)
        wd = cupy.asarray(w)
        run = dense.prepare_mask_sums(data, start, wd)
        r = event_times(run, reps)
        call = event_times(lambda: dense.mask_sums(data, start, wd), max(5, reps // 3))
        span_bytes = w.shape[1] * data.itemsize * data.shape[0]
        r.update(
            n_masks=len(masks),
            span_pixels=int(w.shape[1]),
            span_fraction=w.shape[1] / data.shape[1],
            effective_TBps=nbytes / r["median_ms"] / 1e9,
            span_TBps=span_bytes / r["median_ms"] / 1e9,
            ratio_to_read=read["median_ms"] / r["median_ms"],
            span_ratio_to_read=(span_bytes / r["median_ms"]) / (nbytes / read["median_ms"]),
            call_median_ms=call["median_ms"],
        )
        results[f"mask_{name}"] = r
        rows.append((f"mask {name} ({len(masks)} masks, span {r['span_fraction']:.2f})", r["median_ms"], r["effective_TBps"], r["ratio_to_read"]))
        if args.check:
            checks[f"mask_{name}"] = bool(cupy.array_equal(run(), reference_mask_sums(data, masks)))

    everything = cupy.arange(data.shape[0], dtype=cupy.int64)
    for op in ("sum", "max"):
        run = dense.prepare_roi_reduce(data, everything, op)
        r = event_times(run, reps)
        r.update(TBps=nbytes / r["median_ms"] / 1e9, time_over_read=r["median_ms"] / read["median_ms"])
        results[f"roi_{op}_whole_scan"] = r
        rows.append((f"roi {op} (whole scan)", r["median_ms"], r["TBps"], read["median_ms"] / r["median_ms"]))
    sel = cupy.asarray(np.random.default_rng(7).permutation(data.shape[0])[: data.shape[0] // 10].astype(np.int64))
    run_sel = dense.prepare_roi_reduce(data, sel, "sum")
    r = event_times(run_sel, reps)
    r.update(TBps=nbytes / 10 / r["median_ms"] / 1e9, frames=int(sel.size))
    results["roi_sum_random_tenth"] = r
    rows.append(("roi sum (random 10% of scan)", r["median_ms"], r["TBps"], float("nan")))
    if args.check:
        checks["roi_sum"] = bool(cupy.array_equal(dense.roi_reduce(data, everything, "sum"), data.sum(axis=0, dtype=cupy.uint64)))
        checks["roi_max"] = bool(cupy.array_equal(dense.roi_reduce(data, everything, "max"), data.max(axis=0)))
        checks["roi_sum_random_tenth"] = bool(cupy.array_equal(run_sel(), data[sel].sum(axis=0, dtype=cupy.uint64)))

    # CuPy references named in the design (cheap ones only).
    refs = {}
    idx = cupy.asarray(np.flatnonzero(bf.ravel()))
    chunk = max(1, data.shape[0] // 8)

    def gather_sum():
        for f0 in range(0, data.shape[0], chunk):
            data[f0 : f0 + chunk][:, idx].sum(axis=1, dtype=cupy.uint64)

    refs["cupy_gather_uint64_sum_disk"] = event_times(gather_sum, 5, warmup=1)
    refs["cupy_sum_axis0_uint64"] = event_times(lambda: data.sum(axis=0, dtype=cupy.uint64), 5, warmup=1)
    results["cupy_references"] = refs
    for k, v in refs.items():
        rows.append((k, v["median_ms"], nbytes / v["median_ms"] / 1e9, read["median_ms"] / v["median_ms"]))

    if args.variants:
        # The other load flavours (kernels/dense.cu QGPU_LOAD), same cases, same run.
        default = dense.LOAD_VARIANT
        variants = {}
        for v, label in dense.LOAD_VARIANTS.items():
            if v == default:
                continue
            dense.LOAD_VARIANT = v
            got = {"read_sum": run_read()}
            for name in ("full_detector", "disk"):
                start, w = span_weights(cases[name])
                got[f"mask_{name}"] = event_times(dense.prepare_mask_sums(data, start, cupy.asarray(w)), reps)
            got["roi_sum_whole_scan"] = event_times(dense.prepare_roi_reduce(data, everything, "sum"), reps)
            dense.LOAD_VARIANT = default
            variants[label] = got
            for case, r in got.items():
                rows.append((f"[{label}] {case}", r["median_ms"], nbytes / r["median_ms"] / 1e9, read["median_ms"] / r["median_ms"]))
        results["load_variants"] = variants

    if args.check:
        results["checks"] = checks
    path = record.write("gpu_dense", results)
    print(f"\nframe {frame_bytes} B, {data.shape[0]} frames; results: {path}")
    print(f"{'case':48s} {'median ms':>10s} {'eff TB/s':>9s} {'read/case':>10s}")
    for name, ms, bw, ratio in rows:
        print(f"{name:48s} {ms:10.3f} {bw:9.3f} {ratio:10.3f}")
    if args.check:
        print("checks:", checks)
        if not all(checks.values()):
            print("CHECK FAILED")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
