"""The field's own readers, as references for ours: LiberTEM's datasets read through a UDF that keeps every
frame, and RosettaSciIO's file readers."""

from __future__ import annotations

import numpy as np


def libertem_counts(kind: str, **params) -> np.ndarray:
    """Every count of a file as LiberTEM 0.16 reads it (``ctx.load(kind, **params)``), (scan..., det...)."""
    from libertem.api import Context
    from libertem.udf.base import UDF

    class Frames(UDF):
        def get_result_buffers(self):
            return {"frames": self.buffer(kind="nav", extra_shape=tuple(self.meta.dataset_shape.sig), dtype=self.meta.input_dtype)}

        def process_frame(self, frame):
            self.results.frames[:] = frame

    ctx = Context.make_with("inline")
    try:
        dataset = ctx.load(kind, **params)
        return np.asarray(ctx.run_udf(dataset=dataset, udf=Frames())["frames"].data)
    finally:
        ctx.close()


def rosettasciio_counts(reader: str, path, **kwargs) -> np.ndarray:
    """Every count of a file as RosettaSciIO reads it (``rsciio.<reader>.file_reader``): its first signal's data."""
    import importlib

    return np.asarray(importlib.import_module(f"rsciio.{reader}").file_reader(str(path), **kwargs)[0]["data"])

