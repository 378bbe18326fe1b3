"""The field's file formats (issue 27): each written with the format's own writer where one exists, or by its
published layout, and read by us, by LiberTEM and by RosettaSciIO where they read it; every count compared."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.io.registry import detect_format, open_reader
from qgpu_dask.io.source import Source
from peers import libertem_counts
from qgpu_dask.samples import write_blo, write_dm, write_frms6, write_mrc, write_raw, write_raw_csr, write_seq, write_ser, write_tvips


def read_all(reader) -> np.ndarray:
    out = np.empty(reader.shape, reader.dtype)
    flat = out.reshape(-1, *reader.shape[2:])
    for start, block in reader.blocks(block_bytes=5 * reader.shape[2] * reader.shape[3] * reader.dtype.itemsize):
        flat[start : start + len(block)] = block
    return out


def read_as(kind: str, path, counts: np.ndarray) -> np.ndarray:
    """Every count of ``path`` read by us, once the format found is ``kind`` and the reader gives the shape,
    dtype and kind of ``counts`` and every count of them."""
    assert detect_format(path).name == kind
    reader = open_reader(Source(str(path)))
    try:
        assert reader.shape == counts.shape and reader.dtype == counts.dtype and reader.kind == kind
        got = read_all(reader)
        assert (got == counts).all()
        return got
    finally:
        reader.close()


# -- LiberTEM's raw_csr ----------------------------------------------------------


def test_raw_csr_counts_equal_libertems(tmp_path, rng):
    counts = ((rng.random((6, 7, 12, 10)) < 0.05) * rng.integers(1, 900, (6, 7, 12, 10))).astype(np.uint16)
    toml = write_raw_csr(tmp_path, counts, ("<i8", "<u4", "<u2"))
    assert detect_format(toml).name == "raw_csr"
    reader = open_reader(Source(str(toml)))
    try:
        assert reader.shape == counts.shape and reader.dtype == np.uint16 and reader.kind == "raw_csr"
        got = read_all(reader)
        assert (got == counts).all()
        assert (got == libertem_counts("raw_csr", path=str(toml))).all()
        assert (reader.frames(40, 2) == counts.reshape(42, 12, 10)[40:42]).all()
    finally:
        reader.close()
    info = qd.inspect(toml)
    assert info["format"] == "raw_csr" and info["shape"] == counts.shape and info["compression"] == "sparse CSR"


def test_raw_csr_through_a_service(svc, names, tmp_path, rng):
    counts = ((rng.random((8, 9, 16, 16)) < 0.04) * rng.integers(1, 4, (8, 9, 16, 16))).astype(np.uint32)
    toml = write_raw_csr(tmp_path, counts, ("<i4", "<i4", "<u4"))
    for layout in ("dense", "compressed"):
        acq = svc.load(toml, name=names(), layout=layout, progress=False)
        assert (acq.frame(7, 8) == counts[7, 8]).all()
        assert (acq.reduce(None, "sum") == counts.sum(axis=(0, 1), dtype=np.uint64)).all()
        acq.release()


def test_bad_raw_csr_files_are_refused_by_name(tmp_path, rng):
    counts = ((rng.random((3, 4, 8, 8)) < 0.1) * 3).astype(np.uint8)
    toml = write_raw_csr(tmp_path, counts, ("<i4", "<i4", "<u1"))
    indices = np.fromfile(tmp_path / "coords.dat", "<i4")
    indices[-1] = 64
    indices.tofile(tmp_path / "coords.dat")
    reader = open_reader(Source(str(toml)))
    last = int(np.flatnonzero(counts.reshape(12, 64).any(axis=1))[-1])
    with pytest.raises(ValueError, match=f"events.toml': frame {last} has a pixel index 64 outside its 64 pixels"):
        read_all(reader)
    with pytest.raises(ValueError, match=r"holds 12 frames, but the scan \(5, 3\) has 15 positions"):
        open_reader(Source(str(toml), scan_shape=(5, 3)))
    (tmp_path / "values.dat").write_bytes(b"")
    with pytest.raises(ValueError, match="are not a CSR matrix"):
        open_reader(Source(str(toml)))
    (tmp_path / "values.dat").unlink()
    with pytest.raises(ValueError, match="names data file .*values.dat', which does not exist"):
        open_reader(Source(str(toml)))
    toml.write_text(toml.read_text().replace('data_dtype = "<u1"', ""))
    with pytest.raises(ValueError, match=r"its \[raw_csr\] table lacks data_dtype"):
        open_reader(Source(str(toml)))


# -- raw binary, described ---------------------------------------------------------


@pytest.mark.parametrize("dtype,offset,gap", [(">u2", 0, 0), ("<u4", 100, 24), ("<f4", 7, 3)])
def test_raw_frames_described(tmp_path, rng, dtype, offset, gap):
    counts = rng.integers(0, 60000, (5, 6, 9, 11))
    toml = write_raw(tmp_path, counts, dtype, offset, gap)
    assert detect_format(toml).name == "raw"
    reader = open_reader(Source(str(toml)))
    try:
        assert reader.shape == counts.shape and reader.dtype == np.dtype(dtype).newbyteorder("=") and reader.dtype.isnative
        got = read_all(reader)
        assert (got == counts.astype(dtype)).all()
        if offset == gap == 0:  # LiberTEM's raw reads frames back to back from the file's first byte
            theirs = libertem_counts("raw", path=str(tmp_path / "scan.bin"), nav_shape=counts.shape[:2], sig_shape=counts.shape[2:], dtype=dtype)
            assert (got == theirs).all()
    finally:
        reader.close()


def test_raw_through_a_service_and_its_errors(svc, names, tmp_path, rng):
    counts = rng.integers(0, 9, (6, 4, 16, 16)).astype(np.uint16)
    toml = write_raw(tmp_path, counts, ">u2", 64, 16)
    acq = svc.load(toml, name=names(), layout="compressed", progress=False)
    assert (acq.frame(5, 3) == counts[5, 3]).all() and acq.dtype == np.uint16
    acq.release()
    with pytest.raises(ValueError, match=r"scan.bin' is \d+ bytes, too short for the 30 frames of its raw header \(\d+ bytes\): frame 24 is the first missing"):
        svc.load(toml, name=names(), scan_shape=(6, 5), progress=False)
    toml.write_text(toml.read_text().replace('dtype = ">u2"', 'dtype = "twelve bits"'))
    with pytest.raises(ValueError, match="scan.toml': dtype 'twelve bits' is not a dtype"):
        qd.inspect(toml)


# -- MRC (Direct Electron movies) ----------------------------------------------------


def write_de_movie(folder, counts: np.ndarray, info: dict[str, str], byteorder: str = "<", name: str = "20261204_7_movie.mrc"):
    """``counts`` (scan..., det...) as a Direct Electron movie (``mrcfile``'s writer) and its info file."""
    path = write_mrc(folder / name, counts.reshape(-1, *counts.shape[2:]), byteorder)
    (folder / "20261204_7_info.txt").write_text("".join(f"{k} = {v}\n" for k, v in info.items()))
    return path


@pytest.mark.parametrize("dtype,byteorder", [("uint16", "<"), ("int16", ">"), ("float32", "<"), ("int8", "<")])
def test_mrc_counts_equal_rosettasciios_libertems_and_mrcfiles(tmp_path, rng, dtype, byteorder):
    """RosettaSciIO and LiberTEM (through ncempy) read little-endian MRC only: a big-endian file is compared
    with mrcfile's reading alone."""
    import mrcfile
    from peers import rosettasciio_counts

    counts = rng.integers(0, 100, (4, 5, 12, 14)).astype(dtype)
    path = write_de_movie(tmp_path, counts, {"Scan - Enable": "Enable", "Scan - Type": "Raster", "Scan - Size X": "5", "Scan - Size Y": "4"},
                          byteorder)
    got = read_as("mrc", path, counts)
    if byteorder == "<":
        assert (got == rosettasciio_counts("mrc", path)).all()
        assert (got == libertem_counts("mrc", path=str(path), nav_shape=(4, 5))).all()
    with mrcfile.open(path, permissive=True) as mrc:
        assert (got.reshape(-1, 12, 14) == mrc.data).all()


def test_mrc_scan_shapes_and_errors(tmp_path, rng):
    counts = rng.integers(0, 9, (3, 4, 8, 8)).astype(np.uint16)
    roi = {"Scan - Enable": "Enable", "Scan - Size X": "40", "Scan - Size Y": "30", "Scan - ROI Enable": "Enable",
           "Scan - ROI Size X": "4", "Scan - ROI Size Y": "3"}
    path = write_de_movie(tmp_path, counts, roi)
    assert qd.inspect(path)["shape"] == (3, 4, 8, 8)
    assert qd.inspect(path, scan_shape=(6, 2))["shape"] == (6, 2, 8, 8)
    write_de_movie(tmp_path, counts, {"Scan - Enable": "Enable", "Scan - Type": "Custom"})
    with pytest.raises(ValueError, match="a Direct Electron scan of custom positions \\('Custom'\\)"):
        qd.inspect(path)
    plain = write_de_movie(tmp_path, counts, {}, name="stack.mrc")
    info = qd.inspect(plain)
    assert info["shape"] is None and info["frames"] == 12 and "give scan_shape=(rows, cols)" in info["needs"]
    cut = tmp_path / "cut.mrc"
    cut.write_bytes(plain.read_bytes()[:-200])
    with pytest.raises(ValueError, match=r"cut.mrc' is \d+ bytes, too short for the 12 frames of its mrc header \(\d+ bytes\): frame 10 is the first missing"):
        qd.inspect(cut, scan_shape=(3, 4))


def test_mrc_through_a_service(svc, names, tmp_path, rng):
    counts = rng.poisson(0.4, (6, 5, 16, 16)).astype(np.uint16)
    path = write_de_movie(tmp_path, counts, {"Scan - Enable": "Enable", "Scan - Size X": "5", "Scan - Size Y": "6"})
    acq = svc.load(path, name=names(), layout="compressed", progress=False)
    assert acq.shape == counts.shape and (acq.frame(5, 4) == counts[5, 4]).all()
    assert (acq.reduce(None, "sum") == counts.sum(axis=(0, 1), dtype=np.uint64)).all()
    acq.release()


# -- NanoMegas .blo -----------------------------------------------------------------


def test_blo_counts_equal_rosettasciios_and_libertems(tmp_path, rng):
    from peers import rosettasciio_counts

    counts = rng.integers(0, 256, (5, 7, 16, 16)).astype(np.uint8)
    path = write_blo(tmp_path / "ped.blo", counts)
    got = read_as("blo", path, counts)
    assert (got == rosettasciio_counts("blockfile", path)).all()
    assert (got == libertem_counts("blo", path=str(path))).all()


def test_blo_through_a_service_and_damaged_records(svc, names, tmp_path, rng):
    counts = rng.integers(0, 4, (6, 5, 16, 16)).astype(np.uint8)
    path = write_blo(tmp_path / "ped.blo", counts)
    acq = svc.load(path, name=names(), progress=False)
    assert acq.shape == counts.shape and (acq.frame(4, 3) == counts[4, 3]).all()
    acq.release()
    data = bytearray(path.read_bytes())
    frames_at = int.from_bytes(data[12:16], "little")
    data[frames_at + 17 * (6 + 256) + 2] ^= 0xFF  # frame 17's index
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="ped.blo': frame 17's record starts aa 55 ee 00 00 00, not 0x55AA and its index"):
        svc.load(path, name=names(), progress=False)
    with pytest.raises(ValueError, match=r"holds a scan of \(6, 5\), but scan_shape=\(5, 6\) was given"):
        qd.inspect(path, scan_shape=(5, 6))


