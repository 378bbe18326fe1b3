"""Shared fixtures: real Dask clusters of worker processes (so every call is serialized).

``svc`` runs each test on CPU workers and, where CuPy sees a GPU, again on GPU
workers (three worker processes sharing the one GPU); GPU runs carry the
``gpu`` marker.
"""

from __future__ import annotations

import json
import os
import re
import sys
import zlib
from pathlib import Path

import dask.config
import numpy as np
import pytest
from distributed import Client, LocalCluster

import qgpu_dask as qd
from processes import Started, free_ports

# Workers started by the tests (and the programs they run) compile kernels on first use rather than warming
# every one up as they start: dozens of short-lived clusters on two cores. tests/test_first_calls.py turns it on.
# Set here (local clusters' nannies hand it to their workers) and in the environment (the programs tests run).
os.environ.setdefault("DASK_QGPU__WARM_UP", "False")
dask.config.set({"qgpu.warm-up": False})


def cupy_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


BACKENDS = [pytest.param("cpu", id="cpu"),
            pytest.param("gpu", id="gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")])]


def evicted(path) -> bool:
    """Drop ``path``'s pages from the page cache (written back first); whether its first page left it (a read
    that may not wait for the drive finds nothing)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # the probe below must not start readahead
        try:
            return os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT) == 0
        except BlockingIOError:
            return True
    finally:
        os.close(fd)


def module(backend: str):
    """The array module of a BACKENDS parameter: NumPy, or CuPy (residents on the GPU)."""
    if backend == "cpu":
        return np
    import cupy

    return cupy


def host(a) -> np.ndarray:
    """A NumPy view or copy of a NumPy or CuPy array."""
    return np.asarray(a.get() if hasattr(a, "get") else a)


def compiling_module(name: str):
    """The module ``name`` that compiles a kernel source, imported where CuPy is missing too, with empty stand-ins
    for CuPy bound in it: its constants and pure functions work, nothing that launches does (nothing on a CPU
    calls that)."""
    import importlib
    import importlib.util
    import types

    with pytest.MonkeyPatch.context() as patch:
        if importlib.util.find_spec("cupy") is None:
            for stand_in in ("cupy", "cupyx", "cupyx.scipy", "cupyx.scipy.fft"):
                patch.setitem(sys.modules, stand_in, types.ModuleType(stand_in))
        return importlib.import_module(name)


def asked_into(svc, series, shape: tuple[int, ...], name: str, *args) -> tuple[np.ndarray, list[int], object]:
    """The first owner's reply to query ``name`` on its acquisitions of ``series``, asked to write into a fresh
    float32 client result of ``shape`` (every value 7 before): (that result, those acquisitions' series
    positions, the reply)."""
    from qgpu_dask.queries.results import result_array, target_of
    from qgpu_dask.service.handoff import token
    from qgpu_dask.service.shard import Shard

    out = result_array(shape, np.float32)
    out[:] = 7
    mine = [i for i, a in enumerate(series) if a.owner == series[0].owner]
    reply = svc.router.call(series[0].owner, Shard.ask, name, [series.names[i] for i in mine], *args, handoff=token(),
                            into=(target_of(out), mine)).result()
    return out, mine, reply


def make_service(backend: str, n_workers: int = 3, budget: str | None = "256 MiB") -> qd.Service:
    with dask.config.set({"qgpu.cpu": backend == "cpu"}):  # the nannies hand their workers the settings in force
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = Client(cluster, direct_to_workers=True)
    return qd.Service(client, budget=budget, cluster=cluster)


@pytest.fixture(scope="session", params=BACKENDS)
def svc(request):
    service = make_service(request.param)
    service.backend = request.param
    yield service
    service.close()


@pytest.fixture(scope="session")
def scheduler_file(svc, tmp_path_factory):
    """A scheduler file for ``svc``'s cluster."""
    path = tmp_path_factory.mktemp("scheduler") / "scheduler.json"
    # what `dask scheduler --scheduler-file` writes and a Client reads; client.write_scheduler_file dumps the
    # workers' metrics too, whose tuple keys JSON refuses (distributed 2026.8) once a worker has run a task
    path.write_text(json.dumps({"type": "Scheduler", "address": svc.client.scheduler.address}))
    return path


@pytest.fixture(scope="module")
def browser():
    """Headless chromium for the viewer's browser tests (tests/browser.py), quit after the module."""
    from browser import chromium

    driver = chromium()
    yield driver
    driver.quit()


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: fresh inputs per test, repeatable runs."""
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


@pytest.fixture
def names(request, svc):
    """Unique acquisition names for a test, released afterwards."""
    made: list[str] = []

    def make(prefix: str = "t") -> str:
        name = f"{request.node.name}-{prefix}-{len(made)}"
        made.append(name)
        return name

    yield make
    for n in made:
        if n in svc:
            svc[n].release()


@pytest.fixture
def tpx_sim(tmp_path):
    """Start LiberTEM-live's Timepix3 simulator on a mock scan (a function of the scan shape, giving its port);
    stopped by its PID."""
    pytest.importorskip("libertem_live")
    program = Path(sys.executable).with_name("libertem-live-asi-tpx-sim")
    if not program.exists():
        pytest.skip("libertem-live-asi-tpx-sim is not installed beside this Python (pip install 'libertem-live[sim]')")
    started = Started(tmp_path)

    def start(rows: int, cols: int) -> int:
        port = free_ports(1)[0]
        ready = re.compile(rf"listening \('127\.0\.0\.1', {port}\)")
        return started.start([str(program), "--mock-nav-shape", str(rows), str(cols), "--port", str(port)],
                             lambda text: port if ready.search(text) else None, "tpx-sim")

    yield start
    started.close()


def mock_frames(n: int) -> np.ndarray:
    """What the simulator's mock sends (its documented construction): frame i all zero but pixel i % 512**2, which holds i."""
    frames = np.zeros((n, 512 * 512), np.uint32)
    i = np.arange(1, n)
    frames[i, i % (512 * 512)] = i
    return frames.reshape(n, 512, 512)
