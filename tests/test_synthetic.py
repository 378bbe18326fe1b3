"""The synthetic crystal acquisition: shapes, determinism, dtype range, and lattice contrast."""

from __future__ import annotations

import time

import numpy as np
import pytest

from qgpu_dask.io import synthetic
from qgpu_dask.io.synthetic import crystal, crystal_geometry, projected_potential

SCAN = (32, 32)
DET = (64, 64)


@pytest.fixture(scope="module")
def acquisition() -> np.ndarray:
    return crystal(SCAN, DET, dtype="uint16", spacing=8.0, seed=1)


def radii(geometry: synthetic.CrystalGeometry) -> np.ndarray:
    rows, cols = np.indices(geometry.det_shape)
    return np.hypot(rows - geometry.center[0], cols - geometry.center[1])


def virtual_images(data: np.ndarray, geometry: synthetic.CrystalGeometry) -> tuple[np.ndarray, np.ndarray]:
    r = radii(geometry)
    bf_mask = r <= geometry.bf_radius
    adf_mask = (r >= geometry.adf_inner) & (r <= geometry.adf_outer)
    as64 = data.astype(np.int64)
    return (as64 * bf_mask).sum(axis=(2, 3)), (as64 * adf_mask).sum(axis=(2, 3))


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "int16", "float32"])
def test_shape_dtype_layout(dtype: str) -> None:
    data = crystal((6, 5), (16, 20), dtype=dtype, dose=300, seed=3)
    assert data.shape == (6, 5, 16, 20)
    assert data.dtype == np.dtype(dtype)
    assert data.flags.c_contiguous
    assert data.min() >= 0
    assert np.array_equal(data, np.round(data))


def test_deterministic_for_seed() -> None:
    a = crystal((8, 8), (32, 32), seed=5)
    b = crystal((8, 8), (32, 32), seed=5)
    c = crystal((8, 8), (32, 32), seed=6)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_smaller_scan_is_corner_of_larger() -> None:
    width = synthetic.STREAM_POSITIONS
    small = crystal((3, width), (32, 32), seed=2)
    large = crystal((5, 2 * width + 3), (32, 32), seed=2)
    assert np.array_equal(large[:3, :width], small)


def test_rows_are_those_of_the_whole() -> None:
    whole = crystal((5, 6), (16, 16), seed=4)
    assert np.array_equal(np.concatenate([crystal((5, 6), (16, 16), seed=4, rows=r) for r in ((0, 2), (2, 5))]), whole)


def test_uint8_clips_instead_of_wrapping() -> None:
    # At this dose the disk pixels hold far more than 255 counts.
    wide = crystal((4, 4), (32, 32), dtype="uint16", dose=200_000, seed=9)
    narrow = crystal((4, 4), (32, 32), dtype="uint8", dose=200_000, seed=9)
    assert wide.max() > 255
    assert narrow.max() == 255
    assert np.array_equal(narrow, np.minimum(wide, 255).astype(np.uint8))


def test_dose_is_electrons_per_position(acquisition: np.ndarray) -> None:
    totals = acquisition.sum(axis=(2, 3), dtype=np.int64)
    assert abs(totals.mean() - 2000.0) < 0.02 * 2000.0
    # Poisson spread of ~sqrt(2000) per frame, not more.
    assert totals.std() < 3 * np.sqrt(2000.0)
    assert not crystal((2, 2), (16, 16), dose=0).any()


def test_disk_where_the_geometry_says(acquisition: np.ndarray) -> None:
    geometry = crystal_geometry(DET, 8.0)
    mean = acquisition.mean(axis=(0, 1))
    r = radii(geometry)
    inside = mean[r <= geometry.bf_radius - 1.5].mean()
    gap = mean[(r >= geometry.bf_radius + geometry.max_shift + 1.0) & (r <= geometry.adf_inner)].mean()
    assert gap < 0.1 * inside


