"""EMPAD .raw files and HDF5 stacks of one gzip chunk per frame: the readers alone and through the service."""

from __future__ import annotations

import re
import zlib

import h5py
import numpy as np
import pytest
import zarr

import qgpu_dask as qd
from qgpu_dask.io.readers.empad import FRAME_BYTES
from qgpu_dask.io.readers.gzip_stack import GzipStackReader
from qgpu_dask.io.readers.hdf5 import HDF5Reader
from qgpu_dask.io.registry import detect_format, open_reader, readable
from qgpu_dask.io.source import Source

SCAN = (5, 7)
GZIP_SCAN = (6, 7)
GZIP_DET = (20, 24)


def write_empad(path, rng, n_frames: int, extra_bytes: int = 0) -> np.ndarray:
    """An EMPAD .raw file of distinct float32 values (multiples of 1/4, so float64 sums are exact),
    metadata rows of garbage; returns the (n_frames, 128, 128) frames a reader should give."""
    stored = np.empty((n_frames, 130, 128), "<f4")
    stored[:, :128] = rng.permutation(n_frames * 128 * 128).reshape(n_frames, 128, 128) * 0.25 - 1000
    stored[:, 128:] = rng.choice(np.array([np.nan, np.inf, -3e38, 7e37], "<f4"), (n_frames, 2, 128))
    path.write_bytes(stored.tobytes() + bytes(extra_bytes))
    return stored[:, :128].astype(np.float32)


def read_all(reader, block_bytes: int) -> np.ndarray:
    frames = np.empty((reader.shape[0] * reader.shape[1], *reader.shape[2:]), reader.dtype)
    expected_start = 0
    for start, block in reader.blocks(block_bytes):
        assert start == expected_start and block.dtype == reader.dtype
        frames[start : start + len(block)] = block
        expected_start = start + len(block)
    assert expected_start == len(frames)
    return frames.reshape(reader.shape)


def poisson_stack(rng) -> np.ndarray:
    lam = rng.uniform(0.5, 300, GZIP_DET)
    return rng.poisson(lam, (GZIP_SCAN[0] * GZIP_SCAN[1], *GZIP_DET)).astype(np.uint16)


def write_gzip(path, data: np.ndarray, shuffle: bool = False, four_d: bool = False) -> None:
    if four_d:
        data = data.reshape(*GZIP_SCAN, *GZIP_DET)
    chunks = (1,) * (data.ndim - 2) + GZIP_DET
    with h5py.File(path, "w") as f:
        f.create_dataset("/entry/data", data=data, chunks=chunks, compression="gzip", shuffle=shuffle)


# -- EMPAD ---------------------------------------------------------------------


def test_empad_reader_alone(tmp_path, rng):
    path = tmp_path / "scan_x7_y5.raw"
    frames = write_empad(path, rng, 35)
    assert detect_format(path).name == "empad"
    reader = open_reader(Source(str(path)))
    try:
        assert reader.kind == "empad raw" and reader.frames(33, 2).tobytes() == frames[33:35].tobytes()
        assert reader.shape == (5, 7, 128, 128) and reader.dtype == np.float32
        got = read_all(reader, block_bytes=3 * 128 * 128 * 4)  # blocks of 3 frames, across scan rows
        assert (got == frames.reshape(5, 7, 128, 128)).all()
    finally:
        reader.close()


def test_empad_through_service(svc, names, rng, tmp_path):
    named = tmp_path / "scan_x7_y5.raw"
    other = tmp_path / "empad_run.raw"
    for path, scan_shape in [(named, None), (other, SCAN)]:
        frames = write_empad(path, rng, 35).reshape(*SCAN, 128, 128)
        acq = svc.load(path, scan_shape=scan_shape, name=names())
        assert acq.shape == (*SCAN, 128, 128) and acq.dtype == np.float32
        assert acq.info()["layout"] == "dense"
        for r, c in [(0, 0), (2, 3), (4, 6)]:
            assert (acq.frame(r, c) == frames[r, c]).all()
        assert (acq.reduce(None, "sum") == frames.sum(axis=(0, 1), dtype=np.float64)).all()
        assert (acq.reduce(None, "max") == frames.max(axis=(0, 1))).all()


