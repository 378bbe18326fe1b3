"""Saved residents: a resident written as it is held, and opened again without re-encoding.

A compressed resident is saved as its coding model, streams (the bytes its
encoder wrote) and group index, a dense one as its counts, a sparse one as its
non-zeros (row pointers, frames, pixels, values); the file is a
``formats.container``. Opening one copies the arrays to the device and lets
the resident's constructor check their structure.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from types import ModuleType

import numpy as np

from ..device import Uploads, array_module, host_memory, to_host
from ..formats import codec, container
from ..resident import DenseCounts, Resident
from ..resident.base import check_dtype, check_shape
from ..resident.compressed import MODEL_KEYS, STREAM_KEYS, CompressedCounts
from ..resident.groups import GROUP_KEYS, GroupIndex
from ..resident.sparse import SPARSE_KEYS, SparseCounts
from .source import Source

DENSE_KEY = "counts"
UPLOAD_SLOTS = 2 * container.THREADS  # one being filled and one being copied up per reading thread
PENDING = ("payload",)  # read while the resident is built: only its size is needed to check the rest


def save_resident(resident: Resident, path: str | os.PathLike) -> int:
    """Write ``resident`` to ``path`` as it is held; returns the file's bytes."""
    meta = {"layout": resident.layout, "shape": list(resident.shape), "dtype": str(resident.dtype)}
    if isinstance(resident, CompressedCounts):
        cy2, cx2 = resident.groups.center
        meta |= {"codec": codec.FORMAT, "block": resident.block, "stats": dict(resident.stats), "group_center": [cy2, cx2]}
        arrays = {k: getattr(resident.model, k) for k in MODEL_KEYS} | resident.stream_arrays() | resident.groups.arrays()
    elif isinstance(resident, DenseCounts):
        arrays = {DENSE_KEY: resident.flat}
    elif isinstance(resident, SparseCounts):
        arrays = resident.arrays()
    else:
        raise TypeError(f"cannot save a resident of layout {resident.layout!r}")
    return container.write(path, meta, {k: to_host(v) for k, v in arrays.items()})


def is_saved(source: Source) -> bool:
    """Whether ``source`` is a saved resident, opened whole (:func:`open_resident`), rather than a file a
    reader streams (``io.registry.open_reader``): the one place loads and inspections choose between them."""
    return container.is_container(Path(source.path).expanduser())


def describe_saved(source: Source) -> dict:
    """Shape, dtype, raw bytes, layout and the device bytes a load reserves, from a saved resident's header."""
    meta = container.read_header(Path(source.path).expanduser())
    shape, dtype = check_shape(meta["shape"]), check_dtype(meta["dtype"])
    if source.dataset is not None:
        raise ValueError(f"{source.path!r} is a saved resident: it holds one acquisition, not dataset {source.dataset!r}")
    if source.scan_shape is not None and tuple(source.scan_shape) != shape[:2]:
        raise ValueError(f"{source.path!r} has scan shape {shape[:2]}, but scan_shape={tuple(source.scan_shape)} was given")
    return {
        "shape": shape,
        "dtype": str(dtype),
        "raw_bytes": int(np.prod(shape)) * dtype.itemsize,
        "load_bytes": {"dense": DenseCounts.held_bytes(shape, dtype), "sparse": sum(int(a["nbytes"]) for a in meta["arrays"])}.get(
            meta["layout"]) or compressed_bytes(meta),
        "layout": meta["layout"],
    }


def compressed_bytes(meta: dict) -> int:
    """Device bytes of a saved compressed resident once open: its arrays plus its group index's derived starts."""
    entries = {a["name"]: a for a in meta["arrays"]}
    width = entries.get("group_width", {"shape": [0]})["shape"]
    return sum(int(a["nbytes"]) for a in meta["arrays"]) + GroupIndex.derived_bytes(tuple(width))


def open_resident(name: str, path: str | os.PathLike, xp: ModuleType | None = None) -> Resident:
    """The resident saved at ``path``, named ``name``, its arrays on the device of ``xp`` (default: this process's):
    for a GPU, read in chunks through pinned slots straight into device memory (``device.Uploads``). A
    compressed resident is built and checked while its payload is still read (``container.opened``)."""
    xp = xp or array_module()

    def build(meta: dict, arrays: dict) -> Resident:
        return resident_from(name, path, meta, arrays, xp)

    if xp is np:
        return container.opened(path, build, pending=PENDING)
    # 16 bytes spare: a payload that ends the allocation is still padded to whole lines for the decoder
    # (else the resident would copy it, before its bytes arrive)
    return container.opened(path, build, lambda nbytes: xp.empty(nbytes + 16, np.uint8)[:nbytes], uploads(), PENDING)


@functools.cache
def uploads() -> Uploads:
    """This process's pinned slots for reads bound for its GPU (made at the first reopen, or as a shard warms up)."""
    return Uploads(UPLOAD_SLOTS, container.CHUNK)


def read_saved(path: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """The header and host arrays of the resident saved at ``path``, every checksum verified (nothing built yet:
    a damaged file is refused before anything else is done); in pinned memory where they go to a GPU."""
    return container.read(path, host_memory)


def resident_from(name: str, path: str | os.PathLike, meta: dict, arrays: dict[str, np.ndarray], xp: ModuleType | None = None) -> Resident:
    """The resident of a saved file's header and arrays (``read_saved``), on the device of ``xp``."""
    xp = xp or array_module()
    where = os.fspath(path)
    layout = meta["layout"]
    wanted = {"dense": (DENSE_KEY,), "sparse": SPARSE_KEYS}.get(layout, MODEL_KEYS + STREAM_KEYS + GROUP_KEYS)
    missing = [k for k in wanted if k not in arrays]
    if missing:
        raise ValueError(f"{where!r}: the saved {layout} resident lacks the arrays {missing}")
    unknown = sorted(k for k in arrays if k not in wanted)
    if unknown:
        raise ValueError(f"{where!r}: the saved {layout} resident holds arrays this version does not know: {unknown}")
    if layout == "dense":
        counts = arrays[DENSE_KEY]
        if counts.dtype != np.dtype(meta["dtype"]):
            raise ValueError(f"{where!r}: the saved counts are {counts.dtype}, but the header says {meta['dtype']}")
        return DenseCounts(name, xp.asarray(counts), meta["shape"]).indexed()
    if layout == "sparse":
        try:
            return SparseCounts.held_as(name, check_shape(meta["shape"]), meta["dtype"], *(xp.asarray(arrays[k]) for k in SPARSE_KEYS))
        except ValueError as e:
            raise ValueError(f"{where!r}: {e}") from None
    payload = arrays["payload"]
    if payload.ndim != 1 or payload.dtype != np.uint8:
        raise ValueError(f"{where!r}: the saved stream payload is {payload.dtype} of shape {payload.shape}, expected 1-D uint8")
    model = {k: xp.asarray(arrays[k]) for k in MODEL_KEYS}
    streams = {k: xp.asarray(arrays[k]) for k in STREAM_KEYS}
    shape = check_shape(meta["shape"])
    try:
        groups = GroupIndex.from_arrays(shape[2:], *meta["group_center"], arrays, shape[0] * shape[1], xp)
    except ValueError as e:
        raise ValueError(f"{where!r}: {e}") from None
    return CompressedCounts(name, shape, meta["dtype"], meta["block"], model, streams, meta.get("stats", {}), groups)
