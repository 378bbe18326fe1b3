"""The layout "auto" holds a new acquisition in, the reason ``acq.info()`` gives, and the dense index."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_service

import qgpu_dask as qd
from qgpu_dask.resident.compressed import MIN_RATIO, estimated_ratio
from qgpu_dask.resident.dense import DenseCounts
from qgpu_dask.service.layout import choose
from qgpu_dask.phase.calibration import moment_masks

MIB = 2**20


def never() -> float:
    raise AssertionError("the ratio was estimated where the choice does not depend on it")


def high_entropy(rng, shape) -> np.ndarray:
    """uint32 counts spread over 0..60000, as a Merlin detector's at high dose: no codec gains much on them."""
    return rng.integers(0, 60000, shape).astype(np.uint32)


def test_choose_each_branch():
    asked = choose("compressed", "uint16", "cpu", MIB, 100 * MIB, never)
    assert asked.compressed and asked.reason == "compressed: asked for"
    assert choose("dense", "uint16", "cuda", MIB, 100 * MIB, never).reason == "dense: asked for"
    floats = choose("auto", "float32", "cuda", MIB, 100 * MIB, never)
    assert not floats.compressed and floats.reason.startswith("dense: float32 counts are held dense")
    fits = choose("auto", "uint16", "cpu", MIB, 100 * MIB, never)
    assert not fits.compressed and fits.index and "fits the CPU worker's 100.00 MiB free budget" in fits.reason
    tight = choose("auto", "uint16", "cpu", 100 * MIB, MIB, lambda: 9.0)
    assert tight.compressed and tight.reason.startswith("compressed: 100.00 MiB dense would not fit") and "ratio 9.0" in tight.reason
    gpu = choose("auto", "uint16", "cuda", MIB, 100 * MIB, lambda: 9.0)
    assert gpu.compressed and gpu.reason.startswith("compressed: on a GPU")
    for kind in ("cpu", "cuda"):
        low = choose("auto", "uint32", kind, 100 * MIB, 99 * MIB, lambda: 1.17)
        assert not low.compressed and not low.index
        assert low.reason.startswith(f"dense: estimated ratio 1.17 is below {MIN_RATIO}") and "its index does not fit" in low.reason
    with pytest.raises(ValueError, match="unknown layout 'zip'"):
        choose("zip", "uint16", "cpu", MIB, MIB, never)
    with pytest.raises(ValueError, match="holds unsigned integer counts; this acquisition is int16"):
        choose("compressed", "int16", "cpu", MIB, MIB, never)


def test_estimated_ratio(rng):
    merlin = high_entropy(rng, (9, 64 * 64))  # 3 x 3 scans of a small detector
    assert estimated_ratio(merlin) < MIN_RATIO
    assert choose("auto", "uint32", "cuda", MIB, 100 * MIB, lambda: estimated_ratio(merlin)).compressed is False
    sparse = rng.poisson(0.3, (256, 16 * 16)).astype(np.uint16)
    assert estimated_ratio(sparse) > 4


def test_dense_index_gives_the_plain_bits(rng):
    for dtype in ("uint8", "uint16", "uint32", "int16"):
        info = np.iinfo(dtype)
        counts = rng.integers(info.min, info.max, (5, 7, 12, 10), endpoint=True).astype(dtype)
        plain = DenseCounts("plain", counts.reshape(35, -1).copy(), counts.shape)
        promised = DenseCounts("indexed", counts.reshape(35, -1).copy(), counts.shape).index_later()
        assert promised.index is None and promised.nbytes == counts.nbytes + DenseCounts.index_bytes(counts.shape, dtype) > plain.nbytes
        indexed = promised.indexed()  # the bytes counted while it was promised are those it holds
        assert indexed.nbytes == counts.nbytes + DenseCounts.index_bytes(counts.shape, dtype) and not indexed.index_to_come
        rows, cols = np.indices((12, 10))
        masks = np.concatenate([moment_masks((12, 10)), [3 * rows - 5 * cols + 7, (rows > 2) & (rows < 6), 1 - (cols == 3),
                                                        qd.masks.disk((12, 10), (5, 5), 3), cols > 4]]).astype(np.int64)
        for stack in (masks, masks[:3], masks[4:5], masks[5:6], masks[6:7], masks[7:]):
            got, want = indexed.virtual_images(stack), plain.virtual_images(stack)
            assert got.dtype == want.dtype and (got == want).all()
        roi = np.ones((5, 7), bool)
        for op in ("sum", "max", "mean"):
            for r in (None, roi, ~np.eye(5, 7, dtype=bool)):
                got, want = indexed.reduce(r, op), plain.reduce(r, op)
                assert got.dtype == want.dtype and (got == want).all()


