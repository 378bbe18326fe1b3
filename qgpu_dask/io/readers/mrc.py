"""MRC files (MRC2014): a stack of frames after a 1024-byte header and its extended header, as Direct
Electron cameras save 4D-STEM movies. The header is parsed by ``mrcfile`` (the format's own library: the
``formats`` extra); the frames are read as any frames at a stride are (``FrameFile``).

The scan shape is ``scan_shape``, or, for a Direct Electron movie (``YYYYMMDD_N[_suffix]_movie.mrc``), the
scan its ``YYYYMMDD_N[_suffix]_info.txt`` describes, as RosettaSciIO reads it:

- a raster (``Scan - Type = Raster``): ``Scan - Size X/Y``, or the scan's ROI where one was enabled;
- any other scan type (DE-Server's ``Scan - Type`` offers Random, Distributed, Hilbert Curve, Serpentine, ...,
  ``XY File``; DEAPI's ``set_xy_array`` sets ``XY Array``): the position of each frame, in
  ``YYYYMMDD_N[_suffix]_scan_coordinates.csv`` beside the movie. Positions that visit every point of a grid
  from (0, 0) exactly once (a random or custom ordering of a raster) put each frame at its raster position as
  the movie is read, so the acquisition is an ordinary raster; any others (repeated, missing or off-grid
  positions) load as one scan row (1, n) in the order recorded, their positions kept (``KeepsPositions``).

Where the facts come from: the scan types are DEAPI's (github.com/directelectron/deapi: ``deapi/prop_dump.json``
lists the options of "Scan - Type"; the client's ``set_xy_array`` sends integer (x, y) positions, repeats
allowed, and "Scan - Points" becomes their number). The coordinate file's name and its lines of ``x,y``
integers are RosettaSciIO's reading (0.15, ``rsciio/mrc/_api.py``: ``find_related_de_files`` and
``read_de_metadata_file``, which puts position (x, y) at scan row y, column x), and the files DE-Server
2.7.5 wrote in RosettaSciIO's test data (``rsciio/tests/data/mrc``) show it: ``ROI_Random_Scan``, a Random
scan of a 12 x 29 ROI ("Scan - ROI Size X/Y"), has "Scan - Points = 348" and 348 lines ``x,y`` with no header,
x in 0..11 and y in 0..28, every point once (counted from the ROI's corner); ``Custom``, an ``XY File`` scan,
has 30 lines visiting 15 points twice each. Assumed, where nothing was found: one frame a position ("Scan -
Camera Frames Per Point = 1"; the counts must match, else it is refused), positions in scan pixels (the file
names no unit), and non-integer positions read as they are (DE-Server wrote integers).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..source import Source
from .base import Format, stack_shape
from .file_bytes import READ_PIECE, READERS
from .frame_file import FrameFile, StoredFrames

MAP = b"MAP "  # bytes 208..211 of an MRC2014 header
MOVIE = re.compile(r"^(?P<stamp>\d{8})_(?P<number>\d+)(?:_.+?)?(?:_\d+)?_movie\.mrc$")
POSITIONS = "scan_coordinates.csv"  # the tail of a Direct Electron scan's coordinate file's name


def is_mrc(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is an MRC2014 file ("MAP " at byte 208 of a 1024-byte header)."""
    if not path.is_file() or path.stat().st_size < 1024:
        return False
    with open(path, "rb") as f:
        f.seek(208)
        return f.read(4) == MAP


def de_prefix(path: Path) -> str | None:
    """``YYYYMMDD_N_``, which the files a Direct Electron movie comes with begin with; None for another name."""
    named = MOVIE.fullmatch(path.name)
    return None if named is None else f"{named['stamp']}_{named['number']}_"


def de_file(path: Path, tail: str) -> Path | None:
    """The file ``YYYYMMDD_N[_suffix]_<tail>`` beside a Direct Electron movie, or None."""
    prefix = de_prefix(path)
    if prefix is None:
        return None
    found = sorted(path.parent.glob(f"{prefix}{tail}")) + sorted(path.parent.glob(f"{prefix}*_{tail}"))
    return found[0] if found else None


