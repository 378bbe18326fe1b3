"""Ruff's lint (pyproject's [tool.ruff]) over the package, tests, benchmarks and CI scripts: an unused import, an
undefined name or a syntax error fails the suite, not a reviewer's eye."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install '.[test]'")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "qgpu_dask", "tests", "benchmarks", ".ci"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
