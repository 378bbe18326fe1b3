"""The feed: blocks of consecutive frames from dense and compressed residents, decoded ahead of their
consumer, against the counts themselves with ==."""

from __future__ import annotations

import numpy as np
import pytest

from qgpu_dask.device import to_host
from qgpu_dask.formats import codec
from qgpu_dask.resident.compressed import CompressedCounts
from qgpu_dask.resident.dense import DenseCounts
from qgpu_dask.resident.feed import SPAN_BYTES, span_frames

from conftest import BACKENDS
from test_compressed import corrupt


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


def test_spans_are_whole_blocks_and_whole_codec_blocks():
    assert span_frames(512, (1, 1), 4 * 192 * 192) == 512  # dense: one block at a time
    assert span_frames(512, (2048, 8), 4 * 192 * 192) == 2048 * (SPAN_BYTES // (2048 * 4 * 192 * 192)) < 8 * 2048  # capped at SPAN_BYTES
    assert span_frames(512, (2048, 8), 2 * 64 * 64) == 8 * 2048  # as many as fill the device
    assert span_frames(100, (256, 3), 4) == 800  # no short common multiple: whole blocks covering the units
    assert span_frames(4096, (256, 1), 4) == 4096 and span_frames(64, (256, 1), 1 << 30) == 256  # at least a block or a unit


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_malformed_stream_stops_the_feed_before_its_frames(counts, backend):
    resident = residents(counts, backend)[1]
    corrupt(resident, "flip")
    bad_block = int(np.argwhere((to_host(resident.streams.index) >> codec.FORM_SHIFT) == codec.ANS)[0, 0])
    flat = counts.reshape(-1, *counts.shape[2:])
    got = []
    with pytest.raises(ValueError, match="malformed compressed stream"):
        for block in resident.feed(64, amplitude=False, depth=2):
            got.append(to_host(block).copy())
    seen = sum(len(g) for g in got)
    assert seen <= bad_block * resident.block and (np.concatenate(got or [flat[:0]]) == flat[:seen]).all()
