"""Compressed residents (qgpu-ans-1) against the dense layout of the same counts, in one run.

For each dose (mean counts per detector pixel) the script makes Poisson counts
on the device, holds them dense and compressed, and measures:

- size: resident bytes over the order-0 entropy bound (target <= 1.10), raw
  bytes over resident bytes, the stream forms and the scan block;
- encode throughput, GB/s of raw counts (target >= 20), against the dense
  full-read bandwidth;
- a virtual image of a new mask on every repeat (a disk at a random centre
  away from the previous one, a random 30% and a random 90% of the pixels), plan and run,
  over the dense full read (``read_sum``; target <= 0.5) and over the dense
  layout's virtual image of the same mask;
- the frame at a random scan position (target <= 2 ms) against the dense frame copy.

Then a moving disk: 16 compressed acquisitions at one dose, a disk whose
centre moves one pixel per step; each step plans the new mask on every
acquisition and runs the plans together as a shard does for a series query
(side CUDA streams; answered incrementally after the first step). Reported:
ms per acquisition per step (target <= 0.3) against the dense layout's
virtual image of the same mask.

Every virtual image, frame and ROI sum is held to the dense layout's with
``==``; a failed check makes the exit status 1. Runs on a GPU (CuPy) or on
the CPU (Numba; with ``DASK_QGPU__CPU=True`` or without CuPy), where
NumPy's sum stands in for ``read_sum``. The result goes to
``benchmarks/results/compressed_<device>[_small].json`` via record.py, or to ``--out``.

    python benchmarks/compressed.py
    DASK_QGPU__CPU=True python benchmarks/compressed.py --small
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import record
from timing import timed

import qgpu_dask as qd
from qgpu_dask.device import array_module, to_host
from qgpu_dask.resident import DenseCounts
from qgpu_dask.resident.compressed import CompressedCounts
from qgpu_dask.resident.masks import mask_weights
from qgpu_dask.queries.virtual_images import run_together

TARGETS = {"bound_ratio_max": 1.10, "virtual_image_over_read_max": 0.5, "moving_ms_per_acquisition_max": 0.3,
           "frame_ms_max": 2.0, "encode_GBps_min": 20.0}
CHUNK_VALUES = 1 << 26  # Poisson values drawn at once (int64 temporaries of 512 MiB)


def poisson_counts(xp, out, mean, seed: int):
    """Fill ``out`` (n_frames, frame_len) uint16 with Poisson counts drawn on its device, in chunks: ``mean``
    is every count's mean (a float) or ``mean(f0, f1)``, the means of frames [f0, f1) (an array broadcast
    to their shape)."""
    rng = np.random.default_rng(seed) if xp is np else xp.random.RandomState(seed)
    rows = max(1, CHUNK_VALUES // out.shape[1])
    for f0 in range(0, out.shape[0], rows):
        part = out[f0 : f0 + rows]
        part[...] = rng.poisson(mean(f0, f0 + part.shape[0]) if callable(mean) else mean, part.shape)
    return out


def synced(xp, fn):
    """``fn`` followed by a device synchronisation, so wall time covers its kernels."""
    if xp is np:
        return fn

    def run():
        result = fn()
        xp.cuda.Device().synchronize()
        return result

    return run


def full_read(xp, flat):
    """The dense full-read reference: ``read_sum`` on a GPU, NumPy's uint64 sum on the CPU."""
    if xp is np:
        return lambda: flat.sum(dtype=np.uint64)
    from qgpu_dask.resident.cuda.dense import read_sum

    return synced(xp, lambda: read_sum(flat))


def release(xp) -> None:
    """Return freed device memory to the driver between big allocations."""
    if xp is not np:
        xp.get_default_memory_pool().free_all_blocks()


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def random_disks(det, radius: float, n: int, rng) -> list[np.ndarray]:
    """``n`` disks at random centres, each at least two radii from the previous (no overlap, so no incremental answer)."""
    masks, last = [], None
    while len(masks) < n:
        centre = rng.uniform(radius, np.array(det) - radius)
        if last is None or np.hypot(*(centre - last)) >= 2 * radius:
            masks.append(qd.masks.disk(det, centre, radius))
            last = centre
    return masks