def test_empad_bad_files(svc, names, rng, tmp_path):
    short = tmp_path / "scan_x7_y5.raw"
    write_empad(short, rng, 34, extra_bytes=100)
    name = names()
    with pytest.raises(ValueError, match=rf"scan_x7_y5\.raw' is {34 * FRAME_BYTES + 100} bytes.*{FRAME_BYTES} bytes.*34 whole frames found, the scan \(5, 7\) needs 35"):
        svc.load(short, name=name)
    assert name not in svc

    write_empad(short, rng, 34)
    with pytest.raises(ValueError, match=r"scan_x7_y5\.raw' holds 34 EMPAD frames, but the scan \(5, 7\) needs 35"):
        svc.load(short, name=name)
    assert name not in svc

    unnamed = tmp_path / "data.raw"
    write_empad(unnamed, rng, 35)
    with pytest.raises(ValueError, match="give scan_shape"):
        open_reader(Source(str(unnamed)))
    with pytest.raises(ValueError, match=r"holds 35 EMPAD frames, but the scan \(6, 6\) needs 36"):
        open_reader(Source(str(unnamed), scan_shape=(6, 6)))
    (tmp_path / "odd.raw").write_bytes(bytes(1000))
    with pytest.raises(ValueError, match=rf"'.*odd\.raw' is 1000 bytes, not a positive multiple of the EMPAD frame size {FRAME_BYTES}"):
        detect_format(tmp_path / "odd.raw")
    (tmp_path / "empty.raw").write_bytes(b"")
    with pytest.raises(ValueError, match="is 0 bytes"):
        detect_format(tmp_path / "empty.raw")


def test_empad_hdf5(svc, names, rng, tmp_path):
    """EMPAD HDF5 files are ordinary 4-D float32 datasets: the generic HDF5 reader loads them."""
    frames = write_empad(tmp_path / "unused.raw", rng, 35).reshape(*SCAN, 128, 128)
    with h5py.File(tmp_path / "empad.h5", "w") as f:
        f["/data/raw"] = frames
    reader = open_reader(Source(str(tmp_path / "empad.h5")))
    reader.close()
    assert isinstance(reader, HDF5Reader)
    acq = svc.load(tmp_path / "empad.h5", name=names())
    assert acq.dtype == np.float32 and acq.info()["layout"] == "dense"
    assert (acq.frame(3, 4) == frames[3, 4]).all()
    assert (acq.reduce(None, "sum") == frames.sum(axis=(0, 1), dtype=np.float64)).all()


# -- HDF5 stacks of one gzip chunk per frame ---------------------------------


@pytest.mark.parametrize("shuffle, four_d", [(False, False), (True, False), (True, True)])
def test_gzip_stack_reader_alone(tmp_path, rng, shuffle, four_d):
    data = poisson_stack(rng)
    path = tmp_path / "stack.h5"
    write_gzip(path, data, shuffle, four_d)
    reader = open_reader(Source(str(path), scan_shape=None if four_d else GZIP_SCAN))
    try:
        assert isinstance(reader, GzipStackReader)
        frame_bytes = GZIP_DET[0] * GZIP_DET[1] * 2
        # 5-frame blocks: several blocks in flight, tasks of up to 8 frames split across them
        assert (read_all(reader, 5 * frame_bytes) == data.reshape(*GZIP_SCAN, *GZIP_DET)).all()
        assert (read_all(reader, 64 * 2**20) == data.reshape(*GZIP_SCAN, *GZIP_DET)).all()
    finally:
        reader.close()


