"""Sustained ingest into a live compressed acquisition while a viewer queries it (issue 9's measurement).

A detector simulator (``qgpu-dask simulate``, in a process of its own as a detector is) streams ``--frames *
--repeat`` Poisson frames (``--det`` x ``--det`` uint16, ``--dose`` counts per pixel) over loopback TCP, as
fast as it goes, into one live compressed acquisition on a one-worker cluster: raw frames (a .npy whose
``--repeat`` scan rows hold the same ``--frames`` frames), and the stored bitshuffle-LZ4 chunks of an Arina
master as a DECTRIS detector sends them (``--compressed``). A viewer loop meanwhile asks for a moving-disk virtual
image as fast as it can. Baselines from the same run: each stream read by a bare reader (the wire's
rate, chunks not decoded), ingest with no viewer, and the viewer on the finished acquisition. Each stream
is first ingested once unmeasured (the Numba chunk parser and the CUDA decoder compile on first use);
every figure is then the median of ``--runs`` runs.

    python benchmarks/live_gpu.py                                   # on the GPU machine
    python benchmarks/live_gpu.py --small                           # seconds, on the CPU too: what CI runs
    python benchmarks/live_gpu.py --frames-per-read 1024 256 4096   # reads of other sizes too
    python benchmarks/live_gpu.py --streams bitshuffle_lz4          # the Arina's stream alone
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import qgpu_dask as qd

import record
from load_arina import write_master


def write_frames(path: Path, scan: tuple[int, int], det: int, dose: float) -> None:
    """A (scan_rows, scan_cols, det, det) .npy: ``scan_cols`` Poisson frames, the same in every scan row."""
    rng = np.random.default_rng(3)
    row = rng.poisson(dose, (scan[1], det, det)).astype(np.uint16)
    out = np.lib.format.open_memmap(path, "w+", np.uint16, (*scan, det, det))
    out[:] = row
    out.flush()


def serving(simulate: list[str]) -> tuple[int, subprocess.Popen]:
    """``qgpu-dask simulate`` with the arguments ``simulate`` in a process of its own (as a detector is), on a
    free port; once it says it is serving (its file open, as a detector is before a scan): (port, process)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "qgpu_dask.cli", "simulate", *simulate, "--port", str(port)],
                               stdout=subprocess.PIPE, text=True)
    if "serving" not in process.stdout.readline():
        process.kill()
        raise RuntimeError(f"qgpu-dask simulate {' '.join(simulate)} did not start")
    return port, process


def drained(source: qd.TcpSource, det: int) -> int:
    """Every frame of the stream read as it comes into one reused buffer (not decoded) and dropped: the frames."""
    space = np.empty(0, np.uint8)

    def buffer(nbytes: int) -> np.ndarray:
        nonlocal space
        if space.size < nbytes:
            space = np.empty(nbytes, np.uint8)
        return space[:nbytes]

    return sum(len(b) for b in source.batches((det, det), np.dtype(np.uint16), buffer))


def wire_rate(svc, simulate: list[str], det: int) -> float:
    """Frames per second a bare reader on the worker takes from the simulator: the ingest's two processes
    and socket, nothing decoded or appended."""
    port, process = serving(simulate)
    t0 = time.perf_counter()
    n = svc.client.submit(drained, qd.TcpSource("127.0.0.1", port), det, pure=False).result()
    seconds = time.perf_counter() - t0
    process.wait()
    return n / seconds


def view(acq, det: int, i: int) -> None:
    """The viewer's ``i``-th query: a virtual image of a disk moving across the bright field."""
    acq.virtual_image(qd.masks.disk((det, det), (det / 2 + 10 * det / 192 * np.sin(i / 7), det / 2), det / 8))


def watched(future, acq, det: int) -> int:
    """The viewer's queries on ``acq``, asked one after another until ``future`` (its ingest) is done; how many."""
    views = 0
    while not future.done():
        view(acq, det, views)
        views += 1
    return views


