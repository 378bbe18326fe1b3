"""Norpix StreamPix .seq files (Direct Electron cameras among others): a little-endian header (magic 0xFEED,
version, the frame's width, height and bit depth, the bytes from one frame to the next), then the frames,
each followed by a footer (its timestamp). The frames start at byte 8192 (version 5 and later) or 1024.

A .seq file says nothing of the scan: ``scan_shape`` is needed (``qd.inspect`` counts the frames). The dark
and gain references a camera may save beside it (``.seq.dark.mrc``, ``.seq.gain.mrc``) are not applied:
the counts are held as recorded.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..source import Source
from .base import Format, stack_shape
from .frame_file import FrameFile

MAGIC = 0xFEED
MONO = 100  # the only image format read: one channel
DTYPES = {8: "u1", 16: "<u2", 32: "<u4"}


def is_seq(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` starts with the StreamPix magic 0xFEED."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(4)
    return len(head) == 4 and struct.unpack("<I", head)[0] == MAGIC


def open_seq(path: Path, source: Source) -> FrameFile:
    where = repr(str(path))
    with open(path, "rb") as f:
        head = f.read(1024)
    if len(head) < 1024:
        raise ValueError(f"{where} is {len(head)} bytes: shorter than a .seq header")
    version = struct.unpack_from("<i", head, 28)[0]
    width, height, bits, _, _, image_format, _, _, stride = struct.unpack_from("<9I", head, 548)
    compression = struct.unpack_from("<I", head, 620)[0] if version >= 5 else 0
    if image_format != MONO or bits not in DTYPES or compression:
        raise ValueError(f"{where}: frames of image format {image_format}, {bits} bits, compression {compression} are not read"
                         f" (read: format {MONO}, {sorted(DTYPES)} bits, uncompressed)")
    offset = 8192 if version >= 5 else 1024
    frame_bytes = width * height * bits // 8
    stride = stride or frame_bytes
    frames = max(0, path.stat().st_size - offset + stride - frame_bytes) // stride
    shape = stack_shape((frames, height, width), source.scan_shape, where, "frames", "no scan shape (a .seq file has none)")
    return FrameFile("seq", path, shape, DTYPES[bits], offset, stride)


FORMAT = Format("seq", is_seq, open_seq, "a StreamPix .seq file")