def test_bf_dark_adf_bright_on_columns(acquisition: np.ndarray) -> None:
    geometry = crystal_geometry(DET, 8.0)
    bf, adf = virtual_images(acquisition, geometry)
    columns = geometry.column_positions(SCAN).astype(int)
    assert len(columns) == (SCAN[0] // 8) * (SCAN[1] // 8)
    # Columns sit at 4 + 8k; cell corners, half a period away, at 8k.
    on_bf, off_bf = bf[columns[:, 0], columns[:, 1]], bf[0::8, 0::8]
    on_adf, off_adf = adf[columns[:, 0], columns[:, 1]], adf[0::8, 0::8]
    assert on_bf.max() < off_bf.min()
    assert on_bf.mean() < 0.8 * off_bf.mean()
    assert on_adf.min() > off_adf.max()
    assert on_adf.mean() > 3.0 * off_adf.mean()

    potential, _, _ = projected_potential(SCAN, geometry)
    assert np.corrcoef(bf.ravel(), potential.ravel())[0, 1] < -0.9
    assert np.corrcoef(adf.ravel(), potential.ravel())[0, 1] > 0.9


def test_abf_differs_from_bf(acquisition: np.ndarray) -> None:
    # ABF (the disk's outer half) darkens around each column where the field is steep; BF darkens on it.
    geometry = crystal_geometry(DET, 8.0)
    r = radii(geometry)
    bf, _ = virtual_images(acquisition, geometry)
    abf = (acquisition.astype(np.int64) * ((r > geometry.abf_inner) & (r <= geometry.bf_radius))).sum(axis=(2, 3))
    assert np.corrcoef(bf.ravel(), abf.ravel())[0, 1] < 0.9  # 0.991 with a uniform disk, ~0.77 now
    columns = geometry.column_positions(SCAN).astype(int)
    assert abf[columns[:, 0], columns[:, 1]].mean() < abf[0::8, 0::8].mean()  # columns dark in ABF too


def test_mean_pattern_is_a_uniform_disk(acquisition: np.ndarray) -> None:
    # The tilt of the disk's profile averages out over the lattice: the inside of the mean disk stays flat.
    geometry = crystal_geometry(DET, 8.0)
    mean = acquisition.mean(axis=(0, 1))
    r = radii(geometry)
    rings = [mean[(r >= a) & (r < a + 1)].mean() for a in range(int(geometry.bf_radius) - 1)]
    assert max(rings) < 1.02 * min(rings)


def test_disk_deflected_towards_columns(acquisition: np.ndarray) -> None:
    geometry = crystal_geometry(DET, 8.0)
    rows, cols = np.indices(DET)
    total = acquisition.sum(axis=(2, 3), dtype=np.float64)
    com_r = (acquisition * rows).sum(axis=(2, 3)) / total - geometry.center[0]
    com_c = (acquisition * cols).sum(axis=(2, 3)) / total - geometry.center[1]
    _, grad_r, grad_c = projected_potential(SCAN, geometry)
    assert np.corrcoef(com_r.ravel(), grad_r.ravel())[0, 1] > 0.7
    assert np.corrcoef(com_c.ravel(), grad_c.ravel())[0, 1] > 0.7
    assert np.abs(com_r).max() < geometry.max_shift + 1.0


def test_potential_peaks_on_columns() -> None:
    geometry = crystal_geometry(DET, 8.0)
    potential, grad_r, grad_c = projected_potential((16, 16), geometry)
    assert potential[4, 4] == pytest.approx(1.0, abs=1e-9)
    assert potential[0, 0] < 0.01
    assert abs(grad_r[4, 4]) < 1e-9 and abs(grad_c[4, 4]) < 1e-9
    assert potential.max() <= 1.0 + 1e-9


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dtype": "bool"},
        {"dtype": "complex64"},
        {"dose": -1.0},
        {"dose": float("nan")},
        {"det_shape": (4, 64)},
        {"scan_shape": (0, 4)},
        {"scan_shape": (4, 4, 4)},
        {"spacing": 0.5},
        {"seed": -1},
        {"seed": 1.5},
        {"rows": (1, 1)},
        {"rows": (0, 3)},
    ],
)
def test_bad_arguments(kwargs: dict) -> None:
    args = {"scan_shape": (2, 2), "det_shape": (16, 16)} | kwargs
    with pytest.raises(ValueError):
        crystal(**args)


def test_fast_enough() -> None:
    crystal((4, 4), DET)  # warm up
    start = time.perf_counter()
    crystal(SCAN, DET)
    # Typically ~0.2 s on two cores; the bound only catches a gross regression.
    assert time.perf_counter() - start < 2.0
