"""The saved form of a resident: one file holding its arrays as they are (GPU-free, NumPy).

A resident is saved without re-encoding (compressed streams stay the bytes
the encoder wrote), so reopening it costs a read and a copy to the device. The
read is parallel: each array's checksum is a digest of digests of its 4 MiB
chunks, so several threads read and check chunks at once, into one allocation
that the arrays are views of (a single SHA-256 over an array would hold the
read to one core, about 1 GB/s).

Layout (all integers little-endian; offsets from the start of the file)::

    0        8 bytes   magic b"QGPURES\x00"
    8        uint32    version (3)
    12       uint32    header length H
    16       H bytes   header: UTF-8 JSON, keys sorted, no spaces
    16 + H   32 bytes  SHA-256 of the H header bytes
    ...      zeros up to the first array; every array starts at a multiple
             of 4096 bytes (a page: read straight into page-aligned memory)
             and is followed by zeros up to the next one

The header holds ``layout`` ("dense" or "compressed"), ``codec`` (the stream
format of a compressed resident, ``formats.codec.FORMAT``), ``shape``,
``dtype`` (the counts'), ``block``, ``group_center`` (the group index's
centre (cy2, cx2) in half pixels), ``stats`` and ``arrays``: a list of
``{name, dtype, shape, offset, nbytes, sha256}``, the dtype as NumPy's
explicit little-endian string (``"<u2"``), ``sha256`` as hex of the SHA-256 of
the concatenated SHA-256 digests of the array's bytes (C order) in chunks of
CHUNK bytes (the last may be shorter; an empty array has no chunk). Writing
the same meta and arrays gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from . import codec

MAGIC = b"QGPURES\x00"
VERSION = 3
PREFIX = struct.Struct("<8sII")  # magic, version, header length
DIGEST_BYTES = 32
ALIGN = 4096
CHUNK = 4 << 20  # bytes of an array digested (and read) at once
THREADS = min(16, os.cpu_count() or 1)  # threads that read and digest chunks
LAYOUTS = ("dense", "compressed")
CODECS = (codec.FORMAT,)

PathLike = str | os.PathLike


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def little_endian(array: np.ndarray) -> np.ndarray:
    """``array`` C-contiguous and little-endian (a copy only when it is not already)."""
    array = np.ascontiguousarray(array)
    return array.astype(array.dtype.newbyteorder("<"), copy=False)


def as_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array, as a flat uint8 view."""
    return array.reshape(-1).view(np.uint8)


def is_container(path: PathLike) -> bool:
    """Whether ``path`` is a file that starts with the container magic."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def check_meta(meta: dict, where: str) -> None:
    """ValueError unless ``meta`` has a known layout, a shape, a dtype and, compressed, a known codec and a block."""
    layout = meta.get("layout")
    if layout not in LAYOUTS:
        raise ValueError(f"{where!r}: unknown resident layout {layout!r} (known: {', '.join(LAYOUTS)})")
    if not isinstance(meta.get("shape"), list) or not isinstance(meta.get("dtype"), str):
        raise ValueError(f"{where!r}: the header lacks the resident's shape or dtype")
    if not isinstance(meta.get("stats", {}), dict):
        raise ValueError(f"{where!r}: the header's stats are not an object")
    if layout == "compressed":
        if meta.get("codec") not in CODECS:
            raise ValueError(f"{where!r}: unknown codec {meta.get('codec')!r} (this qgpu-dask reads {', '.join(CODECS)}):"
                             " save it again from its source")
        block = meta.get("block")
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"{where!r}: a compressed resident needs a positive block, the header has {block!r}")
        center = meta.get("group_center")
        if not (isinstance(center, list) and len(center) == 2 and all(isinstance(c, int) and not isinstance(c, bool) for c in center)):
            raise ValueError(f"{where!r}: a compressed resident needs its group index centre [cy2, cx2], the header has {center!r}")


def encode_header(meta: dict, entries: list[dict]) -> bytes:
    return json.dumps({**meta, "arrays": entries}, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def chunks(nbytes: int) -> list[tuple[int, int]]:
    """The (start, end) of an array's digest chunks: CHUNK bytes each, the last shorter; none for no bytes."""
    return [(lo, min(lo + CHUNK, nbytes)) for lo in range(0, nbytes, CHUNK)]