# -- TVIPS ------------------------------------------------------------------------


def test_tvips_counts_equal_rosettasciios(tmp_path, rng):
    """Not LiberTEM's here: it looks for scan coordinates in every version-2 series, and in 60-byte frame
    headers finds pixels there (NaN, for these counts)."""
    from rsciio.tvips import file_reader

    counts = rng.integers(0, 60000, (3, 4, 16, 16)).astype(np.uint16)
    path = write_tvips(tmp_path, counts.reshape(12, 16, 16))
    assert detect_format(path).name == "tvips"
    assert qd.inspect(path)["frames"] == 12 and qd.inspect(path)["shape"] is None
    reader = open_reader(Source(str(path), scan_shape=(3, 4)))
    try:
        got = read_all(reader)
        assert reader.kind == "tvips" and (got == counts).all()
        assert (got == file_reader(str(path), scan_shape=(3, 4))[0]["data"]).all()
    finally:
        reader.close()


def test_tvips_split_files_and_a_scan_found_from_coordinates(tmp_path, rng, svc, names):
    """Two frames before the scan, then a 3 x 4 raster and one frame after it, over three files (the first
    holding the first row's end: LiberTEM looks for it there only)."""
    frames = rng.integers(0, 200, (15, 16, 16)).astype(np.uint8)
    scan = np.stack(np.meshgrid(np.arange(4), np.arange(3)), -1).reshape(12, 2)  # (x, y), rows of 4
    coordinates = np.concatenate([[[0, 0], [0, 0]], scan, [[0, 0]]])
    path = write_tvips(tmp_path, frames, record_limit=7, coordinates=coordinates)
    assert len(list(tmp_path.glob("series_*.tvips"))) == 3
    reader = open_reader(Source(str(path)))
    try:
        assert reader.shape == (3, 4, 16, 16) and reader.dtype == np.uint8
        got = read_all(reader)
        assert (got.reshape(12, 16, 16) == frames[2:14]).all()
        assert (got == libertem_counts("tvips", path=str(path))).all()
        assert (reader.frames(3, 4) == frames[5:9]).all()  # across the files' boundary
    finally:
        reader.close()
    acq = svc.load(path, name=names(), progress=False)
    assert (acq.frame(2, 3) == frames[13]).all()
    acq.release()
    (tmp_path / "series_002.tvips").write_bytes((tmp_path / "series_002.tvips").read_bytes()[:-5])
    with pytest.raises(ValueError, match=r"series_002.tvips' is not whole frame records of 364 bytes \(0 and 359 bytes more\): cut\?"):
        qd.inspect(path)


