"""Exact results through a real cluster: every answer equals NumPy's with ==."""

from __future__ import annotations

import numpy as np
import pytest

import qgpu_dask as qd

SCAN, DET = (6, 7), (16, 12)


def random_counts(rng, dtype, shape=SCAN + DET):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape, dtype=dtype)


def reference_image(data, mask, acc):
    """NumPy reference: exact integer arithmetic in Python ints via object arrays where needed."""
    flat = data.reshape(data.shape[0], data.shape[1], -1).astype(object)
    return (flat * mask.reshape(-1).astype(object)).sum(axis=2).astype(acc)


def masks_for(det):
    center = (det[0] / 2 - 0.5, det[1] / 2 - 0.5)
    return qd.masks.disk(det, center, 3), qd.masks.annulus(det, center, 3, 5), qd.masks.annulus(det, center, 5, 20)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "int16", "int32", "float32"])
def test_virtual_images_and_reductions(svc, names, rng, dtype):
    data = random_counts(rng, dtype)
    acq = svc.put(data, name=names())
    bf, abf, adf = masks_for(DET)
    images = acq.virtual_images([bf, abf, adf])
    assert images.shape == (3,) + SCAN
    if data.dtype.kind == "f":
        assert images.dtype == np.float64
        ref = np.stack([(data.astype(np.float64) * m).sum(axis=(2, 3)) for m in (bf, abf, adf)])
        np.testing.assert_allclose(images, ref, rtol=1e-12, atol=1e-9)
    else:
        expected = np.int64 if data.dtype.kind == "i" else (np.uint32 if data.dtype.itemsize < 4 else np.uint64)
        assert images.dtype == expected
        ref = np.stack([reference_image(data, m, expected) for m in (bf, abf, adf)])
        assert (images == ref).all()
        assert (acq.virtual_image(bf) == ref[0]).all()

    roi = rng.random(SCAN) < 0.4
    roi[0, 0] = True
    total = acq.reduce(roi, "sum")
    assert total.dtype == {"u": np.uint64, "i": np.int64, "f": np.float64}[data.dtype.kind]
    if data.dtype.kind == "f":
        np.testing.assert_allclose(total, data[roi].astype(np.float64).sum(axis=0), rtol=1e-12, atol=1e-9)
    else:
        assert (total == data[roi].sum(axis=0, dtype=total.dtype)).all()
        assert (acq.reduce(roi, "mean") == data[roi].mean(axis=0, dtype=np.float64)).all()
    peak = acq.reduce(roi, "max")
    assert peak.dtype == data.dtype and (peak == data[roi].max(axis=0)).all()
    assert (acq.reduce(None, "max") == data.max(axis=(0, 1))).all()
    frame = acq.frame(4, 5)
    assert frame.dtype == data.dtype and (frame == data[4, 5]).all()
    rows, cols = data.shape[:2]
    assert (acq.frame(rows - 1, cols - 1) == data[-1, -1]).all()  # the last (a negative index is out of range)


def test_max_starts_from_selected_frames(svc, names):
    """Negative data: a max that started from 0 would return 0 here."""
    data = -np.arange(1, 1 + 2 * 3 * 4 * 5, dtype=np.int16).reshape(2, 3, 4, 5)
    acq = svc.put(data, name=names())
    assert (acq.reduce(op="max") == data.max(axis=(0, 1))).all()
    assert acq.reduce(op="max").max() < 0


def test_saturated_uint16_full_detector(svc, names):
    small = np.full((3, 4, 16, 16), 65535, dtype=np.uint16)
    acq = svc.put(small, name=names())
    image = acq.virtual_image(np.ones((16, 16), bool))
    assert (image == 65535 * 256).all()
    big = np.full((2, 2, 512, 512), 65535, dtype=np.uint16)
    acq = svc.put(big, name=names())
    image = acq.virtual_image(np.ones((512, 512), bool))
    assert image.dtype == np.uint64
    assert (image == 65535 * 512 * 512).all()
    assert (acq.reduce(op="sum") == np.full((512, 512), 65535 * 4, np.uint64)).all()


def test_integer_and_float_weights(svc, names, rng):
    data = random_counts(rng, "uint16")
    acq = svc.put(data, name=names())
    weights = rng.integers(0, 5, DET).astype(np.int32)
    image = acq.virtual_image(weights)
    assert image.dtype == np.uint32
    assert (image == reference_image(data, weights, np.uint32)).all()

    heavy = np.full(DET, 2**20, dtype=np.int64)
    image = acq.virtual_image(heavy)
    assert image.dtype == np.uint64
    assert (image == reference_image(data, heavy, np.uint64)).all()

    signed = rng.integers(-3, 4, DET).astype(np.int8)
    signed[0, 0] = -1
    image = acq.virtual_image(signed)
    assert image.dtype == np.int64
    assert (image == reference_image(data, signed, np.int64)).all()

    fweights = rng.random(DET)
    image = acq.virtual_image(fweights)
    assert image.dtype == np.float64
    np.testing.assert_allclose(image, (data.astype(np.float64) * fweights).sum(axis=(2, 3)), rtol=1e-12)


def test_mask_touching_one_row(svc, names, rng):
    """A mask whose span is one detector row in the middle of the frame."""
    data = random_counts(rng, "uint8")
    acq = svc.put(data, name=names())
    mask = np.zeros(DET, bool)
    mask[7, 3:9] = True
    assert (acq.virtual_image(mask) == data[:, :, 7, 3:9].sum(axis=2, dtype=np.uint32)).all()


def test_empty_roi_sum_is_zero(svc, names, rng):
    data = random_counts(rng, "uint16")
    acq = svc.put(data, name=names())
    total = acq.reduce(np.zeros(SCAN, bool), "sum")
    assert total.dtype == np.uint64 and (total == 0).all()