def tree_digest(leaves: list[bytes]) -> str:
    """An array's checksum from its chunks' SHA-256 digests, in order."""
    return hashlib.sha256(b"".join(leaves)).hexdigest()


def digest(data: np.ndarray, threads: ThreadPoolExecutor) -> str:
    """The checksum of the flat uint8 array ``data`` (its chunks digested on ``threads``)."""
    return tree_digest(list(threads.map(lambda span: hashlib.sha256(data[span[0] : span[1]]).digest(), chunks(data.size))))


def write(path: PathLike, meta: dict, arrays: dict[str, np.ndarray]) -> int:
    """Write ``arrays`` with the header ``meta`` to ``path``; returns the file's bytes.

    The file is written under a temporary name in the same folder and renamed
    over ``path`` at the end, so a crash never leaves a half-written file there.
    """
    path = Path(path)
    meta = json.loads(json.dumps(meta))  # as it will read back: tuples become lists
    check_meta(meta, str(path))
    if "arrays" in meta:
        raise ValueError("the header's 'arrays' field is written by the container, not given in meta")
    arrays = {name: little_endian(a) for name, a in arrays.items()}
    with ThreadPoolExecutor(THREADS) as threads:
        entries = [
            {"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": 0, "nbytes": int(a.nbytes),
             "sha256": digest(as_bytes(a), threads)}
            for name, a in arrays.items()
        ]
    # Offsets depend on the header's length, which depends on the offsets: grow the start until it holds.
    start = 0
    while True:
        at = start
        for entry in entries:
            entry["offset"] = at
            at = aligned(at + entry["nbytes"])
        header = encode_header(meta, entries)
        need = aligned(PREFIX.size + len(header) + DIGEST_BYTES)
        if need <= start:
            break
        start = need
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(PREFIX.pack(MAGIC, VERSION, len(header)))
            f.write(header)
            f.write(hashlib.sha256(header).digest())
            for entry, a in zip(entries, arrays.values()):
                f.write(bytes(entry["offset"] - f.tell()))
                f.write(as_bytes(a))
            size = f.tell()
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size


def read_header(path: PathLike) -> dict:
    """The checked header of the container at ``path`` (its arrays listed, not read)."""
    with open(path, "rb") as f:
        return header_of(f, str(path))


