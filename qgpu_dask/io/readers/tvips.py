"""TVIPS camera series (``<name>_000.tvips``, ``_001``, ...): a 256-byte little-endian series header in the
first file (its size 256, version 1 or 2, frame width and height, 8 or 16 bits a pixel, and for version 2
the bytes of each frame's header), then frame records running on from file to file: a frame header (12
bytes in version 1) and the pixels.

The scan is ``scan_shape`` from the first frame, or, where version-2 frame headers carry the scan
coordinates (``Scan_x``, ``Scan_y``: float32 at bytes 68 and 72 of a header of at least 76 bytes), found from
them as LiberTEM does: the scan begins at the frame at (0, 0) that (0, 1) follows (the frames before it were
recorded before the scan), its rows are as long as x runs before it falls back, and it holds every whole
row of the frames after its start. With ``scan_shape`` and coordinates, the scan still begins where they say.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..source import Source
from .base import Format, ScanShapeNeeded
from .frame_file import FrameFile, FrameFiles

SERIES_HEADER = 256
HEADER = np.dtype([("size", "<u4"), ("version", "<u4"), ("width", "<u4"), ("height", "<u4"), ("bits", "<u4"), ("x_offset", "<u4"),
                   ("y_offset", "<u4"), ("x_bin", "<u4"), ("y_bin", "<u4"), ("pixel_size", "<u4"), ("ht", "<u4"), ("mag", "<u4"),
                   ("frame_header", "<u4")])
VERSION_1_FRAME_HEADER = 12
SCAN_AT = 68  # Scan_x, Scan_y (float32) in a version-2 frame header
PART = re.compile(r"^(?P<base>.*)_(?P<number>\d{3})\.tvips$", re.IGNORECASE)
DETECT_FRAMES = 4096  # frame headers looked at to find where the scan begins and its row length


def series_header(path: Path) -> np.void | None:
    """The series header of ``path`` if it is the first file of a TVIPS series, else None."""
    if not path.is_file() or path.stat().st_size < SERIES_HEADER or PART.match(path.name) is None:
        return None
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER.itemsize), HEADER)[0]
    if header["size"] != SERIES_HEADER or header["version"] not in (1, 2) or header["bits"] not in (8, 16):
        return None
    return header


def is_tvips(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is a TVIPS series' first file (named ``*_000.tvips``, its series header valid)."""
    return series_header(path) is not None and int(PART.match(path.name)["number"]) == 0


def scan_from_coordinates(parts: list[FrameFile], total: int, where: str) -> tuple[int, tuple[int, int]] | None:
    """(first frame of the scan, (rows, cols)) from the frame headers' scan coordinates, or None where they
    do not show a scan beginning."""
    taken = []
    for part in parts:  # the first DETECT_FRAMES frames' headers, from as many files as hold them
        left = DETECT_FRAMES - sum(map(len, taken))
        if left <= 0:
            break
        taken.append(part.heads(0, min(part.shape[1], left)))
    heads = np.concatenate(taken)
    n = len(heads)
    coords = np.ascontiguousarray(heads[:, SCAN_AT : SCAN_AT + 8]).view("<f4").reshape(n, 2).astype(np.int64)  # (x, y)
    begins = np.flatnonzero((coords[:-1] == 0).all(axis=1) & (coords[1:, 0] == 1) & (coords[1:, 1] == 0))
    if not begins.size:
        return None
    start = int(begins[0])
    xs = coords[start:, 0]
    falls = np.flatnonzero(xs[1:] < xs[:-1])
    if not falls.size:
        return None
    cols = int(xs[: falls[0] + 1].max()) + 1
    rows = (total - start) // cols
    if rows < 1:
        raise ValueError(f"{where}: its scan coordinates begin a scan of rows of {cols} at frame {start}, but no whole row follows")
    return start, (rows, cols)


def open_tvips(path: Path, source: Source) -> FrameFiles:
    where = repr(str(path))
    header = series_header(path)
    version, bits = int(header["version"]), int(header["bits"])
    head = int(header["frame_header"]) if version == 2 else VERSION_1_FRAME_HEADER
    det = (int(header["height"]), int(header["width"]))
    dtype = np.dtype(f"<u{bits // 8}")
    record = head + det[0] * det[1] * dtype.itemsize
    base = PART.match(path.name)["base"]
    parts = []
    for number in range(1000):
        name = path.with_name(f"{base}_{number:03d}{path.suffix}")
        if not name.is_file():
            break
        offset = SERIES_HEADER if number == 0 else 0
        frames, rest = divmod(name.stat().st_size - offset, record)
        if rest:
            raise ValueError(f"{str(name)!r} is not whole frame records of {record} bytes ({frames} and {rest} bytes more): cut?")
        if frames:
            parts.append(FrameFile("tvips", name, (1, frames, *det), dtype, offset, head=head))
    if not parts:
        raise ValueError(f"{where}: the series holds no frames")
    total = sum(p.shape[1] for p in parts)
    found = scan_from_coordinates(parts, total, where) if version == 2 and head >= SCAN_AT + 8 else None
    first = found[0] if found else 0
    scan = source.scan_shape or (found[1] if found else None)
    if scan is None:
        raise ScanShapeNeeded(f"{where}: its {total} frames carry no scan coordinates (a version-{version} series, {head}-byte frame"
                              " headers): give scan_shape=(rows, cols)", total)
    return FrameFiles("tvips", parts, (*(int(s) for s in scan), *det), first)


FORMAT = Format("tvips", is_tvips, open_tvips, "a TVIPS series (*_000.tvips)")