def time_queries(fn, inputs: list, warmup: int) -> tuple[float, list]:
    """Median ms of ``fn(x)`` over ``inputs[warmup:]`` (the first ``warmup`` run untimed) and every result."""
    results, times = [], []
    for i, x in enumerate(inputs):
        t0 = time.perf_counter()
        results.append(fn(x))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return median_ms(times), results


def same(a: list, b: list) -> bool:
    """Element-wise ``==`` (and equal dtypes) of two lists of arrays."""
    return all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def dose_case(xp, flat, shape, dose: float, args, rng) -> dict:
    """Size, encode, virtual images, frames and checks of one dose."""
    det = shape[2:]
    dense = DenseCounts("dense", flat, shape)
    read_times, _ = timed(full_read(xp, flat), args.reps, warmup=2)
    read = {"ms": median_ms(read_times), "GBps": flat.nbytes / median_ms(read_times) / 1e6}

    encode = synced(xp, lambda: CompressedCounts.encode("compressed", flat, shape))
    encode_times, comp = timed(encode, args.encode_reps, warmup=1)
    enc_ms = median_ms(encode_times)
    encode_gbps = flat.nbytes / enc_ms / 1e6
    info = comp.describe()
    payload = int(comp.streams.payload.nbytes)
    index = int(comp.streams.index.nbytes + comp.streams.block_base.nbytes)
    entry = {
        "dose": dose,
        "read": read,
        "size": {"nbytes": comp.nbytes, "raw_bytes": comp.raw_bytes, "entropy_bytes": comp.stats["entropy_bytes"],
                 "bound_ratio": info["bound_ratio"], "raw_ratio": info["ratio"], "block": comp.block, "forms": comp.forms(),
                 "payload_bytes": payload, "index_bytes": index, "model_bytes": comp.nbytes - payload - index},
        "encode": {"ms": enc_ms, "GBps": encode_gbps, "over_read_bandwidth": encode_gbps / read["GBps"]},
    }

    warm = 2
    n = warm + args.reps
    mask_sets = {
        "disk": random_disks(det, det[0] / 8, n, rng),
        "random30": [rng.random(det) < 0.3 for _ in range(n)],
        "random90": [rng.random(det) < 0.9 for _ in range(n)],  # answered from the frame totals and the other 10%
    }
    checks = {}
    entry["virtual_image"] = {}
    for name, masks in mask_sets.items():
        comp_ms, got = time_queries(comp.virtual_images, masks, warm)
        dense_ms, want = time_queries(dense.virtual_images, masks, warm)
        entry["virtual_image"][name] = {"compressed_ms": comp_ms, "dense_ms": dense_ms, "masks": len(masks),
                                        "over_read": comp_ms / read["ms"], "over_dense": comp_ms / dense_ms}
        checks[f"virtual_image_{name}"] = same(got, want)

    positions = [(int(r), int(c)) for r, c in zip(rng.integers(0, shape[0], n), rng.integers(0, shape[1], n))]
    comp_ms, got = time_queries(lambda p: comp.frame(*p), positions, warm)
    dense_ms, want = time_queries(lambda p: dense.frame(*p), positions, warm)
    entry["frame"] = {"compressed_ms": comp_ms, "dense_ms": dense_ms, "over_dense": comp_ms / dense_ms}
    checks["frame"] = same(got, want)

    roi = rng.random(shape[:2]) < 0.1
    checks["reduce_sum_all"] = same([comp.reduce(None, "sum")], [dense.reduce(None, "sum")])
    checks["reduce_sum_roi"] = same([comp.reduce(roi, "sum")], [dense.reduce(roi, "sum")])
    entry["checks"] = checks
    return entry


