"""LiberTEM UDFs run unchanged on residents (``qd.run_udf``, issue 27): LiberTEM's own SumUDF, ApplyMasksUDF,
SumSigUDF, its centre of mass and UDFs written as a user writes them (per frame, per partition, a list run in
one pass), on dense and compressed residents, with and without a ROI, each result compared with LiberTEM's
``Context.run_udf`` on the same file: ``==`` where the results are exact, LiberTEM's float tolerance where
it is floating point arithmetic done in another order."""

from __future__ import annotations

import numpy as np
import pytest

import qgpu_dask as qd

libertem_api = pytest.importorskip("libertem.api")
from libertem.udf.base import UDF  # noqa: E402
from libertem.udf.com import CoMUDF  # noqa: E402
from libertem.udf.masks import ApplyMasksUDF  # noqa: E402
from libertem.udf.sum import SumUDF  # noqa: E402
from libertem.udf.sumsigudf import SumSigUDF  # noqa: E402


def user_udfs() -> tuple[type, type]:
    """Two UDFs as a notebook writes them (classes defined where they are used, sent by value): the brightest
    count of each frame and the histogram of all counts (per frame, buffers of 'nav' and 'single' kind, a
    merge), and the number of frames above a threshold in each pixel (per partition, a 'sig' buffer)."""

    class PeakAndHistogram(UDF):
        def get_result_buffers(self):
            return {"peak": self.buffer(kind="nav", dtype=np.int64),
                    "histogram": self.buffer(kind="single", extra_shape=(16,), dtype=np.int64)}

        def process_frame(self, frame):
            self.results.peak[:] = frame.max()
            self.results.histogram[:] += np.bincount(np.minimum(frame.reshape(-1), 15).astype(np.int64), minlength=16)

        def merge(self, dest, src):
            dest.peak[:] = src.peak
            dest.histogram[:] += src.histogram

    class AboveThreshold(UDF):
        def __init__(self, threshold: int):
            super().__init__(threshold=threshold)

        def get_result_buffers(self):
            return {"above": self.buffer(kind="sig", dtype=np.int64)}

        def process_partition(self, partition):
            self.results.above[:] += (partition > self.params.threshold).sum(axis=0)

        def merge(self, dest, src):
            dest.above[:] += src.above

    return PeakAndHistogram, AboveThreshold


def disk(shape, center, radius) -> np.ndarray:
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    return ((yy - center[0]) ** 2 + (xx - center[1]) ** 2 <= radius**2).astype(np.float32)


def udfs(det_shape) -> list:
    """LiberTEM's UDFs and the user's, fresh (a UDF instance is run once)."""
    peak_hist, above = user_udfs()
    bright, ring = disk(det_shape, (11, 9), 5), 1 - disk(det_shape, (11, 9), 8)
    blank, phase = np.zeros(det_shape, np.float32), bright * np.exp(0.5j)  # an all-zero mask; complex masks (the runner's)
    return [SumUDF(), SumSigUDF(), ApplyMasksUDF(mask_factories=[lambda: bright, lambda: ring, lambda: blank]),
            ApplyMasksUDF(mask_factories=[lambda: phase]), CoMUDF.with_params(cy=11.0, cx=9.0),
            CoMUDF.with_params(cy=10.5, cx=8.0, r=6.0, regression=1, scan_rotation=12.0), peak_hist(), above(threshold=3)]


def assert_same(ours: dict, theirs: dict) -> None:
    """Every buffer of a UDF's results equal: exactly for integer and integral float buffers (sums of counts in
    float32 below 2**24), else within LiberTEM's own tolerance for float arithmetic in another order."""
    assert ours.keys() == theirs.keys()
    for key in theirs:
        a, b = np.asarray(ours[key].raw_data), np.asarray(theirs[key].raw_data)
        assert a.shape == b.shape and a.dtype == b.dtype, key
        assert (ours[key].valid_mask == theirs[key].valid_mask).all(), key
        assert ours[key].data.shape == theirs[key].data.shape, key
        if a.dtype.kind in "iu" or (np.isfinite(b).all() and (b == np.round(b)).all()):
            assert (a == b).all(), key
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=key)


@pytest.fixture(scope="module")
def libertem():
    ctx = libertem_api.Context.make_with("inline")
    yield ctx
    ctx.close()