# -- Gatan DigitalMicrograph ---------------------------------------------------------


@pytest.mark.parametrize("version,dtype", [(4, "uint16"), (3, "float32"), (4, "int8")])
def test_dm_4d_counts_equal_rosettasciios_and_libertems(tmp_path, rng, version, dtype):
    from peers import rosettasciio_counts

    counts = rng.integers(0, 120, (3, 4, 16, 12)).astype(dtype)
    path = write_dm(tmp_path / f"stack.dm{version}", counts, version)
    got = read_as("dm", path, counts)
    assert (got == rosettasciio_counts("digitalmicrograph", path)).all()
    assert (got == libertem_counts("dm", path=str(path))).all()


def test_dm_frame_stacks_and_refusals(tmp_path, rng, svc, names):
    counts = rng.poisson(0.5, (4, 3, 16, 16)).astype(np.uint32)
    path = write_dm(tmp_path / "frames.dm4", counts.reshape(12, 16, 16), thumbnail=False)
    info = qd.inspect(path)
    assert info["shape"] is None and info["frames"] == 12 and "give scan_shape=(rows, cols)" in info["needs"]
    acq = svc.load(path, name=names(), scan_shape=(4, 3), layout="compressed", progress=False)
    assert (acq.frame(3, 2) == counts[3, 2]).all() and acq.dtype == np.uint32
    acq.release()
    old = write_dm(tmp_path / "old.dm4", counts, swapped=False)
    with pytest.raises(ValueError, match="its 4-D stack does not say it is in C order"):
        qd.inspect(old)
    flat = write_dm(tmp_path / "image.dm3", counts[0, 0], 3)
    with pytest.raises(ValueError, match=r"image.dm3' holds no image of 3 or 4 dimensions \(images of \[2, 2\] dimensions\)"):
        qd.inspect(flat)


