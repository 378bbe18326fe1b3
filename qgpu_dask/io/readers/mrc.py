"""MRC files (MRC2014): a stack of frames after a 1024-byte header and its extended header, as Direct
Electron cameras save 4D-STEM movies. The header is parsed by ``mrcfile`` (the format's own library: the
``formats`` extra); the frames are read as any frames at a stride are (``FrameFile``).

The scan shape is ``scan_shape``, or, for a Direct Electron movie (``YYYYMMDD_N[_suffix]_movie.mrc``), the
raster scan its ``YYYYMMDD_N[_suffix]_info.txt`` describes (``Scan - Size X/Y``, or the scan's ROI where one
was enabled), as RosettaSciIO reads it.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..source import Source
from .base import Format, stack_shape
from .frame_file import FrameFile

MAP = b"MAP "  # bytes 208..211 of an MRC2014 header
MOVIE = re.compile(r"^(?P<stamp>\d{8})_(?P<number>\d+)(?:_.+?)?(?:_\d+)?_movie\.mrc$")


def is_mrc(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is an MRC2014 file ("MAP " at byte 208 of a 1024-byte header)."""
    if not path.is_file() or path.stat().st_size < 1024:
        return False
    with open(path, "rb") as f:
        f.seek(208)
        return f.read(4) == MAP


def de_info(path: Path) -> dict[str, str] | None:
    """The ``key = value`` lines of a Direct Electron movie's info file, or None where it has none."""
    named = MOVIE.fullmatch(path.name)
    if named is None:
        return None
    prefix = f"{named['stamp']}_{named['number']}_"
    found = sorted(path.parent.glob(f"{prefix}info.txt")) + sorted(path.parent.glob(f"{prefix}*_info.txt"))
    if not found:
        return None
    lines = (line.split("=", 1) for line in found[0].read_text(errors="replace").splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in lines}


def de_scan_shape(path: Path) -> tuple[int, int] | None:
    """(rows, cols) of the raster scan a Direct Electron movie's info file describes; None where there is
    none or it was not a scan; ValueError for a scan of custom positions (not a raster)."""
    info = de_info(path)
    if info is None or info.get("Scan - Enable", "Disable") != "Enable":
        return None
    if info.get("Scan - Type", "Raster") != "Raster":
        raise ValueError(f"{str(path)!r} is a Direct Electron scan of custom positions ({info['Scan - Type']!r}): scans that are not"
                         " a raster are not read yet; give scan_shape=(rows, cols) to read its frames as a grid")
    roi = "ROI " if info.get("Scan - ROI Enable", "Disable") == "Enable" else ""
    try:
        return int(info[f"Scan - {roi}Size Y"]), int(info[f"Scan - {roi}Size X"])
    except (KeyError, ValueError):
        raise ValueError(f"{str(path)!r}: its Direct Electron info file gives no scan size (Scan - {roi}Size X/Y)") from None


def open_mrc(path: Path, source: Source) -> FrameFile:
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
    where = repr(str(path))
    shape = stack_shape((frames, rows, cols), source.scan_shape or de_scan_shape(path), where, "frames",
                        "no scan shape (no Direct Electron info file of a raster scan beside it)")
    return FrameFile("mrc", path, shape, dtype, offset)


FORMAT = Format("mrc", is_mrc, open_mrc, "an MRC file")
