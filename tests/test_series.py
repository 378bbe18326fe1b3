"""The series engine: one plan and one pass over every compressed acquisition of a series, exact on CPU and GPU."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.resident.masks import mask_weights
from qgpu_dask.resident.series import SeriesSums

from conftest import BACKENDS, cupy_available, host, module
from test_compressed import corrupt, encode





def reference(counts: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """(n_masks, n_frames) exact int64 sums."""
    flat = counts.reshape(counts.shape[0] * counts.shape[1], -1).astype(np.int64)
    return masks.reshape(masks.shape[0], -1).astype(np.int64) @ flat.T


def members(rng, xp, doses, shape=(13, 11, 17, 17), dtype=np.uint16) -> tuple[list[np.ndarray], list]:
    """Counts at several doses (so several scan block sizes) and their compressed residents on ``xp``'s device."""
    counts = [rng.poisson(d, shape).astype(dtype) for d in doses]
    return counts, [encode(c, xp) for c in counts]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_path_of_a_series_is_exact(rng, backend):
    xp = module(backend)
    counts, residents = members(rng, xp, [0.05, 0.4, 3.0])
    assert len({r.block for r in residents}) > 1  # members of several block sizes share one launch
    series = SeriesSums(residents)
    det = (17, 17)
    paths = [
        ("direct", np.stack([qd.masks.disk(det, (8, 8), 4), qd.masks.annulus(det, (8, 8), 5, 7)])),
        ("incremental", np.stack([qd.masks.disk(det, (9, 8), 4), qd.masks.annulus(det, (8, 8), 5, 7)])),
        ("complement", np.stack([np.ones(det, np.int64) * 3, np.where(rng.random(det) < 0.9, 2, -1)])),
        ("mixed", rng.integers(-3, 4, (5, *det))),  # more masks than one launch holds: a few launches
    ]
    for path, masks in paths:
        weights = mask_weights(masks, det, np.uint16)
        run = series.plan(weights)
        if path == "incremental":
            assert run.decoded_pixels < int(masks[0].sum()) // 2  # only the pixels the disk's move changed
        if path == "complement":
            assert run.decoded_pixels < 0.2 * masks[0].size
        got = host(run())
        assert got.dtype == weights.acc_dtype and got.shape == (3, masks.shape[0], 13 * 11)
        for a, c in enumerate(counts):
            assert (got[a].astype(np.int64) == reference(c, masks).astype(weights.acc_dtype)).all(), (path, a)


@pytest.mark.parametrize("backend", BACKENDS)
def test_odd_shapes_saturated_and_32_bit_counts(rng, backend):
    xp = module(backend)
    for det, dtype in (((17, 17), np.uint16), ((130, 128), np.uint8), ((257, 257), np.uint32)):
        counts = rng.poisson(0.3, (3, 7, *det)).astype(dtype)
        counts.reshape(-1)[rng.integers(0, counts.size, 50)] = np.iinfo(dtype).max  # saturated pixels
        residents = [encode(counts, xp), encode(counts[:, ::-1].copy(), xp)]
        masks = np.stack([rng.random(det) < 0.3, qd.masks.disk(det, (det[0] / 2, det[1] / 2), det[0] / 3)])
        weights = mask_weights(masks, det, dtype)
        got = host(SeriesSums(residents).plan(weights)())
        for a, c in enumerate((counts, counts[:, ::-1])):
            want = reference(c, masks)
            assert (got[a] == want.astype(weights.acc_dtype)).all(), (det, dtype)
        if dtype == np.uint32:
            assert weights.acc_dtype == np.uint64 and int(got.max()) > 2**32  # sums beyond 32 bits stay exact