@pytest.mark.parametrize("engine", [True, False], ids=["engine", "runner"])
def test_libertems_and_a_users_udfs_give_what_libertem_gives_on_the_file(svc, names, rng, tmp_path, libertem, engine):
    """LiberTEM's standard sums answered by the engine, or (``engine=False``) run by LiberTEM's runner on the
    resident like every other UDF: the same result buffers, their valid masks included."""
    counts = rng.poisson(1.5, (10, 12, 22, 18)).astype(np.uint16)
    path = tmp_path / "scan.npy"
    np.save(path, counts)
    dataset = libertem.load("npy", path=str(path))
    roi = rng.random((10, 12)) < 0.4
    expected = libertem.run_udf(dataset=dataset, udf=udfs(counts.shape[2:]))
    expected_roi = libertem.run_udf(dataset=dataset, udf=udfs(counts.shape[2:]), roi=roi)
    for layout in ("dense", "compressed"):
        acq = svc.load(path, name=names(), layout=layout)
        got = qd.run_udf(udfs(counts.shape[2:]), acq, engine=engine)
        assert isinstance(got, tuple) and len(got) == len(expected)
        for ours, theirs in zip(got, expected):
            assert_same(ours, theirs)
        for ours, theirs in zip(qd.run_udf(udfs(counts.shape[2:]), acq, roi=roi, engine=engine), expected_roi):
            assert_same(ours, theirs)
        one = qd.run_udf(SumUDF(), acq)  # one UDF: one dict, as Context.run_udf gives it
        assert isinstance(one, dict) and (one["intensity"].data == counts.sum(axis=(0, 1), dtype=np.float32)).all()
        acq.release()


def test_a_series_gives_one_result_per_acquisition_from_each_owner(svc, names, rng, libertem):
    data = [rng.poisson(0.5 + i, (6, 5, 16, 16)).astype(np.uint16) for i in range(3)]
    workers = list(svc.client.scheduler_info()["workers"])
    series = qd.Series(svc, [svc.put(d, name=names(), worker=workers[i % len(workers)], layout=("dense", "compressed")[i % 2])
                             for i, d in enumerate(data)])
    got = qd.run_udf(SumSigUDF(), series)
    assert len(got) == 3
    for ours, counts in zip(got, data):
        theirs = libertem.run_udf(dataset=libertem.load("memory", data=counts), udf=SumSigUDF())
        assert_same(ours, theirs)
    series.release()


def test_bad_udf_arguments_are_refused_on_the_client_and_a_failing_udf_leaves_the_service_usable(svc, names, rng):
    counts = rng.poisson(1.0, (4, 5, 8, 8)).astype(np.uint16)
    acq = svc.put(counts, name=names())
    with pytest.raises(TypeError, match="LiberTEM UDF instance or a list of them"):
        qd.run_udf(lambda frame: frame.sum(), acq)
    with pytest.raises(TypeError, match="LiberTEM UDF instance or a list of them"):
        qd.run_udf([], acq)
    with pytest.raises(ValueError, match=r"roi must be a bool array of the scan's shape \(4, 5\)"):
        qd.run_udf(SumUDF(), acq, roi=np.ones((5, 4), bool))

    class Broken(UDF):
        def get_result_buffers(self):
            return {"x": self.buffer(kind="nav")}

        def process_frame(self, frame):
            raise ArithmeticError("this UDF fails on purpose")

    with pytest.raises(ArithmeticError, match="fails on purpose"):
        qd.run_udf(Broken(), acq)
    assert (qd.run_udf(SumUDF(), acq)["intensity"].data == counts.sum(axis=(0, 1))).all()
    assert (acq.reduce() == counts.sum(axis=(0, 1))).all()


def test_a_udf_writing_into_its_tile_does_not_change_the_resident(svc, names, rng):
    """Tiles of dense counts in their own dtype are views of the resident, handed out read-only."""

    class Scribble(UDF):
        def get_preferred_input_dtype(self):
            return self.USE_NATIVE_DTYPE

        def get_result_buffers(self):
            return {"x": self.buffer(kind="nav")}

        def process_frame(self, frame):
            frame[:] = 0

    counts = rng.poisson(1.0, (4, 5, 8, 8)).astype(np.uint16)
    acq = svc.put(counts, name=names(), layout="dense")
    with pytest.raises(ValueError, match="read-only"):
        qd.run_udf(Scribble(), acq)
    assert (acq.reduce() == counts.sum(axis=(0, 1))).all()
