"""LiberTEM UDFs run unchanged on residents (``qd.run_udf``): on each owner, over the acquisition's held counts,
with LiberTEM's own runner, so ``process_frame``, ``process_tile``, ``process_partition``, ``merge`` and the
result buffers behave as they do in ``Context.run_udf`` on the file, and the result is what that returns.

The UDFs travel to the owners pickled (a notebook's UDF class by value). There each acquisition is a
LiberTEM data set backed by the resident (``resident_dataset``), cut into one partition per thread that the
runner works on side by side; nothing is read from a file and no frame leaves the owner, only the results.
LiberTEM's standard sums (SumUDF, SumSigUDF, ApplyMasksUDF) are answered by the engine's exact kernels instead
(``udf_answers``), still as LiberTEM's result buffers. Needs LiberTEM (``pip install qgpu-dask[libertem]``), imported when a UDF is run.
"""

from __future__ import annotations

import functools
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
    ``roi`` over the scan; ``engine``: whether LiberTEM's standard UDFs are answered by the engine. Per
    acquisition, what LiberTEM's ``Context.run_udf`` returns: a dict of result buffers, or a tuple of them for a
    list of UDFs."""

    name = "run_udf"
    thread = "load"  # it reads every frame: beside loads, not in the way of interactive queries
    long = True

    def __init__(self, series, udf, roi=None, engine: bool = True):
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
        self.udfs, self.roi, self.engine = udfs, roi, bool(engine)

    def arguments(self) -> tuple:
        return self.udfs, self.roi, self.engine

    @staticmethod
    def run(ctx: Context, residents: list, udfs: list, roi, engine: bool) -> list[tuple[dict, ...]]:
        """Each resident's results: LiberTEM's standard UDFs answered by the engine (``engine``), the others run
        by LiberTEM's runner over its held counts, all in the order given."""
        from .resident_dataset import ResidentDataSet
        from .udf_answers import answer, answered

        parts = []
        for resident in residents:
            dataset = ResidentDataSet(resident, THREADS)
            fills = [answer(u, resident, roi) if engine else None for u in udfs]
            results: list = [None] * len(udfs)
            filled = [i for i, fill in enumerate(fills) if fill is not None]
            for i, got in zip(filled, answered([udfs[i].copy() for i in filled], [fills[i] for i in filled], dataset, roi) if filled else []):
                results[i] = got
            ran = [i for i, got in enumerate(results) if got is None]  # the rest, and any the engine turned down
            rest = [udfs[i].copy() for i in ran]
            for i, got in zip(ran, runner(threaded(rest)).run_udf(dataset=dataset, udf=rest, roi=roi) if ran else []):
                results[i] = got
            parts.append(tuple(results))
        return parts

    def assemble(self, parts: list) -> list:
        return [part[0] if self.one else part for part in parts]


def threaded(udfs: list) -> bool:
    """Whether partitions run side by side on threads: not where a UDF works frame by frame (Python for every
    frame, holding the GIL: on 2 cores a per-frame UDF took 138 ms on two threads, 89 ms on one, for 4096
    frames of 128 x 128), and only where there are cores to share the rest (tiles and partitions, NumPy letting
    the GIL go)."""
    from libertem.udf.base import UDFMethod

    return THREADS > 1 and all(u.get_method() != UDFMethod.FRAME for u in udfs)


@functools.cache
def runner(threads: bool):
    """This process's LiberTEM context, made on first use and kept (one query thread runs UDFs): its executor
    works through an acquisition's partitions on THREADS threads, or in the calling thread."""
    from libertem.api import Context as LiberTEM

    return LiberTEM.make_with("threads", cpus=THREADS) if threads else LiberTEM.make_with("inline")


def run_udf(udf, acquisitions, roi=None, engine: bool = True) -> Any:
    """Run a LiberTEM UDF (or a list of them, in one pass) unchanged on an acquisition or a series where their
    counts are held, and return what LiberTEM's ``Context.run_udf`` returns on the same data: a dict of result
    buffers (a tuple of dicts for a list), one per acquisition for a series. ``roi``: a bool array of the scan
    shape, as in LiberTEM. LiberTEM's SumUDF, SumSigUDF, ApplyMasksUDF and CoMUDF are answered by the engine's
    exact sums (``udf_answers``); ``engine=False`` runs them through LiberTEM's runner too (its float32 arithmetic)."""
    return acquisitions.ask(RunUDF, udf, roi, engine)