# -- TIA .ser ------------------------------------------------------------------------


@pytest.mark.parametrize("version,dtype", [(0x220, "uint16"), (0x210, "int32"), (0x220, "float32")])
def test_ser_counts_equal_rosettasciios_and_libertems(tmp_path, rng, version, dtype):
    """(LiberTEM, through ncempy, misreads uint8 elements: not among these.)"""
    from peers import rosettasciio_counts

    counts = rng.integers(0, 5000, (3, 4, 12, 10)).astype(dtype)
    path = write_ser(tmp_path / "scan_1.ser", counts, version)
    got = read_as("ser", path, counts)
    assert (got == rosettasciio_counts("tia", path)).all()
    assert (got == libertem_counts("ser", path=str(path))).all()


def test_ser_through_a_service_and_its_errors(tmp_path, rng, svc, names):
    counts = rng.poisson(0.6, (5, 4, 16, 16)).astype(np.uint8)
    path = write_ser(tmp_path / "scan_1.ser", counts)
    acq = svc.load(path, name=names(), progress=False)
    assert (acq.frame(4, 3) == counts[4, 3]).all() and acq.dtype == np.uint8
    acq.release()
    frames = write_ser(tmp_path / "frames_1.ser", counts.reshape(20, 16, 16))
    info = qd.inspect(frames)
    assert info["shape"] is None and info["frames"] == 20
    assert qd.inspect(frames, scan_shape=(2, 10))["shape"] == (2, 10, 16, 16)
    data = bytearray(path.read_bytes())
    second = path.read_bytes().index(struct.pack("<hii", 1, 16, 16), 200 + 256)  # element 1's type and size
    data[second : second + 2] = struct.pack("<h", 2)
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="scan_1.ser': element 1 is not of the first element's data type and size"):
        svc.load(path, name=names(), progress=False)


