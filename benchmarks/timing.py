"""Timing and workloads shared by the benchmarks: wall-clock repeats, CUDA-event timings and a file of random counts."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[list[float], Any]:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times; the seconds of each and the last result."""
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return times, result


def median_ms(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` in ms."""
    return statistics.median(timed(fn, repeats, warmup)[0]) * 1e3


def device_clock(xp) -> Callable[[Callable[[], Any]], tuple[Any, float]]:
    """A timer for code on ``xp``'s device (NumPy or CuPy): clock(fn) -> (result, ms) of fn's second call (the
    first compiles kernels and makes FFT plans), synchronised before and after."""
    sync = (lambda: xp.cuda.Device().synchronize()) if xp is not np else (lambda: None)

    def clock(fn: Callable[[], Any]) -> tuple[Any, float]:
        fn()
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        return out, (time.perf_counter() - t0) * 1e3

    return clock


def event_times(fn: Callable[[], Any], reps: int, warmup: int = 3) -> dict:
    """Median / min / max milliseconds of ``fn()`` between CUDA events on the current stream (CuPy)."""
    import cupy

    for _ in range(warmup):
        fn()
    cupy.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "reps": reps}


def latencies(fn: Callable[[], Any], n: int, warmup: int = 20) -> dict:
    """p50 / p95 / p99 in ms of ``n`` calls of ``fn``."""
    times = sorted(t * 1e3 for t in timed(fn, n, warmup)[0])
    return {"p50_ms": times[n // 2], "p95_ms": times[int(n * 0.95)], "p99_ms": times[int(n * 0.99)], "calls": n}


def write_counts(path: Path, scan: tuple[int, int], det: tuple[int, int], seed: int = 0) -> Path:
    """An HDF5 file with dataset /data of uniform random uint16 counts 0..7, written row by row."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("data", shape=scan + det, dtype=np.uint16)
        for r in range(scan[0]):
            d[r] = rng.integers(0, 8, (scan[1],) + det, dtype=np.uint16)
    return path