def de_info(path: Path) -> dict[str, str] | None:
    """The ``key = value`` lines of a Direct Electron movie's info file, or None where it has none."""
    found = de_file(path, "info.txt")
    if found is None:
        return None
    lines = (line.split("=", 1) for line in found.read_text(errors="replace").splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in lines}


def scan_type(info: dict[str, str] | None) -> str | None:
    """The ``Scan - Type`` of a Direct Electron info file ("Raster" where it names none); None where the movie
    was not a scan."""
    if info is None or info.get("Scan - Enable", "Disable") != "Enable":
        return None
    return info.get("Scan - Type", "Raster")


def de_scan_shape(path: Path, info: dict[str, str] | None) -> tuple[int, int] | None:
    """(rows, cols) of the raster scan a Direct Electron movie's ``info`` describes; None where it was not a scan."""
    if scan_type(info) is None:
        return None
    roi = "ROI " if info.get("Scan - ROI Enable", "Disable") == "Enable" else ""
    try:
        return int(info[f"Scan - {roi}Size Y"]), int(info[f"Scan - {roi}Size X"])
    except (KeyError, ValueError):
        raise ValueError(f"{str(path)!r}: its Direct Electron info file gives no scan size (Scan - {roi}Size X/Y)") from None


def de_positions(path: Path, kind: str, frames: int) -> np.ndarray:
    """(x, y) of each of the ``frames`` frames of a Direct Electron movie of a ``kind`` scan (not a raster), from
    its coordinate file, float64; ValueError naming the file where it is missing or does not hold them."""
    found = de_file(path, POSITIONS)
    if found is None:
        raise ValueError(f"{str(path)!r} is a Direct Electron scan of custom positions ({kind!r}), but the file of its positions"
                         f" ({de_prefix(path)}{POSITIONS}) is not beside it: put it there, or give scan_shape=(rows, cols) to read"
                         " its frames as a grid in the order they were recorded")
    try:
        xy = np.loadtxt(found, delimiter=",", ndmin=2)
    except ValueError as err:
        raise ValueError(f"{str(found)!r} is not lines of 'x,y' numbers, as Direct Electron writes a scan's positions ({err})") from None
    if xy.shape != (frames, 2) or not np.isfinite(xy).all():
        raise ValueError(f"{str(found)!r} holds {len(xy)} lines of {xy.shape[1]} numbers, but the {frames} frames of {str(path)!r} need one"
                         " 'x,y' line each (finite numbers): is it this movie's, and was the scan one camera frame a position?")
    return xy


def raster_order(xy: np.ndarray) -> tuple[tuple[int, int], np.ndarray] | None:
    """((rows, cols), the frame recorded at each raster position) where the positions ``xy`` (x, y) visit every
    point of a grid from (0, 0) exactly once; None for any others."""
    if (xy != np.round(xy)).any() or xy.min() < 0:
        return None
    x, y = xy[:, 0].astype(np.int64), xy[:, 1].astype(np.int64)
    rows, cols = int(y.max()) + 1, int(x.max()) + 1
    if rows * cols != len(xy):
        return None
    order = np.full(len(xy), -1, np.int64)
    order[y * cols + x] = np.arange(len(xy))
    return ((rows, cols), order) if (order >= 0).all() else None  # a point left out is a point visited twice


