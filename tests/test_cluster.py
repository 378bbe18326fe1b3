"""The cluster recipes as a user runs them: ``cluster/cpu-node.sh`` started as its own process (the
environment's ``dask`` on PATH), its cluster asked where it listens, then stopped by its PID."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from distributed import Client

from processes import Started

ROOT = Path(__file__).resolve().parent.parent


def test_cpu_node_binds_scheduler_and_workers_to_loopback(tmp_path):
    scheduler_file = tmp_path / "scheduler.json"
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "QGPU_SCHEDULER_FILE": str(scheduler_file), "QGPU_LOG_DIR": str(tmp_path / "logs"), "QGPU_PYTHON": sys.executable,
           "QGPU_SCHEDULER_ARGS": "--port 0"}
    started = Started(tmp_path)
    try:
        started.start(["bash", str(ROOT / "cluster" / "cpu-node.sh"), "1"], lambda log: "Cluster up" in log or None, "cpu-node",
                      timeout_s=180, env=env)
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:"), address
        with Client(scheduler_file=str(scheduler_file), timeout=60) as client:
            workers = client.scheduler_info()["workers"]
            assert len(workers) == 1 and all(w.startswith("tcp://127.0.0.1:") for w in workers), workers
    finally:
        started.close()
