"""An independent reader of saved compressed residents, written from docs/compressed-format.md alone.

It parses the container bytes (§11), decodes every stream in every form (§2-§6)
and the group index (§10) with plain Python integers and NumPy, and checks
them == against the dense counts the file was saved from. It imports nothing
of qgpu_dask's readers or decoders (only the writer, to make the files): it is
the proof that the spec is complete.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct

import numpy as np
import pytest

from qgpu_dask.io.saved import save_resident
from qgpu_dask.resident.compressed import CompressedCounts

# ---------------------------------------------------------------- §11: the container


def read_container(raw: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    assert raw[:8] == b"QGPURES\x00"
    version, length = struct.unpack_from("<II", raw, 8)
    assert version == 4
    header = raw[16 : 16 + length]
    assert hashlib.sha256(header).digest() == raw[16 + length : 48 + length]
    meta = json.loads(header)
    arrays = {}
    for entry in meta["arrays"]:
        offset, nbytes = entry["offset"], entry["nbytes"]
        assert offset % 4096 == 0 and offset >= 48 + length
        data = raw[offset : offset + nbytes]
        leaves = b"".join(hashlib.sha256(data[at : at + 32768]).digest() for at in range(0, nbytes, 32768))
        assert len(data) == nbytes and hashlib.sha256(leaves).hexdigest() == entry["sha256"]
        arrays[entry["name"]] = np.frombuffer(data, dtype=np.dtype(entry["dtype"])).reshape(entry["shape"])
    return meta, arrays


# ---------------------------------------------------------------- §2-§6: the streams


def le(data: bytes, at: int, nbytes: int) -> int:
    return int.from_bytes(data[at : at + nbytes], "little")


class Words:
    """The 16-bit words of an ans stream, from word 2 on (§6)."""

    def __init__(self, stream: bytes):
        self.stream, self.next = stream, 2

    def read(self) -> int:
        assert 2 * self.next + 2 <= len(self.stream), "truncated"
        word = le(self.stream, 2 * self.next, 2)
        self.next += 1
        return word


def symbol(x: int, table: list[int], words: Words) -> tuple[int, int]:
    """(symbol, new state) decoded from table T (§6)."""
    slot = x & 4095
    s = max(i for i in range(len(table) - 1) if table[i] <= slot)
    x = (table[s + 1] - table[s]) * (x >> 12) + slot - table[s]
    if x < 2**16:
        x = (x << 16) | words.read()
    return s, x


def decode_ans(stream: bytes, n: int, R: int, V: int, value_table: list[int], run_table: list[int], chunks: int, maxval: int) -> list[int]:
    x = le(stream, 0, 4)
    assert x >= 2**16 and len(stream) % 2 == 0 and len(stream) >= 4
    words = Words(stream)
    out = [0] * n
    i = 0
    while i < n:
        if R:
            r, x = symbol(x, run_table, words)
            if r == R + 1:
                break
            i += r
            assert i < n
            if r == R:
                continue
        s, x = symbol(x, value_table, words)
        count = s if R == 0 else s + 1
        if s == V:
            excess = 0
            for c in range(chunks):
                excess |= (x & 0xFFFF) << (16 * c)
                x = ((x >> 16) << 16) | words.read()
            count += excess
        assert count <= maxval
        out[i] = count
        i += 1
    assert x == 2**16 and 2 * words.next == len(stream)
    return out


def decode_streams(meta: dict, arrays: dict) -> tuple[np.ndarray, list[int]]:
    """(n_frames, frame_len) counts and how many streams of each form (§5)."""
    rows, cols, det_rows, det_cols = meta["shape"]
    n_frames, frame_len = rows * cols, det_rows * det_cols
    itemsize = np.dtype(meta["dtype"]).itemsize
    maxval, chunks, block = 2 ** (8 * itemsize) - 1, 2 if itemsize == 4 else 1, meta["block"]
    index, base, payload = arrays["index"], arrays["block_base"], arrays["payload"].tobytes()
    run, values, table_start, cum = arrays["run"], arrays["values"], arrays["table_start"], arrays["cum"]
    n_blocks = -(-n_frames // block)
    assert index.shape == (n_blocks, frame_len) and base.shape == (n_blocks + 1,)
    assert int(base[0]) == 0 and int(base[-1]) == len(payload)
    counts = np.zeros((n_frames, frame_len), dtype=np.uint64)
    forms = [0] * 5
    for b in range(n_blocks):
        n = min(block, n_frames - b * block)
        for p in range(frame_len):
            form, offset = int(index[b, p]) >> 29, int(index[b, p]) & 0x1FFFFFFF
            start = int(base[b]) + offset
            end = int(base[b]) + (int(index[b, p + 1]) & 0x1FFFFFFF) if p + 1 < frame_len else int(base[b + 1])
            stream = payload[start:end]
            length = end - start
            forms[form] += 1
            if form == 0:
                assert length == 0
                col = [0] * n
            elif form == 1:
                assert length == 4
                col = [le(stream, 0, 4)] * n
                assert 1 <= col[0] <= maxval
            elif form == 2:
                k = length // (2 + itemsize)
                assert length == k * (2 + itemsize) + (k * (2 + itemsize)) % 2 and k <= n
                col = [0] * n
                last = -1
                for j in range(k):
                    position = le(stream, 2 * j, 2)
                    assert last < position < n
                    col[position] = le(stream, 2 * k + itemsize * j, itemsize)
                    last = position
            elif form == 3:
                R, V, t = int(run[p]), int(values[p]), int(table_start[p])
                value_table = [int(v) for v in cum[t : t + V + 2]]
                run_table = [int(v) for v in cum[t + V + 2 : t + V + 2 + R + 3]] if R else []
                col = decode_ans(stream, n, R, V, value_table, run_table, chunks, maxval)
            elif form == 4:
                assert length == n * itemsize + (n * itemsize) % 2
                col = [le(stream, itemsize * j, itemsize) for j in range(n)]
            else:
                raise AssertionError(f"unknown form {form}")
            counts[b * block : b * block + n, p] = col
    return counts, forms


# ---------------------------------------------------------------- §10: the group index


def spec_center(pattern: np.ndarray) -> list[int]:
    rows, cols = pattern.shape
    total = sum(int(v) for v in pattern.ravel())
    if total == 0:
        return [rows - 1, cols - 1]
    mr = sum(r * int(pattern[r, c]) for r in range(rows) for c in range(cols))
    mc = sum(c * int(pattern[r, c]) for r in range(rows) for c in range(cols))
    cy2, cx2 = (4 * mr + total) // (2 * total), (4 * mc + total) // (2 * total)
    return [min(max(cy2, 0), 2 * (rows - 1)), min(max(cx2, 0), 2 * (cols - 1))]


def spec_octant(u: int, v: int) -> int:
    rules = [
        u > 0 and v >= 0 and v < u,
        u > 0 and v >= u,
        u <= 0 and v > 0 and abs(u) < v,
        u < 0 and v > 0 and abs(u) >= v,
        u < 0 and v <= 0 and abs(v) < abs(u),
        u < 0 and v < 0 and abs(v) >= abs(u),
        u >= 0 and v < 0 and u < abs(v),
        u > 0 and v < 0 and u >= abs(v),
    ]
    return rules.index(True) if any(rules) else 0


def spec_groups(det_rows: int, det_cols: int, cy2: int, cx2: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(ring, leaf group, n_groups) per flat pixel."""
    ring, octant = [], []
    for r in range(det_rows):
        for c in range(det_cols):
            dy2, dx2 = 2 * r - cy2, 2 * c - cx2
            d = dy2 * dy2 + dx2 * dx2
            k = 0 if d == 0 else (math.isqrt(d - 1) + 1 + 1) // 2  # smallest k with (2k)**2 >= d
            assert d <= 4 * k * k and (k == 0 or d > 4 * (k - 1) ** 2)
            ring.append(k)
            octant.append(spec_octant(dx2, -dy2))
    ring, octant = np.array(ring), np.array(octant)
    K = int(ring.max()) + 1
    n_bands = -(-K // 32)
    return ring, K + 8 * (ring // 32) + octant, K + 8 * n_bands


def decode_group_index(meta: dict, arrays: dict) -> np.ndarray:
    """(n_frames, n_groups) sums read from the packed fields."""
    rows, cols, det_rows, det_cols = meta["shape"]
    n_frames = rows * cols
    cy2, cx2 = meta["group_center"]
    assert 0 <= cy2 <= 2 * (det_rows - 1) and 0 <= cx2 <= 2 * (det_cols - 1)
    _, _, n_groups = spec_groups(det_rows, det_cols, cy2, cx2)
    base, width, bits = arrays["group_base"], arrays["group_width"], arrays["group_bits"]
    n_gblocks = -(-n_frames // 256)
    assert base.shape == width.shape == (n_gblocks, n_groups) and base.dtype == np.uint64 and width.dtype == np.uint8
    assert bits.ndim == 1 and bits.dtype == np.uint64 and (width <= 64).all()
    words = [int(w) for w in bits]
    sums = np.zeros((n_frames, n_groups), dtype=np.uint64)
    t = 0
    for b in range(n_gblocks):
        n_b = min(256, n_frames - 256 * b)
        for g in range(n_groups):
            w = int(width[b, g])
            for i in range(n_b):
                field = 0
                if w:
                    lo = words[t >> 6] >> (t & 63)
                    if (t & 63) + w > 64:
                        lo |= words[(t >> 6) + 1] << (64 - (t & 63))
                    field = lo & (2**w - 1)
                sums[256 * b + i, g] = int(base[b, g]) + field
                t += w
    assert len(words) == -(-t // 64) and (t % 64 == 0 or words[-1] >> (t % 64) == 0)
    return sums


def expected_sums(dense: np.ndarray, meta: dict) -> np.ndarray:
    _, _, det_rows, det_cols = meta["shape"]
    ring, leaf, n_groups = spec_groups(det_rows, det_cols, *meta["group_center"])
    sums = np.zeros((dense.shape[0], n_groups), dtype=np.uint64)
    for p in range(dense.shape[1]):
        sums[:, ring[p]] += dense[:, p].astype(np.uint64)
        sums[:, leaf[p]] += dense[:, p].astype(np.uint64)
    return sums


# ---------------------------------------------------------------- the files


def every_form(rng, dtype, shape=(40, 41, 5, 6)) -> np.ndarray:
    """Counts that make the encoder write every form: busy value-mode pixels with escapes at the dtype's top,
    run-mode pixels, a constant, an empty, a uniformly random (raw) pixel and a busy one that goes nearly
    empty (sparse later blocks); 1640 scans, not a multiple of any block."""
    top = np.iinfo(dtype).max
    counts = rng.poisson(3.0, shape).astype(dtype)
    flat = counts.reshape(shape[0] * shape[1], -1)
    flat[:, 1::3] = rng.poisson(0.05, flat[:, 1::3].shape)
    flat[::37, ::2] = top
    flat[:, 4] = top
    flat[:, 5] = 0
    flat[:, 7] = rng.integers(0, top, flat.shape[0], endpoint=True, dtype=dtype)
    flat[:, 9] = 0
    flat[:1000, 9] = rng.poisson(5.0, 1000)
    flat[[1200, 1500], 9] = 3
    return counts


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
def test_independent_reader_decodes_a_saved_file(rng, tmp_path, dtype):
    counts = every_form(rng, dtype)
    flat = counts.reshape(counts.shape[0] * counts.shape[1], -1)
    path = tmp_path / "spec.qgpu"
    save_resident(CompressedCounts.encode("spec", flat, counts.shape), path)
    meta, arrays = read_container(path.read_bytes())
    assert meta["layout"] == "compressed" and meta["codec"] == "qgpu-ans-2" and meta["shape"] == list(counts.shape)
    assert sorted(arrays) == sorted(["run", "values", "table_start", "cum", "index", "block_base", "payload", "totals",
                                     "group_base", "group_width", "group_bits"])

    decoded, forms = decode_streams(meta, arrays)
    assert (decoded == flat).all()
    assert all(forms), f"streams per form (empty, constant, sparse, ans, raw): {forms}"
    assert (arrays["run"] == 0).any() and (arrays["run"] > 0).any()  # both modes
    assert (arrays["totals"] == flat.sum(axis=1, dtype=np.uint64)).all()

    assert meta["group_center"] == spec_center(flat.sum(axis=0, dtype=np.uint64).reshape(counts.shape[2:]))
    assert (decode_group_index(meta, arrays) == expected_sums(flat, meta)).all()


def test_independent_reader_on_the_worked_example(tmp_path):
    counts = np.array([0, 0, 0, 70, 0, 0, 1, 0], np.uint16).reshape(2, 4, 1, 1)
    path = tmp_path / "a.qgpu"
    save_resident(CompressedCounts.encode("a", counts.reshape(8, 1), counts.shape), path)
    raw = path.read_bytes()
    assert len(raw) == 45072 and raw[:16].hex(" ") == "51 47 50 55 52 45 53 00 04 00 00 00 09 07 00 00"
    meta, arrays = read_container(raw)
    assert arrays["payload"].tobytes().hex(" ") == "49 1a 6c 00 f9 31"
    assert meta["group_center"] == [0, 0]
    assert arrays["group_width"].tolist() == [[7, 7, 0, 0, 0, 0, 0, 0, 0]]
    assert [hex(int(w)) for w in arrays["group_bits"]] == ["0x40008c00000", "0x40008c000"]
    decoded, _ = decode_streams(meta, arrays)
    assert decoded.ravel().tolist() == [0, 0, 0, 70, 0, 0, 1, 0]
    assert (decode_group_index(meta, arrays) == expected_sums(decoded, meta)).all()


def test_spec_geometry_example():
    pattern = np.array([[0, 1, 0, 0], [0, 5, 2, 0], [0, 0, 1, 0]])
    assert spec_center(pattern) == [2, 3]
    ring, leaf, n_groups = spec_groups(3, 4, 2, 3)
    assert ring.reshape(3, 4).tolist() == [[2, 2, 2, 2], [2, 1, 1, 2], [2, 2, 2, 2]]
    assert leaf.reshape(3, 4).tolist() == [[6, 5, 4, 3], [7, 7, 3, 3], [7, 8, 9, 10]]
    assert n_groups == 11
