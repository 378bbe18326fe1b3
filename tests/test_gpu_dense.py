"""The CUDA dense kernels against their CPU twin: identical bits for integer results.

Every check draws fresh random inputs (seeded from the test's name), poisons
the device memory pool first so an unwritten output element cannot pass as a
zero, and compares with ``np.array_equal``. Float results are compared with a
float64 NumPy reference with a tight tolerance (summation order differs).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")
try:
    if cupy.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except Exception:  # no driver / no device
    pytest.skip("no CUDA device", allow_module_level=True)

from qgpu_dask.resident.cpu import dense as cpu  # noqa: E402
from qgpu_dask.resident.cuda import dense as gpu  # noqa: E402

INT_TYPES = [np.uint8, np.uint16, np.uint32, np.int8, np.int16, np.int32]


@pytest.fixture
def rng(request):
    """Fresh inputs per test, repeatable across runs."""
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def poison() -> None:
    """Fill free blocks of CuPy's pool with 0xA5 bytes so outputs that reuse them start as garbage."""
    blocks = [cupy.full(n, 0xA5, dtype=np.uint8) for n in (1 << 26, 1 << 22, 1 << 18, 1 << 14, 1 << 10)]
    cupy.cuda.get_current_stream().synchronize()
    del blocks


def random_data(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape, dtype=dtype)


def disk(rng, det, radius=None):
    """A bool disk at a random centre (may be clipped by the detector edge)."""
    rows, cols = det
    r = radius if radius is not None else rng.uniform(1.5, max(rows, cols) / 2)
    cy, cx = rng.uniform(0, rows), rng.uniform(0, cols)
    yy, xx = np.mgrid[:rows, :cols]
    m = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    if not m.any():
        m[int(cy) % rows, int(cx) % cols] = True
    return m


def span_weights(masks, acc):
    """The caller's form: weights over the detector rows the masks touch."""
    stack = np.asarray(masks)
    cols = stack.shape[2]
    rows = np.flatnonzero(stack.reshape(stack.shape[0], stack.shape[1], -1).any(axis=(0, 2)))
    start, stop = int(rows[0]) * cols, (int(rows[-1]) + 1) * cols
    flat = stack.reshape(stack.shape[0], -1)[:, start:stop]
    return start, np.ascontiguousarray(flat.astype(acc))


def both_mask_sums(data, start, weights):
    poison()
    got = gpu.mask_sums(cupy.asarray(data), start, cupy.asarray(weights))
    assert isinstance(got, cupy.ndarray) and got.dtype == weights.dtype
    assert got.shape == (weights.shape[0], data.shape[0])
    return got.get(), cpu.mask_sums(data, start, weights)


def exact_reference(data, start, weights):
    """Python-int reference (object arrays): independent of both kernels."""
    span = data[:, start : start + weights.shape[1]].astype(object)
    return (weights.astype(object)[:, None, :] * span[None]).sum(axis=2)


# ---------------------------------------------------------------- mask_sums, integer data


@pytest.mark.parametrize("dtype", INT_TYPES)
@pytest.mark.parametrize("det", [(13, 17), (64, 64), (24, 40)])
def test_bool_disk_matches_cpu(rng, dtype, det):
    data = random_data(rng, dtype, (257,) + det).reshape(257, -1)
    acc = np.int64 if np.dtype(dtype).kind == "i" else np.uint64
    start, w = span_weights([disk(rng, det)], acc)
    got, ref = both_mask_sums(data, start, w)
    assert np.array_equal(got, ref)
    assert np.array_equal(got.astype(object), exact_reference(data, start, w))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_uint32_accumulator(rng, dtype):
    det = (64, 64)
    data = random_data(rng, dtype, (300,) + det).reshape(300, -1)
    if dtype == np.uint16:
        data //= 2  # keeps 32767 x 4096 x weight 1 inside uint32
    start, w = span_weights([disk(rng, det), np.ones(det, bool)], np.uint32)
    got, ref = both_mask_sums(data, start, w)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("acc", [np.uint64, np.uint32])