def moving_disk(xp, staging, shape, args) -> dict:
    """16 compressed acquisitions encoded one by one from ``staging``; a disk moving one pixel per step over all."""
    det = shape[2:]
    radius = det[0] * 0.12
    row, col0 = det[0] / 2, det[1] / 2 - args.steps / 2
    masks = [qd.masks.disk(det, (row, col0 + s), radius) for s in range(args.steps)]
    acquisitions, want, dense_times = [], [], []
    for k in range(args.acquisitions):
        poisson_counts(xp, staging, args.moving_dose, seed=1000 + k)
        acquisitions.append(CompressedCounts.encode(f"acq{k}", staging, shape))
        dense = DenseCounts("staging", staging, shape)
        images = []
        for mask in masks:
            t0 = time.perf_counter()
            images.append(dense.virtual_images(mask))
            dense_times.append(time.perf_counter() - t0)
        want.append(images)
    step_ms, got = [], [[] for _ in acquisitions]
    for mask in masks:
        t0 = time.perf_counter()
        weights = mask_weights(mask, det, staging.dtype)  # once per step, as a shard does for a series query
        answers = [to_host(a) for a in run_together([acq.plan_virtual_images(weights) for acq in acquisitions])]  # as a reply brings them
        for images, answer in zip(got, answers):
            images.append(answer)
        step_ms.append((time.perf_counter() - t0) * 1e3)
    per_acq = statistics.median(step_ms[1:]) / len(acquisitions)
    dense_ms = median_ms(dense_times)
    entry = {
        "dose": args.moving_dose, "acquisitions": len(acquisitions), "steps": args.steps, "radius": radius,
        "compressed_bytes": sum(a.nbytes for a in acquisitions),
        "first_step_ms_per_acquisition": step_ms[0] / len(acquisitions),
        "ms_per_acquisition_per_step": per_acq,
        "dense_ms_per_acquisition": dense_ms,
        "over_dense": per_acq / dense_ms,
        "checks": {"every_step": all(same(g, w) for g, w in zip(got, want))},
    }
    return entry


def mark(ok: bool) -> str:
    return "ok" if ok else "MISS"


