"""PNDetector pnCCD .frms6 acquisitions: ``<name>.hdr`` (an INI file: ``[measurementInfo]`` with the scan as
``stemimagesize=ROWSxCOLS`` and the readout mode), ``<name>_000.frms6`` (dark frames) and ``<name>_001.frms6``
onwards (the scan's frames, running on from file to file).

Each .frms6 file is a 1024-byte little-endian header (its size, 1024; the frame header's, 64; version 6; the
stored width and height; the frames it holds) and frame records: a 64-byte header and uint16 pixels. The
camera reads its two halves out side by side: a stored frame of (h, 2w) is the detector's (2h, w), its top
half on the left and its bottom half, turned by 180 degrees, on the right; frames are put back as the
detector sees them.

The counts are held as recorded: the dark frames are not subtracted (LiberTEM subtracts their mean unless
``enable_offset_correction=False``, giving floats). Binned readouts are refused.
"""

from __future__ import annotations

import configparser
import re
import struct
from pathlib import Path

import numpy as np

from ..source import Source
from .base import Format
from .frame_file import FrameFile, FrameFiles

HEADER, FRAME_HEADER, VERSION = 1024, 64, 6
PART = re.compile(r"^(?P<base>.*)_(?P<number>\d{3})\.frms6$", re.IGNORECASE)
READOUT = re.compile(r'^"?bin:\s*(?P<bin>\d+),\s*windowing:\s*(?P<rows>\d+)\s*x\s*(?P<cols>\d+)\s*"?$')


def file_header(path: Path) -> tuple[int, int, int] | None:
    """(stored width, stored height, frames) of a .frms6 file's header, or None where it is not one."""
    if not path.is_file() or path.stat().st_size < HEADER:
        return None
    with open(path, "rb") as f:
        head = f.read(HEADER)
    if struct.unpack_from("<HH", head) != (HEADER, FRAME_HEADER) or head[7] != VERSION:
        return None
    width, height = struct.unpack_from("<HH", head, 88)
    return width, height, struct.unpack_from("<I", head, 1020)[0]


def measurement(path: Path) -> dict | None:
    """The ``[measurementInfo]`` of a .frms6 acquisition's .hdr file, or None where ``path`` is not one."""
    if not path.is_file() or path.suffix.lower() != ".hdr" or path.stat().st_size > 1 << 20:
        return None
    parser = configparser.ConfigParser()
    try:
        parser.read_string(path.read_text(errors="strict"))
    except (UnicodeDecodeError, configparser.Error):
        return None
    return dict(parser["measurementInfo"]) if parser.has_section("measurementInfo") else None


def is_frms6(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is a .frms6 acquisition's .hdr file, or one of its .frms6 files."""
    return measurement(path) is not None or (PART.match(path.name) is not None and file_header(path) is not None)


def unfolded(frames: np.ndarray, out: np.ndarray) -> None:
    """Stored frames (n, h, 2w) as the detector's (n, 2h, w): the left half on top, the right half turned by 180
    degrees below it."""
    h, w = frames.shape[1], frames.shape[2] // 2
    out[:, :h] = frames[:, :, :w]
    out[:, h:] = frames[:, ::-1, : w - 1 : -1]


def open_frms6(path: Path, source: Source) -> FrameFiles:
    base = path.with_suffix("") if path.suffix.lower() == ".hdr" else path.with_name(PART.match(path.name)["base"])
    hdr = base.with_suffix(".hdr")
    info = measurement(hdr)
    if info is None:
        raise ValueError(f"{str(path)!r}: a .frms6 acquisition is read with its .hdr, and {str(hdr)!r} is missing or has no [measurementInfo]")
    where = repr(str(hdr))
    readout = READOUT.match(info.get("readoutmode", ""))
    if readout is None or int(readout["bin"]) != 1:
        raise ValueError(f"{where}: readout mode {info.get('readoutmode')!r} is not read (unbinned readouts only)")
    try:
        scan = tuple(int(v) for v in info["stemimagesize"].split("x"))
    except (KeyError, ValueError):
        raise ValueError(f"{where} gives no scan as stemimagesize=ROWSxCOLS (found {info.get('stemimagesize')!r})") from None
    parts = []
    for number in range(1, 1000):
        name = base.with_name(f"{base.name}_{number:03d}.frms6")
        found = file_header(name)
        if found is None:
            break
        width, height, frames = found
        record = FRAME_HEADER + width * height * 2
        frames = frames or (name.stat().st_size - HEADER) // record
        if frames:
            parts.append(FrameFile("frms6", name, (1, frames, 2 * height, width // 2), "<u2", HEADER, head=FRAME_HEADER,
                                   stored=(height, width), arrange=unfolded))
    if not parts:
        raise ValueError(f"{where}: no frames in {base.name}_001.frms6 onwards")
    if source.scan_shape is not None:
        scan = tuple(int(v) for v in source.scan_shape)
    return FrameFiles("frms6", parts, (*scan, *parts[0].shape[2:]))


FORMAT = Format("frms6", is_frms6, open_frms6, "a PNDetector .frms6 acquisition (.hdr or .frms6)")
