"""Mask builders and mask-weight rules (no cluster)."""

from __future__ import annotations

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.resident.masks import mask_weights


def test_disk_annulus_sector_geometry():
    disk = qd.masks.disk((9, 9), (4, 4), 2)
    assert disk.dtype == bool and disk.sum() == 13 and disk[4, 4] and not disk[0, 0]
    ring = qd.masks.annulus((9, 9), (4, 4), 2, 4)
    assert not (ring & disk).any() and ring[4, 8] and not ring[4, 4]
    quarters = [qd.masks.sector((9, 9), (4, 4), 0, 4, a, a + 90) for a in (0, 90, 180, 270)]
    union = np.logical_or.reduce(quarters)
    assert sum(q.sum() for q in quarters) == union.sum()  # disjoint
    assert (union == qd.masks.annulus((9, 9), (4, 4), 0, 4)).all()
    assert quarters[0][3, 6] and quarters[1][2, 3] and quarters[2][5, 2] and quarters[3][6, 5]
    wrapped = qd.masks.sector((9, 9), (4, 4), 0, 4, 315, 45)
    assert wrapped[4, 7] and not wrapped[4, 1]
    assert (qd.masks.from_image(np.eye(3)) == np.eye(3, dtype=bool)).all()


@pytest.mark.parametrize("bad", [lambda: qd.masks.disk((9, 9), (4, 4), 0), lambda: qd.masks.annulus((9, 9), (4, 4), 3, 2), lambda: qd.masks.disk((9,), (4, 4), 2)])
def test_bad_mask_arguments(bad):
    with pytest.raises(ValueError):
        bad()


def test_accumulator_rules():
    det = (4, 4)
    ones = np.ones(det, bool)
    assert mask_weights(ones, det, np.uint16).acc_dtype == np.uint32
    assert mask_weights(ones, det, np.uint32).acc_dtype == np.uint64
    assert mask_weights(np.full(det, 2**16 + 1), det, np.uint16).acc_dtype == np.uint64
    assert mask_weights(ones, det, np.int16).acc_dtype == np.int64
    assert mask_weights(-np.ones(det, np.int8), det, np.uint8).acc_dtype == np.int64
    assert mask_weights(ones * 0.5, det, np.uint16).acc_dtype == np.float64
    assert mask_weights(ones, det, np.float32).acc_dtype == np.float64
    big = np.ones((512, 512), bool)
    assert mask_weights(big, (512, 512), np.uint16).acc_dtype == np.uint64  # 65535 * 262144 > 2**32


def test_span_covers_only_touched_rows():
    mask = np.zeros((6, 5), bool)
    mask[2, 1] = mask[3, 4] = True
    w = mask_weights(mask, (6, 5), np.uint8)
    assert w.span_start == 10 and w.weights.shape == (1, 10)
    assert w.weights[0, 1] == 1 and w.weights[0, 9] == 1 and w.weights.sum() == 2
