"""Progress bars of single long calls: shown once a call has run progress.DELAY seconds, never for a quick one."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np
import pytest

from qgpu_dask.service import progress


def test_a_long_load_shows_its_bar(svc, names, rng, tmp_path, capsys, monkeypatch):
    data = rng.poisson(0.5, (8, 8, 16, 16)).astype(np.uint16)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("/entry/data", data=data)
    monkeypatch.setattr(progress, "DELAY", 0.0)  # every call counts as long
    name = names()
    acq = svc.load(tmp_path / "a.h5", name=name)
    err = capsys.readouterr().err
    assert f"loading {name}" in err and "100%" in err and "32.0k/32.0k" in err  # the file's bytes, all read
    assert acq.checksum() is not None
    assert f"checksum {name}" in capsys.readouterr().err
    assert svc.load(tmp_path / "a.h5", name=names(), progress=False).shape == data.shape
    assert "loading" not in capsys.readouterr().err  # progress=False: no bar


def test_a_quick_call_shows_none(svc, names, rng, capsys):
    acq = svc.put(rng.poisson(0.5, (2, 3, 4, 4)).astype(np.uint16), name=names())
    assert acq.checksum()
    assert capsys.readouterr().err == ""


def test_a_failed_call_raises_through_its_bar(capsys, monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setattr(progress, "POLL", 0.05)

    def fails() -> None:
        time.sleep(0.3)
        raise ValueError("the worker's own error")

    with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="the worker's own error"):
        progress.waited(pool.submit(fails), "failing", 10, count=lambda: 4)
    err = capsys.readouterr().err
    assert "failing" in err and "4/10" in err and "10/10" not in err  # the bar stops where the call did


def test_a_series_load_advances_within_its_files(svc, names, rng, tmp_path, capsys, monkeypatch):
    big = rng.poisson(0.5, (132, 128, 64, 64)).astype(np.uint16)  # 132 MiB: read in 3 blocks of at most 64 MiB
    small = big[:4]
    paths = [tmp_path / "big.h5", tmp_path / "small.h5"]
    for path, data in zip(paths, (big, small)):
        with h5py.File(path, "w") as f:
            f.create_dataset("data", data=data, chunks=(1, 128, 64, 64), compression="gzip", compression_opts=1)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setattr(progress, "POLL", 0.02)
    series = svc.load(paths, dataset="data", name=[names(), names()], layout="dense")
    err = capsys.readouterr().err
    assert "136M/136M" in err and "2/2 acquisitions" in err
    shown = {(int(n), int(done)) for n, done in re.findall(r"\| (\d+)\.?\d*M/136M [^\r]*?(\d)/2 acquisitions", err)}
    assert any(n >= 64 and n < 132 for n, done in shown), shown  # the big file's first blocks, before it was done
    assert (series[0].frame(7, 9) == big[7, 9]).all() and (series[1].frame(3, 9) == small[3, 9]).all()
