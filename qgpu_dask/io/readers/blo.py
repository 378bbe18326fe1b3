"""NanoMegas .blo block files (precession electron diffraction): a 240-byte little-endian header, a navigator
image, then one record a scan position: a 6-byte frame header (0x55AA, the frame's index) and its square
pattern, 8-bit (16-bit where a version-259 header's note says "Blo Bit Depth: 16 bits", as LiberTEM reads
it). The scan is (NY, NX), in C order.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..source import Source
from .base import Format
from .frame_file import FrameFile

MAGIC = b"IMGBLO"
VERSIONS = (0x0102, 0x0103)
HEADER = np.dtype([("id", "S6"), ("version", "<u2"), ("navigator_at", "<u4"), ("frames_at", "<u4"), ("unknown", "<u4"),
                   ("det", "<u2"), ("det_rotation", "<u2"), ("nx", "<u2"), ("ny", "<u2")])
FRAME_HEAD = 6  # bytes before each pattern: <u2 0x55AA, <u4 frame index
BIT_DEPTH = re.compile(rb"Blo Bit Depth:\s*(\d+)\s*bits")


def is_blo(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` starts with the block file magic and a known version."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(8)
    return head[:6] == MAGIC and int.from_bytes(head[6:8], "little") in VERSIONS


def checked_heads(heads: np.ndarray, first: int, where: str) -> None:
    """ValueError naming the first frame whose record does not start with 0x55AA and its own index."""
    marks = heads[:, 0].astype(np.uint16) | heads[:, 1].astype(np.uint16) << 8
    index = np.ascontiguousarray(heads[:, 2:6]).view("<u4").reshape(-1)
    bad = np.flatnonzero((marks != 0x55AA) | (index != first + np.arange(len(heads))))
    if bad.size:
        k = int(bad[0])
        raise ValueError(f"{where}: frame {first + k}'s record starts {heads[k].tobytes().hex(' ')}, not 0x55AA and its index"
                         " (a damaged or cut block file?)")


def open_blo(path: Path, source: Source) -> FrameFile:
    where = str(path)
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER.itemsize), HEADER)[0]
        note = f.read(max(0, int(header["navigator_at"]) - 240)) if header["version"] == 0x0103 else b""
    bits = BIT_DEPTH.search(note)
    dtype = np.dtype(f"<u{int(bits.group(1)) // 8}") if bits else np.dtype(np.uint8)
    scan, det = (int(header["ny"]), int(header["nx"])), int(header["det"])
    if source.scan_shape is not None and tuple(source.scan_shape) != scan:
        raise ValueError(f"{where!r} holds a scan of {scan}, but scan_shape={tuple(source.scan_shape)} was given")
    if min(*scan, det) == 0:
        raise ValueError(f"{where!r}: its header gives an empty scan {scan} or detector side {det}")
    return FrameFile("blo", path, (*scan, det, det), dtype, int(header["frames_at"]), head=FRAME_HEAD,
                     check=lambda heads, first: checked_heads(heads, first, repr(where)))


FORMAT = Format("blo", is_blo, open_blo, "a NanoMegas .blo file")
