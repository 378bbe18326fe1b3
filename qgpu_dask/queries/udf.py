"""LiberTEM UDFs run unchanged on residents (``qd.run_udf``): on each owner, over the acquisition's held counts,
with LiberTEM's own runner, so ``process_frame``, ``process_tile``, ``process_partition``, ``merge`` and the
result buffers behave as they do in ``Context.run_udf`` on the file, and the result is what that returns.

The UDFs travel to the owners pickled (a notebook's UDF class by value). There each acquisition is a
LiberTEM data set backed by the resident (``resident_dataset``), cut into one partition per thread that the
runner works on side by side; nothing is read from a file and no frame leaves the owner, only the results.
Needs LiberTEM (``pip install qgpu-dask[libertem]``), imported when a UDF is run.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .base import Context, Query, register

THREADS = min(8, os.cpu_count() or 1)  # partitions an acquisition is cut into, run side by side on the owner


def libertem_udf_class() -> type:
    """LiberTEM's UDF base class; ImportError saying how to install it where LiberTEM is missing."""
    try:
        from libertem.udf.base import UDF
    except ImportError:
        raise ImportError("qd.run_udf runs LiberTEM UDFs and needs LiberTEM: pip install 'qgpu-dask[libertem]'") from None
    return UDF


@register
class RunUDF(Query):
    """One LiberTEM UDF, or a list of them run in one pass, on every acquisition (``udf``); an optional bool
    ``roi`` over the scan. Per acquisition, what LiberTEM's ``Context.run_udf`` returns: a dict of result
    buffers, or a tuple of them for a list of UDFs."""

    name = "run_udf"
    thread = "load"  # it reads every frame: beside loads, not in the way of interactive queries
    long = True

    def __init__(self, series, udf, roi=None):
        base = libertem_udf_class()
        self.one = isinstance(udf, base)
        udfs = [udf] if self.one else list(udf) if isinstance(udf, (list, tuple)) else None
        if not udfs or not all(isinstance(u, base) for u in udfs):
            raise TypeError(f"run_udf takes a LiberTEM UDF instance or a list of them, got {udf!r}")
        if roi is not None:
            scan_shape = series.same("scan_shape")
            roi = np.asarray(roi)
            if roi.dtype != bool or roi.shape != tuple(scan_shape):
                raise ValueError(f"roi must be a bool array of the scan's shape {tuple(scan_shape)}, got {roi.dtype} {roi.shape}")
        self.udfs, self.roi = udfs, roi

    def arguments(self) -> tuple:
        return self.udfs, self.roi

    @staticmethod
    def run(ctx: Context, residents: list, udfs: list, roi) -> list[tuple[dict, ...]]:
        """Each resident's results, the UDFs run on it by LiberTEM's runner over its held counts."""
        from libertem.api import Context as LiberTEM

        from .resident_dataset import ResidentDataSet

        runner = LiberTEM.make_with("threads", cpus=THREADS) if THREADS > 1 else LiberTEM.make_with("inline")
        try:
            return [tuple(runner.run_udf(dataset=ResidentDataSet(r, THREADS), udf=[u.copy() for u in udfs], roi=roi)) for r in residents]
        finally:
            runner.close()

    def assemble(self, parts: list) -> list:
        return [part[0] if self.one else part for part in parts]


def run_udf(udf, acquisitions, roi=None) -> Any:
    """Run a LiberTEM UDF (or a list of them, in one pass) unchanged on an acquisition or a series where their
    counts are held, and return what LiberTEM's ``Context.run_udf`` returns on the same data: a dict of result
    buffers (a tuple of dicts for a list), one per acquisition for a series. ``roi``: a bool array of the scan
    shape, as in LiberTEM."""
    return acquisitions.ask(RunUDF, udf, roi)
