"""LiberTEM's standard UDFs answered by the engine: SumUDF, SumSigUDF, ApplyMasksUDF (without shifts) and CoMUDF
(whose every result comes from three mask sums a frame) ask for sums of counts that a resident already gives
exactly (``reduce``, ``virtual_images``), in milliseconds where LiberTEM's runner converts and walks every frame. ``qd.run_udf`` answers them here and runs any other UDF
through LiberTEM's runner (``resident_dataset``).

The results are still LiberTEM's: a dry run of its runner sets each UDF up as a run would (its meta, its result
buffers for the data set and ROI); the engine's exact sums are written into those buffers in the buffers'
dtype, every position the ROI selects is marked processed, and the UDF's own ``get_results`` makes the
result buffers ``Context.run_udf`` returns. Against LiberTEM's float32 arithmetic they differ only in its
rounding (the engine's sums are exact before the one conversion).

Needs LiberTEM (imported by ``udf`` when a UDF is run); written against LiberTEM 0.16's runner.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from libertem.executor.inline import InlineJobExecutor
from libertem.udf.base import UDF, UDFRunner
from libertem.udf.com import CoMUDF
from libertem.udf.masks import ApplyMasksUDF
from libertem.udf.sum import SumUDF
from libertem.udf.sumsigudf import SumSigUDF

from ..resident import Resident


def answer(udf: UDF, resident: Resident, roi: np.ndarray | None) -> Callable[[UDF], None] | None:
    """How the engine fills ``udf``'s buffers for ``resident`` (once a dry run allocated them), or None where
    it does not answer this UDF (another class, a subclass, shifted masks)."""
    kind = type(udf)
    chosen = slice(None) if roi is None else roi.reshape(-1)
    if kind is SumUDF:
        return lambda u: put(u, "intensity", resident.reduce(roi, "sum"))
    if kind is SumSigUDF:
        return lambda u: put(u, "intensity", resident.virtual_images(np.ones((1, *resident.det_shape), np.uint8)).reshape(-1)[chosen])
    if kind is ApplyMasksUDF and udf.params.shifts is None:
        return lambda u: put(u, "intensity", mask_sums(resident, u.masks.computed_masks)[chosen])
    if kind is CoMUDF:  # its private buffer of the sums of its three masks (disk, y and x moments) is all its results come from
        return lambda u: put(u, "raw_mask_result", mask_sums(resident, u.get_task_data()["engine"].masks.computed_masks)[chosen])
    return None


def mask_sums(resident: Resident, stack) -> np.ndarray:
    """(frames, masks) exact sums of each mask of ``stack`` (dense or sparse, LiberTEM's mask stack) over each
    frame. Float masks of whole numbers (LiberTEM's 0/1 disks and rings, its moment masks) are summed as the
    integers they are: exact, and on the engine's integer paths; an all-zero mask sums to 0 (the engine refuses
    one); ValueError for masks the engine does not take (complex)."""
    stack = np.asarray(stack.todense() if hasattr(stack, "todense") else stack).reshape(-1, *resident.det_shape)
    if stack.dtype.kind == "f" and np.isfinite(stack).all() and (stack == np.round(stack)).all() and np.abs(stack).max(initial=0) < 2**53:
        stack = stack.astype(np.int64)
    used = np.flatnonzero(stack.reshape(len(stack), -1).any(axis=1))
    sums = resident.virtual_images(stack[used]).reshape(len(used), -1).T if used.size else np.zeros((resident.n_frames, 0))
    out = np.zeros((resident.n_frames, len(stack)), sums.dtype)
    out[:, used] = sums
    return out


def put(udf: UDF, name: str, values: np.ndarray) -> None:
    """Buffer ``name`` of ``udf``'s results (flat, ROI-compressed) set to ``values`` in the buffer's dtype."""
    raw = udf.results.get_buffer(name).raw_data
    raw[...] = np.asarray(values).reshape(raw.shape)


def answered(udfs: list[UDF], fills: list[Callable[[UDF], None]], dataset, roi: np.ndarray | None) -> list[dict | None]:
    """The results of ``udfs``, each filled by its ``fills`` entry after a dry run of LiberTEM's runner on
    ``dataset`` set them up; every position of ``roi`` (all, without) marked processed. None for a UDF whose
    masks the engine does not take: LiberTEM's runner is left to run it."""
    UDFRunner(udfs).run_for_dataset(dataset=dataset, executor=InlineJobExecutor(), roi=roi, dry=True)
    valid = np.ones(int(np.prod(dataset.shape.nav)) if roi is None else int(np.count_nonzero(roi)), bool)
    results: list[dict | None] = []
    for udf, fill in zip(udfs, fills):
        try:
            fill(udf)
        except ValueError:
            results.append(None)
            continue
        udf.meta.set_valid_nav_mask(valid)
        results.append(udf._do_get_results())
    return results
