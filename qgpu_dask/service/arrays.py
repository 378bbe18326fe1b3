"""An acquisition as a Dask array (``acq.to_dask()``), so HyperSpy and plain Dask work on a resident without a
copy of its file: each chunk, whole scan rows of about CHUNK_BYTES of counts, is a task that asks the owner's
shard for those frames (``Shard.frames``: any layout, decoded where compressed) when the array is computed, on
any worker of the service's Dask client or, with another scheduler, through that client. After the
acquisition moves (a worker lost) or is released, its chunks say so: make the array again.
"""

from __future__ import annotations

import uuid

import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from distributed import Actor

from .shard import Shard, shard_key

CHUNK_BYTES = 64 * 2**20


def held_frames(name: str, owner: str, first_row: int, rows: int, shape: tuple[int, int, int, int]) -> np.ndarray:
    """Scan rows ``first_row`` .. ``first_row + rows`` of acquisition ``name``, (rows, cols, det rows, det cols),
    from the shard of ``owner`` (on the owner itself: no transfer); RuntimeError naming it where it is not held there."""
    cols = shape[1]
    shard = Actor(Shard, owner, key=shard_key(owner))
    try:
        flat = shard.frames(name, first_row * cols, (first_row + rows) * cols).result()
    except (KeyError, OSError) as err:
        raise RuntimeError(f"acquisition {name!r} is not held on {owner} ({err}): released, or held elsewhere since a worker was"
                           " lost: make its array again with acq.to_dask()") from None
    return flat.reshape(rows, *shape[1:])


def as_dask(name: str, owner: str, shape: tuple[int, int, int, int], dtype: np.dtype, chunk_bytes: int = CHUNK_BYTES) -> da.Array:
    """The Dask array of acquisition ``name`` held by ``owner``: chunks of whole scan rows, one task each, in one
    graph layer annotated for the owner (kept where a graph is computed unoptimized; Dask's array optimization
    drops annotations, and a chunk read elsewhere comes from the owner's shard); its keys are new at every
    call (an acquisition released and loaded again under its name is another array)."""
    row_bytes = shape[1] * shape[2] * shape[3] * np.dtype(dtype).itemsize
    step = max(1, chunk_bytes // row_bytes)
    starts = range(0, shape[0], step)
    key = f"qgpu-{name}-{uuid.uuid4().hex[:12]}"
    tasks = {(key, i, 0, 0, 0): (held_frames, name, owner, lo, min(step, shape[0] - lo), shape) for i, lo in enumerate(starts)}
    layer = MaterializedLayer(tasks, annotations={"workers": [owner], "allow_other_workers": True})
    chunks = (tuple(min(step, shape[0] - lo) for lo in starts), (shape[1],), (shape[2],), (shape[3],))
    return da.Array(HighLevelGraph({key: layer}, {key: set()}), key, chunks, dtype=dtype)
