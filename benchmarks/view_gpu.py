"""The viewer in a real browser (headless chromium): how fast a drawn detector follows the mouse (issue 25).

A series of ``--acquisitions`` resident acquisitions (on a GPU: Arina masters of 512 x 512 x 192 x 192 at 0.3
counts per pixel, loaded as the series benchmark's are; on CPU workers: 64 x 64 x 128 x 128 Poisson counts with
a bright-field disk, put) is viewed through the web server (``ViewServer``, in this process) in headless chromium
driven by selenium. In the page, a scripted drag moves a disk detector on a circle every animation frame for
``--seconds``: updates drawn per second, and the drag-to-pixels latency (from the ask made for a pointer
position to its image painted) p50 / p95, split at the answer's arrival in the page. The same with the grid of every acquisition's image. Then the
slider: steps to the next acquisition, ms from the step to its image painted. Baselines from the same run:
the API's own answer to the same questions from Python (``acq.virtual_image`` of a moving disk,
``series.virtual_images``), as answers per second; every viewer figure is given beside it.

    python benchmarks/view_gpu.py            # on the GPU machine: 64 acquisitions
    DASK_QGPU__CPU=True python benchmarks/view_gpu.py --acquisitions 4   # the CPU variant (2-core machine)
    python benchmarks/view_gpu.py --small    # seconds: what CI runs
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import qgpu_dask as qd
from qgpu_dask.detector import masks
from qgpu_dask.phase.calibration import bright_field_disk
from qgpu_dask.view.server import ViewServer

import record

DRAG = """
const [seconds, grid, centre, swing, radius, done] = arguments;
const v = window.qgpuViewers[0];
v.setGrid(grid);
const drawn0 = grid ? v.drawn.grid : v.drawn.image, timed0 = v.timings.length, start = performance.now();
function step(now) {
  const t = (now - start) / 1000;
  if (t < seconds) {
    const a = 2 * Math.PI * t / 2;
    v.setDetector({kind: "disk", center: [centre[0] + swing * Math.sin(a), centre[1] + swing * Math.cos(a)], radius});
    requestAnimationFrame(step);
    return;
  }
  const drawn = (grid ? v.drawn.grid : v.drawn.image) - drawn0;
  const timed = v.timings.slice(timed0);
  v.setGrid(false);
  done({drawn, seconds: t, latencies_ms: timed.map(x => x.drawn - x.asked), server_ms: timed.map(x => x.received - x.asked),
        page_ms: timed.map(x => x.drawn - x.received)});
}
requestAnimationFrame(step);
"""

STEP = """
const [index, done] = arguments;
const v = window.qgpuViewers[0];
const timed0 = v.timings.length, start = performance.now();
v.setIndex(index);
function look() {  // the step's image painted: its timing entry (taken in the frame after it was drawn)
  const entry = v.lastImage.index === index ? v.timings.slice(timed0).find(x => x.seq === v.lastImage.seq) : undefined;
  if (entry) done(entry.drawn - start);
  else setTimeout(look, 1);
}
look();
"""


def browser():
    """Headless chromium through chromedriver; None where they are not installed."""
    chromium, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (chromium and driver):
        return None
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1600,1200"):
        options.add_argument(flag)
    page = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    page.set_script_timeout(600)
    return page


def disk_counts(rng, scan, det: int, dose: float) -> tuple[np.ndarray, tuple[float, float]]:
    """Poisson counts with a bright bright-field disk of radius det / 8 off the centre; the disk's centre."""
    centre = (det * 0.45, det * 0.55)
    rows, cols = np.indices((det, det))
    disk = np.hypot(rows - centre[0], cols - centre[1]) <= det / 8
    mean = dose + disk * 40 * dose
    return rng.poisson(mean, (*scan, det, det)).astype(np.uint16), centre


def held_series(svc, args, folder: Path) -> tuple[qd.Series, tuple[float, float]]:
    """The series viewed: Arina masters loaded (a GPU) or counts put (CPU workers), 2 distinct contents."""
    if args.arina:
        from load_arina import write_master
        from load_series_gpu import bf_means

        det = (args.det, args.det)
        masters = [write_master(folder, tuple(args.scan), det, args.dose, seed=k, stem=f"v{k}", mean=bf_means(det, args.dose))[0]
                   for k in range(2)]
        series = svc.load([masters[k % 2] for k in range(args.acquisitions)], name=[f"view{k}" for k in range(args.acquisitions)],
                          progress=False)
        return series, bright_field_disk(series[0].reduce(op="mean"))[0]
    rng = np.random.default_rng(5)
    made = [disk_counts(rng, tuple(args.scan), args.det, args.dose) for _ in range(min(2, args.acquisitions))]
    held = [svc.put(made[k % len(made)][0], name=f"view{k}") for k in range(args.acquisitions)]
    return qd.Series(svc, held), made[0][1]


