"""Benchmarks run in their small mode (seconds, what CI runs) and write their JSON where QGPU_DASK_RESULTS points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_cpu_vs_libertem_small(tmp_path):
    env = {**os.environ, "QGPU_DASK_RESULTS": str(tmp_path), "QGPU_DASK_CPU": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "benchmarks/cpu_vs_libertem.py", "--small"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp_path / "cpu_vs_libertem_small.json").read_text())["results"]
    assert results["small"] and results["all_equal"]
    assert results["default_layout"]["layout"] == "dense" and "fits the CPU worker's" in results["default_layout"]["layout_reason"]
    assert set(results["queries"]) == {"virtual_image", "sum_pattern", "center_of_mass"}
    for row in results["queries"].values():
        assert row["default"]["layout"] == "dense" and row["compressed"]["layout"] == "compressed"
    if results["libertem"]:  # LiberTEM importable: its results were compared too, and the targets judged
        assert any(k.startswith("qgpu[1] default virtual_image == libertem") for k in results["equal"]) and results["targets"]
