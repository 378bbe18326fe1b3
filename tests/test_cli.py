"""The command line: `qgpu-dask info` against a running cluster, and the demo at a tiny size."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from qgpu_dask.cli import main


def test_info_prints_shards_and_acquisitions(svc, names, scheduler_file, capsys):
    acq = svc.put(np.ones((2, 3, 4, 4), np.uint8), name=names())
    assert main(["info", "--scheduler-file", str(scheduler_file)]) == 0
    out = capsys.readouterr().out
    assert out.count("tcp://") >= 3 + 1  # three shards and the acquisition's owner
    assert acq.name in out and "2x3x4x4" in out
    assert main(["info", "--address", svc.client.scheduler.address]) == 0
    assert acq.name in capsys.readouterr().out


@pytest.mark.parametrize("keep", [False, True])
def test_demo_draws_one_figure_and_cleans_up(tmp_path, capsys, keep):
    out = tmp_path / "demo"
    argv = ["demo", "--scan", "8", "8", "--det", "16", "16", "--workers", "1", "--out", str(out)]
    assert main(argv + ["--keep"] * keep) == 0
    printed = capsys.readouterr().out
    assert "exact against NumPy: yes" in printed
    with Image.open(out / "demo.png") as png:
        assert png.format == "PNG" and png.size == (1350, 840)
    assert sorted(p.name for p in out.glob("*.h5")) == (["crystal-0.h5", "crystal-1.h5"] if keep else [])
    assert ("kept the HDF5 files" if keep else "removed the HDF5 files") in printed


def test_demo_removes_its_files_when_it_fails(tmp_path):
    # A 1 x 1 scan has no top-left quarter: the ROI mean fails after both files were written and loaded.
    out = tmp_path / "demo"
    with pytest.raises(ValueError, match="the roi selects no scan position"):
        main(["demo", "--scan", "1", "1", "--det", "16", "16", "--workers", "1", "--out", str(out)])
    assert list(out.glob("*.h5")) == []
