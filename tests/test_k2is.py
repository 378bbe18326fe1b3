"""Gatan K2 IS acquisitions (issue 27): written by the published layout (``samples.write_k2is``: sector files
that start and end part way through a frame, frames before and after the scan), read by us and by LiberTEM,
every count compared; and the errors a damaged acquisition gives."""

from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.io.readers.base import ScanShapeNeeded
from qgpu_dask.io.registry import detect_format, open_reader
from qgpu_dask.io.source import Source
from peers import libertem_counts
from qgpu_dask.samples import write_k2is

SCAN, DET = (2, 3), (1860, 2048)
TORN = (3, 8, 13, 18, 23, 28, 1, 6)  # write_k2is' default: every sector file starts within a frame
BLOCK = 0x5758


def read_all(reader) -> np.ndarray:
    """Every frame of ``reader`` in blocks of two frames (a block ends within a scan row)."""
    out = np.empty(reader.shape, reader.dtype)
    flat = out.reshape(-1, *reader.shape[2:])
    for start, block in reader.blocks(block_bytes=2 * DET[0] * DET[1] * 2):
        flat[start : start + len(block)] = block
    return out


@pytest.fixture(scope="module")
def counts():
    return np.random.default_rng(27).integers(0, 4096, (*SCAN, *DET), dtype=np.uint16)


@pytest.fixture
def acquisition(tmp_path, counts):
    """The .gtg of an acquisition whose .gtg gives the scan, two frames recorded before it and one after."""
    return write_k2is(tmp_path, counts)


def test_counts_equal_libertems(tmp_path, counts):
    """LiberTEM 0.16 reads a small acquisition only where the shutter flag is set from the first frame every
    sector holds (it looks for the flag 12800 blocks on, past the end of a small file): so the .gtg records no
    scan here and the shutter is open from the first whole frame. Sector files that all start within a frame,
    and some that start at a frame."""
    for torn in (TORN, (0, 5, 31, 2, 0, 17, 9, 4)):
        gtg = write_k2is(tmp_path, counts, lead=0, scan_in_gtg=False, torn=torn)
        theirs = libertem_counts("k2is", path=str(gtg), nav_shape=SCAN)
        assert (theirs == counts).all()
        for path in (gtg, tmp_path / "capture_7.bin"):
            assert detect_format(path).name == "k2is"
            reader = open_reader(Source(str(path), scan_shape=SCAN))
            try:
                assert reader.shape == counts.shape and reader.dtype == np.uint16 and reader.kind == "k2is"
                assert (read_all(reader) == theirs).all()
            finally:
                reader.close()
    info = qd.inspect(gtg)
    assert info["format"] == "k2is" and info["shape"] is None and info["frames"] == 7 and info["det_shape"] == DET
    assert info["needs"].endswith("come with no scan shape (its .gtg records no SI Dimensions): give scan_shape=(rows, cols)")
    with pytest.raises(ScanShapeNeeded, match=r"the 7 frames of '.*capture_2.bin' come with no scan shape"):
        open_reader(Source(str(tmp_path / "capture_2.bin")))


def test_the_scan_from_the_gtg_begins_a_frame_before_the_shutter(acquisition, counts):
    """The frames before the scan (shutter closed) are dropped, and so is the one frame after it; the scan
    begins a frame before the shutter flag (the camera sets it a frame late), as LiberTEM reads it."""
    for path in (acquisition, acquisition.with_name("capture_1.bin")):
        assert detect_format(path).name == "k2is"
        reader = open_reader(Source(str(path)))
        try:
            assert reader.shape == counts.shape and reader.compression == "12-bit packed"
            assert (read_all(reader) == counts).all()
            assert (reader.frames(4, 2) == counts.reshape(6, *DET)[4:]).all()
        finally:
            reader.close()
    info = qd.inspect(acquisition)
    assert info["format"] == "k2is" and info["shape"] == counts.shape and info["raw_bytes"] == counts.nbytes
    reader = open_reader(Source(str(acquisition), scan_shape=(1, 7)))  # scan_shape over the .gtg's: the frame after the scan too
    try:
        assert (reader.frames(0, 6) == counts.reshape(6, *DET)).all() and (reader.frames(6, 1) == 2000).all()
    finally:
        reader.close()
    with pytest.raises(ValueError, match=r"the scan \(2, 4\) has 8 positions, but the sector files of '.*capture_.gtg' hold 7 whole frames"):
        open_reader(Source(str(acquisition), scan_shape=(2, 4)))


