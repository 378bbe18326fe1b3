"""Bitshuffle-LZ4 chunks: decoded bytes equal h5py + hdf5plugin's, malformed chunks are refused."""

from __future__ import annotations

from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest

from qgpu_dask.formats.bitshuffle_lz4 import decompress, decompress_into

from conftest import cupy_available


def frames(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """All-zero, Poisson at three doses, and full-range random frames (incompressible blocks)."""
    dtype = np.dtype(dtype)
    stack = [np.zeros(shape, dtype)]
    stack += [rng.poisson(dose, shape).astype(dtype) for dose in (0.01, 0.3, 5.0)]
    stack.append(rng.integers(0, 256, shape + (dtype.itemsize,), dtype=np.uint8).view(dtype)[..., 0])
    return np.stack(stack)


def write_read(path: Path, data: np.ndarray, nelems: int = 0) -> tuple[list[bytes], np.ndarray]:
    """Write data one frame a chunk through hdf5plugin; return the raw chunks and h5py's read."""
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "data", data=data, chunks=(1,) + data.shape[1:], **hdf5plugin.Bitshuffle(nelems=nelems, cname="lz4")
        )
    with h5py.File(path, "r") as f:
        ds = f["data"]
        corner = (0,) * (ds.ndim - 1)
        chunks = []
        for i in range(ds.shape[0]):
            mask, raw = ds.id.read_direct_chunk((i,) + corner)
            assert mask == 0
            chunks.append(raw)
        return chunks, ds[...]


def assert_decodes(chunks: list[bytes], expected: np.ndarray) -> None:
    for i, raw in enumerate(chunks):
        got = decompress(raw, expected.dtype, expected[i].size)
        assert got.dtype == expected.dtype and got.shape == (expected[i].size,)
        assert np.array_equal(got, expected[i].ravel())
        assert got.tobytes() == expected[i].tobytes()
    for threads in (1, 2):
        out = np.empty_like(expected)
        decompress_into(chunks, out, threads=threads)
        assert out.tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (17, 13), (192, 192)])
def test_equals_hdf5plugin(tmp_path: Path, dtype: str, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape) + np.dtype(dtype).itemsize)
    chunks, expected = write_read(tmp_path / "a.h5", frames(dtype, shape, rng))
    assert_decodes(chunks, expected)


def test_many_blocks_uint32(tmp_path: Path) -> None:
    """512x512 uint32: 128 blocks of 2048 elements each (8192 bytes)."""
    rng = np.random.default_rng(5)
    data = np.stack([rng.poisson(0.3, (512, 512)), rng.integers(0, 2**32, (512, 512))]).astype(np.uint32)
    chunks, expected = write_read(tmp_path / "a.h5", data)
    assert int.from_bytes(chunks[0][8:12], "big") == 8192
    assert_decodes(chunks, expected)


@pytest.mark.parametrize("nelems", [8, 24, 1024])
def test_block_sizes(tmp_path: Path, nelems: int) -> None:
    """Other block sizes, the header giving them in bytes; 10101 elements leave a short last block and 5 trailing."""
    rng = np.random.default_rng(nelems)
    data = rng.poisson(2.0, (2, 91, 111)).astype(np.uint16)
    chunks, expected = write_read(tmp_path / "a.h5", data, nelems=nelems)
    assert int.from_bytes(chunks[0][8:12], "big") == 2 * nelems
    assert_decodes(chunks, expected)


@pytest.mark.parametrize("dtype", ["int16", "float32", ">u2", "uint64", "V3"])
def test_other_types(tmp_path: Path, dtype: str) -> None:
    """Signed, float, big-endian, 8-byte and 3-byte elements keep their bytes."""
    rng = np.random.default_rng(3)
    size = np.dtype(dtype).itemsize
    data = rng.integers(0, 4, (2, 17, 13, size), dtype=np.uint8).view(dtype)[..., 0]
    chunks, expected = write_read(tmp_path / "a.h5", data)
    assert_decodes(chunks, expected)