# -- StreamPix .seq -------------------------------------------------------------------



@pytest.mark.parametrize("dtype,version", [("uint16", 5), ("uint8", 4)])
def test_seq_counts_equal_libertems(tmp_path, rng, dtype, version):
    counts = rng.integers(0, 250, (3, 4, 16, 12)).astype(dtype)
    path = write_seq(tmp_path / "movie.seq", counts.reshape(12, 16, 12), version=version)
    assert detect_format(path).name == "seq"
    info = qd.inspect(path)
    assert info["shape"] is None and info["frames"] == 12 and "give scan_shape=(rows, cols)" in info["needs"]
    reader = open_reader(Source(str(path), scan_shape=(3, 4)))
    try:
        got = read_all(reader)
        assert reader.kind == "seq" and reader.dtype == np.dtype(dtype) and (got == counts).all()
        assert (got == libertem_counts("seq", path=str(path), nav_shape=(3, 4))).all()
    finally:
        reader.close()


def test_seq_through_a_service(tmp_path, rng, svc, names):
    counts = rng.poisson(0.5, (4, 5, 16, 16)).astype(np.uint16)
    path = write_seq(tmp_path / "movie.seq", counts.reshape(20, 16, 16))
    acq = svc.load(path, name=names(), scan_shape=(4, 5), layout="compressed", progress=False)
    assert (acq.frame(3, 4) == counts[3, 4]).all()
    acq.release()
    with pytest.raises(ValueError, match=r"scan_shape \(5, 5\) has 25 positions, but '.*movie.seq' holds 20 frames"):
        svc.load(path, name=names(), scan_shape=(5, 5), progress=False)


# -- PNDetector .frms6 -------------------------------------------------------------------