@pytest.mark.parametrize("backend", BACKENDS)
def test_malformed_stream_names_the_acquisition_and_nothing_partial_leaves(rng, backend):
    xp = module(backend)
    counts, residents = members(rng, xp, [0.5, 0.5, 0.5], shape=(20, 20, 8, 8))
    for i, r in enumerate(residents):
        r.name = f"acq{i}"
    pixel = corrupt(residents[1], "flip")
    series = SeriesSums(residents)
    mask = np.zeros((8, 8), bool)
    mask.reshape(-1)[pixel] = True
    weights = mask_weights(mask, (8, 8), np.uint16)
    with pytest.raises(ValueError, match=rf"acquisition 'acq1': malformed compressed stream \(scan block \d+, detector pixel {pixel}\)"):
        series.plan(weights)()
    other = np.zeros((8, 8), bool)
    other.reshape(-1)[(pixel + 1) % 64] = True
    got = host(SeriesSums([residents[0], residents[2]]).plan(mask_weights(other, (8, 8), np.uint16))())
    assert (got[1, 0] == reference(counts[2], other[None])[0]).all()  # the others still answer


def test_service_series_of_mixed_layouts_and_dtypes(svc, names, rng):
    det = (12, 10)
    data = [rng.poisson(0.6, (6, 7, *det)).astype(np.uint16) for _ in range(3)] + [rng.poisson(0.6, (6, 7, *det)).astype(np.uint8)]
    layouts = ["compressed", "dense", "compressed", "compressed"]
    acqs = [svc.put(d, name=names(), layout=lay) for d, lay in zip(data, layouts)]
    series = qd.Series(svc, acqs)
    for step in range(3):
        masks = np.stack([qd.masks.disk(det, (5 + step, 5), 3), rng.integers(-2, 3, det)])
        got = series.virtual_images(masks)
        assert got.dtype == np.int64 and got.shape == (4, 2, 6, 7)
        for a, d in enumerate(data):
            assert (got[a].reshape(2, -1) == reference(d, masks)).all()
        bf = series.virtual_images(masks[0])
        assert bf.dtype == np.uint32
        assert (bf[0] == acqs[0].virtual_image(masks[0])).all()


def test_binned_virtual_images_are_exact_square_sums_made_on_the_owners(svc, names, rng):
    det = (12, 10)
    data = [rng.poisson(0.6, (11, 8, *det)).astype(np.uint16) for _ in range(2)] + [rng.poisson(0.6, (11, 8, *det)).astype(np.uint8)]
    acqs = [svc.put(d, name=names(), layout=lay) for d, lay in zip(data, ["compressed", "dense", "compressed"])]
    series = qd.Series(svc, acqs)
    disk, signed = qd.masks.disk(det, (5, 5), 3), rng.integers(-2, 3, det)
    full = series.virtual_images(disk)
    for factor in (1, 2, 3, 8):
        got = series.virtual_images(disk, bin=factor)
        rows, cols = 11 // factor, 8 // factor  # the edge rows and columns that fill no square are left out
        want = full[:, : rows * factor, : cols * factor].reshape(3, rows, factor, cols, factor).sum(axis=(2, 4), dtype=np.uint64)
        assert got.dtype == (np.uint32 if factor == 1 else np.uint64) and got.shape == (3, rows, cols)
        assert (got == want).all()
    both = series.virtual_images(np.stack([disk, signed]), bin=2)
    assert both.dtype == np.int64 and both.shape == (3, 2, 5, 4)
    assert (both[1, 1] == series.virtual_images(signed)[1, :10, :8].reshape(5, 2, 4, 2).sum(axis=(1, 3))).all()
    assert (acqs[0].virtual_images(disk, bin=3)[0] == series.virtual_images(disk, bin=3)[0]).all()
    for bad in (0, 9, 2.0, True):
        with pytest.raises(ValueError, match="bin must be a whole number of scan positions from 1 to 8"):
            series.virtual_images(disk, bin=bad)
    assert (series.virtual_images(disk) == full).all()  # the service answers as before


