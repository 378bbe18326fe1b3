"""Every benchmark runs in its small mode and writes the fields the docs' tables read; the docs' tables are
what benchmarks/results/*.json give (benchmarks/tables.py --check), also in a shallow clone.

Each ``python benchmarks/X.py --small`` runs as a subprocess on CPU workers (DASK_QGPU__CPU=True) and, where CuPy
sees a GPU, again on the GPU (marked ``gpu``), writing its JSON into a temporary QGPU_DASK_RESULTS and its files
into a temporary TMPDIR: the system's temporary folder gets nothing of qgpu's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import cupy_available

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import tables  # noqa: E402

HELPERS = {"record", "tables", "timing"}  # modules the benchmarks share, not benchmarks
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem not in HELPERS)
# What a small run may skip, saying so in its JSON's "skipped": every figure of the CUDA-only benchmarks on CPU
# workers, and the other project's side of a comparison where that project is not installed.
CUDA_ONLY = {"gpu_dense", "tensor_rates"}
CPU_ONLY = {"cpu_vs_libertem"}  # a comparison of CPU workers, on any machine
# The other project's fields: those with a part ("a/b/c") that starts with one of these.
OTHER_PROJECT = {"ssb_vs_ptychography40": ("ptychography40", "phases_correlation", "first_over_udf", "repeat_over_udf"),
                 "cpu_vs_libertem": ("libertem", "all_equal")}
NEEDS_BROWSER = {"view_gpu"}  # benchmarks measured in headless chromium only (view_phase_gpu reads the socket without one)
NEEDS_SIMULATORS = {"live_detectors"}  # benchmarks fed by LiberTEM-live's detector simulators (programs beside Python)
# Figures read from JSON that an earlier version of the benchmark wrote (its layout since changed).
EARLIER_LAYOUT = {"multi_gpu_256", "multi_gpu_512"}


def gpus() -> int:
    if not cupy_available():
        return 0
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def params():
    for script in SCRIPTS:
        yield pytest.param(script, "cpu", id=f"{script}-cpu")
        if script in CPU_ONLY:
            continue
        need = 2 if script == "multi_gpu" else 1
        yield pytest.param(script, "gpu", id=f"{script}-gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
            gpus() < need, reason=f"needs CuPy and {need} GPU(s)")])


def read_fields(script: str) -> list[str]:
    """Every results path the docs' tables and figures read from this benchmark's JSON."""
    out = set()
    for item in tables.TABLES:
        if item.benchmark == script and item.name not in EARLIER_LAYOUT:
            for cells in item.rows if isinstance(item, tables.Table) else [item.parts]:
                out.update(tables.fields(cells))
    return sorted(out)


@pytest.mark.parametrize("script,backend", list(params()))
def test_small_run_writes_the_fields_the_tables_read(script, backend, tmp_path, request):
    source = (ROOT / "benchmarks" / f"{script}.py").read_text()
    if "--small" not in source and "record.parse" not in source:
        pytest.skip(f"benchmarks/{script}.py has no --small yet")
    if script in NEEDS_BROWSER and not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip(f"benchmarks/{script}.py drives chromium: apt-get install chromium chromium-driver")
    if script in NEEDS_SIMULATORS and not (Path(sys.executable).parent / "libertem-live-mib-sim").exists():
        pytest.skip(f"benchmarks/{script}.py is fed by LiberTEM-live's simulators: pip install 'libertem-live[sim]'")
    system_temp = Path(tempfile.gettempdir())
    # short: chromium's singleton socket under TMPDIR must fit a Unix socket path (108 bytes)
    temp = Path(tempfile.mkdtemp(prefix="bench-", dir=system_temp))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    before = {p.name for p in system_temp.glob("qgpu*")}
    env = {**os.environ, "QGPU_DASK_RESULTS": str(tmp_path), "TMPDIR": str(temp),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if backend == "cpu":
        env["DASK_QGPU__CPU"] = "True"
    else:
        env.pop("DASK_QGPU__CPU", None)
    run = subprocess.run([sys.executable, f"benchmarks/{script}.py", "--small"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, f"benchmarks/{script}.py --small failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    left = sorted({p.name for p in system_temp.glob("qgpu*")} - before)
    assert not left, f"benchmarks/{script}.py --small left {left} in {system_temp}: write under tempfile.gettempdir()"
    written = list(tmp_path.glob("*.json"))
    assert len(written) == 1, f"benchmarks/{script}.py --small wrote {written}, not one JSON"
    doc = json.loads(written[0].read_text())
    assert {"benchmark", "commit", "date", "machine", "results"} <= doc.keys()
    results = doc["results"]
    wanted = read_fields(script)
    assert wanted, f"no table in benchmarks/tables.py reads {script}'s results"
    if results.get("skipped"):
        assert (script in CUDA_ONLY and backend == "cpu") or script in OTHER_PROJECT, f"{script} on {backend} skipped {results['skipped']}"
        wanted = [] if script in CUDA_ONLY else [f for f in wanted if not any(part.startswith(OTHER_PROJECT[script]) for part in f.split("/"))]
    missing = []
    for path in wanted:
        try:
            tables.lookup(results, path)
        except KeyError:
            missing.append(path)
    assert not missing, f"{written[0].name} lacks fields the docs' tables read: {missing}"


def test_figures_older_than_a_change_of_the_code_they_measure_are_marked_stale():
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if shallow != "false":
        pytest.skip("needs the repository's history")
    path = "qgpu_dask/device.py"
    latest = tables.git("log", "-1", "--format=%H", "--", path)
    before = tables.git("rev-parse", f"{latest}~1")
    assert tables.freshness(latest, (path,)) == ""
    assert tables.freshness(before, (path,)) == f"stale: {path} changed after these figures, last at {latest[:7]}"
    assert tables.freshness(before, ()) == ""  # a benchmark measuring no package code never goes stale
    assert tables.freshness(latest + "+dirty", (path,)) == f"measured on a tree with uncommitted changes ({latest[:7]}+dirty)"
    assert tables.freshness("unknown", (path,)) == "commit unknown: these figures cannot be placed in the history"
    assert tables.freshness("0" * 40, (path,)) == tables.UNAVAILABLE


def test_docs_tables_are_what_the_results_give():
    run = subprocess.run([sys.executable, "benchmarks/tables.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_check_in_a_shallow_clone_compares_figures_without_history(tmp_path):
    """CI's fresh clone may be shallow: staleness cannot be told there, the figures still are compared."""
    if shutil.which("git") is None or subprocess.run(["git", "status"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("needs git and a repository")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{ROOT}", str(clone)], check=True, capture_output=True)
    for name in ("benchmarks", "docs"):  # the working tree's, as committed or not
        shutil.rmtree(clone / name)
        shutil.copytree(ROOT / name, clone / name, ignore=shutil.ignore_patterns("__pycache__", "*_small.json"))
    check = [sys.executable, "benchmarks/tables.py", "--check"]
    run = subprocess.run(check, cwd=clone, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    page = clone / "docs" / "benchmarks.md"
    text = page.read_text()
    at = text.index("<!-- table: gpu_dense -->")
    row = text.index("| virtual image, disk mask |", at)
    page.write_text(text[:row] + text[row:].replace("| virtual image, disk mask |", "| virtual image, disk mask (hand-typed) |", 1))
    run = subprocess.run(check, cwd=clone, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "docs/benchmarks.md: gpu_dense" in run.stderr and "run python benchmarks/tables.py" in run.stderr


def test_gpu_round_knows_every_benchmark():
    """.ci/gpu/round.py runs every benchmark but those it names as left out, each writing the results files the
    docs' tables read of it, and its summary figure is a field of the committed JSON."""
    sys.path.insert(0, str(ROOT / ".ci" / "gpu"))
    import round as gpu_round

    assert sorted(gpu_round.STEPS.keys() | gpu_round.NOT_IN_ROUND.keys()) == SCRIPTS
    assert not gpu_round.STEPS.keys() & gpu_round.NOT_IN_ROUND.keys()
    for name, step in gpu_round.STEPS.items():
        assert step.script == name
        read = {item.result for item in tables.TABLES if item.benchmark == name}
        assert set(step.results) <= read, f"{name}: {step.results} not among the tables' {read}"
        path = ROOT / "benchmarks" / "results" / f"{step.results[0]}.json"
        if path.exists():
            gpu_round.lookup(json.loads(path.read_text())["results"], step.headline)
