"""The command line: `qgpu-dask info` against a running cluster (the demo runs in CI's first command)."""

from __future__ import annotations

import numpy as np

from qgpu_dask.cli import main


def test_info_prints_shards_and_acquisitions(svc, names, scheduler_file, capsys):
    acq = svc.put(np.ones((2, 3, 4, 4), np.uint8), name=names())
    assert main(["info", "--scheduler-file", str(scheduler_file)]) == 0
    out = capsys.readouterr().out
    assert out.count("tcp://") >= 3 + 1  # three shards and the acquisition's owner
    assert acq.name in out and "2x3x4x4" in out
    assert main(["info", "--address", svc.client.scheduler.address]) == 0
    assert acq.name in capsys.readouterr().out
