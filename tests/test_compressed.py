"""The compressed layout (qgpu-ans-2): codec round trips, forms, twins, exact queries, corruption, increments."""

from __future__ import annotations

import numba
import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.formats import codec
from qgpu_dask.resident.compressed import CompressedCounts
from qgpu_dask.resident.cpu import compressed as cpu_kernels
from qgpu_dask.resident.dense import DenseCounts
from qgpu_dask.resident.masks import mask_weights

from conftest import BACKENDS, cupy_available, module


def encode(counts: np.ndarray, xp=np) -> CompressedCounts:
    flat = xp.asarray(counts.reshape(counts.shape[0] * counts.shape[1], -1))
    return CompressedCounts.encode("t", flat, counts.shape)


def assert_same_queries(resident, counts: np.ndarray, rng) -> None:
    """Every query of ``resident`` equals the NumPy answer on ``counts`` with ==."""
    dense = DenseCounts("d", counts.reshape(counts.shape[0] * counts.shape[1], -1), counts.shape)
    det = counts.shape[2:]
    masks = [qd.masks.disk(det, (det[0] / 3, det[1] / 2), det[0] / 4), rng.integers(-3, 4, det), rng.random(det) < 0.3]
    for mask in masks:
        assert (resident.virtual_images(mask) == dense.virtual_images(mask)).all()
    rows, cols = counts.shape[:2]
    roi = rng.random((rows, cols)) < 0.5
    roi[-1, -1] = True
    for op in ("sum", "max", "mean"):
        got, want = resident.reduce(roi, op), dense.reduce(roi, op)
        assert got.dtype == want.dtype and (got == want).all()
    data = resident.data
    assert data.dtype == counts.dtype and (np.asarray(data.get() if hasattr(data, "get") else data) == counts).all()
    for r, c in ((0, 0), (rows - 1, cols - 1), (rows // 2, cols // 3)):
        got = resident.frame(r, c)
        assert got.dtype == counts.dtype and (got == counts[r, c]).all()


@pytest.mark.parametrize("dose", [0.05, 0.3, 1.0, 5.0])
def test_poisson_round_trip_near_entropy(rng, dose):
    counts = rng.poisson(dose, (67, 61, 17, 17)).astype(np.uint16)  # 4087 scans: not a multiple of any block
    resident = encode(counts)
    resident.check()
    assert_same_queries(resident, counts, rng)
    info = resident.describe()
    assert info["layout"] == "compressed" and info["format"] == codec.FORMAT
    assert resident.n_frames % resident.block != 0
    # payload against the order-0 bound of each pixel's counts (tables and index are fixed costs at this size)
    assert resident.streams.payload.nbytes <= 1.05 * info["entropy_bytes"]
    assert info["ratio"] > 1


def test_odd_detectors_and_scan_counts(rng):
    big = rng.poisson(0.4, (3, 5, 257, 257)).astype(np.uint8)
    assert_same_queries(encode(big), big, rng)
    one = rng.poisson(2.0, (1, 1, 3, 4)).astype(np.uint32)
    assert_same_queries(encode(one), one, rng)


def test_every_form_is_exact(rng):
    """Empty, constant, sparse, rANS and raw streams in one acquisition; saturated and 32-bit counts."""
    counts = np.zeros((40, 40, 6, 6), dtype=np.uint16)
    flat = counts.reshape(1600, 36)
    flat[:, 6:] = rng.poisson(2.0, (1600, 30))  # typical pixels: streams of a few hundred scans
    flat[:, 1] = 65535  # saturated everywhere: constant
    flat[:, 2] = rng.poisson(1.0, 1600)  # rANS
    flat[:, 3] = rng.integers(0, 65536, 1600)  # incompressible: raw
    flat[:1000, 4] = rng.poisson(5.0, 1000)  # busy, then nearly empty: the later blocks are sparse
    flat[[1200, 1500], 4] = 3
    flat[:, 5] = np.where(rng.random(1600) < 0.9, 65535, rng.integers(0, 65535, 1600))  # mostly saturated
    resident = encode(counts)
    forms = resident.forms()
    assert all(forms[name] > 0 for name in codec.FORM_NAMES), forms
    assert_same_queries(resident, counts, rng)
    wide = rng.integers(0, 2**32, (4, 9, 5, 3), dtype=np.uint32)
    wide[0, 0, 0, 0] = 2**32 - 1
    assert_same_queries(encode(wide), wide, rng)
    escapes = rng.poisson(0.02, (30, 30, 4, 4)).astype(np.uint32)
    escapes[::7, ::5, 1, 2] = 3_000_000_000  # escaped excesses of two 16-bit chunks in run mode
    assert_same_queries(encode(escapes), escapes, rng)


def corrupt(resident: CompressedCounts, kind: str) -> int:
    """Damage the first rANS stream: flip a bit of its words, or shorten it by a word; returns its pixel."""
    index = resident.streams.index
    host = np.asarray(index.get() if hasattr(index, "get") else index)
    b, p = map(int, np.argwhere((host >> codec.FORM_SHIFT) == codec.ANS)[0])
    start = int(resident.streams.block_base[b]) + int(host[b, p] & codec.OFFSET_MASK)
    if kind == "flip":
        resident.streams.payload[start + 5] ^= 0x10
    else:
        index[b, p + 1] -= 2  # the next stream starts earlier: this one is truncated
    return p


@pytest.mark.parametrize("kind", ["flip", "shorten"])
def test_corrupted_streams_raise(rng, kind):
    counts = rng.poisson(0.5, (20, 20, 8, 8)).astype(np.uint16)
    resident = encode(counts)
    pixel = corrupt(resident, kind)
    with pytest.raises(ValueError, match="malformed compressed stream"):
        resident.check()
    mask = np.zeros(64, bool)
    mask[pixel] = True
    with pytest.raises(ValueError, match="malformed compressed stream"):
        resident.virtual_images(mask.reshape(8, 8))
    with pytest.raises(ValueError, match="malformed compressed stream"):
        resident.reduce(None, "sum")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_frame_reads_its_streams_up_to_its_position(rng, backend):
    """A frame decodes each stream only as far as its position: every frame is exact, and a stream cut
    short is reported by the frames that reach its end, as by every other query."""
    counts = rng.poisson(1.5, (24, 25, 8, 8)).astype(np.uint16)
    counts[3, 7, 2, 5] = 65535  # an escape
    resident = encode(counts, module(backend))
    assert resident.block < 600  # several scan blocks: frames at every depth of one
    for i in range(600):
        assert (resident.frame(*divmod(i, 25)) == counts[i // 25, i % 25]).all(), i
    pixel = corrupt(resident, "shorten")
    last = min(resident.block, 600) - 1  # the damaged stream's block is the first
    with pytest.raises(ValueError, match=rf"malformed compressed stream \(scan block 0, detector pixel {pixel}\)"):
        resident.frame(*divmod(last, 25))
    assert (resident.frame(*divmod(last + 1, 25)) == counts.reshape(600, 8, 8)[last + 1]).all()  # the service stays usable


def test_moving_disk_is_incremental(rng):
    counts = rng.poisson(0.3, (16, 16, 24, 24)).astype(np.uint16)
    resident = encode(counts)
    dense = DenseCounts("d", counts.reshape(256, -1), counts.shape)
    for step in range(6):
        disk = qd.masks.disk((24, 24), (10 + step * 0.5, 11), 6)
        run = resident.prepare_mask_sums(mask_weights(disk, (24, 24), counts.dtype))
        if step:
            assert run.decoded_pixels < disk.sum() / 2
        want = dense.virtual_images(disk).reshape(1, -1)
        assert (run() == want).all()
        assert (run() == want).all()  # a plan repeats the same answer


def test_service_layouts_give_the_same_bits(svc, names, rng):
    counts = rng.poisson(0.7, (9, 11, 16, 12)).astype(np.uint16)
    comp = svc.put(counts, name=names(), layout="compressed")
    dense = svc.put(counts, name=names(), layout="dense")
    auto = svc.put(counts, name=names())
    assert comp.info()["layout"] == "compressed" and dense.info()["layout"] == "dense"
    assert auto.info()["layout"] == ("dense" if svc.backend == "cpu" else "compressed")  # see test_layout.py
    info = comp.info()
    assert info["nbytes"] < info["raw_bytes"] and info["ratio"] > 1 and info["entropy_bytes"] > 0
    masks = np.stack([qd.masks.disk((16, 12), (8, 6), 4), rng.integers(-2, 3, (16, 12))])
    assert (comp.virtual_images(masks) == dense.virtual_images(masks)).all()
    roi = rng.random((9, 11)) < 0.4
    roi[0, 0] = True
    for op in ("sum", "mean", "max"):
        assert (comp.reduce(roi, op) == dense.reduce(roi, op)).all()
    assert (comp.frame(3, 4) == counts[3, 4]).all()
    series = qd.Series(svc, [comp, dense, auto])
    images = series.virtual_images(masks[0])
    assert (images[0] == images[1]).all() and (images[0] == images[2]).all()
    assert (series.reduce(roi, "sum", total=True) == 3 * counts[roi].sum(axis=0, dtype=np.uint64)).all()
    assert svc.submit(lambda r: r.layout, comp).result() == "compressed"


def test_service_refuses_and_survives_bad_streams(svc, names, rng):
    floats = rng.random((3, 3, 4, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="unsigned integer"):
        svc.put(floats, name=names(), layout="compressed")
    with pytest.raises(ValueError, match="unknown layout"):
        svc.put(floats, name=names(), layout="zip")
    assert svc.put(floats, name=names()).info()["layout"] == "dense"  # auto keeps floats dense

    counts = rng.poisson(0.5, (12, 10, 8, 8)).astype(np.uint16)
    bad = svc.put(counts, name=names(), layout="compressed")
    good = svc.put(counts, name=names(), layout="compressed", worker=bad.owner)
    pixel = svc.submit(corrupt, bad, "flip").result()
    mask = np.zeros(64, bool)
    mask[pixel] = True
    with pytest.raises(ValueError, match="malformed compressed stream"):
        bad.virtual_image(mask.reshape(8, 8))
    assert (good.virtual_image(mask.reshape(8, 8)) == counts.reshape(12, 10, 64)[:, :, pixel]).all()
    with pytest.raises(ValueError, match="malformed compressed stream"):
        bad.reduce()  # still refused: nothing partial comes back


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("dose", [0.05, 1.0, 5.0], ids=lambda d: f"dose{d}")
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32"])
@pytest.mark.parametrize("det", [(19, 13), (12, 22)], ids=lambda d: f"det{d[0]}x{d[1]}")
def test_gpu_encoder_writes_the_cpu_bytes(rng, dose, dtype, det):
    """One partial thread block of pixels whose rows are not 16-byte aligned (counts staged one by one), and
    two blocks, the second partial, whose rows are for uint16 and uint32 (16-byte copies); short last tiles."""
    import cupy

    counts = rng.poisson(dose, (23, 31, *det)).astype(dtype)
    counts.reshape(-1)[rng.integers(0, counts.size, 40)] = np.iinfo(dtype).max  # escapes
    on_cpu, on_gpu = encode(counts), encode(counts, cupy)
    for name in ("index", "block_base", "payload"):
        assert (getattr(on_gpu.streams, name).get() == getattr(on_cpu.streams, name)).all(), name
    assert on_gpu.block == on_cpu.block
    # into a payload of leftover bytes: with room behind it for the slots (each stream coded once), and without
    from qgpu_dask.resident.cuda import compressed as gpu_kernels
    from qgpu_dask.resident.compressed import MODEL_KEYS

    flat = cupy.asarray(counts.reshape(23 * 31, -1))
    total = on_cpu.streams.payload.size
    room = gpu_kernels.slot_room(flat.shape[0], flat.shape[1], on_cpu.block, flat.dtype.itemsize)
    for size in (total + room + 1, room + 1):
        out = cupy.full(size, 0xA5, dtype=np.uint8)
        into = gpu_kernels.encode(flat, on_cpu.block, *(getattr(on_gpu.model, k) for k in MODEL_KEYS), out=out)
        assert into.payload.data.ptr == out.data.ptr and (into.payload.get() == on_cpu.streams.payload).all(), size
    assert_same_queries(on_gpu, counts, rng)
    corrupt(on_gpu, "flip")
    with pytest.raises(ValueError, match="malformed compressed stream"):
        on_gpu.check()



def test_large_masks_decode_their_complement(rng):
    counts = rng.poisson(0.8, (12, 13, 20, 20)).astype(np.uint16)
    resident = encode(counts)
    dense = DenseCounts("d", counts.reshape(156, -1), counts.shape)
    everything = np.ones((20, 20), dtype=np.int64) * 3
    most = rng.random((20, 20)) < 0.9
    for mask, at_most in ((everything, 0), (most, (~most).sum()), (np.where(most, 2, -1), (~most).sum())):
        resident.series().forget_last()  # a new acquisition: no previous answer to build on
        run = resident.prepare_mask_sums(mask_weights(mask, (20, 20), counts.dtype))
        assert run.decoded_pixels == at_most
        assert (run().reshape(-1, 12, 13) == dense.virtual_images(mask)).all()


def test_check_catches_wrong_totals(rng):
    counts = rng.poisson(0.5, (6, 7, 5, 5)).astype(np.uint16)
    resident = encode(counts)
    resident.check()
    resident.totals[3] += 1
    with pytest.raises(ValueError, match="frame totals do not match"):
        resident.check()


def mixed_counts(rng, dtype, shape=(37, 41, 6, 7)) -> np.ndarray:
    """Busy value-mode pixels (some at the dtype's largest count: escapes), sparse run-mode ones, a constant and
    an empty pixel; the scan count is not a multiple of the block."""
    top = np.iinfo(dtype).max
    counts = rng.poisson(3.0, shape).astype(dtype)
    flat = counts.reshape(shape[0] * shape[1], -1)
    flat[:, 1::3] = rng.poisson(0.05, flat[:, 1::3].shape)
    flat[::97, ::2] = top
    flat[:, 3] = rng.poisson(0.05, flat.shape[0])
    flat[:, 4] = top
    flat[:, 5] = 0
    return counts


@pytest.mark.parametrize("threads", [1, 2])
def test_work_split_and_pairs_give_the_dense_sums(rng, threads):
    """Every pixel as its own mask, odd and even sets of value-mode pixels, one pixel, no pixel and ROI
    reductions, with the work split over 1 and 2 threads, equal (==) to the counts."""
    counts = mixed_counts(rng, np.uint16)
    flat = counts.reshape(-1, 42).astype(np.uint64)
    resident = encode(counts)
    assert resident.n_frames % resident.block and resident.n_frames > resident.block  # several blocks, the last short
    assert (resident.model.run == 0).sum() % 2 == 1  # a value-mode pixel is left without a partner
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        streams, model = resident.streams, resident.model
        pixels = np.arange(42)
        assert (cpu_kernels.mask_sums(streams, model, pixels, np.eye(42, dtype=np.uint64)) == flat.T).all()
        for chosen in (pixels[::2], pixels[:5], pixels[[7]], pixels[[0, 41]]):
            weights = rng.integers(0, 4, (3, chosen.size)).astype(np.uint64)
            want = weights @ flat[:, chosen].T
            assert (cpu_kernels.mask_sums(streams, model, chosen, weights) == want).all()
        empty = cpu_kernels.mask_sums(streams, model, pixels[:0], np.zeros((2, 0), dtype=np.uint64))
        assert empty.shape == (2, resident.n_frames) and not empty.any()
        mult = rng.integers(0, 3, resident.n_frames).astype(np.uint32)
        assert (cpu_kernels.roi_reduce(streams, model, mult, "sum") == (flat * mult[:, None]).sum(axis=0)).all()
        assert (cpu_kernels.roi_reduce(streams, model, mult, "max") == flat[mult > 0].max(axis=0)).all()
        assert_same_queries(resident, counts, rng)
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
def test_largest_counts_of_each_dtype(rng, dtype):
    """Escapes up to the dtype's largest count in value-mode and run-mode pixels decode exactly."""
    counts = mixed_counts(rng, dtype, (11, 13, 4, 5))
    resident = encode(counts)
    assert (resident.model.run == 0).any() and (resident.model.run > 0).any()
    assert_same_queries(resident, counts, rng)


def test_truncated_stream_in_a_lockstep_pair_is_named(rng):
    """A value-mode stream decoded beside another reports its own pixel and scan block, through the mask
    sums and the ROI reduction, and the resident still answers masks that avoid it."""
    counts = rng.poisson(40.0, (64, 64, 4, 4)).astype(np.uint16)  # busy pixels: value mode, small blocks
    resident = encode(counts)
    assert (resident.model.run == 0).all() and resident.n_frames // resident.block >= 8
    b, p = 3, 9
    assert resident.streams.index[b, p] >> codec.FORM_SHIFT == codec.ANS
    resident.streams.index[b, p + 1] -= 2  # stream (3, 9) loses its last word
    mask = np.zeros((4, 4), bool)
    mask.flat[[1, p]] = True
    message = f"scan block {b}, detector pixel {p}\\): a stream is truncated"
    with pytest.raises(ValueError, match=message):
        resident.virtual_images(mask)
    with pytest.raises(ValueError, match=message):
        resident.reduce(None, "sum")
    fine = np.zeros((4, 4), bool)
    fine.flat[[0, 1, 2]] = True
    assert (resident.virtual_images(fine) == counts[..., fine].sum(axis=-1, dtype=np.uint32)).all()
