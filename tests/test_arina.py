"""Arina/Eiger masters (bitshuffle-LZ4 frames in linked data files) and qd.inspect, through real files."""

from __future__ import annotations

import hashlib

import h5py
import hdf5plugin
import dask.config
import numpy as np
import pytest

import qgpu_dask as qd

from conftest import cupy_available, evicted
from qgpu_dask.samples import write_arina


def h5py_frames(master) -> np.ndarray:
    """Every frame as h5py and hdf5plugin read them, the reference."""
    with h5py.File(master, "r") as f:
        group = f["/entry/data"]
        return np.concatenate([group[name][...] for name in sorted(group)])


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32"])
def test_arina_master_loads_every_count(svc, names, rng, tmp_path, dtype):
    frames = rng.poisson(0.6, (36, 19, 23)).astype(dtype)  # 19 x 23: frames that are not a multiple of 8 elements
    frames[5] = np.iinfo(dtype).max
    master = write_arina(tmp_path, frames, per_file=10)  # four data files, the last one short
    reference = h5py_frames(master)
    assert (reference == frames).all()
    acq = svc.load(master, name=names())  # 36 frames: a 6 x 6 scan
    assert acq.shape == (6, 6, 19, 23) and acq.dtype == np.dtype(dtype)
    for i in range(36):
        assert (acq.frame(i // 6, i % 6) == reference[i]).all()
    assert acq.checksum() == hashlib.sha256(reference.tobytes()).hexdigest()
    dense = svc.load(master, name=names(), scan_shape=(4, 9), layout="dense")
    assert dense.shape == (4, 9, 19, 23)
    assert dense.checksum() == acq.checksum()


def test_arina_errors_name_the_file_and_frame(svc, names, rng, tmp_path):
    frames = rng.poisson(0.6, (12, 16, 16)).astype(np.uint16)
    master = write_arina(tmp_path, frames, per_file=6)
    with pytest.raises(ValueError, match="do not make a square scan: give scan_shape"):
        svc.load(master, name=names())
    with h5py.File(tmp_path / "scan_data_000002.h5", "r") as f:
        info = f["/entry/data/data"].id.get_chunk_info(3)  # frame 6 + 3 = 9
    raw = bytearray((tmp_path / "scan_data_000002.h5").read_bytes())
    raw[info.byte_offset + 16 : info.byte_offset + info.size] = b"\xff" * (info.size - 16)  # the LZ4 block is garbage
    (tmp_path / "scan_data_000002.h5").write_bytes(bytes(raw))
    bad = names()
    with pytest.raises(ValueError, match=r"scan_master\.h5.*data_000002.*frame 9 "):
        svc.load(master, name=bad, scan_shape=(3, 4))
    assert bad not in svc
    assert all(s["reserved_bytes"] == 0 for s in svc.info()["shards"])
    (tmp_path / "scan_data_000001.h5").unlink()
    with pytest.raises((ValueError, KeyError), match="data_000001"):
        svc.load(master, name=names(), scan_shape=(3, 4))


def test_inspect_reports_without_loading(rng, tmp_path):
    frames = rng.poisson(0.6, (16, 8, 8)).astype(np.uint16)
    master = write_arina(tmp_path, frames, per_file=16)
    info = qd.inspect(master)
    assert info["format"] == "arina/eiger master" and info["compression"] == "bitshuffle-lz4"
    assert info["shape"] == (4, 4, 8, 8) and info["dtype"] == "uint16" and info["raw_bytes"] == frames.nbytes
    with h5py.File(tmp_path / "g.h5", "w") as f:
        f.create_dataset("d", data=frames, chunks=(1, 8, 8), compression="gzip", shuffle=True)
    info = qd.inspect(tmp_path / "g.h5", scan_shape=(2, 8))
    assert info["format"] == "hdf5 gzip stack" and info["compression"] == "shuffle+deflate" and info["shape"] == (2, 8, 8, 8)
    np.save(tmp_path / "a.npy", frames.reshape(4, 4, 8, 8))
    info = qd.inspect(tmp_path / "a.npy")
    assert info["format"] == "npy" and info["compression"] == "none" and info["file_bytes"] > frames.nbytes
    (tmp_path / "x.bin").write_bytes(b"not a detector file")
    with pytest.raises(ValueError, match="is not an HDF5 file"):
        qd.inspect(tmp_path / "x.bin")


def test_reader_blocks_and_read_into_agree(rng, tmp_path):
    from qgpu_dask.io.readers.arina import ArinaReader

    frames = rng.poisson(0.6, (30, 11, 9)).astype(np.uint16)
    master = write_arina(tmp_path, frames, per_file=7)
    reader = ArinaReader(master, (5, 6))
    try:
        into = np.zeros_like(frames)
        reader.read_into(into, block_bytes=4 * 11 * 9 * 2)  # several blocks per data file
        assert (into == frames).all()
        seen = np.zeros_like(frames)
        for start, block in reader.blocks(block_bytes=3 * 11 * 9 * 2):
            seen[start : start + len(block)] = block
        assert (seen == frames).all()
    finally:
        reader.close()


def test_truncated_data_file_is_refused(svc, names, rng, tmp_path):
    frames = rng.poisson(3.0, (12, 32, 32)).astype(np.uint16)
    master = write_arina(tmp_path, frames, per_file=6)
    data = tmp_path / "scan_data_000002.h5"
    raw = data.read_bytes()
    data.write_bytes(raw[: len(raw) * 2 // 3])
    bad = names()
    with pytest.raises(ValueError, match=r"scan_master\.h5.*data_000002"):
        svc.load(master, name=bad, scan_shape=(3, 4))
    assert bad not in svc


@pytest.mark.parametrize("direct", ["0", "1"])
def test_a_block_read_in_pieces_side_by_side_gives_every_byte(rng, tmp_path, monkeypatch, direct):
    """Spans read in pieces of two pages by several threads, plainly or (evicted from the page cache) direct
    from the drive: the frames are h5py's, and a file cut short is still named at the frame whose chunk it
    ends in."""
    from qgpu_dask.io.readers import file_bytes
    from qgpu_dask.io.readers.arina import ArinaReader

    monkeypatch.setattr(file_bytes, "READ_PIECE", 2 * file_bytes.ALIGN)
    monkeypatch.setitem(dask.config.config["qgpu"], "direct-reads", direct == "1")
    frames = rng.poisson(3.0, (40, 32, 32)).astype(np.uint16)
    master = write_arina(tmp_path, frames, per_file=20)
    reader = ArinaReader(master, (5, 8))
    try:
        for stack in reader.stacks:
            stack.stored.open()  # HDF5's metadata and chunk index read, then the pages go (small files: all of them)
        cold = all([evicted(data_file) for data_file in tmp_path.glob("scan_data_*.h5")])
        assert (np.concatenate([b for _, b in reader.blocks(block_bytes=13 * 32 * 32 * 2)]) == h5py_frames(master)).all()
        stored = [stack.stored.file for stack in reader.stacks]
        if direct == "1" and cold and all(f.direct for f in stored):
            assert all(f.direct_bytes > 0 for f in stored)
        if direct == "0":
            assert sum(f.direct_bytes for f in stored) == 0
    finally:
        reader.close()
    data = tmp_path / "scan_data_000002.h5"
    data.write_bytes(data.read_bytes()[:-3000])
    reader = ArinaReader(master, (5, 8))
    try:
        with pytest.raises(ValueError, match=r"data_000002.*the file ends inside the chunk of frame 1[0-9]"):
            list(reader.blocks())
    finally:
        reader.close()


def write_interleaved(folder, frames: np.ndarray) -> object:
    """A master whose one data file holds two other datasets written frame by frame between its frames,
    so each frame's chunk lies apart from the next one's."""
    n, rows, cols = frames.shape
    with h5py.File(folder / "mixed_data_000001.h5", "w") as f:
        filters = hdf5plugin.Bitshuffle(nelems=0, cname="lz4")
        data = f.create_dataset("/entry/data/data", shape=frames.shape, dtype=frames.dtype, chunks=(1, rows, cols), **filters)
        others = [f.create_dataset(f"/other/{k}", shape=frames.shape, dtype=frames.dtype, chunks=(1, rows, cols), **filters) for k in range(2)]
        for i in range(n):
            data[i] = frames[i]
            for other in others:
                other[i] = frames[(i + 1) % n]
    master = folder / "mixed_master.h5"
    with h5py.File(master, "w") as f:
        f["/entry/data/data_000001"] = h5py.ExternalLink("mixed_data_000001.h5", "/entry/data/data")
    return master


def test_frames_stored_apart_read_one_by_one(rng, tmp_path):
    from qgpu_dask.io.readers.arina import ArinaReader

    frames = rng.poisson(2.0, (24, 16, 16)).astype(np.uint16)
    master = write_interleaved(tmp_path, frames)
    reader = ArinaReader(master, (4, 6))
    try:
        stored = reader.stacks[0].stored
        data, starts, ends, masks = stored.read(0, 24)
        assert data.size == (ends - starts).sum()  # not the span: each chunk was read on its own
        into = np.zeros_like(frames)
        reader.read_into(into, block_bytes=5 * 16 * 16 * 2)
        assert (into == frames).all()
    finally:
        reader.close()


def test_file_ending_inside_a_chunk_names_the_frame(rng, tmp_path):
    from qgpu_dask.io.readers.arina import ArinaReader

    frames = rng.poisson(2.0, (16, 16, 16)).astype(np.uint16)
    master = write_arina(tmp_path, frames, per_file=16)
    data_file = tmp_path / "scan_data_000001.h5"
    with h5py.File(data_file, "r") as f:
        info = f["/entry/data/data"].id.get_chunk_info(11)
    reader = ArinaReader(master, (4, 4))
    try:
        with open(data_file, "r+b") as f:  # the file is cut after HDF5 opened it: our own read meets the end
            f.truncate(info.byte_offset + info.size // 2)
        with pytest.raises(ValueError, match=r"scan_master\.h5' \(data_000001\).*the file ends inside the chunk of frame 11 "):
            reader.read_into(np.zeros_like(frames))
    finally:
        reader.close()


def h5py_chunk_info(dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, sizes, filter masks) of every frame's chunk asked of HDF5 one chunk at a time (-1, 0, 0 where none)."""
    lead = dataset.shape[:-2]
    offsets, sizes, masks = np.full(int(np.prod(lead)), -1, np.int64), np.zeros(int(np.prod(lead)), np.int64), np.zeros(int(np.prod(lead)), np.uint32)
    for k in range(dataset.id.get_num_chunks()):
        info = dataset.id.get_chunk_info(k)
        frame = np.ravel_multi_index(info.chunk_offset[:-2], lead)
        offsets[frame], sizes[frame], masks[frame] = info.byte_offset, info.size, info.filter_mask
    return offsets, sizes, masks


def test_the_chunk_index_is_hdf5s_chunk_by_chunk(rng, tmp_path):
    """The compiled chunk index (no Python per chunk) and h5py's chunk_iter both give what HDF5 reports chunk by
    chunk: chunks in order, chunks stored apart, frames in two leading dimensions with chunks missing, a chunk
    the filter skipped; a missing or misplaced chunk is refused by name."""
    from qgpu_dask.io.readers.chunk_index import chunk_iter_c, chunk_table, chunk_table_py
    from qgpu_dask.io.readers.stored_chunks import StoredChunks

    assert chunk_iter_c() is not None  # Linux wheels of h5py: the compiled path is the one taken
    write_arina(tmp_path, rng.poisson(0.5, (300, 16, 16)).astype(np.uint16), per_file=300)
    write_interleaved(tmp_path, rng.poisson(2.0, (24, 16, 16)).astype(np.uint16))
    with h5py.File(tmp_path / "lead.h5", "w") as f:
        lead = f.create_dataset("frames", (3, 5, 8, 8), np.uint16, chunks=(1, 1, 8, 8), **hdf5plugin.Bitshuffle(cname="lz4"))
        lead[:2] = rng.poisson(1.0, (2, 5, 8, 8))
        lead.id.write_direct_chunk((2, 1, 0, 0), np.arange(64, dtype=np.uint16).tobytes(), filter_mask=1)
        f.create_dataset("blocks", (4, 8, 8), np.uint16, chunks=(2, 8, 8))[:] = 1  # two frames a chunk
    for path, name in [("scan_data_000001.h5", "/entry/data/data"), ("mixed_data_000001.h5", "/entry/data/data"), ("lead.h5", "frames")]:
        with h5py.File(tmp_path / path, "r") as f:
            expected = h5py_chunk_info(f[name])
            for table in (chunk_table(f[name]), chunk_table_py(f[name])):
                assert all((got == want).all() and got.dtype == want.dtype for got, want in zip(table[:3], expected))
                assert table[3] == 0
    with h5py.File(tmp_path / "lead.h5", "r") as f:
        assert (chunk_table(f["frames"])[0] < 0).sum() == 4
        with pytest.raises(ValueError, match=r"here: frame 10 has no stored chunk \(4 of 15 frames are missing\)"):
            StoredChunks(f["frames"], "here").open()
        assert chunk_table(f["blocks"])[3] == chunk_table_py(f["blocks"])[3] == 0  # chunk corners 0 and 2: frames 1 and 3 have none
        with pytest.raises(ValueError, match=r"here: frame 1 has no stored chunk"):
            StoredChunks(f["blocks"], "here").open()


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
def test_device_load_through_pinned_buffers(rng, tmp_path):
    import cupy as cp

    from qgpu_dask.io.readers.arina import ArinaReader
    from qgpu_dask.io.load import read_dense

    frames = rng.poisson(0.8, (70, 12, 10)).astype(np.uint16)
    master = write_arina(tmp_path, frames, per_file=17)
    reader = ArinaReader(master, (7, 10))
    try:
        resident = read_dense("staged", reader, cp, block_bytes=10 * 12 * 10 * 2)  # 10 frames a block: the ring turns over
        assert (cp.asnumpy(resident.flat).reshape(frames.shape) == frames).all()
    finally:
        reader.close()


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
def test_a_coded_load_decodes_the_stored_chunks_on_the_gpu_into_the_bytes_of_the_cpu_twin(rng, tmp_path):
    """The GPU reads stored chunks, decodes and codes them; the resident's streams are the CPU load's, byte for byte."""
    import cupy as cp

    from qgpu_dask.io.load import model_sample, read_coded
    from qgpu_dask.io.readers.arina import ArinaReader
    from qgpu_dask.resident.live import Coding

    frames = rng.poisson(0.8, (1600, 12, 10)).astype(np.uint16)
    frames[7] = 65535  # escapes
    master = write_arina(tmp_path, frames, per_file=300)
    held = {}
    for xp in (np, cp):
        reader = ArinaReader(master, (40, 40))
        try:
            coding = Coding.chosen(model_sample(reader), (12, 10), xp)
            held[xp] = read_coded("coded", reader, coding, xp, block_bytes=130 * 12 * 10 * 2)
        finally:
            reader.close()
    on_gpu, on_cpu = held[cp], held[np]
    assert (cp.asnumpy(on_gpu.data).reshape(frames.shape) == frames).all()
    for key in ("payload", "index", "block_base"):
        assert (cp.asnumpy(getattr(on_gpu.streams, key)) == getattr(on_cpu.streams, key)).all(), key
    assert (cp.asnumpy(on_gpu.totals) == on_cpu.totals).all()


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
def test_the_load_kernels_warm_up_on_the_gpu():
    import cupy as cp

    from qgpu_dask.io.load import warm_up

    warm_up(cp)


def test_inspect_without_the_scan_shape(svc, names, rng, tmp_path):
    """A master whose frame count is not a square (and any 3-D stack) is described by its frames, and says
    that scan_shape is needed to load it."""
    frames = rng.poisson(0.6, (15, 8, 6)).astype(np.uint16)
    master = write_arina(tmp_path, frames, per_file=8)
    info = qd.inspect(master)
    assert info == {"format": "arina/eiger master", "shape": None, "det_shape": (8, 6), "frames": 15,
                    "needs": "15 frames do not make a square scan: give scan_shape=(rows, cols)", "dtype": "uint16",
                    "compression": "bitshuffle-lz4", "file_bytes": info["file_bytes"], "raw_bytes": frames.nbytes}
    assert qd.inspect(master, scan_shape=(3, 5))["shape"] == (3, 5, 8, 6)
    with h5py.File(tmp_path / "stack.h5", "w") as f:
        f.create_dataset("data", data=frames)
    info = qd.inspect(tmp_path / "stack.h5")
    assert info["shape"] is None and info["frames"] == 15 and "is a 3-D stack of 15 frames: give scan_shape=(rows, cols)" in info["needs"]
    with pytest.raises(ValueError, match="15 frames do not make a square scan: give scan_shape"):
        svc.load(master, name=names())
    assert (svc.load(master, name=names(), scan_shape=(5, 3)).frame(4, 2) == frames[14]).all()
