"""The labelled overview figure the demo draws (qgpu_dask/figure.py), from plain NumPy arrays."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from qgpu_dask.figure import figure, nice_length


def panels(rng, scan=(12, 10), det=(16, 16)):
    images = {name: rng.poisson(50, scan) for name in ("BF", "ABF", "ADF")}
    return images, rng.normal(size=(2, *scan)), rng.normal(size=scan), rng.poisson(3.0, det).astype(np.float64)


def test_one_png_of_the_fixed_size(tmp_path, rng):
    images, com, icom, mean = panels(rng)
    path = figure(tmp_path / "f.png", images, com, icom, mean, scan_step_A=0.41, title="t")
    with Image.open(path) as png:
        assert png.format == "PNG" and png.size == (1350, 840)
    mean[:] = 0  # an all-zero pattern still draws (log scale of nothing)
    figure(tmp_path / "g.png", images, com, icom, mean)
    assert (tmp_path / "g.png").stat().st_size > 0


def test_bad_panels_are_named(tmp_path, rng):
    images, com, icom, mean = panels(rng)
    with pytest.raises(ValueError, match=r"figure takes three virtual images, got 2 \(BF, ABF\)"):
        figure(tmp_path / "f.png", {k: images[k] for k in ("BF", "ABF")}, com, icom, mean)
    with pytest.raises(ValueError, match=r"com must be \(2, 12, 10\) and icom \(12, 10\), got \(2, 10, 12\)"):
        figure(tmp_path / "f.png", images, com.transpose(0, 2, 1), icom, mean)
    assert not (tmp_path / "f.png").exists()


def test_scale_bar_lengths_are_round():
    assert [nice_length(s) for s in (96, 256, 10, 3.3)] == [20, 50, 2, 0.5]
