"""The CPU kernels against plain NumPy, on shapes the service tests do not reach."""

from __future__ import annotations

import numpy as np
import pytest

from qgpu_dask.resident.cpu import dense


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int16, np.float32])
def test_mask_sums_and_roi(dtype):
    rng = np.random.default_rng(7)
    data = (rng.integers(-50, 200, (257, 33)) if np.dtype(dtype).kind != "u" else rng.integers(0, 200, (257, 33))).astype(dtype)
    acc = {"u": np.uint64, "i": np.int64, "f": np.float64}[np.dtype(dtype).kind]
    weights = rng.integers(0, 4, (3, 20)).astype(acc)
    out = dense.mask_sums(data, 5, weights)
    ref = data[:, 5:25].astype(acc) @ weights.T
    if acc is np.float64:
        np.testing.assert_allclose(out, ref.T, rtol=1e-12)
    else:
        assert (out == ref.T).all()
    idx = np.array([200, 3, 3, 256, 0], dtype=np.int64)
    total = dense.roi_reduce(data, idx, "sum")
    assert total.dtype == acc
    if acc is np.float64:
        np.testing.assert_allclose(total, data[idx].astype(acc).sum(axis=0))
    else:
        assert (total == data[idx].astype(acc).sum(axis=0)).all()
    assert (dense.roi_reduce(data, idx, "max") == data[idx].max(axis=0)).all()
    assert (dense.roi_reduce(data, idx[:1], "max") == data[200]).all()


def test_max_propagates_nan():
    data = np.ones((4, 3), np.float32)
    data[2, 1] = np.nan
    out = dense.roi_reduce(data, np.arange(4, dtype=np.int64), "max")
    assert np.isnan(out[1]) and out[0] == 1 and out[2] == 1


def test_unknown_op():
    with pytest.raises(ValueError, match="unknown reduction op"):
        dense.roi_reduce(np.ones((2, 2), np.uint8), np.arange(2, dtype=np.int64), "median")