class Reordered(StoredFrames):
    """The frames of ``stored`` (a FrameFile whose records are their frames back to back, in the order they were
    recorded) at the raster positions they were recorded at: raster position k holds frame ``order[k]`` of the
    file. A block of raster rows gathers its frames by index, READ_PIECE bytes of them a thread, each run of
    frames that follow each other in the file in one read."""

    compression = "none"

    def __init__(self, stored: FrameFile, order: np.ndarray):
        self.stored, self.order = stored, order
        self.kind, self.shape, self.dtype = stored.kind, stored.shape, stored.dtype

    def frames_into(self, out: np.ndarray, start: int) -> np.ndarray:
        """Raster positions start .. start + len(out) copied into ``out`` in native byte order."""
        n, size, stored = len(out), self.stored.frame_bytes, self.stored
        wanted = self.order[start : start + n]
        into = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        rows = into.reshape(n, -1).view(np.uint8)
        cuts = np.flatnonzero(np.diff(wanted) != 1) + 1
        group = max(1, READ_PIECE // size)
        spans, span, count = [], [], 0  # runs (a, b) of out's rows, about ``group`` frames a thread
        for a, b in zip([0, *cuts], [*cuts, n]):
            for lo in range(int(a), int(b), group):
                hi = min(int(b), lo + group)
                span.append((lo, hi))
                count += hi - lo
                if count >= group:
                    spans.append(span)
                    span, count = [], 0
        if span:
            spans.append(span)

        def read(runs: list[tuple[int, int]]) -> None:
            for a, b in runs:
                got = stored.file.read_plain(stored.offset + int(wanted[a]) * stored.stride, memoryview(rows[a:b].reshape(-1)))
                if got < (b - a) * size:
                    stored.cut_at(int(wanted[a]) + got // size)

        for _ in READERS.map(read, spans):  # the first error is raised
            pass
        if stored.stored != self.dtype:
            into.byteswap(inplace=True)  # the file's byte order, made native
        if into is not out:
            out[...] = into
        return out

    def close(self) -> None:
        self.stored.close()


class Irregular(FrameFile):
    """A movie of a scan whose positions are not a raster's: its frames as one scan row (1, n) in the order
    recorded, and ``positions``, (n, 2) float64 (row, col) of each in scan pixels (``KeepsPositions``)."""

    def __init__(self, path: Path, shape: tuple[int, int, int, int], dtype, offset: int, positions: np.ndarray):
        super().__init__("mrc", path, shape, dtype, offset)
        self.positions = positions


def custom_scan(path: Path, kind: str, stack: tuple[int, int, int], dtype, offset: int) -> StoredFrames:
    """The reader of a Direct Electron movie of a ``kind`` scan (not a raster) of ``stack`` (frames, det rows,
    det cols): a raster where its positions are one, else its frames as recorded with their positions."""
    frames, det = stack[0], stack[1:]
    xy = de_positions(path, kind, frames)
    grid = raster_order(xy)
    if grid is None:
        return Irregular(path, (1, frames, *det), dtype, offset, np.ascontiguousarray(xy[:, ::-1]))
    (rows, cols), order = grid
    return Reordered(FrameFile("mrc", path, (rows, cols, *det), dtype, offset), order)


def open_mrc(path: Path, source: Source) -> StoredFrames:
    try:
        import mrcfile
        from mrcfile.utils import data_dtype_from_header
    except ImportError:
        raise ValueError(f"reading {str(path)!r} (MRC) needs mrcfile: pip install 'qgpu-dask[formats]'") from None
    with mrcfile.open(path, header_only=True, permissive=True) as mrc:
        header = mrc.header
        try:
            dtype = data_dtype_from_header(header)
        except ValueError as err:
            raise ValueError(f"{str(path)!r}: {err}") from None
        frames, rows, cols = int(header.nz), int(header.ny), int(header.nx)
        offset = header.nbytes + int(header.nsymbt)
    info = None if source.scan_shape else de_info(path)
    kind = scan_type(info)
    if kind not in (None, "Raster"):
        return custom_scan(path, kind, (frames, rows, cols), dtype, offset)
    shape = stack_shape((frames, rows, cols), source.scan_shape or de_scan_shape(path, info), repr(str(path)), "frames",
                        "no scan shape (no Direct Electron info file of a scan beside it)")
    return FrameFile("mrc", path, shape, dtype, offset)


FORMAT = Format("mrc", is_mrc, open_mrc, "an MRC file")