def test_saturated_uint16_full_detector(acc):
    det = (192, 192)
    data = np.full((5, det[0] * det[1]), 65535, dtype=np.uint16)
    start, w = span_weights([np.ones(det, bool)], acc)
    got, ref = both_mask_sums(data, start, w)
    assert np.array_equal(got, ref)
    assert (got == 65535 * det[0] * det[1]).all()


@pytest.mark.parametrize("det", [(13, 17), (64, 64)])
def test_integer_weights(rng, det):
    data = random_data(rng, np.uint16, (129,) + det).reshape(129, -1)
    m = rng.integers(0, 1000, (2,) + det) * np.stack([disk(rng, det), disk(rng, det)])
    start, w = span_weights(m, np.uint64)
    got, ref = both_mask_sums(data, start, w)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("dtype", [np.int16, np.uint16, np.int8, np.int32])
@pytest.mark.parametrize("det", [(13, 17), (64, 64)])
def test_negative_weights_int64(rng, dtype, det):
    data = random_data(rng, dtype, (200,) + det).reshape(200, -1)
    m = rng.integers(-3, 4, (3,) + det)
    m[1] = rng.integers(-40000, 40000, det)  # int32 weights
    start, w = span_weights(m, np.int64)
    got, ref = both_mask_sums(data, start, w)
    assert np.array_equal(got, ref)
    assert np.array_equal(got.astype(object), exact_reference(data, start, w))


def test_wide_weights_need_64bit_inner_and_segments(rng):
    """int64 weights beyond int32 on a 192 x 192 frame: shared memory holds only part of the span."""
    det = (192, 192)
    data = random_data(rng, np.uint8, (40,) + det).reshape(40, -1)
    w = rng.integers(-(2**33), 2**33, (2, det[0] * det[1]), dtype=np.int64)
    got, ref = both_mask_sums(data, 0, w)
    assert np.array_equal(got, ref)
    assert np.array_equal(got.astype(object), exact_reference(data, 0, w))


def test_uint32_data_large_weights(rng):
    det = (32, 32)
    data = random_data(rng, np.uint32, (100,) + det).reshape(100, -1)
    w = rng.integers(0, 2**20, (2, 32 * 20), dtype=np.uint64)
    got, ref = both_mask_sums(data, 96, w)
    assert np.array_equal(got, ref)
    assert np.array_equal(got.astype(object), exact_reference(data, 96, w))


@pytest.mark.parametrize("n_masks", [2, 3, 8, 10, 17])
@pytest.mark.parametrize("det", [(64, 64), (13, 17)])
def test_several_masks(rng, n_masks, det):
    data = random_data(rng, np.uint16, (333,) + det).reshape(333, -1)
    start, w = span_weights([disk(rng, det) for _ in range(n_masks)], np.uint64)
    got, ref = both_mask_sums(data, start, w)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int16, np.uint32])
def test_spans_mid_frame(rng, dtype):
    """Spans that start and end at arbitrary pixels (not row or 16-byte boundaries)."""
    det = (64, 64)
    data = random_data(rng, dtype, (77,) + det).reshape(77, -1)
    acc = np.int64 if np.dtype(dtype).kind == "i" else np.uint64
    for _ in range(6):
        start = int(rng.integers(0, 4000))
        length = int(rng.integers(1, 4096 - start + 1))
        w = rng.integers(0, 2, (2, length)).astype(acc)
        got, ref = both_mask_sums(data, start, w)
        assert np.array_equal(got, ref), (start, length)


