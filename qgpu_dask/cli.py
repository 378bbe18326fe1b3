"""The ``qgpu-dask`` command: ``demo`` (the main job), ``info`` (the shards of a running cluster), ``simulate``
(a detector replaying an acquisition file as a frame stream) and ``view`` (the viewer as a web page)."""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import signal
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

from .detector import masks
from .figure import figure
from .io.registry import open_reader
from .io.source import Source
from .io.simulator import serve
from .io.synthetic import crystal, crystal_geometry
from .service import Service
from .service.service import scheduler_address
from .phase.calibration import icom
from .phase.optics import Optics


def timed(fn, repeat: int = 5) -> tuple[object, float]:
    """fn's result and its median wall time in ms over ``repeat`` calls."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return result, statistics.median(times)


CHECK_BYTES = 64 * 2**20  # uint64 counts the demo's check holds at once


def block_rows(scan_cols: int, frame_len: int) -> int:
    """Scan rows whose counts take at most CHECK_BYTES as uint64 (at least one)."""
    return max(1, CHECK_BYTES // (scan_cols * frame_len * 8))


def write_crystal(path: Path, scan: tuple[int, int], det: tuple[int, int], dose: float, seed: int) -> None:
    """A synthetic crystal acquisition as /entry/data of an HDF5 file, written a few scan rows at a time."""
    rows = block_rows(scan[1], det[0] * det[1])
    with h5py.File(path, "w") as f:
        data = f.create_dataset("/entry/data", shape=scan + det, dtype="uint16", chunks=(1, scan[1]) + det)
        for r0 in range(0, scan[0], rows):
            r1 = min(r0 + rows, scan[0])
            data[r0:r1] = crystal(scan, det, "uint16", dose=dose, seed=seed, rows=(r0, r1))


def exact_against_numpy(path: Path, images: np.ndarray, stack: list[np.ndarray], roi: np.ndarray, mean: np.ndarray) -> bool:
    """Whether ``images`` (one per mask of ``stack``) and the ROI ``mean`` equal NumPy's of the file's counts,
    read a few scan rows at a time (uint64 per block only, never the whole acquisition)."""
    weights = np.stack([m.ravel() for m in stack], axis=1).astype(np.uint64)
    total = None
    with h5py.File(path, "r") as f:
        data = f["/entry/data"]
        scan_cols, frame_len = data.shape[1], data.shape[2] * data.shape[3]
        rows = block_rows(scan_cols, frame_len)
        for r0 in range(0, data.shape[0], rows):
            block = data[r0 : r0 + rows].reshape(-1, frame_len).astype(np.uint64)
            n = block.shape[0] // scan_cols
            if not (images[:, r0 : r0 + n] == (block @ weights).T.reshape(len(stack), n, scan_cols)).all():
                return False
            part = block[roi[r0 : r0 + n].ravel()].sum(axis=0, dtype=np.uint64)
            total = part if total is None else total + part
    return bool((mean == (total.astype(np.float64) / int(roi.sum())).reshape(mean.shape)).all())


def demo(args: argparse.Namespace) -> int:
    """A synthetic crystal series through the embedded cluster, checked against NumPy, drawn as one figure."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scan, det = tuple(args.scan), tuple(args.det)
    t0 = time.perf_counter()
    cluster_kwargs = {} if args.workers is None else {"n_workers": args.workers}
    paths: list[Path] = []
    try:
        with Service.local(**cluster_kwargs) as svc:
            shards = svc.info()["shards"]
            n = args.frames or max(2, len(shards))
            print(f"cluster: {len(shards)} shard(s) on {shards[0]['device']['kind']} ({time.perf_counter() - t0:.1f} s to start)")

            for i in range(n):
                paths.append(out / f"crystal-{i}.h5")
                write_crystal(paths[-1], scan, det, args.dose, i)
            acq_bytes = np.prod(scan + det) * 2
            print(f"wrote {n} synthetic crystal acquisitions {scan[0]}x{scan[1]}x{det[0]}x{det[1]} uint16 ({acq_bytes / 2**20:.1f} MiB each) to {out}/")

            t0 = time.perf_counter()
            for a in svc.acquisitions():
                if a.name.startswith("crystal-"):
                    a.release()
            series = svc.load(paths, dataset="/entry/data", layout=args.layout)
            print(f"loaded across {len({a.owner for a in series})} shard(s) in {time.perf_counter() - t0:.2f} s")
            held = series[0].info()
            if held["layout"] == "compressed":
                print(f"held compressed ({held['format']}): {held['ratio']:.1f}x smaller than raw")

            geo = crystal_geometry(det)
            detectors = {
                "BF": masks.disk(det, geo.center, geo.bf_radius),
                "ABF": masks.annulus(det, geo.center, geo.abf_inner, geo.bf_radius),
                "ADF": masks.annulus(det, geo.center, geo.adf_inner, geo.adf_outer),
            }
            stack = list(detectors.values())
            images, t_series = timed(lambda: series.virtual_images(stack))
            first = series[0]
            _, t_one = timed(lambda: first.virtual_image(detectors["BF"]))
            roi = np.zeros(scan, bool)
            roi[: scan[0] // 2, : scan[1] // 2] = True
            mean, t_mean = timed(lambda: first.reduce(roi, "mean"))
            com = first.center_of_mass()
            exact = exact_against_numpy(paths[0], images[0], stack, roi, mean)

            picture = figure(
                out / "demo.png",
                {f"{k} ({m.sum()} px)": images[0, i] for i, (k, m) in enumerate(detectors.items())},
                com, icom(com, 1.0), mean,
                title=f"{first.name}: {scan[0]}x{scan[1]} scan x {det[0]}x{det[1]} detector (synthetic crystal)",
                mean_title="mean pattern, top-left quarter (log)",
            )
            print(f"virtual images BF/ABF/ADF of the series ({n} x 3): {t_series:.1f} ms; one BF image: {t_one:.2f} ms")
            print(f"scan-ROI mean pattern ({int(roi.sum())} positions): {t_mean:.2f} ms")
            print(f"exact against NumPy: {'yes' if exact else 'NO'}")
            print(f"figure: {picture}")
            print(svc.info())
            series.release()
    finally:
        if not args.keep:
            for path in paths:
                path.unlink(missing_ok=True)
    if paths:
        print(f"kept the HDF5 files in {out}/" if args.keep else "removed the HDF5 files it wrote (--keep keeps them)")
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


def view(args: argparse.Namespace) -> int:
    """Serve the viewer for every acquisition of a running cluster until interrupted (Ctrl-C or SIGTERM)."""
    from .view.server import ViewServer

    try:
        svc = Service.connect(args.address, scheduler_file=args.scheduler_file)
    except (OSError, ValueError) as err:
        print(f"qgpu-dask view: {err}", file=sys.stderr)
        return 1
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    with svc, ViewServer(svc, args.host, args.port, args.token, args.optics) as server:
        print(f"viewer of {len(svc.acquisitions())} acquisitions at {server.url}", flush=True)
        try:
            while not stop[0]:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
    return 0


def simulate(args: argparse.Namespace) -> int:
    """Serve ``args.file`` as a qgpu-frames-1 stream to the first client on ``args.port`` at ``args.rate`` Hz."""
    source = Source(str(args.file), args.dataset, tuple(args.scan_shape) if args.scan_shape else None)

    def ready() -> None:  # listening, the first frames read
        print(f"serving {args.file} on {args.host}:{args.port}" + (f" at {args.rate:g} frames/s" if args.rate else ""), flush=True)

    with listening(args.host, args.port) as listener:
        sent, seconds = serve(source, listener, args.rate, compressed=args.compressed, ready=ready)
    print(f"sent {sent} frames in {seconds:.2f} s from the client's connection ({sent / max(seconds, 1e-9):.0f} frames/s)")
    return 0


class BadArgument(Exception):
    """An argument that cannot work, found before anything starts: one line naming it and what to do, exit 2."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (exit 2) rather than the usage and then the error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def at_least(low: int, what: str) -> Callable[[str], int]:
    """An argument type: an integer of ``low`` or more; ``what`` says what to give."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer: give {what}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}: give {what}")
        return value

    return parse


