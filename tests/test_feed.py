"""The feed: blocks of consecutive frames from dense and compressed residents, decoded ahead of their
consumer, against the counts themselves with ==."""

from __future__ import annotations

import numpy as np
import pytest

from qgpu_dask.device import to_host
from qgpu_dask.resident.compressed import CompressedCounts
from qgpu_dask.resident.dense import DenseCounts

from conftest import cupy_available

BACKENDS = [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")])]


def residents(counts: np.ndarray, backend: str) -> list:
    if backend == "gpu":
        import cupy as xp
    else:
        xp = np
    flat = xp.asarray(counts.reshape(counts.shape[0] * counts.shape[1], -1))
    return [DenseCounts("d", flat, counts.shape), CompressedCounts.encode("c", flat, counts.shape)]


@pytest.fixture(scope="module")
def counts():
    rng = np.random.default_rng(11)
    return rng.poisson(20.0, (29, 31, 9, 11)).astype(np.uint16)  # 899 scans in blocks of 256: the last one partial


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_scans, depth", [(64, 2), (100, 0), (899, 1), (1000, 3), (1, 2)])
def test_feed_gives_every_frame_once_in_order(counts, backend, block_scans, depth):
    flat = counts.reshape(-1, *counts.shape[2:])
    for resident in residents(counts, backend):
        assert resident.n_frames % 32 != 0
        got = []
        for block in resident.feed(block_scans, amplitude=False, depth=depth):
            assert block.dtype == counts.dtype and block.shape[1:] == counts.shape[2:] and block.shape[0] <= block_scans
            got.append(to_host(block).copy())
        assert [len(g) for g in got[:-1]] == [block_scans] * (len(got) - 1)
        assert (np.concatenate(got) == flat).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_amplitudes_are_float32_square_roots(counts, backend):
    want = np.sqrt(counts.reshape(-1, *counts.shape[2:]).astype(np.float32))
    for resident in residents(counts, backend):
        got = np.concatenate([to_host(b).copy() for b in resident.feed(128, amplitude=True, depth=2)])
        assert got.dtype == np.float32 and (got == want).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_consumer_on_the_device_sees_each_block_before_the_next_is_made(counts, backend):
    """Sums taken by the consumer (on its own stream on a GPU) while later blocks are decoded ahead."""
    want = counts.reshape(-1, *counts.shape[2:]).astype(np.float64).sum(axis=(1, 2))
    for resident in residents(counts, backend):
        xp = resident.xp
        sums = [b.sum(axis=(1, 2), dtype=xp.float64) for b in resident.feed(50, amplitude=False, depth=2)]
        assert (np.concatenate([to_host(s) for s in sums]) == want).all()


def test_bad_feed_arguments(counts):
    resident = residents(counts, "cpu")[1]
    for kwargs, word in (({"block_scans": 0}, "block_scans"), ({"block_scans": 2.5}, "block_scans"), ({"depth": -1}, "depth"),
                         ({"amplitude": "yes"}, "amplitude")):
        with pytest.raises(ValueError, match=word):
            next(resident.feed(**kwargs))
    assert (to_host(next(resident.feed(899, amplitude=False))) == counts.reshape(-1, *counts.shape[2:])).all()


def test_frames_of_a_compressed_resident_decode_only_their_blocks(counts):
    dense, compressed = residents(counts, "cpu")
    edge = compressed.block
    assert 3 * edge < compressed.n_frames < 4 * edge
    for lo, hi in ((0, 899), (5, 6), (edge - 1, edge + 3), (edge, 3 * edge), (edge + 1, 899), (7, 7)):
        got = compressed.frames_flat(lo, hi)
        assert got.shape == (hi - lo, compressed.frame_len) and (got == dense.frames_flat(lo, hi)).all()
    for lo, hi in ((-1, 3), (5, 4), (890, 900)):
        with pytest.raises(IndexError, match="frames"):
            compressed.frames_flat(lo, hi)