def test_through_a_service(acquisition, counts, svc, names):
    acq = svc.load(acquisition, name=names(), progress=False)
    assert acq.shape == counts.shape and (acq.frame(1, 2) == counts[1, 2]).all()
    assert (acq.reduce(None, "sum") == counts.sum(axis=(0, 1), dtype=np.uint64)).all()
    acq.release()


def test_a_missing_or_foreign_sector_file_is_named(acquisition):
    (acquisition.parent / "capture_4.bin").unlink()
    for path in (acquisition, acquisition.with_name("capture_2.bin")):
        with pytest.raises(ValueError, match=r"has 8 sector files capture_\*.bin beside it, and 7 are there \(capture_1.bin, capture_2.bin,"
                                             r" capture_3.bin, capture_5.bin, .*\): put all 8, and no other file named so, beside it"):
            qd.inspect(path)
    (acquisition.parent / "capture_4.bin").write_bytes(bytes(BLOCK))
    with pytest.raises(ValueError, match="capture_4.bin' is not a K2 IS sector file"):
        open_reader(Source(str(acquisition)))


def test_a_cut_sector_file_is_named(acquisition):
    sector = acquisition.parent / "capture_6.bin"
    whole = sector.read_bytes()
    sector.write_bytes(whole[: (TORN[5] + 32 * 6 + 5) * BLOCK])  # the torn frame, the two before the scan, 4 of its frames and a piece
    with pytest.raises(ValueError, match=r"the scan \(2, 3\) has 6 positions, but the sector files of .* hold 4 whole frames .*: cut short"):
        open_reader(Source(str(acquisition)))
    sector.write_bytes(whole)
    reader = open_reader(Source(str(acquisition)))
    try:
        sector.write_bytes(whole[: (TORN[5] + 32 * 7) * BLOCK])
        with pytest.raises(ValueError, match="capture_6.bin' ended at frame 5 of the scan while being read"):
            read_all(reader)
    finally:
        reader.close()


@pytest.mark.parametrize("field,value,error", [
    (0, 0x12345678, "the block at byte {at} .frame 4 of the scan. starts 0x12345678, not the sync word 0xFFFF0055"),
    (24, 999, r"the 32 blocks of frame 4 of the scan carry frame ids \[107, 999\]: blocks are missing"),
])
def test_a_damaged_block_is_named(acquisition, field, value, error):
    sector = acquisition.parent / "capture_3.bin"
    at = (TORN[2] + 32 * (2 + 4) + 5) * BLOCK  # block 5 of the scan's frame 4: past the torn frame, the 2 before the scan and 4 of it
    data = bytearray(sector.read_bytes())
    struct.pack_into(">I", data, at + field, value)
    sector.write_bytes(bytes(data))
    reader = open_reader(Source(str(acquisition)))
    try:
        with pytest.raises(ValueError, match="capture_3.bin': " + error.format(at=at)):
            read_all(reader)
    finally:
        reader.close()


def test_sectors_out_of_step_are_refused(tmp_path, counts):
    """A sector file of another acquisition, whose shutter opened a frame later, among the eight."""
    gtg = write_k2is(tmp_path, counts)
    other = tmp_path / "other"
    other.mkdir()
    write_k2is(other, counts, lead=3)
    shutil.copy(other / "capture_8.bin", tmp_path / "capture_8.bin")
    with pytest.raises(ValueError, match=r"capture_8.bin': the shutter opens at another frame than in capture_1.bin \(frame 3\)"):
        open_reader(Source(str(gtg)))
