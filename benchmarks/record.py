"""Write a benchmark result as JSON with the commit, machine and date beside the figures."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SMALL = {"on": False}


def parse(parser: argparse.ArgumentParser, small: dict) -> argparse.Namespace:
    """Add ``--small`` to ``parser`` and parse: with it, ``small``'s values become the defaults (tiny shapes,
    few repeats: seconds on a 2-core CPU machine, what CI runs; flags given still win) and results are written
    as ``<name>_small.json``, which the docs' tables never read."""
    parser.add_argument("--small", action="store_true", help="tiny shapes and few repeats (seconds on 2 CPU cores; CI runs it)")
    if parser.parse_known_args()[0].small:
        parser.set_defaults(**small)
    args = parser.parse_args()
    SMALL["on"] = args.small
    return args


def commit() -> str:
    """QGPU_DASK_COMMIT when set (a copied tree on another machine may carry a stale .git), else the
    checked-out commit (with '+dirty' when the tree has changes), or 'unknown'."""
    if os.environ.get("QGPU_DASK_COMMIT"):
        return os.environ["QGPU_DASK_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict:
    """CPU, core count and, where CuPy sees one, the GPU."""
    info = {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception:
        info["gpu"] = None
    return info


def write(name: str, results: dict, out_dir: str | os.PathLike | None = None) -> Path:
    """Save ``results`` as ``<name>.json`` (``<name>_small.json`` in small mode) with commit, machine and UTC
    date in ``out_dir``, else QGPU_DASK_RESULTS, else benchmarks/results/; return the path."""
    out = Path(out_dir or os.environ.get("QGPU_DASK_RESULTS") or RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{name}_small" if SMALL["on"] and not name.endswith("_small") else name
    doc = {
        "benchmark": name,
        "commit": commit(),
        "machine": machine(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "results": results,
    }
    path = out / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def publish(name: str, results: dict) -> Path:
    """:func:`write` the results, print them a line per key and where they went."""
    out = write(name, results)
    for key, value in results.items():
        print(f"{key}: {value}")
    print(f"wrote {out}")
    return out


def reported(path: Path, lines: list[str], checks: dict[str, bool]) -> int:
    """Print a run's readable lines and where its JSON went; the exit status: 1 (naming them) if a check failed."""
    print("\n".join(["", *lines, "", f"results: {path}"]))
    if not all(checks.values()):
        print("CHECK FAILED:", [k for k, v in checks.items() if not v])
        return 1
    return 0
