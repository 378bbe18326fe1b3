"""A user's own query, written as in a notebook (a class defined where it is used, sent by value), runs on
the owners like a built-in: exact, one call per shard, checked on the client, and a new version of the
class replaces the old one on the shards."""

from __future__ import annotations

import os

import numpy as np
import pytest

import qgpu_dask as qd


def peak_query(offset: int = 0) -> type[qd.Query]:
    """A query type as a notebook defines it: the brightest count inside a mask at every scan position,
    plus ``offset`` (another ``offset`` is another version of the class)."""

    class PeakImage(qd.Query):
        """(n, scan_rows, scan_cols) the largest count within ``mask`` of each pattern, native dtype."""

        name = "peak_image_test"

        def __init__(self, series, mask):
            mask = np.asarray(mask, bool)
            if mask.shape != series.same("det_shape"):
                raise ValueError(f"the mask is {mask.shape}, the detector {series.same('det_shape')}")
            self.args = (mask,)

        @staticmethod
        def run(ctx, residents, mask):
            parts = []
            for r in residents:
                pixels = r.xp.asarray(np.flatnonzero(mask))
                peaks = [block.reshape(len(block), -1)[:, pixels].max(axis=1) for block in r.feed(7, amplitude=False)]
                parts.append(qd.device.to_host(r.xp.concatenate(peaks)).reshape(r.scan_shape) + offset)
            return parts

        def assemble(self, parts):
            return np.stack(parts)

    return qd.register(PeakImage)


def calls_query() -> type[qd.Query]:
    class Calls(qd.Query):
        """Per acquisition: (the process that ran it, how many residents that call got)."""

        name = "calls_test"

        @staticmethod
        def run(ctx, residents):
            return [(os.getpid(), len(residents))] * len(residents)

    return qd.register(Calls)


def test_a_user_query_is_exact_on_a_series_and_an_acquisition(svc, names, rng):
    data = [rng.poisson(1.0 + i, (5, 6, 10, 12)).astype(np.uint16) for i in range(4)]
    series = qd.Series(svc, [svc.put(d, name=names(), layout=layout) for d, layout in zip(data, ["dense", "compressed"] * 2)])
    mask = qd.masks.annulus((10, 12), (5, 6), 1, 4)
    expected = np.stack([d[..., mask].max(axis=-1) for d in data])
    PeakImage = peak_query()
    assert (series.ask(PeakImage, mask) == expected).all()
    assert (series.ask("peak_image_test", mask) == expected).all()  # by its registered name too
    assert (series[2].ask(PeakImage, mask) == expected[2]).all()  # an acquisition gets its own image
    future = series.ask(PeakImage, mask, wait=False)
    assert (future.result() == expected).all()

    Calls = calls_query()
    calls = series.ask(Calls)
    owners = [a.owner for a in series]
    assert len({pid for pid, _ in calls}) == len(set(owners))  # one call per shard
    assert [n for _, n in calls] == [owners.count(o) for o in owners]


def test_a_user_query_checks_on_the_client_and_a_new_version_replaces_the_old(svc, names, rng):
    data = rng.poisson(2.0, (4, 4, 8, 8)).astype(np.uint16)
    acq = svc.put(data, name=names())
    mask = qd.masks.disk((8, 8), (4, 4), 3)
    with pytest.raises(ValueError, match=r"the mask is \(3, 3\), the detector \(8, 8\)"):
        acq.ask(peak_query(), np.ones((3, 3), bool))
    assert (acq.ask(peak_query(), mask) == data[..., mask].max(axis=-1)).all()
    assert (acq.ask(peak_query(offset=5), mask) == data[..., mask].max(axis=-1) + 5).all()  # the edited class runs
    assert (acq.virtual_image(mask) == data[..., mask].sum(axis=-1)).all()  # the shard is still usable


def test_register_refuses_what_is_not_a_query():
    class NoRun(qd.Query):
        name = "no_run"

    with pytest.raises(TypeError, match="has no run"):
        qd.register(NoRun)
    with pytest.raises(TypeError, match="subclass of qd.Query"):
        qd.register(len)
    with pytest.raises(ValueError, match="a query named 'ssb' is registered already"):
        qd.register(type("Mine", (qd.Query,), {"name": "ssb", "run": staticmethod(lambda ctx, residents: [])}))
    with pytest.raises(KeyError, match="no query named 'nothing'"):
        qd.queries.lookup("nothing")
