"""The GPU round: the `gpu`-marked suite, then every benchmark whose tables are stale, within a time budget.

GPU time comes in calls of at most 10 minutes, so a round is planned here, run there in as many calls as it
needs, and collected here after each call:

    python3 .ci/gpu/round.py plan [--steps a b ...]   # here: what is stale, most stale first -> .gpu-round/plan.json
    bash .ci/gpu/run 540                              # there (carry .whl and .gpu-round): run until 540 s are spent
    python3 .ci/gpu/round.py collect DIR              # here: DIR is what came back; results -> benchmarks/results

`plan` needs the history (staleness is `benchmarks/tables.py`'s); `run` needs none and never changes the tree
it measures: results and logs go to $OUT as one archive, with the state of the round, so the next call resumes
where this one stopped. Collected results are committed with the commit they measured (`plan` records it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / ".gpu-round"
RESULTS = ROOT / "benchmarks" / "results"
ARCHIVE = "round.tar.gz"
MARGIN_S = 15  # kept back from the budget for packing the archive


@dataclass(frozen=True)
class Step:
    """A benchmark as the round runs it: its script and arguments, the results files it writes, the figure its
    summary line shows, about how long it takes on one H100/H200 (to decide whether it fits what is left)."""

    script: str
    args: tuple[str, ...]
    results: tuple[str, ...]
    headline: str  # a path in the first results file ("a/b/c")
    seconds: int
    needs: tuple[str, ...] = ()  # Python modules beyond the package's own (peers); the step is skipped without them


# Every GPU benchmark, by the name of its script. Arguments give the docs' full runs (docs/benchmarks.md).
STEPS: dict[str, Step] = {
    "gpu_dense": Step("gpu_dense", ("--check",), ("gpu_dense",), "mask_disk/effective_TBps", 90),
    "reliability": Step("reliability", ("--scan", "96", "96", "--det", "128", "128"), ("reliability_cuda",),
                        "under_load/queries_per_s", 180),
    "load_arina": Step("load_arina", (), ("load_arina_cuda",), "service_load/auto/GBps", 120),
    "live_gpu": Step("live_gpu", ("--streams", "bitshuffle_lz4"), ("live_cuda",), "bitshuffle_lz4/with_viewer/frames_per_s", 150),
    "service_overhead": Step("service_overhead", ("--scan", "256", "256", "--det", "192", "192"), ("service_overhead_cuda",),
                             "round_trip/tiny_virtual_image/p50_ms", 120),
    "series_gpu": Step("series_gpu", (), ("series_gpu",), "doses/0/moving_disk/ms_per_acquisition", 300),
    "live_detectors": Step("live_detectors", (), ("live_detectors_cuda",), "merlin/alone/over_libertem_live", 240,
                           ("libertem_qd_mpx", "libertem_dectris", "libertem_asi_tpx3")),
    "load_series_gpu": Step("load_series_gpu", ("--fill",), ("load_series_gpu",), "saved_reopen/GBps", 300),
    "view_gpu": Step("view_gpu", (), ("view_cuda",), "drag/updates_per_s", 240, ("selenium",)),
    "view_phase_gpu": Step("view_phase_gpu", (), ("view_phase_cuda",), "socket/ssb/p50_ms", 180),
    "ssb_gpu": Step("ssb_gpu", (), ("ssb_cuda",), "first_ssb_ms", 150),
    "direct_gpu": Step("direct_gpu", (), ("direct_cuda",), "phase/prepare_ms", 120),
    "ptycho_gpu": Step("ptycho_gpu", (), ("ptycho_cuda",), "iteration/fed_ms", 300),
    "compressed": Step("compressed", (), ("compressed_cuda",), "moving_disk/ms_per_acquisition_per_step", 300),
    "load_formats": Step("load_formats", (), ("load_formats_cuda",), "formats/mrc/GBps", 240, ("rsciio", "libertem")),
    "run_udf": Step("run_udf", (), ("run_udf_cuda",), "udfs/sum/dense/over_default", 180, ("libertem",)),
    "tensor_rates": Step("tensor_rates", (), ("tensor_rates_cuda",), "tflops/f32_fma", 30),
}
# Benchmarks the round leaves out, and why (a test keeps STEPS and these equal to benchmarks/*.py).
NOT_IN_ROUND = {
    "cpu_vs_libertem": "CPU only: measured on the 2-core machine against LiberTEM",
    "ssb_vs_ptychography40": "CPU only: against ptychography40",
    "first_calls": "CPU only: first calls of a fresh cluster of CPU workers on the 2-core machine, empty and filled Numba cache",
    "multi_gpu": "needs a machine of several GPUs (withheld)",
}
SUITE_SECONDS = 300


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.rstrip()  # a leading space is a status column


def staleness(step: Step) -> tuple[str, str]:
    """(the oldest date among the step's results, why it is to be run) or ("", "") where every table is current."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import tables

    oldest, reasons = "9999", []
    for result in step.results:
        path = RESULTS / f"{result}.json"
        if not path.exists():
            oldest, reasons = "0000", reasons + [f"{result}: never measured"]
            continue
        doc = json.loads(path.read_text())
        note = tables.freshness(str(doc.get("commit") or "unknown"), tuple(tables.MEASURES[step.script]))
        if note:
            oldest = min(oldest, str(doc.get("date", "0000")))
            reasons.append(f"{result}: {note}")
    return ("", "") if not reasons else (oldest, "; ".join(reasons))


def plan(names: list[str] | None, suite: bool) -> dict:
    """The steps to run at HEAD, most stale first (or ``names`` in their order), and the suite; refuses a tree
    with changes to anything but results and docs, since the results must name the code they measured."""
    changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
               if not line[3:].startswith(("benchmarks/results/", "docs/"))]
    if changed:
        raise SystemExit(f"commit first: the round measures a commit, and these files differ from HEAD: {', '.join(changed)}")
    unknown = sorted(set(names or []) - STEPS.keys())
    if unknown:
        raise SystemExit(f"no such step {unknown}; the round knows {sorted(STEPS)}")
    if names:
        steps = [(name, "asked for") for name in names]
    else:
        stale = [(staleness(step), name) for name, step in STEPS.items()]
        steps = [(name, why) for (oldest, why), name in sorted(stale) if why]
    doc = {"commit": git("rev-parse", "HEAD"), "suite": suite,
           "steps": [{"name": name, "why": why} for name, why in steps]}
    STATE.mkdir(exist_ok=True)
    (STATE / "plan.json").write_text(json.dumps(doc, indent=2) + "\n")
    (STATE / "done.json").write_text("{}\n")
    return doc


