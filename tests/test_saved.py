"""Saved residents: written as held, reopened without re-encoding, byte-identical; damaged files refused."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.formats import codec, container

SHAPE = (5, 7, 17, 17)


def poisson(rng, shape=SHAPE) -> np.ndarray:
    return rng.poisson(0.8, shape).astype(np.uint16)


def answers(acq, data) -> list[np.ndarray]:
    """Every kind of query on ``acq``, each checked against NumPy on ``data``."""
    masks = np.stack([qd.masks.disk(SHAPE[2:], (8, 8), 4), qd.masks.disk(SHAPE[2:], (5, 11), 2.5)])
    roi = np.zeros(SHAPE[:2], bool)
    roi[1:4, 2:6] = True
    out = [
        acq.virtual_images(masks),
        acq.reduce(None, "sum"),
        acq.reduce(roi, "max"),
        acq.frame(3, 4),
    ]
    assert (out[0] == (data[None].astype(np.uint32) * masks[:, None, None]).sum(axis=(3, 4))).all()
    assert (out[1] == data.sum(axis=(0, 1), dtype=np.uint64)).all()
    assert (out[2] == data[roi].max(axis=0)).all()
    assert (out[3] == data[3, 4]).all()
    return out


def rewrite_header(path, change) -> None:
    """Apply ``change`` to the JSON header of the container at ``path``, keeping its checksum valid."""
    raw = path.read_bytes()
    length = container.PREFIX.unpack_from(raw)[2]
    meta = json.loads(raw[16 : 16 + length])
    change(meta)
    header = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    assert len(header) <= length
    header = header.ljust(length)  # JSON allows trailing spaces; the arrays stay where they were
    path.write_bytes(raw[:16] + header + hashlib.sha256(header).digest() + raw[16 + length + 32 :])


# ---------------------------------------------------------------- the container itself


def test_container_round_trip(tmp_path, rng):
    arrays = {
        "a": rng.integers(0, 2**16, (3, 5), dtype=np.uint16),
        "b": rng.random(7),
        "empty": np.zeros((0, 4), np.uint32),
        "bytes": rng.integers(0, 256, 101, dtype=np.uint8),
        "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
    }
    meta = {"layout": "dense", "shape": (1, 2, 3, 4), "dtype": "uint16", "stats": {"x": 0.1}}
    path = tmp_path / "c.qgpu"
    size = container.write(path, meta, arrays)
    assert size == path.stat().st_size
    assert container.is_container(path) and not container.is_container(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["c.qgpu"]  # no temporary file left behind

    header, back = container.read(path)
    assert header["shape"] == [1, 2, 3, 4] and header["stats"] == {"x": 0.1} and header["layout"] == "dense"
    assert list(back) == list(arrays)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype.newbyteorder("<") and back[name].shape == a.shape
        assert (back[name] == a).all()
        assert back[name].flags.writeable
    for entry in header["arrays"]:
        assert entry["offset"] % 4096 == 0

    raw = path.read_bytes()
    assert raw[:8] == b"QGPURES\x00" and struct.unpack_from("<I", raw, 8)[0] == 4
    length = struct.unpack_from("<I", raw, 12)[0]
    assert hashlib.sha256(raw[16 : 16 + length]).digest() == raw[16 + length : 48 + length]
    container.write(tmp_path / "again.qgpu", {k: v for k, v in header.items() if k != "arrays"}, back)
    assert (tmp_path / "again.qgpu").read_bytes() == raw


@pytest.mark.gpu
def test_container_read_through_pinned_slots_into_device_memory(tmp_path, rng):
    """Arrays of many chunks read through two slots (each taken again many times) land on the GPU byte for byte;
    a damaged chunk is refused with the slots free again."""
    cp = pytest.importorskip("cupy")
    from qgpu_dask.device import Uploads

    arrays = {"big": rng.integers(0, 2**32, (5 * container.CHUNK // 4 + 123,), dtype=np.uint32),
              "small": rng.integers(0, 256, 777, dtype=np.uint8), "empty": np.zeros(0, np.uint16)}
    path = tmp_path / "c.qgpu"
    container.write(path, {"layout": "dense", "shape": (1, 1, 1, 1), "dtype": "uint16"}, arrays)
    slots = Uploads(2, container.CHUNK)
    _, back = container.read(path, lambda nbytes: cp.empty(nbytes, np.uint8), slots)
    for name, a in arrays.items():
        assert isinstance(back[name], cp.ndarray) and back[name].dtype == a.dtype and (back[name].get() == a).all()
    raw = bytearray(path.read_bytes())
    raw[container.read_header(path)["arrays"][0]["offset"] + 3 * container.CHUNK] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="array 'big' does not match its checksum"):
        container.read(path, lambda nbytes: cp.empty(nbytes, np.uint8), slots)
    assert slots.free.qsize() == 2


@pytest.mark.gpu
def test_device_range_digests_are_hashlibs(rng):
    """The GPU's SHA-256 of byte ranges (kernels/sha256.cu) == hashlib's: every tail length around the padding
    limits (55, 56, 63, 64 bytes), empty and whole leaves, starts off and on 16-byte lines."""
    cp = pytest.importorskip("cupy")
    from qgpu_dask.formats.sha256_cuda import range_digests

    data = rng.integers(0, 256, 3 * container.LEAF + 4096, dtype=np.uint8)
    lengths = [0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 1000, container.LEAF - 1, container.LEAF, 2 * container.LEAF + 77]
    starts = [s for s in (0, 16, 1, 7, 4093) for _ in lengths]
    lengths = lengths * 5
    got = range_digests(cp.asarray(data), np.array(starts), np.array(lengths))
    assert got.shape == (len(starts), 32)
    for (a, n), digest in zip(zip(starts, lengths), got):
        assert digest.tobytes() == hashlib.sha256(data[a : a + n]).digest(), (a, n)
    assert container.leaf_digests(data) == range_digests(cp.asarray(data), np.arange(4) * container.LEAF,
                                                         [container.LEAF] * 3 + [4096]).tobytes()
    with pytest.raises(ValueError, match="a range ends past the"):
        range_digests(cp.asarray(data), np.array([data.size - 3]), np.array([4]))


def test_container_refuses_damage(tmp_path, rng):
    meta = {"layout": "compressed", "codec": codec.FORMAT, "block": 256, "shape": [1, 1, 1, 1], "dtype": "uint8", "group_center": [0, 0]}
    path = tmp_path / "c.qgpu"
    container.write(path, meta, {"payload": rng.integers(0, 256, 1000, dtype=np.uint8)})
    raw = path.read_bytes()
    entry = container.read_header(path)["arrays"][0]

    flipped = bytearray(raw)
    flipped[entry["offset"] + 500] ^= 0x10
    path.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="array 'payload' does not match its checksum"):
        container.read(path)

    path.write_bytes(raw[:-1])
    with pytest.raises(ValueError, match="truncated: array 'payload'"):
        container.read(path)
    path.write_bytes(raw[:20])
    with pytest.raises(ValueError, match="truncated"):
        container.read(path)

    path.write_bytes(raw[:8] + struct.pack("<I", 3) + raw[12:])
    with pytest.raises(ValueError, match=r"format version 3 is not supported \(this qgpu-dask reads version 4\): save it again from its source"):
        container.read(path)

    header = bytearray(raw)
    header[20] ^= 0x01
    path.write_bytes(bytes(header))
    with pytest.raises(ValueError, match="header does not match its checksum"):
        container.read(path)

    path.write_bytes(raw)
    rewrite_header(path, lambda m: m.update(codec="qgpu-ans-9"))
    with pytest.raises(ValueError, match="unknown codec 'qgpu-ans-9'"):
        container.read(path)
    path.write_bytes(raw)
    rewrite_header(path, lambda m: m.update(codec="qgpu-ans-1"))
    with pytest.raises(ValueError, match=r"unknown codec 'qgpu-ans-1' \(this qgpu-dask reads qgpu-ans-2\): save it again from its source"):
        container.read(path)
    path.write_bytes(raw)
    rewrite_header(path, lambda m: m.pop("group_center"))
    with pytest.raises(ValueError, match=r"needs its group index centre \[cy2, cx2\], the header has None"):
        container.read(path)

    path.write_bytes(b"\x89HDF\r\n\x1a\n" + raw[8:])
    with pytest.raises(ValueError, match=r"c\.qgpu.*not a saved qgpu resident.*HDF"):
        container.read(path)
    assert not container.is_container(path)

    with pytest.raises(ValueError, match="unknown codec"):
        container.write(tmp_path / "d.qgpu", meta | {"codec": "zstd"}, {})
    assert not (tmp_path / "d.qgpu").exists()


# ---------------------------------------------------------------- through the service


@pytest.mark.parametrize("layout", ["compressed", "dense"])
def test_save_and_reload(svc, names, rng, tmp_path, layout):
    data = poisson(rng)
    acq = svc.put(data, name=names(), layout=layout)
    path = tmp_path / "run1.qgpu"
    assert acq.save(path) == str(path)
    again = svc.load(path, name=names("again"), layout="auto")
    assert again.info()["layout"] == layout == acq.info()["layout"]
    assert again.nbytes == acq.nbytes
    assert again.info()["source"]["path"] == str(path)
    for mine, theirs in zip(answers(again, data), answers(acq, data)):
        assert mine.dtype == theirs.dtype and (mine == theirs).all()

    resaved = tmp_path / "resaved.qgpu"
    again.save(resaved)
    assert resaved.read_bytes() == path.read_bytes()

    header = container.read_header(path)
    assert header["layout"] == layout and header["shape"] == list(SHAPE) and header["dtype"] == "uint16"
    if layout == "compressed":
        assert header["codec"] == codec.FORMAT and header["block"] >= 1
        assert {a["name"] for a in header["arrays"]} == {"run", "values", "table_start", "cum", "index", "block_base", "payload", "totals",
                                                        "group_base", "group_width", "group_bits"}
    saved_bytes = sum(a["nbytes"] for a in header["arrays"])
    if layout == "compressed":  # the group index's starts are derived when it is reopened: 8 bytes per (block, group)
        saved_bytes += 8 * int(np.prod(next(a["shape"] for a in header["arrays"] if a["name"] == "group_width")))
    assert saved_bytes == (acq.nbytes if layout == "compressed" else acq.info()["raw_bytes"])  # a dense index is built at reopen

    other = "dense" if layout == "compressed" else "compressed"
    with pytest.raises(ValueError, match=f"held {layout} and loads as it was saved"):
        svc.load(path, name=names("wrong"), layout=other)
    with pytest.raises(ValueError, match="saved resident: it holds one acquisition, not dataset '/data'"):
        svc.load(path, name=names("ds"), dataset="/data")


def test_name_defaults_to_stem(svc, rng, tmp_path):
    data = poisson(rng)
    acq = svc.put(data)
    try:
        acq.save(tmp_path / "stem_saved.qgpu")
    finally:
        acq.release()
    again = svc.load(tmp_path / "stem_saved.qgpu")
    try:
        assert again.name == "stem_saved"
        assert (again.frame(0, 1) == data[0, 1]).all()
    finally:
        again.release()


def still_usable(svc, names, rng) -> None:
    data = poisson(rng)
    answers(svc.put(data, name=names("after")), data)


@pytest.mark.parametrize("layout", ["compressed", "dense"])
def test_damaged_files_refused(svc, names, rng, tmp_path, layout):
    acq = svc.put(poisson(rng), name=names(), layout=layout)
    path = tmp_path / "good.qgpu"
    acq.save(path)
    raw = path.read_bytes()
    entries = {a["name"]: a for a in container.read_header(path)["arrays"]}
    target = "payload" if layout == "compressed" else "counts"

    refused = [names("flipped"), names("v3"), names("short")]

    flipped = bytearray(raw)
    flipped[entries[target]["offset"] + entries[target]["nbytes"] // 2] ^= 0x04
    (tmp_path / "flipped.qgpu").write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match=f"array '{target}' does not match its checksum"):
        svc.load(tmp_path / "flipped.qgpu", name=refused[0])
    still_usable(svc, names, rng)

    (tmp_path / "v3.qgpu").write_bytes(raw[:8] + struct.pack("<I", 3) + raw[12:])
    with pytest.raises(ValueError, match="saved resident format version 3 is not supported .* save it again from its source"):
        svc.load(tmp_path / "v3.qgpu", name=refused[1])

    (tmp_path / "short.qgpu").write_bytes(raw[:-3])
    with pytest.raises(ValueError, match=r"is truncated: array '\w+' ends past the end of the file"):
        svc.load(tmp_path / "short.qgpu", name=refused[2])

    assert not [n for n in refused if n in svc]
    assert all(s["reserved_bytes"] == 0 for s in svc.info()["shards"])
    still_usable(svc, names, rng)


def test_unknown_arrays_refused(tmp_path, rng):
    from qgpu_dask.io.saved import open_resident, save_resident
    from qgpu_dask.resident.compressed import CompressedCounts

    counts = poisson(rng)
    resident = CompressedCounts.encode("t", counts.reshape(35, -1), counts.shape)
    path = tmp_path / "r.qgpu"
    save_resident(resident, path)
    meta, arrays = container.read(path)
    meta.pop("arrays")
    container.write(path, meta, arrays | {"extra": np.zeros(3, np.uint8)})
    with pytest.raises(ValueError, match=r"holds arrays this version does not know: \['extra'\]"):
        open_resident("t", path)