def api_rate(fn, centre, swing: float, radius: float, det: int, seconds: float) -> float:
    """Answers per second of ``fn(mask)`` from Python for a disk moving as the page's drag moves it."""
    n, start = 0, time.perf_counter()
    while (t := time.perf_counter() - start) < seconds or n < 3:
        a = 2 * math.pi * t / 2
        fn(masks.disk((det, det), (centre[0] + swing * math.sin(a), centre[1] + swing * math.cos(a)), radius))
        n += 1
    return n / (time.perf_counter() - start)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def drag_figure(page, seconds: float, grid: bool, centre, swing: float, radius: float) -> dict:
    out = page.execute_async_script(DRAG, seconds, grid, list(centre), swing, radius)
    lat = out["latencies_ms"]
    return {"updates_per_s": out["drawn"] / out["seconds"], "latency_p50_ms": percentile(lat, 50), "latency_p95_ms": percentile(lat, 95),
            "answers": len(lat), "server_ms_p50": percentile(out["server_ms"], 50), "page_ms_p50": percentile(out["page_ms"], 50)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu = qd.device.has_gpu()
    parser.add_argument("--acquisitions", type=int, default=64 if gpu else 4)
    parser.add_argument("--scan", type=int, nargs=2, default=(512, 512) if gpu else (64, 64))
    parser.add_argument("--det", type=int, default=192 if gpu else 128)
    parser.add_argument("--dose", type=float, default=0.3)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each scripted drag")
    parser.add_argument("--steps", type=int, default=10, help="slider steps timed")
    parser.add_argument("--arina", action=argparse.BooleanOptionalAction, default=gpu,
                        help="load Arina masters (default on a GPU) rather than put counts")
    args = record.parse(parser, {"acquisitions": 2, "scan": (16, 16), "det": 32, "seconds": 1.0, "steps": 2, "arina": False})
    backend = "cuda" if gpu else "cpu"
    page = browser()
    if page is None:
        print("no chromium and chromedriver: apt-get install chromium chromium-driver", file=sys.stderr)
        return 1
    folder = Path(tempfile.mkdtemp(prefix="qgpu-view-"))
    try:
        with qd.Service.local(n_workers=1, dashboard_address=":0") if gpu else qd.Service.local(n_workers=2, dashboard_address=":0") as svc:
            series, centre = held_series(svc, args, folder)
            radius, swing = args.det / 10, args.det / 12
            acq = series[0]
            baseline = {"image_per_s": api_rate(acq.virtual_image, centre, swing, radius, args.det, args.seconds),
                        "series_per_s": api_rate(series.virtual_images, centre, swing, radius, args.det, args.seconds)}
            with ViewServer(svc) as server:
                page.get(server.address("series/?names=" + ",".join(series.names)))
                deadline = time.monotonic() + 300
                while not page.execute_script("const v = (window.qgpuViewers || [])[0]; return v && v.drawn.image > 0;"):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the page drew no image in 300 s")
                    time.sleep(0.05)
                drag = drag_figure(page, args.seconds, False, centre, swing, radius)
                grid = drag_figure(page, args.seconds, True, centre, swing, radius)
                steps = [page.execute_async_script(STEP, (k + 1) % len(series)) for k in range(args.steps)]
                errors = page.execute_script("return window.qgpuViewers[0].errors;")
            series.release()
    finally:
        page.quit()
        shutil.rmtree(folder, ignore_errors=True)
    results = {
        "acquisitions": args.acquisitions, "scan": list(args.scan), "det": args.det, "backend": backend, "seconds": args.seconds,
        "baseline": baseline,
        "drag": {**drag, "over_api": drag["updates_per_s"] / baseline["image_per_s"]},
        "grid": {**grid, "over_api": grid["updates_per_s"] / baseline["series_per_s"]},
        "slider": {"step_p50_ms": statistics.median(steps), "step_max_ms": max(steps), "steps": len(steps)},
        "errors": errors,
        "targets": {"drag_updates_per_s_min": 30.0 if gpu else 10.0, "grid_updates_per_s_min": 10.0, "latency_p50_ms_max": 50.0,
                    "latency_p95_ms_max": 100.0, "step_ms_max": 50.0},
    }
    path = record.write(f"view_{backend}", results)
    lines = [f"{args.acquisitions} acquisitions of {args.scan[0]}x{args.scan[1]}x{args.det}x{args.det} ({backend})",
             f"drag: {drag['updates_per_s']:.1f} updates/s (API alone {baseline['image_per_s']:.1f}/s), latency p50 {drag['latency_p50_ms']:.1f} "
             f"p95 {drag['latency_p95_ms']:.1f} ms",
             f"grid: {grid['updates_per_s']:.1f} updates/s (API alone {baseline['series_per_s']:.1f}/s), latency p50 {grid['latency_p50_ms']:.1f} ms",
             f"p50 ms from ask to answer received / from received to painted: drag {drag['server_ms_p50']:.1f} / {drag['page_ms_p50']:.1f}, "
             f"grid {grid['server_ms_p50']:.1f} / {grid['page_ms_p50']:.1f}",
             f"slider step: {results['slider']['step_p50_ms']:.1f} ms p50"]
    return record.reported(path, lines, {"no errors on the page": not errors})


if __name__ == "__main__":
    sys.exit(main())