def test_service_auto_is_dense_on_cpu_with_its_reason(svc, names, rng):
    counts = rng.poisson(0.5, (8, 8, 16, 16)).astype(np.uint16)
    auto = svc.put(counts, name=names())
    comp = svc.put(counts, name=names(), layout="compressed")
    assert comp.info()["layout_reason"] == "compressed: asked for"
    info = auto.info()
    if svc.backend == "cpu":
        assert info["layout"] == "dense" and "fits the CPU worker's" in info["layout_reason"]
        assert info["nbytes"] == counts.nbytes + DenseCounts.index_bytes(counts.shape, "uint16")
    else:
        assert info["layout"] == "compressed" and info["layout_reason"].startswith("compressed: on a GPU")
    assert (auto.reduce() == comp.reduce()).all() and (auto.reduce(op="max") == comp.reduce(op="max")).all()
    assert np.array_equal(auto.center_of_mass((7.5, 7.5)), comp.center_of_mass((7.5, 7.5)), equal_nan=True)
    masks = np.concatenate([moment_masks((16, 16)), [qd.masks.annulus((16, 16), (7.5, 7.5), 3, 7)]])
    assert (auto.virtual_images(masks) == comp.virtual_images(masks)).all()


def test_service_small_budget_compresses_and_keeps_high_entropy_dense(rng):
    """A budget of 40 kB: 8 x 8 x 16 x 16 uint16 counts fit raw (32 kB) but not with their index (51 kB)."""
    svc = make_service("cpu", n_workers=1, budget="40 kB")
    try:
        counts = rng.poisson(0.5, (8, 8, 16, 16)).astype(np.uint16)
        acq = svc.put(counts, name="sparse")
        info = acq.info()
        assert info["layout"] == "compressed" and info["layout_reason"].startswith("compressed: 50.50 kiB dense would not fit the CPU worker's")
        assert (acq.reduce() == counts.sum(axis=(0, 1), dtype=np.uint64)).all()
        acq.release()
        merlin = high_entropy(rng, (6, 6, 16, 16))  # 36 kB raw, 46 kB with its index
        acq = svc.put(merlin, name="merlin")
        info = acq.info()
        assert info["layout"] == "dense" and info["nbytes"] == merlin.nbytes
        assert info["layout_reason"].startswith(f"dense: estimated ratio 1.00 is below {MIN_RATIO}") and "its index does not fit" in info["layout_reason"]
        assert (acq.reduce() == merlin.sum(axis=(0, 1), dtype=np.uint64)).all()
    finally:
        svc.close()


def test_a_complete_dense_live_acquisition_keeps_an_index(svc, names, rng):
    counts = rng.poisson(0.8, (4, 6, 16, 16)).astype(np.uint16)
    acq = svc.create(names(), (4, 6), (16, 16), "uint16", layout="dense")
    acq.append(counts[:2].reshape(-1, 16, 16))
    assert acq.info()["layout_reason"] == "dense: asked for" and acq.info()["nbytes"] == counts.nbytes
    acq.append(counts[2:].reshape(-1, 16, 16))
    info = acq.info()
    assert not info["live"] and info["layout_reason"] == "dense: asked for"
    assert info["nbytes"] == counts.nbytes + DenseCounts.index_bytes(counts.shape, "uint16")
    moments = acq.virtual_images(moment_masks((16, 16)))
    rows, cols = np.indices((16, 16))
    assert (moments[1] == (counts * rows).sum(axis=(2, 3))).all() and (moments[2] == (counts * cols).sum(axis=(2, 3))).all()
    assert (acq.reduce() == counts.sum(axis=(0, 1), dtype=np.uint64)).all() and (acq.reduce(op="max") == counts.max(axis=(0, 1))).all()