@pytest.mark.parametrize("shuffle", [False, True])
def test_gzip_stack_skipped_filters(tmp_path, rng, shuffle):
    """Chunks whose filter mask marks a filter skipped hold those bytes unfiltered; HDF5 reads them the same."""
    data = poisson_stack(rng)
    path = tmp_path / "masked.h5"
    write_gzip(path, data, shuffle)
    n = GZIP_DET[0] * GZIP_DET[1]
    with h5py.File(path, "r+") as f:
        d = f["/entry/data"]
        shuffled = data[5].view(np.uint8).reshape(n, 2).T.tobytes()
        if shuffle:  # bit 0: shuffle skipped, bit 1: deflate skipped
            d.id.write_direct_chunk((3, 0, 0), data[3].tobytes(), filter_mask=0b11)
            d.id.write_direct_chunk((4, 0, 0), zlib.compress(data[4].tobytes()), filter_mask=0b01)
            d.id.write_direct_chunk((5, 0, 0), shuffled, filter_mask=0b10)
        else:  # bit 0: deflate skipped
            d.id.write_direct_chunk((3, 0, 0), data[3].tobytes(), filter_mask=0b1)
        stored = d[...]
    assert (stored == data).all()
    reader = open_reader(Source(str(path), scan_shape=GZIP_SCAN))
    try:
        assert isinstance(reader, GzipStackReader)
        assert (read_all(reader, 4 * n * 2).reshape(data.shape) == data).all()
    finally:
        reader.close()


def test_gzip_stack_wrong_chunk_size(tmp_path, rng):
    data = poisson_stack(rng)
    path = tmp_path / "short.h5"
    write_gzip(path, data)
    with h5py.File(path, "r+") as f:
        f["/entry/data"].id.write_direct_chunk((17, 0, 0), zlib.compress(data[17].tobytes()[:-6]))
    reader = open_reader(Source(str(path), scan_shape=GZIP_SCAN))
    try:
        with pytest.raises(ValueError, match=r"short\.h5', dataset '/entry/data': frame 17: chunk inflates to 954 bytes, expected 960"):
            read_all(reader, 64 * 2**20)
    finally:
        reader.close()


def test_other_hdf5_layouts_use_the_generic_reader(tmp_path, rng):
    data = poisson_stack(rng)
    path = tmp_path / "layouts.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("two_frames", data=data, chunks=(2, *GZIP_DET), compression="gzip")
        f.create_dataset("lzf", data=data, chunks=(1, *GZIP_DET), compression="lzf")
        f.create_dataset("checksummed", data=data, chunks=(1, *GZIP_DET), compression="gzip", fletcher32=True)
        f.create_dataset("contiguous", data=data)
        f.create_dataset("unwritten", shape=data.shape, dtype=data.dtype, chunks=(1, *GZIP_DET), compression="gzip")
        f["unwritten"][:3] = data[:3]
    for dataset in ["two_frames", "lzf", "checksummed", "contiguous", "unwritten"]:
        reader = open_reader(Source(str(path), dataset, GZIP_SCAN))
        try:
            assert type(reader) is HDF5Reader
            with pytest.raises(ValueError, match="not stored one gzip chunk per frame"):
                GzipStackReader(reader)
        finally:
            reader.close()


@pytest.mark.parametrize("shuffle", [False, True])
def test_gzip_stack_through_service(svc, names, rng, tmp_path, shuffle):
    path = tmp_path / "counts.h5"
    write_gzip(path, poisson_stack(rng), shuffle)
    with h5py.File(path, "r") as f:
        stored = f["/entry/data"][...].reshape(*GZIP_SCAN, *GZIP_DET)
    acq = svc.load(path, scan_shape=GZIP_SCAN, name=names())
    assert acq.shape == stored.shape and acq.dtype == np.uint16
    for r in range(GZIP_SCAN[0]):
        for c in range(GZIP_SCAN[1]):
            assert (acq.frame(r, c) == stored[r, c]).all()
    mask = qd.masks.annulus(GZIP_DET, (10, 12), 3, 9)
    assert (acq.virtual_image(mask) == (stored.astype(np.uint32) * mask).sum(axis=(2, 3))).all()