def test_frms6_counts_equal_libertems(tmp_path, rng, svc, names):
    counts = rng.integers(0, 3000, (3, 4, 16, 10)).astype(np.uint16)
    hdr = write_frms6(tmp_path, counts)
    for path in (hdr, tmp_path / "run_002.frms6"):
        assert detect_format(path).name == "frms6"
        reader = open_reader(Source(str(path)))
        try:
            got = read_all(reader)
            assert reader.shape == counts.shape and reader.kind == "frms6" and (got == counts).all()
        finally:
            reader.close()
    assert (got == libertem_counts("frms6", path=str(hdr), enable_offset_correction=False)).all()
    acq = svc.load(hdr, name=names(), progress=False)
    assert (acq.frame(2, 3) == counts[2, 3]).all()
    acq.release()
    hdr.write_text(hdr.read_text().replace("bin: 1", "bin: 2"))
    with pytest.raises(ValueError, match="run.hdr': readout mode '\"bin: 2, windowing: 16 x 10\"' is not read"):
        qd.inspect(hdr)


@pytest.mark.parametrize("gap", [0, 6])
def test_a_file_cut_after_it_was_opened_names_the_frame(tmp_path, rng, gap):
    """Read straight into the frames (no gap: the file holds them as they are held) or through a block's
    records: either way the first frame the file no longer holds is named."""
    counts = rng.integers(0, 9, (4, 5, 8, 8)).astype(np.uint16)
    toml = write_raw(tmp_path, counts, "<u2", 0, gap)
    reader = open_reader(Source(str(toml)))
    try:
        data = tmp_path / "scan.bin"
        data.write_bytes(data.read_bytes()[: 13 * (128 + gap) + 50])
        with pytest.raises(ValueError, match="scan.bin. ended at frame 13 while being read"):
            read_all(reader)
    finally:
        reader.close()


# -- Direct Electron custom scans ---------------------------------------------------


def write_de_scan(folder, recorded: np.ndarray, xy, info: dict[str, str] | None = None, byteorder: str = "<"):
    """``recorded`` (n, det...) frames in the order a Direct Electron scan took them, the info file of a Random
    scan (``info`` added) and their positions ``xy`` (n, 2: x, y) as DE-Server writes them: the movie's path."""
    from qgpu_dask.samples import write_de_positions

    folder.mkdir(exist_ok=True)
    scan = {"Scan - Enable": "Enable", "Scan - Type": "Random", "Scan - Points": str(len(recorded)), **(info or {})}
    path = write_de_movie(folder, recorded[None], scan, byteorder)
    write_de_positions(folder / "20261204_7_scan_coordinates.csv", xy)
    return path