def table(results: dict) -> list[str]:
    """Readable lines: one block per dose, then the moving disk, with the targets."""
    t = TARGETS
    lines = [f"{'dose':>5s} {'case':30s} {'value':>12s} {'baseline':>12s} {'ratio':>8s}  target"]
    for e in results["doses"]:
        d, s = e["dose"], e["size"]
        lines += [
            f"{d:5g} {'bytes / entropy bound':30s} {s['nbytes']:12d} {s['entropy_bytes']:12.0f} {s['bound_ratio']:8.3f}  "
            f"<= {t['bound_ratio_max']} {mark(s['bound_ratio'] <= t['bound_ratio_max'])}",
            f"{d:5g} {'raw / bytes (block ' + str(s['block']) + ')':30s} {s['raw_bytes']:12d} {s['nbytes']:12d} {s['raw_ratio']:8.2f}",
            f"{d:5g} {'payload / index / model bytes':30s} {s['payload_bytes']:12d} {s['index_bytes']:12d} {s['model_bytes']:8d}",
            f"{d:5g} {'forms':30s} {str(s['forms'])}",
            f"{d:5g} {'encode GB/s vs read GB/s':30s} {e['encode']['GBps']:12.2f} {e['read']['GBps']:12.2f} "
            f"{e['encode']['over_read_bandwidth']:8.3f}  >= {t['encode_GBps_min']} GB/s {mark(e['encode']['GBps'] >= t['encode_GBps_min'])}",
        ]
        for name, v in e["virtual_image"].items():
            lines += [
                f"{d:5g} {'VI ' + name + ' ms vs read':30s} {v['compressed_ms']:12.3f} {e['read']['ms']:12.3f} {v['over_read']:8.3f}  "
                f"<= {t['virtual_image_over_read_max']} {mark(v['over_read'] <= t['virtual_image_over_read_max'])}",
                f"{d:5g} {'VI ' + name + ' ms vs dense VI':30s} {v['compressed_ms']:12.3f} {v['dense_ms']:12.3f} {v['over_dense']:8.3f}",
            ]
        f = e["frame"]
        lines.append(f"{d:5g} {'frame ms vs dense frame':30s} {f['compressed_ms']:12.3f} {f['dense_ms']:12.3f} {f['over_dense']:8.3f}  "
                     f"<= {t['frame_ms_max']} ms {mark(f['compressed_ms'] <= t['frame_ms_max'])}")
    m = results["moving_disk"]
    lines += [
        f"{m['dose']:5g} {'moving disk ms/acq/step':30s} {m['ms_per_acquisition_per_step']:12.4f} {m['dense_ms_per_acquisition']:12.3f} "
        f"{m['over_dense']:8.3f}  <= {t['moving_ms_per_acquisition_max']} ms "
        f"{mark(m['ms_per_acquisition_per_step'] <= t['moving_ms_per_acquisition_max'])}",
        f"{m['dose']:5g} {'moving disk first step ms/acq':30s} {m['first_step_ms_per_acquisition']:12.4f}",
    ]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, nargs=2, default=(512, 512), help="scan rows, cols")
    ap.add_argument("--det", type=int, nargs=2, default=(192, 192), help="detector rows, cols")
    ap.add_argument("--doses", type=float, nargs="+", default=[0.05, 0.3, 1.0, 5.0], help="mean counts per pixel")
    ap.add_argument("--reps", type=int, default=20, help="timed repeats per query")
    ap.add_argument("--encode-reps", type=int, default=3, help="timed encodes per dose")
    ap.add_argument("--acquisitions", type=int, default=16, help="acquisitions of the moving disk")
    ap.add_argument("--steps", type=int, default=20, help="moving-disk steps")
    ap.add_argument("--moving-dose", type=float, default=0.3, help="dose of the moving-disk acquisitions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="results JSON path (default: record.py's folder)")
    args = record.parse(ap, small={"scan": (8, 8), "det": (16, 16), "reps": 2, "encode_reps": 1,
                                   "acquisitions": 2, "steps": 4})
    scan, det = tuple(args.scan), tuple(args.det)
    shape = scan + det
    xp = array_module()
    device = "cpu" if xp is np else "cuda"
    rng = np.random.default_rng(args.seed)
    n_frames, frame_len = scan[0] * scan[1], det[0] * det[1]
    print(f"{device}: {shape} uint16 = {n_frames * frame_len * 2 / 1e9:.2f} GB per acquisition", flush=True)

    results = {"device": device, "shape": list(shape), "dtype": "uint16", "targets": TARGETS, "reps": args.reps, "doses": []}
    checks = {}
    flat = xp.empty((n_frames, frame_len), dtype=np.uint16)
    for i, dose in enumerate(args.doses):
        poisson_counts(xp, flat, dose, seed=args.seed + i)
        entry = dose_case(xp, flat, shape, dose, args, rng)
        results["doses"].append(entry)
        checks.update({f"dose_{dose:g}_{k}": v for k, v in entry["checks"].items()})
        release(xp)
        print(f"dose {dose:g}: bound ratio {entry['size']['bound_ratio']:.3f}, checks {entry['checks']}", flush=True)

    results["moving_disk"] = moving_disk(xp, flat, shape, args)
    checks.update({f"moving_disk_{k}": v for k, v in results["moving_disk"]["checks"].items()})
    results["checks_passed"] = all(checks.values())

    path = record.write(args.out.stem, results, args.out.parent) if args.out else record.write(f"compressed_{device}", results)
    return record.reported(path, table(results), checks)


if __name__ == "__main__":
    raise SystemExit(main())
