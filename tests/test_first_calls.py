"""First calls: compiled kernels are cached in the user's cache folder across processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import qgpu_dask as qd

ROOT = Path(__file__).resolve().parents[1]
# compiles (or loads) one small kernel; prints its cache misses and hits and the folder it caches in
ONE_KERNEL = """
import numpy as np, qgpu_dask
from qgpu_dask.formats.bitshuffle_lz4 import transpose8
transpose8(np.uint64(1))
print(sum(transpose8.stats.cache_misses.values()), sum(transpose8.stats.cache_hits.values()), transpose8.stats.cache_path)
"""


def one_kernel(env: dict) -> tuple[int, int, Path]:
    """(compiles, cache loads, cache folder) of a small kernel's first call in a fresh process with ``env``."""
    full = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")}
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), full.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", ONE_KERNEL], env=full | env, capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1]), Path(out[2])


def test_kernels_are_cached_in_the_user_cache_folder_across_processes(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path / "home")}
    compiled, loaded, folder = one_kernel(env)
    assert (compiled, loaded) == (1, 0)
    assert folder.is_relative_to(tmp_path / "cache" / "qgpu-dask" / "numba")  # the user's cache, not site-packages
    assert list(folder.glob("*transpose8*.nbi"))
    assert not list(Path(qd.__file__).parent.rglob("*transpose8*.nbi"))
    assert one_kernel(env)[:2] == (0, 1)  # the next process compiles nothing: it loads


def test_a_users_own_numba_cache_dir_is_kept(tmp_path):
    _, _, folder = one_kernel({"NUMBA_CACHE_DIR": str(tmp_path / "own"), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert folder.is_relative_to(tmp_path / "own")
    assert not (tmp_path / "cache").exists()