def median_run(runs: int, measure) -> dict:
    """The run with the median ``frames_per_s`` of ``runs`` calls of ``measure()``."""
    results = sorted((measure() for _ in range(runs)), key=lambda r: r["frames_per_s"])
    return results[len(results) // 2]


def ingest(svc, simulate: list[str], scan: tuple[int, int], det: int, viewer: bool, frames_per_read: int) -> dict:
    """One ingest of a scan from ``qgpu-dask simulate`` with the arguments ``simulate``, with or without a
    viewer loop; rates."""
    acq = svc.create(f"live-{time.monotonic_ns()}", scan, (det, det), "uint16")
    port, process = serving(simulate)
    t0 = time.perf_counter()
    future = svc.ingest(qd.TcpSource("127.0.0.1", port, frames_per_read), acq, wait=False)
    views = watched(future, acq, det) if viewer else 0
    result = future.result()
    seconds = time.perf_counter() - t0
    process.wait()
    out = {"frames_per_s": result["received"] / seconds, "GB_per_s": result["received"] * det * det * 2 / seconds / 1e9,
           "views_per_s": views / seconds if viewer else None, "ratio": acq.info()["raw_bytes"] / acq.info()["nbytes"]}
    if viewer:
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < 2.0:
            view(acq, det, n)
            n += 1
        out["views_per_s_finished"] = n / (time.perf_counter() - t0)
    acq.release()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=16384)
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("--det", type=int, default=192)
    ap.add_argument("--dose", type=float, default=0.3)
    ap.add_argument("--streams", nargs="+", choices=["raw", "bitshuffle_lz4"], default=["raw", "bitshuffle_lz4"])
    ap.add_argument("--runs", type=int, default=3, help="runs of each measurement; the median is kept")
    ap.add_argument("--frames-per-read", type=int, nargs="+", default=[1024], help="the first for every measurement, "
                    "the others for ingest with the viewer alone")
    args = record.parse(ap, small={"frames": 256, "repeat": 2, "det": 16, "runs": 1, "frames_per_read": [128], "streams": ["bitshuffle_lz4"]})
    first, *others = args.frames_per_read
    scan = (args.repeat, args.frames)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        streams = {}
        if "raw" in args.streams:
            write_frames(Path(tmp) / "frames.npy", scan, args.det, args.dose)
            streams["raw"] = [str(Path(tmp) / "frames.npy")]
        if "bitshuffle_lz4" in args.streams:
            master, _, _ = write_master(Path(tmp), scan, (args.det, args.det), args.dose, seed=4)
            streams["bitshuffle_lz4"] = [str(master), "--compressed", "--scan-shape", *map(str, scan)]
        results: dict = {"frames": args.frames * args.repeat, "det": args.det, "dose": args.dose, "runs": args.runs,
                         "arina_rate_frames_per_s": 120000}
        with qd.Service.local(n_workers=1) as svc:
            for label, simulate in streams.items():
                ingest(svc, simulate, scan, args.det, False, first)
                wire = statistics.median(wire_rate(svc, simulate, args.det) for _ in range(args.runs))
                print(f"{label} wire: {wire:.0f} frames/s", flush=True)
                alone = median_run(args.runs, lambda: ingest(svc, simulate, scan, args.det, False, first))
                print(f"{label} ingest alone: {alone}", flush=True)
                viewed = median_run(args.runs, lambda: ingest(svc, simulate, scan, args.det, True, first))
                print(f"{label} ingest with viewer: {viewed}", flush=True)
                results[label] = {"wire_frames_per_s": wire, "frames_per_read": first, "alone": alone | {"over_wire": alone["frames_per_s"] / wire},
                                  "with_viewer": viewed | {"over_wire": viewed["frames_per_s"] / wire}}
                for n in others:
                    results[label][f"with_viewer_reading_{n}"] = median_run(args.runs, lambda: ingest(svc, simulate, scan, args.det, True, n))
                    print(f"{label} ingest with viewer, {n} frames a read: {results[label][f'with_viewer_reading_{n}']}", flush=True)
        for key, value in results.items():
            print(f"{key}: {value}")
        record.publish(f"live_{'cuda' if qd.device.has_gpu() else 'cpu'}", results)


if __name__ == "__main__":
    main()