def missing_modules(step: Step) -> list[str]:
    import importlib.util

    return [m for m in step.needs if importlib.util.find_spec(m) is None]


def suite(seconds: float, logs: Path) -> dict:
    """The `gpu`-marked tests under xdist: counts from pytest's summary line."""
    log = logs / "suite.txt"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-m", "gpu", "-n", "6", "-p", "no:cacheprovider", "tests/"]
    rc, took = timed_run(cmd, seconds, log, os.environ.copy())
    text = log.read_text(errors="replace")
    last = [line for line in text.splitlines() if re.search(r"\b(passed|failed|error)", line) and " in " in line]
    summary = last[-1].strip("= ") if last else f"no summary (exit {rc})"
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)
    return {"status": "passed" if rc == 0 else ("cut" if rc == 124 else "failed"), "seconds": round(took),
            "headline": summary, "failed": failed[:20]}


def timed_run(cmd: list[str], seconds: float, log: Path, env: dict) -> tuple[int, float]:
    """Run ``cmd`` with its output in ``log``, killed (exit 124) after ``seconds``."""
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(seconds, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = 124
    return rc, time.monotonic() - start


def lookup(doc: dict, path: str):
    for key in path.split("/"):
        doc = doc[key] if isinstance(doc, dict) else doc[int(key)]
    return doc


def benchmark(step: Step, seconds: float, work: Path, commit: str) -> dict:
    """One benchmark, its JSON into ``work/results``: its status, time and headline figure."""
    missing = missing_modules(step)
    if missing:
        return {"status": "skipped", "seconds": 0, "headline": f"needs {', '.join(missing)} (carry their wheels)"}
    env = dict(os.environ, QGPU_DASK_RESULTS=str(work / "results"), QGPU_DASK_COMMIT=commit, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    rc, took = timed_run([sys.executable, f"benchmarks/{step.script}.py", *step.args], seconds,
                         work / "logs" / f"{step.script}.txt", env)
    written = [r for r in step.results if (work / "results" / f"{r}.json").exists()]
    status = "done" if rc == 0 and len(written) == len(step.results) else ("cut" if rc == 124 else f"failed (exit {rc})")
    headline = ""
    if written:
        try:
            value = lookup(json.loads((work / "results" / f"{step.results[0]}.json").read_text())["results"], step.headline)
            headline = f"{step.headline} = {value if not isinstance(value, float) else f'{value:.4g}'}"
        except (KeyError, IndexError, ValueError, TypeError):
            headline = f"{step.headline}: not in its JSON"
    return {"status": status, "seconds": round(took), "headline": headline}


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "no GPU seen"


def pack(out: Path, work: Path) -> None:
    with tarfile.open(out / (ARCHIVE + ".part"), "w:gz") as tar:
        tar.add(work, arcname=".")
    (out / (ARCHIVE + ".part")).rename(out / ARCHIVE)


def run(budget: float, out: Path) -> int:
    """Run what the plan has left until ``budget`` seconds are spent; the archive in ``out`` after every step."""
    start = time.monotonic()
    if not (STATE / "plan.json").exists():
        raise SystemExit("no .gpu-round/plan.json: run `python3 .ci/gpu/round.py plan` here and carry .gpu-round")
    doc = json.loads((STATE / "plan.json").read_text())
    done = json.loads((STATE / "done.json").read_text()) if (STATE / "done.json").exists() else {}
    work = Path(tempfile.mkdtemp(prefix="qgpu-gpu-round-"))  # packed into ``out`` after each step (8 files come back)
    (work / "results").mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    gpu = gpu_name()
    print(f"round at {doc['commit'][:7]} on {gpu}, budget {budget:.0f} s", flush=True)
    todo = (["suite"] if doc["suite"] else []) + [s["name"] for s in doc["steps"]]
    left = []
    for name in todo:
        status = done.get(name, {}).get("status", "")
        if status in ("passed", "done") or status.startswith("failed"):  # a skipped step runs once its peers come
            continue
        remaining = budget - (time.monotonic() - start) - MARGIN_S
        expected = SUITE_SECONDS if name == "suite" else STEPS[name].seconds
        if done.get(name, {}).get("status") == "cut":
            expected = max(expected, done[name]["seconds"] * 1.5)
        if expected > remaining:
            left.append(name)
            continue
        result = suite(remaining, work / "logs") if name == "suite" else benchmark(STEPS[name], remaining, work, doc["commit"])
        done[name] = dict(result, gpu=gpu)
        print(f"{name}: {result['status']} in {result['seconds']} s; {result['headline']}", flush=True)
        (work / "done.json").write_text(json.dumps(done, indent=2) + "\n")
        pack(out, work)
    (work / "done.json").write_text(json.dumps(done, indent=2) + "\n")
    pack(out, work)
    print(f"left for the next call: {', '.join(left) or 'nothing'}", flush=True)
    return 0


def collect(came_back: Path) -> int:
    """Unpack a call's archive: its results into benchmarks/results (those of the planned commit), its logs and
    state into .gpu-round, so that the next call resumes. Its steps join those collected before (a call made
    before the last one was collected still counts what the earlier one did)."""
    doc = json.loads((STATE / "plan.json").read_text())
    archive = came_back / ARCHIVE if came_back.is_dir() else came_back
    target = STATE / "last"
    shutil.rmtree(target, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    for result in sorted((target / "results").glob("*.json")):
        measured = json.loads(result.read_text())
        if measured.get("commit") != doc["commit"]:
            print(f"{result.name}: measured {measured.get('commit')}, not the planned {doc['commit'][:7]}: left out")
            continue
        shutil.copy(result, RESULTS / result.name)
        print(f"{result.name} -> benchmarks/results")
    logs = STATE / "logs"
    logs.mkdir(exist_ok=True)
    for log in (target / "logs").glob("*.txt"):
        shutil.copy(log, logs / log.name)
    before = json.loads((STATE / "done.json").read_text()) if (STATE / "done.json").exists() else {}
    done = before | json.loads((target / "done.json").read_text())
    (STATE / "done.json").write_text(json.dumps(done, indent=2) + "\n")
    for name, result in done.items():
        print(f"{name}: {result['status']} in {result['seconds']} s on {result['gpu']}; {result['headline']}")
    todo = (["suite"] if doc["suite"] else []) + [s["name"] for s in doc["steps"]]
    left = [n for n in todo if n not in done or done[n]["status"] in ("cut", "skipped")]
    print(f"left: {', '.join(left) or 'nothing'}; then `python benchmarks/tables.py` and commit the results")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("plan", help="here: what to run, most stale first")
    p.add_argument("--steps", nargs="+", help="run these benchmarks (in this order) whether stale or not")
    p.add_argument("--no-suite", action="store_true", help="leave the gpu-marked suite out")
    r = sub.add_parser("run", help="there: run what the plan has left within the budget")
    r.add_argument("budget", type=float, help="seconds this call may spend")
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-round-out")))
    c = sub.add_parser("collect", help="here: take in what a call brought back")
    c.add_argument("came_back", type=Path, help="the folder the call's files came back to, or its archive")
    sub.add_parser("list", help="every step and why it would run")
    args = ap.parse_args()
    if args.verb == "plan":
        doc = plan(args.steps, not args.no_suite)
        for s in doc["steps"]:
            print(f"{s['name']}: {s['why']}")
        total = (SUITE_SECONDS if doc["suite"] else 0) + sum(STEPS[s["name"]].seconds for s in doc["steps"])
        print(f"planned at {doc['commit'][:7]}: {'suite + ' if doc['suite'] else ''}{len(doc['steps'])} benchmarks, about {total} s")
        return 0
    if args.verb == "run":
        args.out.mkdir(parents=True, exist_ok=True)
        return run(args.budget, args.out)
    if args.verb == "collect":
        return collect(args.came_back)
    for name, step in STEPS.items():
        print(f"{name}: {staleness(step)[1] or 'current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
