"""First calls: compiled kernels are cached in the user's cache folder across processes, a worker warms them up
as it starts, and a call that waits for a compile says so in its progress bar."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dask.config
import numpy as np
from distributed import Client, LocalCluster

import qgpu_dask as qd
from qgpu_dask.phase import simulate
from qgpu_dask import samples
from qgpu_dask.samples import write_hdf5
from qgpu_dask.service.shard import Shard

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


def compiles_on_worker() -> int:
    """Kernels compiled so far in this worker (cache loads are no compiles), over qgpu_dask's modules."""
    from numba.core.registry import CPUDispatcher

    seen = {id(v): v for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("qgpu_dask")
            for v in vars(m).values() if isinstance(v, CPUDispatcher)}
    return sum(sum(d.stats.cache_misses.values()) for d in seen.values())


def test_a_fresh_worker_says_it_compiles_and_warms_up_what_first_calls_run(tmp_path, capfd):
    rng = np.random.default_rng(3)
    write_hdf5(tmp_path / "scan.h5", rng.poisson(0.4, (12, 12, 32, 32)).astype(np.uint16))
    over = samples.PHASE_OVER  # the samples' phase.h5, on a smaller scan
    potential = simulate.atoms_potential((12 * over, 12 * over), samples.PHASE_OPTICS.scan_step_A / over, 3.9)
    counts = simulate.acquisition(samples.PHASE_OPTICS, (12, 12), samples.PHASE_DET, potential, over, dose=1e5, seed=1)
    write_hdf5(tmp_path / "phase.h5", counts.astype(np.uint16))
    with dask.config.set({"qgpu.cpu": True, "qgpu.warm-up": True}):  # the nanny hands the worker these settings
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                               env={"NUMBA_CACHE_DIR": str(tmp_path / "empty")})
    with qd.Service(Client(cluster, direct_to_workers=True), cluster=cluster) as svc:
        worker = svc.info()["shards"][0]["worker"]
        first = svc.load(tmp_path / "scan.h5", layout="compressed")  # while the worker compiles its kernels
        assert "compiling " in capfd.readouterr().err
        deadline = time.monotonic() + 900
        while not svc.router.call(worker, Shard.warmed_up).result():
            assert time.monotonic() < deadline
            time.sleep(0.5)
        assert svc.router.call(worker, Shard.compiling).result() is None
        ph = svc.load(tmp_path / "phase.h5", progress=False)
        cal = ph.calibrate(qd.Optics(300e3, 20.0, scan_step_A=samples.PHASE_OPTICS.scan_step_A))
        before = svc.client.run(compiles_on_worker)[worker]
        again = svc.load(tmp_path / "scan.h5", name="again", layout="compressed", progress=False)
        assert (again.frame(3, 4) == first.frame(3, 4)).all()
        fit = ph.fit_aberrations(cal, c10_range_A=100)
        assert ph.direct_ptycho(fit, upsampling=2).phase.shape == (24, 24)
        assert svc.client.run(compiles_on_worker)[worker] == before  # all warmed up: nothing compiled on first use


def test_a_cluster_closed_while_its_workers_warm_up_reports_no_failure(capfd):
    """Closed at once, its workers exit mid-warm-up (their pools refuse new work): that is no failed warm-up."""
    with dask.config.set({"qgpu.cpu": True, "qgpu.warm-up": True}):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    with qd.Service(Client(cluster, direct_to_workers=True), cluster=cluster) as svc:
        assert len(svc.info()["shards"]) == 2
    time.sleep(1.0)  # the workers' last words
    assert "warming up the kernels failed" not in capfd.readouterr().err
