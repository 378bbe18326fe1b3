"""The saved form of a resident: one file holding its arrays as they are (GPU-free, NumPy).

A resident is saved without re-encoding (compressed streams stay the bytes
the encoder wrote), so reopening it costs a read and a copy to the device. The
read is parallel: each array's checksum is a digest of the digests of its
32 KiB leaves, so several threads read CHUNKs at once into one allocation that
the arrays are views of, and the leaves are checked where they land: on the
host by the reading threads, or on the GPU in the device memory the chunks were
copied into (``sha256_cuda``; a single SHA-256 over an array would hold the
read to one core, about 1.4 GB/s, and hashing on the host costs as much as
reading).

Layout (all integers little-endian; offsets from the start of the file)::

    0        8 bytes   magic b"QGPURES\x00"
    8        uint32    version (4)
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
the concatenated SHA-256 digests of the array's bytes (C order) in leaves of
LEAF bytes (the last may be shorter; an empty array has no leaf). Writing
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
from typing import Callable, TypeVar

import numpy as np

from . import codec

MAGIC = b"QGPURES\x00"
VERSION = 4
PREFIX = struct.Struct("<8sII")  # magic, version, header length
DIGEST_BYTES = 32
ALIGN = 4096
LEAF = 32 << 10  # bytes of an array under one leaf digest
CHUNK = 128 * LEAF  # bytes of an array read at once (4 MiB: whole leaves)
THREADS = min(16, os.cpu_count() or 1)  # threads that read (and on the host, digest) chunks
LAYOUTS = ("dense", "compressed", "sparse")
CODECS = (codec.FORMAT,)

PathLike = str | os.PathLike
T = TypeVar("T")


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


def spans(nbytes: int, size: int) -> list[tuple[int, int]]:
    """The (start, end) of ``nbytes`` cut into pieces of ``size`` bytes, the last shorter; none for no bytes."""
    return [(lo, min(lo + size, nbytes)) for lo in range(0, nbytes, size)]


def leaf_digests(data) -> bytes:
    """The concatenated SHA-256 digests of the leaves of the bytes ``data`` (a buffer whose first byte starts
    a leaf): on the host, the twin of ``sha256_cuda.range_digests``."""
    view = memoryview(data).cast("B")
    return b"".join(hashlib.sha256(view[a:b]).digest() for a, b in spans(view.nbytes, LEAF))


def tree_digest(leaves: bytes) -> str:
    """An array's checksum from its leaves' concatenated SHA-256 digests, in order."""
    return hashlib.sha256(leaves).hexdigest()


def digest(data: np.ndarray, threads: ThreadPoolExecutor) -> str:
    """The checksum of the flat uint8 array ``data`` (its chunks' leaves digested on ``threads``)."""
    return tree_digest(b"".join(threads.map(lambda span: leaf_digests(data[span[0] : span[1]]), spans(data.size, CHUNK))))


def write(path: PathLike, meta: dict, arrays: dict[str, np.ndarray]) -> int:
    """Write ``arrays`` with the header ``meta`` to ``path``; returns the file's bytes.

    The file is written under a temporary name in the same folder and renamed
    over ``path`` at the end, so a crash never leaves a half-written file there;
    an OSError names ``path`` (the name the caller gave), not the temporary one.
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
    except BaseException as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # never made: its folder is not one
        if isinstance(err, OSError):
            raise unwritable(err, path) from None
        raise
    return size


def unwritable(err: OSError, path: PathLike) -> OSError:
    """``err`` (writing ``path`` failed, perhaps on a temporary file beside it) as the same kind of OSError naming
    ``path`` and what to do."""
    why = os.strerror(err.errno) if err.errno else str(err)
    return OSError(err.errno, f"{why}: cannot write the file there; give a path in a folder this worker can write, "
                              "with room for the file", str(path))


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
    """(header, arrays) of the container at ``path``, every checksum verified (``opened``, building nothing)."""
    return opened(path, lambda meta, arrays: (meta, arrays), allocate, stage)


def opened(path: PathLike, build: Callable[[dict, dict[str, np.ndarray]], T],
           allocate: Callable[[int], np.ndarray] = lambda nbytes: np.empty(nbytes, np.uint8), stage=None,
           pending: tuple[str, ...] = ()) -> T:
    """``build(header, arrays)`` of the container at ``path``, returned once every checksum is verified.

    The arrays are writable views of one allocation (``allocate(nbytes)``, uint8), read chunk by chunk on
    THREADS threads, each chunk's leaves digested by the thread that read it. With ``stage``
    (``device.Uploads``), the allocation is device memory: each chunk is read into one of its pinned host
    slots (``stage.slot(nbytes)``) and sent on into the allocation, so the file never passes through host
    memory of its size, and the leaves are digested there, on the GPU, once the copies are done. The arrays
    named in ``pending`` are read last, while ``build`` runs on the calling thread (it may use their shape
    and dtype, not their bytes): a reopen's checks and tables are made while the largest array still
    arrives, and its result is dropped if that array then fails its checksum."""
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
        arrays = {e["name"]: buffer[e["offset"] - lo : e["offset"] - lo + e["nbytes"]].view(np.dtype(e["dtype"])).reshape(e["shape"])
                  for e in entries}
        early = [k for k, e in enumerate(entries) if e["name"] not in pending]
        late = [k for k, e in enumerate(entries) if e["name"] in pending]

        def filled(view: memoryview, at: int) -> None:
            done = 0
            while done < view.nbytes:
                got = os.preadv(f.fileno(), [view[done:]], lo + at + done)
                if got <= 0:
                    raise ValueError(f"{where!r} is truncated: it ended while being read")
                done += got

        def on_host(a: int, b: int) -> bytes:
            view = memoryview(buffer)[a:b]
            filled(view, a)
            return leaf_digests(view)

        def to_device(a: int, b: int) -> None:
            with stage.slot(b - a) as slot:
                filled(memoryview(slot.host), a)
                slot.send(buffer, a)

        def started(ks: list[int]) -> list[list]:
            """Each array's chunk reads, queued on the threads."""
            work = on_host if stage is None else to_device
            return [[threads.submit(work, entries[k]["offset"] - lo + a, entries[k]["offset"] - lo + b)
                     for a, b in spans(entries[k]["nbytes"], CHUNK)] for k in ks]

        def verified(ks: list[int], reads: list[list]) -> None:
            """ValueError unless each array's leaves, its reads done, match its checksum."""
            if not ks:
                return
            if stage is None:
                leaves = [b"".join(r.result() for r in chunk_reads) for chunk_reads in reads]
            else:
                for chunk_reads in reads:
                    for r in chunk_reads:
                        r.result()
                stage.finish()
                leaves = device_leaves(buffer, [(entries[k]["offset"] - lo, entries[k]["nbytes"]) for k in ks])
            for k, leaf_digests_of in zip(ks, leaves):
                if tree_digest(leaf_digests_of) != entries[k]["sha256"]:
                    raise ValueError(f"{where!r}: array {entries[k]['name']!r} does not match its checksum (the file is corrupted)")

        threads = ThreadPoolExecutor(THREADS)
        try:
            first, last = started(early), started(late)
            verified(early, first)
            built = build(meta, arrays)
            verified(late, last)
        finally:
            threads.shutdown(cancel_futures=True)
            if stage is not None:
                stage.finish()  # no copy may still run into memory freed after a failed read
    return built


def device_leaves(buffer, places: list[tuple[int, int]]) -> list[bytes]:
    """The concatenated leaf digests of each array (start, nbytes) of the device allocation ``buffer``, taken
    on its GPU in one launch."""
    from .sha256_cuda import range_digests

    leaves = [[(start + a, b - a) for a, b in spans(nbytes, LEAF)] for start, nbytes in places]
    flat = [leaf for array in leaves for leaf in array]
    digests = range_digests(buffer, np.array([a for a, _ in flat], np.uint64), np.array([n for _, n in flat], np.uint64))
    bounds = np.cumsum([0] + [len(array) for array in leaves])
    return [digests[a:b].tobytes() for a, b in zip(bounds[:-1], bounds[1:])]
