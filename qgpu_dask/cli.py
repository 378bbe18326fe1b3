"""The ``qgpu-dask`` command: ``demo`` (the main job), ``info`` (the shards of a running cluster) and ``simulate``
(a detector replaying an acquisition file as a frame stream)."""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from . import masks
from .formats.png import save_png
from .io.source import Source
from .io.stream import serve
from .io.synthetic import crystal, crystal_geometry
from .service import Service


def timed(fn, repeat: int = 5) -> tuple[object, float]:
    """fn's result and its median wall time in ms over ``repeat`` calls."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return result, statistics.median(times)


def demo(args: argparse.Namespace) -> int:
    """A synthetic crystal series through the embedded cluster, checked against NumPy, written as PNG."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scan, det = tuple(args.scan), tuple(args.det)
    t0 = time.perf_counter()
    cluster_kwargs = {} if args.workers is None else {"n_workers": args.workers}
    with Service.local(**cluster_kwargs) as svc:
        shards = svc.info()["shards"]
        n = args.frames or max(2, len(shards))
        print(f"cluster: {len(shards)} shard(s) on {shards[0]['device']['kind']} ({time.perf_counter() - t0:.1f} s to start)")

        paths = []
        for i in range(n):
            path = out / f"crystal-{i}.h5"
            with h5py.File(path, "w") as f:
                f.create_dataset("/entry/data", data=crystal(scan, det, "uint16", dose=args.dose, seed=i), chunks=(1, scan[1]) + det)
            paths.append(path)
        acq_bytes = np.prod(scan + det) * 2
        print(f"wrote {n} synthetic crystal acquisitions {scan[0]}x{scan[1]}x{det[0]}x{det[1]} uint16 ({acq_bytes / 2**20:.1f} MiB each) to {out}/")

        t0 = time.perf_counter()
        for a in svc.acquisitions():
            if a.name.startswith("crystal-"):
                a.release()
        series = svc.load(paths, dataset="/entry/data")
        print(f"loaded across {len({a.owner for a in series})} shard(s) in {time.perf_counter() - t0:.2f} s")
        held = series[0].info()
        if held["layout"] == "compressed":
            print(f"held compressed ({held['format']}): {held['ratio']:.1f}x smaller than raw, "
                  f"{held['bound_ratio']:.2f}x the entropy bound of its counts")

        geo = crystal_geometry(det)
        detectors = {
            "bf": masks.disk(det, geo.center, geo.bf_radius),
            "abf": masks.annulus(det, geo.center, geo.bf_radius / 2, geo.bf_radius),
            "adf": masks.annulus(det, geo.center, geo.adf_inner, geo.adf_outer),
        }
        stack = list(detectors.values())
        images, t_series = timed(lambda: series.virtual_images(stack))
        first = series[0]
        _, t_one = timed(lambda: first.virtual_image(detectors["bf"]))
        roi = np.zeros(scan, bool)
        roi[: scan[0] // 2, : scan[1] // 2] = True
        mean, t_mean = timed(lambda: first.reduce(roi, "mean"))

        with h5py.File(paths[0], "r") as f:
            data = f["/entry/data"][...]
        exact = all(
            (images[0, k] == (data.astype(np.uint64) * m).sum(axis=(2, 3))).all() for k, m in enumerate(stack)
        ) and (mean == data[roi].mean(axis=0, dtype=np.float64)).all()

        for k, name in enumerate(detectors):
            save_png(images[0, k], out / f"{name}.png")
        save_png(mean, out / "mean_pattern.png", log=True)

        print(f"virtual images BF/ABF/ADF of the series ({n} x 3): {t_series:.1f} ms; one BF image: {t_one:.2f} ms")
        print(f"scan-ROI mean pattern ({int(roi.sum())} positions): {t_mean:.2f} ms")
        print(f"exact against NumPy: {'yes' if exact else 'NO'}")
        print(f"images: {', '.join(str(out / f'{k}.png') for k in detectors)}, {out / 'mean_pattern.png'}")
        print(svc.info())
        series.release()
    return 0 if exact else 1


def info(args: argparse.Namespace) -> int:
    """Print the shards and acquisitions of a running cluster; one line on stderr (exit 1) if none answers."""
    try:
        svc = Service.connect(args.address, scheduler_file=args.scheduler_file)
    except (OSError, ValueError) as err:
        print(f"qgpu-dask info: {err}", file=sys.stderr)
        return 1
    with svc:
        print(svc.info())
    return 0


def simulate(args: argparse.Namespace) -> int:
    """Serve ``args.file`` as a qgpu-frames-1 stream to the first client on ``args.port`` at ``args.rate`` Hz."""
    source = Source(str(args.file), args.dataset, tuple(args.scan_shape) if args.scan_shape else None)

    def ready() -> None:  # listening, the first frames read
        print(f"serving {args.file} on {args.host}:{args.port}" + (f" at {args.rate:g} frames/s" if args.rate else ""), flush=True)

    with socket.create_server((args.host, args.port)) as listener:
        sent, seconds = serve(source, listener, args.rate, compressed=args.compressed, ready=ready)
    print(f"sent {sent} frames in {seconds:.2f} s from the client's connection ({sent / max(seconds, 1e-9):.0f} frames/s)")
    return 0


def parser() -> argparse.ArgumentParser:
    """The command's argument parser (the docs' tests check their command lines with it)."""
    parser = argparse.ArgumentParser(prog="qgpu-dask", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="synthetic crystal series on the embedded cluster: virtual images, checked, as PNG")
    p.add_argument("--scan", type=int, nargs=2, default=(96, 96), metavar=("ROWS", "COLS"))
    p.add_argument("--det", type=int, nargs=2, default=(96, 96), metavar=("ROWS", "COLS"))
    p.add_argument("--dose", type=float, default=2000.0, help="electrons per probe position")
    p.add_argument("--frames", type=int, default=None, help="acquisitions in the series (default: one per shard, at least 2)")
    p.add_argument("--workers", type=int, default=None, help="workers of the embedded cluster")
    p.add_argument("--out", default="demo-output", help="folder for the files and PNG images")
    p.set_defaults(run=demo)
    p = sub.add_parser("info", help="shards and acquisitions of a running cluster")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--address", help="scheduler address, e.g. tcp://host:8786")
    where.add_argument("--scheduler-file", help="scheduler file written by `dask scheduler --scheduler-file`")
    p.set_defaults(run=info)
    p = sub.add_parser("simulate", help="a detector: replay an acquisition file as a frame stream over TCP (svc.ingest reads it)")
    p.add_argument("file", help="any file svc.load reads")
    p.add_argument("--rate", type=float, default=None, help="frames per second (default: as fast as it goes)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--dataset", default=None, help="the HDF5 dataset (default: found)")
    p.add_argument("--scan-shape", type=int, nargs=2, default=None, metavar=("ROWS", "COLS"), help="for 3-D stacks")
    p.add_argument("--compressed", action="store_true", help="send an Arina/Eiger master's bitshuffle-LZ4 chunks as they are stored")
    p.set_defaults(run=simulate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
