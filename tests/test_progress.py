"""Progress bars of single long calls: shown once a call has run progress.DELAY seconds, never for a quick one."""

from __future__ import annotations

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