@pytest.mark.parametrize("backend", BACKENDS)
def test_members_of_other_index_centres_share_one_pass(rng, backend):
    """Members whose bright disks sit elsewhere have other group geometries: each gets its own residual pixels
    and group sums in the same launches, exactly."""
    xp = module(backend)
    det, counts = (24, 24), []
    for cy in (11, 13, 11):
        c = rng.poisson(0.2, (9, 31, *det)).astype(np.uint16)
        c[:, :, cy - 3 : cy + 4, 9:16] += rng.poisson(5.0, (9, 31, 7, 7)).astype(np.uint16)
        counts.append(c)
    residents = [encode(c, xp) for c in counts]
    geometries = {r.groups.center for r in residents}
    assert len(geometries) == 2
    series = SeriesSums(residents)
    cy2, cx2 = residents[0].groups.center
    for masks in (qd.masks.disk(det, (cy2 / 2, cx2 / 2), 5)[None],
                  np.stack([qd.masks.annulus(det, (cy2 / 2, cx2 / 2), 2, 8).astype(np.int64) * 3, qd.masks.disk(det, (cy2 / 2, cx2 / 2), 1)])):
        series.forget_last()
        weights = mask_weights(masks, det, np.uint16)
        run = series.plan(weights)
        assert run.decoded_pixels < 0.5 * int((masks != 0).any(axis=0).sum())  # most pixels read from the index
        got = host(run())
        for a, c in enumerate(counts):
            assert (got[a] == reference(c, masks).astype(weights.acc_dtype)).all(), a


def test_info_names_the_index_centre(svc, names, rng):
    counts = rng.poisson(0.02, (8, 9, 16, 16)).astype(np.uint16)  # a faint background: the disk sets the centroid
    counts[:, :, 3:8, 9:14] += rng.poisson(6.0, (8, 9, 5, 5)).astype(np.uint16)
    acq = svc.put(counts, name=names(), layout="compressed")
    cy, cx = acq.info()["index_center"]
    assert abs(cy - 5) <= 0.5 and abs(cx - 11) <= 0.5  # the bright disk's centroid, to the half pixel
    disk = qd.masks.disk((16, 16), (cy, cx), 3)
    assert (acq.virtual_image(disk) == reference(counts, disk[None])[0].reshape(8, 9)).all()


def test_series_results_reuse_memory_only_once_no_view_of_it_lives(svc, names, rng):
    det = (6, 5)
    data = [rng.integers(0, 50, (9, 8, *det), dtype=np.uint16) for _ in range(6)]
    series = qd.Series(svc, [svc.put(d, name=names()) for d in data])
    assert len({a.owner for a in series}) > 1  # assembled from several shards' replies
    masks = [qd.masks.disk(det, (3, 2.5), r) for r in (1.5, 2.5)]
    want = [np.stack([d[:, :, m].sum(axis=-1, dtype=np.uint64).astype(np.uint32) for d in data]) for m in masks]
    first = series.virtual_images(masks[0])
    kept = first[2]  # a view outlives its result
    address = first.ctypes.data
    del first
    gc.collect()
    second = series.virtual_images(masks[1])
    assert not np.shares_memory(second, kept) and (kept == want[0][2]).all() and (second == want[1]).all()
    addresses = {address, second.ctypes.data}
    del kept, second
    gc.collect()
    third = series.virtual_images(masks[0])
    assert (third == want[0]).all() and third.flags.writeable
    assert third.ctypes.data in addresses  # the memory of a collected result again


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
def test_processes_sharing_a_gpu_take_turns_for_a_series_pass_and_a_killed_one_lets_go():
    import subprocess
    import sys
    import time

    from qgpu_dask.device import gpu_turn

    hold = "from qgpu_dask.device import gpu_turn; import time\nwith gpu_turn():\n    print('in', flush=True); time.sleep({})"
    holder = subprocess.Popen([sys.executable, "-c", hold.format(1.5)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "in"
    t0 = time.perf_counter()
    with gpu_turn():
        waited = time.perf_counter() - t0
    holder.wait()
    assert waited > 0.5  # the other process's turn ran to its end first
    killed = subprocess.Popen([sys.executable, "-c", hold.format(60)], stdout=subprocess.PIPE, text=True)
    assert killed.stdout.readline().strip() == "in"
    killed.kill()
    killed.wait()
    t0 = time.perf_counter()
    with gpu_turn():
        assert time.perf_counter() - t0 < 5  # its lock went with it
