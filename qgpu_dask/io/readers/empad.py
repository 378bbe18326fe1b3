"""EMPAD .raw files: little-endian float32 frames of 130 x 128, the last 2 rows metadata.

The file has no header: its size gives the frame count, and the scan shape
comes from the user or the conventional name ``scan_x{cols}_y{rows}.raw``.
Frames are read as any frames at a stride are (``FrameFile``), the 2
metadata rows skipped.
"""

from __future__ import annotations

import re
from pathlib import Path
import numpy as np

from ..source import Source
from .base import Format
from .frame_file import FrameFile

STORED_ROWS = 130  # rows per frame in the file: 128 of counts, then 2 of metadata
DET_SHAPE = (128, 128)
RAW_DTYPE = np.dtype("<f4")
FRAME_BYTES = STORED_ROWS * DET_SHAPE[1] * RAW_DTYPE.itemsize
NAME_PATTERN = re.compile(r"scan_x(\d+)_y(\d+)\.raw$", re.IGNORECASE)


def scan_shape_from_name(path: Path) -> tuple[int, int] | None:
    """(rows, cols) from a name ending ``scan_x{cols}_y{rows}.raw``, or None."""
    match = NAME_PATTERN.search(path.name)
    if match is None:
        return None
    return int(match.group(2)), int(match.group(1))


def frames_in(path: Path, scan_shape: tuple[int, int] | None = None) -> int:
    """Frames in the EMPAD file at ``path``; ValueError naming its size, the frame size and the frames found
    (and needed, where ``scan_shape`` or the name gives the scan) if it is empty or not whole frames."""
    size = path.stat().st_size
    if size == 0 or size % FRAME_BYTES:
        scan = scan_shape or scan_shape_from_name(path)
        needed = f", the scan {tuple(scan)} needs {scan[0] * scan[1]}" if scan else ""
        raise ValueError(
            f"{str(path)!r} is {size} bytes, not a positive multiple of the EMPAD frame size {FRAME_BYTES} bytes "
            f"({STORED_ROWS} x {DET_SHAPE[1]} float32): {size // FRAME_BYTES} whole frames found{needed} (truncated?)"
        )
    return size // FRAME_BYTES


def is_empad(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is an EMPAD .raw file: bare float32 frames with no magic, so a file named ``.raw``
    (the registry asks once no format with a signature matched) whose size is a positive multiple of the
    frame; a .raw file of any other size is refused here, naming its size and the frame size."""
    if not path.is_file() or path.suffix.lower() != ".raw":
        return False
    frames_in(path)
    return True


def open_raw(path: Path, source: Source) -> FrameFile:
    """An EMPAD .raw file as a float32 acquisition of 128 x 128 frames (each frame's 2 metadata rows
    skipped); ``scan_shape`` (rows, cols), if given, wins over the name."""
    scan = source.scan_shape or scan_shape_from_name(path)
    if scan is None:
        raise ValueError(f"{str(path)!r} is an EMPAD .raw file: give scan_shape=(rows, cols) (its name does not follow scan_x{{cols}}_y{{rows}}.raw)")
    rows, cols = (int(s) for s in scan)
    found = frames_in(path, (rows, cols))
    if found != rows * cols:
        raise ValueError(f"{str(path)!r} holds {found} EMPAD frames, but the scan {(rows, cols)} needs {rows * cols}")
    return FrameFile("empad raw", path, (rows, cols, *DET_SHAPE), RAW_DTYPE, 0, FRAME_BYTES)


FORMAT = Format("empad", is_empad, open_raw, "an EMPAD .raw file")