def positive(text: str) -> float:
    """An argument type: a finite number above zero."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number above 0: give one")
    return value


def port_number(text: str) -> int:
    """An argument type: a TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give 0 to 65535 (0: any free one)")
    return value


def listening(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port``; BadArgument naming --host or --port where there can be none."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise BadArgument(f"--host {host}: not an address of this machine ({err.strerror}): give its name or IP address") from None
    try:
        return socket.create_server((host, port))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise BadArgument(f"--port {port}: {host}:{port} is in use: give another port, or 0 for any free one") from None
        raise BadArgument(f"--port {port}: cannot listen on {host}:{port} ({os.strerror(err.errno) if err.errno else err}): "
                          "give another --host or --port") from None


def check_scheduler_file(args: argparse.Namespace) -> None:
    """BadArgument unless ``--scheduler-file`` (where given) is a scheduler file; it is not read whole to find out."""
    if args.scheduler_file is not None:
        try:
            scheduler_address(args.scheduler_file)
        except (OSError, ValueError) as err:
            raise BadArgument(f"--scheduler-file: {err}") from None


def check_demo(args: argparse.Namespace) -> None:
    """The output folder can be one (the numbers were checked as they were parsed)."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise BadArgument(f"--out {args.out}: it is a file, not a folder: give a folder (made if missing)")


def check_view(args: argparse.Namespace) -> None:
    """The scheduler file, the port and the optics (``args.optics`` becomes the Optics its file gives)."""
    check_scheduler_file(args)
    listening(args.host, args.port).close()  # the viewer's server takes it once connected
    if args.optics:
        try:
            args.optics = Optics(**json.loads(Path(args.optics).read_text()))
        except (OSError, ValueError, TypeError) as err:
            raise BadArgument(f"--optics {args.optics}: {err}: give a JSON file of qd.Optics keyword arguments") from None


def check_simulate(args: argparse.Namespace) -> None:
    """The file opens (its format, shape and dtype found) before the port is taken."""
    try:
        open_reader(Source(str(args.file), args.dataset, tuple(args.scan_shape) if args.scan_shape else None)).close()
    except (OSError, ValueError, KeyError) as err:
        raise BadArgument(err.args[0] if isinstance(err, KeyError) else str(err)) from None


def parser() -> argparse.ArgumentParser:
    """The command's argument parser (the docs' tests check their command lines with it)."""
    parser = Parser(prog="qgpu-dask", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="synthetic crystal series on the embedded cluster: virtual images, checked, drawn as one figure")
    p.add_argument("--scan", type=at_least(1, "scan rows and cols of 1 or more"), nargs=2, default=(96, 96), metavar=("ROWS", "COLS"))
    p.add_argument("--det", type=at_least(8, "a detector of 8 x 8 pixels or more"), nargs=2, default=(96, 96), metavar=("ROWS", "COLS"))
    p.add_argument("--dose", type=positive, default=2000.0, help="electrons per probe position")
    p.add_argument("--frames", type=at_least(1, "1 or more acquisitions"), default=None,
                   help="acquisitions in the series (default: one per shard, at least 2)")
    p.add_argument("--workers", type=at_least(1, "1 or more workers"), default=None, help="workers of the embedded cluster")
    p.add_argument("--out", default="demo-output", help="folder for the HDF5 files and the figure demo.png")
    p.add_argument("--layout", default="compressed", choices=("compressed", "dense", "auto"),
                   help="how the workers hold the series (compressed: the smallest; see svc.load)")
    p.add_argument("--keep", action="store_true", help="keep the HDF5 files it wrote (removed at the end otherwise)")
    p.set_defaults(run=demo, check=check_demo)
    p = sub.add_parser("info", help="shards and acquisitions of a running cluster")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--address", help="scheduler address, e.g. tcp://host:8786")
    where.add_argument("--scheduler-file", help="scheduler file written by `dask scheduler --scheduler-file`")
    p.set_defaults(run=info, check=check_scheduler_file)
    p = sub.add_parser("simulate", help="a detector: replay an acquisition file as a frame stream over TCP (svc.ingest reads it)")
    p.add_argument("file", help="any file svc.load reads")
    p.add_argument("--rate", type=positive, default=None, help="frames per second (default: as fast as it goes)")
    p.add_argument("--port", type=port_number, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--dataset", default=None, help="the HDF5 dataset (default: found)")
    p.add_argument("--scan-shape", type=int, nargs=2, default=None, metavar=("ROWS", "COLS"), help="for 3-D stacks")
    p.add_argument("--compressed", action="store_true", help="send an Arina/Eiger master's bitshuffle-LZ4 chunks as they are stored")
    p.set_defaults(run=simulate, check=check_simulate)
    p = sub.add_parser("view", help="the viewer as a web page for every acquisition of a running cluster")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--address", help="scheduler address, e.g. tcp://host:8786")
    where.add_argument("--scheduler-file", help="scheduler file written by `dask scheduler --scheduler-file`")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (loopback unless told)")
    p.add_argument("--port", type=port_number, default=8790, help="port (0: any free one)")
    p.add_argument("--token", default=None, help="the token every page must carry (default: made up, and printed in the URL)")
    p.add_argument("--optics", default=None, help="JSON file of qd.Optics keyword arguments (CoM, iCoM, SSB images, scale bars)")
    p.set_defaults(run=view, check=check_view)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command of ``argv``; its arguments are checked first, and a bad one is one line on stderr, exit 2."""
    args = parser().parse_args(argv)
    try:
        args.check(args)
        return args.run(args)
    except BadArgument as err:
        print(f"qgpu-dask {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