def test_inputs_and_shapes(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    chunks, expected = write_read(tmp_path / "a.h5", rng.poisson(1.0, (2, 8, 8)).astype(np.uint16))
    for raw in (np.frombuffer(chunks[1], np.uint8).copy(), bytearray(chunks[1]), memoryview(chunks[1])):
        assert np.array_equal(decompress(raw, np.uint16, 64), expected[1].ravel())
    decompress_into([], np.empty((0, 8, 8), np.uint16))
    with pytest.raises(ValueError, match="C-contiguous"):
        decompress_into(chunks, np.empty((2, 8, 16), np.uint16)[:, :, ::2])
    with pytest.raises(ValueError, match="expected 2 frames first"):
        decompress_into(chunks, np.empty((3, 8, 8), np.uint16))


# ---------------------------------------------------------------- malformed chunks


def blocks(raw: bytes, count: int, itemsize: int) -> tuple[bytes, list[bytes], bytes]:
    """Split a chunk into its header, its LZ4 blocks and its trailing bytes."""
    block_elems = int.from_bytes(raw[8:12], "big") // itemsize
    n_blocks = count // block_elems + (count % block_elems >= 8)
    pos, parts = 12, []
    for _ in range(n_blocks):
        size = int.from_bytes(raw[pos : pos + 4], "big")
        parts.append(raw[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return raw[:12], parts, raw[pos:]


def join(header: bytes, parts: list[bytes], trailing: bytes) -> bytes:
    return header + b"".join(len(p).to_bytes(4, "big") + p for p in parts) + trailing


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[bytes], np.ndarray]:
    """Six 17x13 uint16 Poisson frames: 216 elements in one block, 5 trailing (10 bytes)."""
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("bslz4") / "a.h5"
    return write_read(path, rng.poisson(0.5, (6, 17, 13)).astype(np.uint16))


COUNT = 17 * 13


def with_block(raw: bytes, block: bytes) -> bytes:
    header, _, trailing = blocks(raw, COUNT, 2)
    return join(header, [block], trailing)


MALFORMED = [
    (lambda r: r[:7], r"chunk is 7 bytes, shorter than the 12-byte bitshuffle header"),
    (lambda r: r[:14], r"block 0: its compressed-size field at byte 12 runs past the chunk end \(14 bytes\)"),
    (lambda r: r[:-1], r"10 bytes of trailing elements expected at byte \d+, the chunk has 9 left"),
    (lambda r: r + b"\0", r"1 unexpected bytes after the data"),
    (lambda r: r[:7] + bytes([r[7] ^ 1]) + r[8:], r"header gives 443 uncompressed bytes, expected 442"),
    (lambda r: b"\xff" + r[1:], r"header gives 18374686479671624122 uncompressed bytes"),
    (lambda r: r[:8] + (8190).to_bytes(4, "big") + r[12:], r"block size 8190 bytes is not a positive multiple"),
    (lambda r: r[:8] + bytes(4) + r[12:], r"block size 0 bytes is not a positive multiple of 8"),
    (lambda r: r[:12] + b"\xff\xff\xff\xff" + r[16:], r"block 0: compressed size 4294967295 at byte 12 runs past"),
    (lambda r: r[:-20], r"block 0: compressed size \d+ at byte 12 runs past the chunk end"),
    (lambda r: with_block(r, b"\x10\x07\x05\x00"), r"LZ4 block 0: match offset 5 at output byte 1 points before"),
    (lambda r: with_block(r, b"\x10\x07\x00\x00"), r"LZ4 block 0: match offset 0 at output byte 1"),
    (lambda r: with_block(r, b"\x50\x01\x02"), r"LZ4 block 0: a literal run of 5 bytes at input byte 1 runs past"),
    (lambda r: with_block(r, b"\xf0\xff"), r"LZ4 block 0: a length runs past the block end"),
    (lambda r: with_block(r, b"\x10\x07\x01"), r"LZ4 block 0: a match offset is cut off by the block end"),
    (lambda r: with_block(r, b"\x40\x01\x02\x03\x04"), r"LZ4 block 0: decodes to 4 bytes, expected 432"),
    (lambda r: with_block(r, b"\x1f\x07\x01\x00\xff\xff\x00"), r"block 0: a match of 529 bytes at output byte 1"),
    (lambda r: with_block(r, b"\xf0\xff\xff" + bytes(528)), r"block 0: a literal run of 525 bytes at output byte"),
]


@pytest.mark.parametrize(("edit", "match"), MALFORMED)
def test_malformed_chunk(sample: tuple[list[bytes], np.ndarray], edit, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decompress(edit(sample[0][0]), np.uint16, COUNT)


def test_damaged_block_within_data(sample: tuple[list[bytes], np.ndarray]) -> None:
    """A valid-looking block whose match reaches before the start: rebuilt from the real block."""
    raw = sample[0][0]
    header, (block,), trailing = blocks(raw, COUNT, 2)
    assert decompress(join(header, [block], trailing), np.uint16, COUNT).tobytes() == sample[1][0].tobytes()
    lit, ip = block[0] >> 4, 1  # the first sequence's literals, then its offset
    if lit == 15:
        while block[ip] == 255:
            lit, ip = lit + 255, ip + 1
        lit, ip = lit + block[ip], ip + 1
    at = ip + lit
    bad = block[:at] + (lit + 1).to_bytes(2, "little") + block[at + 2 :]
    with pytest.raises(ValueError, match=rf"LZ4 block 0: match offset {lit + 1} at output byte {lit} points before"):
        decompress(join(header, [bad], trailing), np.uint16, COUNT)


def test_wrong_count(sample: tuple[list[bytes], np.ndarray]) -> None:
    with pytest.raises(ValueError, match=r"header gives 442 uncompressed bytes, expected 440"):
        decompress(sample[0][0], np.uint16, COUNT - 1)
    with pytest.raises(ValueError, match=r"header gives 442 uncompressed bytes, expected 884"):
        decompress(sample[0][0], np.uint32, COUNT)


@pytest.mark.parametrize(("bad", "first"), [([4], 4), ([1, 4], 1), ([5, 2], 2), ([0], 0)])
def test_decompress_into_names_chunk(sample: tuple[list[bytes], np.ndarray], bad: list[int], first: int) -> None:
    chunks, expected = sample
    chunks = list(chunks)
    for i in bad:
        chunks[i] = with_block(chunks[i], b"\x10\x07\x05\x00")
    for threads in (1, 2, 3):
        out = np.empty_like(expected)
        with pytest.raises(ValueError, match=rf"^chunk {first}: LZ4 block 0: match offset 5"):
            decompress_into(chunks, out, threads=threads)


def test_fuzz_never_crashes(sample: tuple[list[bytes], np.ndarray]) -> None:
    """Every truncation and many random byte edits either decode or raise ValueError."""
    raw = sample[0][2]
    rng = np.random.default_rng(0)
    edits = [raw[:k] for k in range(len(raw))]
    for _ in range(2000):
        damaged = bytearray(raw)
        for at in rng.integers(0, len(raw), rng.integers(1, 4)):
            damaged[at] = rng.integers(0, 256)
        edits.append(bytes(damaged))
    for damaged in edits:
        try:
            decompress(damaged, np.uint16, COUNT)
        except ValueError:
            pass


# ---------------------------------------------------------------- the GPU twin


def packed(chunks: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sizes = np.array([len(c) for c in chunks], np.int64)
    ends = np.cumsum(sizes)
    return np.frombuffer(b"".join(chunks), np.uint8), ends - sizes, ends


def on_gpu(chunks: list[bytes], like: np.ndarray) -> np.ndarray:
    import cupy

    from qgpu_dask.formats import bitshuffle_lz4_cuda

    out = cupy.empty(like.shape, like.dtype)
    bitshuffle_lz4_cuda.decompress_stored(*packed(chunks), out)
    return out.get()


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32"])
@pytest.mark.parametrize(("shape", "nelems"), [((1, 1), 0), ((3, 5), 0), ((17, 13), 0), ((192, 192), 0), ((64, 100), 8),
                                               ((64, 100), 24), ((64, 100), 1024), ((256, 256), 0)])
def test_gpu_decodes_hdf5plugin_chunks_to_the_same_bytes(tmp_path: Path, dtype: str, shape: tuple[int, int], nelems: int) -> None:
    rng = np.random.default_rng(sum(shape) + nelems)
    chunks, expected = write_read(tmp_path / "a.h5", frames(dtype, shape, rng), nelems)
    assert on_gpu(chunks, expected).tobytes() == expected.tobytes()


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
def test_gpu_twin_judges_every_damaged_chunk_as_the_cpu_does(sample: tuple[list[bytes], np.ndarray]) -> None:
    """Every truncation and many random edits of a chunk, plus each malformed case above, in one batch: the
    GPU decodes the same bytes, or reports the same error, chunk by chunk; the first bad one is raised."""
    import cupy

    from qgpu_dask.formats import bitshuffle_lz4_cuda
    from qgpu_dask.formats.bitshuffle_lz4 import as_bytes, decode_chunk, message

    raw = sample[0][2]
    rng = np.random.default_rng(5)
    edits = [raw, *(raw[:k] for k in range(len(raw)))]
    for _ in range(3000):
        damaged = bytearray(raw)
        for at in rng.integers(0, len(raw), rng.integers(1, 4)):
            damaged[at] = rng.integers(0, 256)
        edits.append(bytes(damaged))
    edits += [edit(sample[0][0]) for edit, _ in MALFORMED]
    out = cupy.zeros((len(edits), COUNT), np.uint16)
    errors = bitshuffle_lz4_cuda.outcomes(*packed(edits), out).get()
    got = out.get()
    for i, chunk in enumerate(edits):
        expected = np.zeros(COUNT, np.uint16)
        outcome = decode_chunk(as_bytes(chunk), expected, 2)
        assert tuple(errors[i]) == tuple(outcome), (i, message(*outcome) if outcome[0] else "decodes")
        if outcome[0] == 0:
            assert got[i].tobytes() == expected.tobytes()
    first = int(np.flatnonzero(errors[:, 0])[0])
    with pytest.raises(ValueError, match=rf"^chunk {first}: "):
        bitshuffle_lz4_cuda.decompress_stored(*packed(edits), out)