def header_of(f, where: str) -> dict:
    """The checked header of the open container ``f`` (read from its start); ``where`` names it in errors."""
    prefix = f.read(PREFIX.size)
    if prefix[: len(MAGIC)] != MAGIC:
        raise ValueError(f"{where!r} is not a saved qgpu resident (first bytes {prefix[: len(MAGIC)]!r}, expected {MAGIC!r})")
    if len(prefix) < PREFIX.size:
        raise ValueError(f"{where!r} is truncated: it ends inside the container prefix")
    _, version, length = PREFIX.unpack(prefix)
    if version != VERSION:
        raise ValueError(f"{where!r}: saved resident format version {version} is not supported (this qgpu-dask reads version {VERSION}):"
                         " save it again from its source")
    header = f.read(length)
    digest = f.read(DIGEST_BYTES)
    if len(header) < length or len(digest) < DIGEST_BYTES:
        raise ValueError(f"{where!r} is truncated: it ends inside the header")
    if hashlib.sha256(header).digest() != digest:
        raise ValueError(f"{where!r}: the header does not match its checksum (the file is corrupted)")
    try:
        meta = json.loads(header)
    except ValueError as e:
        raise ValueError(f"{where!r}: the header is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("arrays"), list):
        raise ValueError(f"{where!r}: the header is not an object with a list of arrays")
    check_meta(meta, where)
    header_end = PREFIX.size + length + DIGEST_BYTES
    for entry in meta["arrays"]:
        check_entry(entry, header_end, where)
    names = [entry["name"] for entry in meta["arrays"]]
    if len(set(names)) != len(names):
        raise ValueError(f"{where!r}: array names repeat in the header ({names})")
    return meta


def check_entry(entry: dict, header_end: int, where: str) -> None:
    """ValueError unless an array entry is well formed: a numeric dtype, sizes that agree, an aligned offset."""
    name = entry.get("name") if isinstance(entry, dict) else None
    try:
        dtype = np.dtype(entry["dtype"])
        shape = tuple(int(s) for s in entry["shape"])
        offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{where!r}: array {name!r} has a malformed header entry") from None
    if not isinstance(name, str) or not isinstance(entry.get("sha256"), str):
        raise ValueError(f"{where!r}: array {name!r} has a malformed header entry")
    if dtype.kind not in "biuf" or min(shape, default=0) < 0 or nbytes != int(np.prod(shape)) * dtype.itemsize:
        raise ValueError(f"{where!r}: array {name!r} has an invalid dtype, shape or size in the header")
    if offset % ALIGN or offset < header_end:
        raise ValueError(f"{where!r}: array {name!r} has an invalid offset {offset}")


def read(path: PathLike, allocate: Callable[[int], np.ndarray] = lambda nbytes: np.empty(nbytes, np.uint8),
         stage=None) -> tuple[dict, dict[str, np.ndarray]]:
    """(header, arrays) of the container at ``path``, every checksum verified; the arrays are writable views of
    one allocation (``allocate(nbytes)``, uint8: pinned memory for arrays bound for a GPU), read and checked
    chunk by chunk on THREADS threads. With ``stage`` (``device.Uploads``), the allocation is device memory:
    each chunk is read into one of its pinned host slots (``stage.slot(nbytes)``), checked there and sent on
    into the allocation, so the file never passes through host memory of its size."""
    where = str(path)
    with open(path, "rb") as f:
        meta = header_of(f, where)
        size = os.fstat(f.fileno()).st_size
        entries = meta["arrays"]
        for entry in entries:
            if entry["offset"] + entry["nbytes"] > size:
                raise ValueError(f"{where!r} is truncated: array {entry['name']!r} ends past the end of the file")
        lo = min((e["offset"] for e in entries), default=0)
        hi = max((e["offset"] + e["nbytes"] for e in entries), default=0)
        buffer = allocate(max(hi - lo, 0))
        spans = [(k, entry["offset"] - lo + a, entry["offset"] - lo + b) for k, entry in enumerate(entries) for a, b in chunks(entry["nbytes"])]

        def filled(view: memoryview, at: int) -> bytes:
            done = 0
            while done < view.nbytes:
                got = os.preadv(f.fileno(), [view[done:]], lo + at + done)
                if got <= 0:
                    raise ValueError(f"{where!r} is truncated: it ended while being read")
                done += got
            return hashlib.sha256(view).digest()

        def leaf(span: tuple[int, int, int]) -> bytes:
            _, a, b = span
            if stage is None:
                return filled(memoryview(buffer)[a:b], a)
            with stage.slot(b - a) as slot:
                leaf_digest = filled(memoryview(slot.host), a)
                slot.send(buffer, a)
            return leaf_digest

        try:
            with ThreadPoolExecutor(THREADS) as threads:
                leaves_of: list[list[bytes]] = [[] for _ in entries]
                for (k, _, _), leaf_digest in zip(spans, threads.map(leaf, spans)):
                    leaves_of[k].append(leaf_digest)
        finally:
            if stage is not None:
                stage.finish()  # no copy may still run into memory freed after a failed read
    arrays = {}
    for entry, leaves in zip(entries, leaves_of):
        name = entry["name"]
        if tree_digest(leaves) != entry["sha256"]:
            raise ValueError(f"{where!r}: array {name!r} does not match its checksum (the file is corrupted)")
        start = entry["offset"] - lo
        arrays[name] = buffer[start : start + entry["nbytes"]].view(np.dtype(entry["dtype"])).reshape(entry["shape"])
    return meta, arrays