def test_unaligned_base_pointer(rng):
    """A view that starts 2 bytes into an allocation: the kernels fall back to element loads."""
    det = (64, 64)
    n = 50
    flat = cupy.asarray(random_data(rng, np.uint16, (n * 4096 + 1,)))
    view = flat[1:].reshape(n, 4096)
    assert view.data.ptr % 16 != 0
    start, w = span_weights([disk(rng, det)], np.uint64)
    poison()
    got = gpu.mask_sums(view, start, cupy.asarray(w)).get()
    assert np.array_equal(got, cpu.mask_sums(view.get(), start, w))
    idx = rng.integers(0, n, 9)
    assert np.array_equal(gpu.roi_reduce(view, cupy.asarray(idx), "sum").get(), cpu.roi_reduce(view.get(), idx, "sum"))


@pytest.mark.parametrize("n_frames", [1, 2, 31, 20000])
def test_frame_counts(rng, n_frames):
    det = (13, 17) if n_frames == 20000 else (64, 64)
    data = random_data(rng, np.uint16, (n_frames,) + det).reshape(n_frames, -1)
    start, w = span_weights([disk(rng, det), disk(rng, det)], np.uint64)
    got, ref = both_mask_sums(data, start, w)
    assert np.array_equal(got, ref)


def test_mask_sums_bad_arguments(rng):
    data = cupy.asarray(random_data(rng, np.uint16, (4, 64)))
    with pytest.raises(ValueError):
        gpu.mask_sums(data, 60, cupy.ones((1, 8), dtype=np.uint64))
    with pytest.raises(ValueError):
        gpu.mask_sums(data, 0, cupy.ones((1, 8), dtype=np.float32))
    with pytest.raises(ValueError):
        gpu.mask_sums(data[:, ::2], 0, cupy.ones((1, 8), dtype=np.uint64))


def test_runs_on_the_callers_stream(rng):
    """Launches go to the current CuPy stream: results read on that stream are complete."""
    det = (64, 64)
    data = random_data(rng, np.uint16, (2000,) + det).reshape(2000, -1)
    start, w = span_weights([disk(rng, det)], np.uint64)
    idx = rng.permutation(2000)[:700].astype(np.int64)
    d = cupy.asarray(data)
    cupy.cuda.get_current_stream().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        got = gpu.mask_sums(d, start, cupy.asarray(w))
        roi = gpu.roi_reduce(d, cupy.asarray(idx), "sum")
        host_got, host_roi = cupy.asnumpy(got, stream=stream), cupy.asnumpy(roi, stream=stream)
        stream.synchronize()
    assert np.array_equal(host_got, cpu.mask_sums(data, start, w))
    assert np.array_equal(host_roi, cpu.roi_reduce(data, idx, "sum"))


# ---------------------------------------------------------------- mask_sums, float data


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("det", [(13, 17), (64, 64), (192, 192)])
def test_float_data(rng, dtype, det):
    n = 64 if det == (192, 192) else 200
    data = random_data(rng, dtype, (n,) + det).reshape(n, -1)
    masks = [disk(rng, det).astype(float), rng.random(det) * disk(rng, det), rng.random(det).astype(np.float32)]
    start, w = span_weights(masks, np.float64)
    got, ref = both_mask_sums(data, start, w)
    exact = (w[:, None, :] * data[None, :, start : start + w.shape[1]].astype(np.float64)).sum(axis=2)
    scale = np.abs(w)[:, None, :].max() * np.abs(data).max() * w.shape[1]
    assert np.all(np.isfinite(got))
    assert np.max(np.abs(got - exact)) <= 1e-13 * scale
    assert np.max(np.abs(got - ref)) <= 1e-13 * scale


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int16])
def test_float_weights_on_integer_data(rng, dtype):
    """Float masks on counts: float64 results, as on the CPU."""
    det = (24, 40)
    data = random_data(rng, dtype, (150,) + det).reshape(150, -1)
    masks = [rng.random(det) * disk(rng, det), disk(rng, det) * 0.5]
    start, w = span_weights(masks, np.float64)
    got, ref = both_mask_sums(data, start, w)
    exact = (w[:, None, :] * data[None, :, start : start + w.shape[1]].astype(np.float64)).sum(axis=2)
    scale = np.abs(w).max() * np.abs(data).max() * w.shape[1]
    assert np.max(np.abs(got - exact)) <= 1e-13 * scale
    assert np.max(np.abs(got - ref)) <= 1e-13 * scale