@pytest.mark.parametrize("kind,byteorder", [("Random", "<"), ("XY File", ">")])
def test_de_scan_of_a_raster_in_any_order_is_read_as_that_raster(tmp_path, rng, kind, byteorder):
    """Positions that visit every point of a raster once, in any order: each frame put at its raster position as
    the movie streams (blocks of 5 frames, less than a scan row), equal to mrcfile's frames placed by NumPy and
    to RosettaSciIO's reading (LiberTEM does not read DE scans; RosettaSciIO reads little-endian MRC only)."""
    import mrcfile
    from peers import rosettasciio_counts

    counts = rng.integers(0, 60000, (6, 7, 12, 10)).astype(np.uint16)
    order = rng.permutation(42)  # the raster position of each frame, in the order recorded
    path = write_de_scan(tmp_path, counts.reshape(42, 12, 10)[order], np.stack([order % 7, order // 7], axis=1), {"Scan - Type": kind},
                         byteorder)
    got = read_as("mrc", path, counts)
    with mrcfile.open(path, permissive=True) as mrc:
        placed = np.empty((42, 12, 10), np.uint16)
        placed[order] = mrc.data
    assert (got == placed.reshape(counts.shape)).all()
    if byteorder == "<":
        assert (got == rosettasciio_counts("mrc", path)).all()


@pytest.mark.parametrize("xy", [
    [[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1], [1, 0]],  # a point visited twice
    [[0, 0], [2, 0], [0, 1], [1, 1], [2, 1]],  # a point missed
    [[0, 0], [1, 0], [0, 1], [0, 0]],  # as many positions as the grid's points, (1, 1) missed and (0, 0) twice
    [[0, 0], [1, 0], [2, 0], [0, 1], [1.5, 1], [2, 1]],  # off the grid
], ids=["repeated", "missing", "repeated-and-missing", "off-grid"])
def test_de_irregular_scan_keeps_its_positions(tmp_path, rng, xy):
    """Positions that are not a raster's: the frames as one scan row in the order recorded (mrcfile's), and their
    positions kept as (row, col)."""
    import mrcfile
    from qgpu_dask.io.readers.base import KeepsPositions

    xy = np.array(xy, float)
    frames = rng.integers(0, 9, (len(xy), 8, 6)).astype(np.int16)
    path = write_de_scan(tmp_path, frames, xy, {"Scan - Type": "XY File"})
    with mrcfile.open(path, permissive=True) as mrc:
        recorded = mrc.data[None]
    reader = open_reader(Source(str(path)))
    try:
        assert isinstance(reader, KeepsPositions) and (reader.positions == xy[:, ::-1]).all()
    finally:
        reader.close()
    read_as("mrc", path, recorded)
    info = qd.inspect(path)
    assert info["shape"] == (1, len(xy), 8, 6) and (info["positions"] == xy[:, ::-1]).all()


def test_de_custom_scans_through_a_service(svc, names, tmp_path, rng):
    """A raster recorded out of order answers as any raster; an irregular scan's virtual image is one value a
    position, in the order of ``acq.positions``, which the catalog keeps."""
    counts = rng.poisson(0.5, (4, 5, 16, 16)).astype(np.uint16)
    frames = counts.reshape(20, 16, 16)
    mask = np.zeros((16, 16), bool)
    mask[4:12, 3:11] = True
    order = rng.permutation(20)
    path = write_de_scan(tmp_path / "raster", frames[order], np.stack([order % 5, order // 5], axis=1))
    acq = svc.load(path, name=names(), layout="compressed", progress=False)
    assert acq.shape == counts.shape and acq.positions is None
    assert (acq.virtual_image(mask) == counts[:, :, mask].sum(axis=-1)).all() and (acq.frame(3, 4) == counts[3, 4]).all()
    acq.release()
    xy = rng.random((13, 2)) * 30
    path = write_de_scan(tmp_path / "irregular", frames[:13], xy)
    for layout in ("dense", "compressed"):
        acq = svc.load(path, name=names(), layout=layout, progress=False)
        assert acq.shape == (1, 13, 16, 16) and (acq.positions == xy[:, ::-1]).all()
        assert (acq.virtual_image(mask) == frames[:13, mask].sum(axis=-1)[None]).all()
        assert (svc[acq.name].positions == acq.positions).all()
        acq.release()


def test_de_custom_scan_errors(tmp_path, rng):
    frames = rng.integers(0, 9, (6, 8, 8)).astype(np.uint16)
    path = write_de_scan(tmp_path, frames, [[0, 0], [1, 0], [0, 1]])
    with pytest.raises(ValueError, match=r"coordinates.csv' holds 3 lines of 2 numbers, but the 6 frames of .*movie.mrc' need one 'x,y' line"):
        qd.inspect(path)
    positions = tmp_path / "20261204_7_scan_coordinates.csv"
    positions.write_text("x,y\n" + "0,0\n" * 6)
    with pytest.raises(ValueError, match="scan_coordinates.csv' is not lines of 'x,y' numbers"):
        qd.inspect(path)
    positions.unlink()
    with pytest.raises(ValueError, match=r"custom positions \('Random'\), but the file of its positions \(20261204_7_scan_coordinates.csv\)"
                                         " is not beside it: put it there, or give scan_shape"):
        qd.inspect(path)
    assert qd.inspect(path, scan_shape=(2, 3))["shape"] == (2, 3, 8, 8)  # its frames as a grid, in the order recorded
    order = rng.permutation(6)
    path = write_de_scan(tmp_path, frames, np.stack([order % 3, order // 3], axis=1))
    reader = open_reader(Source(str(path)))
    try:
        path.write_bytes(path.read_bytes()[:-200])
        with pytest.raises(ValueError, match=r"movie.mrc' ended at frame \d while being read"):
            read_all(reader)
    finally:
        reader.close()