def test_damaged_gzip_chunk(svc, names, rng, tmp_path):
    path = tmp_path / "damaged.h5"
    write_gzip(path, poisson_stack(rng))
    with h5py.File(path, "r") as f:
        offset = f["/entry/data"].id.get_chunk_info(17).byte_offset
    with open(path, "r+b") as f:
        f.seek(offset + 4)
        f.write(b"\xff\x00\xff\x00\xff\x00")
    name = names()
    with pytest.raises(ValueError, match=r"damaged\.h5', dataset '/entry/data': frame 17: chunk does not inflate"):
        svc.load(path, scan_shape=GZIP_SCAN, name=name)
    assert name not in svc
    events = [e["event"] for e in svc.state()["events"] if e.get("name") == name]
    assert events in ([], ["load-failed"])  # never "released"; none where the plan's sample of frames (a GPU's) met it first


# -- byte order ----------------------------------------------------------------


def big_endian_files(folder, data: np.ndarray) -> dict:
    """``data`` (a big-endian 4-D array) in every reader's format that can hold it: path -> scan_shape to give."""
    from test_arina import write_arina

    stack = data.reshape(-1, *data.shape[2:])
    np.save(folder / "be.npy", data)
    with h5py.File(folder / "be.h5", "w") as f:
        f.create_dataset("data", data=data, chunks=(1, 2, *data.shape[2:]))
    with h5py.File(folder / "be-gzip.h5", "w") as f:
        f.create_dataset("data", data=stack, chunks=(1, *data.shape[2:]), compression="gzip", shuffle=True)
    z = zarr.create_array(str(folder / "be.zarr"), shape=data.shape, chunks=(2, 2, *data.shape[2:]), dtype=data.dtype, zarr_format=2)
    z[...] = data
    master = write_arina(folder, stack, per_file=7)
    return {folder / "be.npy": None, folder / "be.h5": None, folder / "be-gzip.h5": data.shape[:2], folder / "be.zarr": None, master: data.shape[:2]}


@pytest.mark.parametrize("dtype", [">u2", ">u4"])
def test_big_endian_counts_read_native(rng, tmp_path, dtype):
    """Counts stored big-endian (Merlin data as HyperSpy saves it) come out of every reader in native order."""
    data = rng.poisson(2.0, (4, 5, 6, 8)).astype(dtype)
    data[1, 2, 3, 4] = 258  # 0x0102: a swapped byte order shows
    native = data.astype(np.dtype(dtype).newbyteorder("="))
    for path, scan in big_endian_files(tmp_path, data).items():
        reader = open_reader(Source(str(path), None, scan))
        try:
            assert reader.dtype == native.dtype and reader.dtype.isnative, path
            assert (read_all(reader, 3 * native[0, 0].nbytes) == native).all(), path
        finally:
            reader.close()


def test_big_endian_counts_held_native(svc, names, rng, tmp_path):
    """Loads, puts and live appends of big-endian counts are held native, every count as stored."""
    data = rng.poisson(2.0, (4, 5, 6, 8)).astype(">u2")
    data[1, 2, 3, 4] = 258
    native = data.astype(np.uint16)
    total = native.sum(axis=(0, 1), dtype=np.uint64)
    acqs = [svc.load(path, name=names(), scan_shape=scan) for path, scan in big_endian_files(tmp_path, data).items()]
    acqs.append(svc.put(data, name=names()))
    live = svc.create(names(), data.shape[:2], data.shape[2:], dtype=">u2")
    live.append(data.reshape(-1, *data.shape[2:]))
    for acq in acqs + [live]:
        assert acq.dtype == np.uint16 and acq.dtype.isnative
        assert (acq.reduce(None, "sum") == total).all() and (acq.frame(1, 2) == native[1, 2]).all()