# ---------------------------------------------------------------- roi_reduce


def both_roi(data, idx, op):
    poison()
    got = gpu.roi_reduce(cupy.asarray(data), cupy.asarray(idx), op)
    ref = cpu.roi_reduce(data, idx, op)
    assert isinstance(got, cupy.ndarray) and got.dtype == ref.dtype and got.shape == ref.shape
    return got.get(), ref


@pytest.mark.parametrize("dtype", INT_TYPES)
@pytest.mark.parametrize("det", [(13, 17), (64, 64)])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_roi_matches_cpu(rng, dtype, det, op):
    n = 1000
    data = random_data(rng, dtype, (n,) + det).reshape(n, -1)
    for sel in (
        rng.permutation(n)[: rng.integers(2, n)],  # random ROI, unsorted
        np.array([rng.integers(0, n)]),  # one frame
        np.arange(n)[::-1],  # whole scan, reversed
        rng.integers(0, n, 50),  # with repeats
    ):
        sel = sel.astype(np.int64)
        got, ref = both_roi(data, sel, op)
        assert np.array_equal(got, ref)
        if op == "sum":
            assert np.array_equal(got.astype(object), data[sel].astype(object).sum(axis=0))
        else:
            assert np.array_equal(got, data[sel].max(axis=0))


def test_roi_sum_saturated_uint16():
    data = np.full((70000, 8), 65535, dtype=np.uint16)
    got, ref = both_roi(data, np.arange(70000, dtype=np.int64), "sum")
    assert np.array_equal(got, ref)
    assert (got == 65535 * 70000).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_roi_float(rng, dtype):
    n, det = 600, (64, 64)
    data = random_data(rng, dtype, (n,) + det).reshape(n, -1)
    data[rng.integers(0, n, 5), rng.integers(0, 4096, 5)] = np.nan
    sel = rng.permutation(n)[:400].astype(np.int64)
    got, ref = both_roi(data, sel, "max")
    assert np.array_equal(got, ref, equal_nan=True)
    assert np.array_equal(got, data[sel].max(axis=0), equal_nan=True)
    clean = np.nan_to_num(data)
    got, ref = both_roi(clean, sel, "sum")
    exact = clean[sel].astype(np.float64).sum(axis=0)
    assert np.max(np.abs(got - exact)) <= 1e-12 * np.abs(clean).max() * len(sel)
    assert np.max(np.abs(got - ref)) <= 1e-12 * np.abs(clean).max() * len(sel)


def test_roi_bad_arguments(rng):
    data = cupy.asarray(random_data(rng, np.uint16, (10, 64)))
    with pytest.raises(ValueError):
        gpu.roi_reduce(data, cupy.arange(3), "mean")
    with pytest.raises(ValueError):
        gpu.roi_reduce(data, cupy.zeros(0, dtype=np.int64), "sum")
    with pytest.raises(IndexError):
        gpu.roi_reduce(data, cupy.asarray([0, 10]), "sum")
    with pytest.raises(IndexError):
        gpu.roi_reduce(data, cupy.asarray([-1]), "max")


# ---------------------------------------------------------------- read_sum


@pytest.mark.parametrize("dtype", INT_TYPES + [np.float32])
def test_read_sum(rng, dtype):
    data = random_data(rng, dtype, (1000, 4096 + 3))
    got = gpu.read_sum(cupy.asarray(data)).get()
    if np.dtype(dtype).kind == "f":
        assert abs(got - data.astype(np.float64).sum()) <= 1e-9 * np.abs(data).sum()
    else:
        assert int(got) == int(data.astype(object).sum())