def test_unrecognised_file_names_its_first_bytes(tmp_path):
    """The error shows the file's own first bytes, also for a file long enough for the HDF5 user-block search."""
    assert readable().startswith("an HDF5 file, a .npy array, a Zarr store, a Merlin .mib or .hdr file, ")
    assert readable().endswith(", an EMPAD .raw file or a saved resident")
    path = tmp_path / "x.bin"
    for content in (b"not a detector file", b"MQ1,000001," + bytes(3000), b"ab"):
        path.write_bytes(content)
        with pytest.raises(ValueError, match=re.escape(f"is not {readable()} (first bytes {content[:8]!r})")):
            detect_format(path)


# -- Zarr groups -----------------------------------------------------------------


def test_zarr_group_arrays_at_any_depth(svc, names, rng, tmp_path):
    """A HyperSpy .zspy keeps its data at Experiments/__unnamed__/data: the only 3-D/4-D array loads without
    dataset=; with two, the error lists both by path."""
    data = rng.poisson(2.0, (3, 4, 6, 5)).astype(np.uint16)
    group = zarr.open_group(str(tmp_path / "scan.zspy"), mode="w")
    group.create_array("Experiments/__unnamed__/data", shape=data.shape, chunks=(1, 4, 6, 5), dtype=data.dtype)[...] = data
    group.create_array("Experiments/__unnamed__/axes", shape=(4,), dtype="float64")
    acq = svc.load(tmp_path / "scan.zspy", name=names())
    assert acq.shape == data.shape and (acq.frame(2, 3) == data[2, 3]).all()
    group.create_array("Experiments/other/stack", shape=(12, 6, 5), dtype="uint8")
    with pytest.raises(ValueError, match=re.escape("is a Zarr group: give dataset= (3-D/4-D arrays found: "
                                                   "['Experiments/__unnamed__/data', 'Experiments/other/stack'])")):
        open_reader(Source(str(tmp_path / "scan.zspy")))
    with pytest.raises(KeyError, match=re.escape("has no array 'data' (3-D/4-D arrays: ['Experiments/__unnamed__/data',")):
        open_reader(Source(str(tmp_path / "scan.zspy"), "data"))
    reader = open_reader(Source(str(tmp_path / "scan.zspy"), "/Experiments/other/stack", (3, 4)))
    assert reader.shape == (3, 4, 6, 5)
    reader.close()


def test_readers_read_any_frames_as_their_blocks_give_them(tmp_path, rng):
    from qgpu_dask.io.readers.base import ReadsFrames
    from qgpu_dask.samples import write_arina

    data = rng.poisson(0.8, (7, 9, 6, 5)).astype(np.uint16)
    flat = data.reshape(63, 6, 5)
    np.save(tmp_path / "a.npy", data)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("/four", data=data, chunks=(1, 3, 6, 5), compression="gzip")
        f.create_dataset("/three", data=flat, chunks=(4, 6, 5))
    zarr.save_array(str(tmp_path / "a.zarr"), data)
    master = write_arina(tmp_path, flat, per_file=10)  # seven data files, the last one short
    sources = [Source(str(tmp_path / "a.npy"), None, None), Source(str(tmp_path / "a.h5"), "/four", None),
               Source(str(tmp_path / "a.h5"), "/three", (7, 9)), Source(str(tmp_path / "a.zarr"), None, None),
               Source(str(master), None, (7, 9))]
    for source in sources:
        reader = open_reader(source)
        try:
            assert isinstance(reader, ReadsFrames), reader.kind
            for start, n in ((0, 63), (5, 13), (9, 18), (18, 1), (29, 25), (62, 1)):  # within a row, across rows and data files
                got = reader.frames(start, n)
                assert got.dtype == np.uint16 and got.shape == (n, 6, 5) and (got == flat[start : start + n]).all(), (reader.kind, start, n)
        finally:
            reader.close()
