"""Gatan DigitalMicrograph DM3/DM4 files holding a 4D-STEM stack (4-D: scan rows, scan cols, det rows, det
cols) or a frame stack (3-D, ``scan_shape`` given). The tag tree is parsed by ncempy (the ``formats``
extra; LiberTEM reads DM files through it too), which gives each image's data offset, type and sizes; the
frames are read as any frames at a stride are (``FrameFile``).

The image read is the first of 3 or more dimensions (a file's 2-D thumbnail and images are passed over).
A 4-D stack must say it is in C order (``ImageTags.Meta Data.Data Order Swapped`` = 1, as GMS 3 writes it):
an older file's 4-D stack stored with its scan and detector axes interleaved is refused by name, as LiberTEM
refuses it.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..source import Source
from .base import Format, stack_shape
from .frame_file import FrameFile

DTYPES = {1: "<i2", 2: "<f4", 6: "u1", 7: "<i4", 9: "i1", 10: "<u2", 11: "<u4", 12: "<f8"}  # DM image DataType codes read
SWAPPED = "ImageTags.Meta Data.Data Order Swapped"


def is_dm(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` starts as a DM3 or DM4 tag file of little-endian data (version 3 or 4, then the root
    length, then byte order 1)."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(16)
    if len(head) < 16:
        return False
    version = struct.unpack_from(">I", head)[0]
    order_at = {3: 8, 4: 12}.get(version)
    return order_at is not None and struct.unpack_from(">I", head, order_at)[0] == 1


def open_dm(path: Path, source: Source) -> FrameFile:
    where = repr(str(path))
    try:
        from ncempy.io.dm import fileDM
    except ImportError:
        raise ValueError(f"reading {where} (DigitalMicrograph) needs ncempy: pip install 'qgpu-dask[formats]'") from None
    with fileDM(str(path), on_memory=False) as dm:
        stacks = [i for i in range(len(dm.dataOffset)) if int(dm.dataShape[i]) >= 3]
        if not stacks:
            raise ValueError(f"{where} holds no image of 3 or 4 dimensions (images of {[int(d) for d in dm.dataShape]} dimensions)")
        i = stacks[0]
        code = int(dm.dataType[i])
        sizes = [int(v[i]) for v in (dm.zSize2, dm.zSize, dm.ySize, dm.xSize)]
        ndim, offset = int(dm.dataShape[i]), int(dm.dataOffset[i])
        swapped = int(dm.allTags.get(f".ImageList.{i + 1}.{SWAPPED}", 0))
    if code not in DTYPES:
        raise ValueError(f"{where}: its image holds DM data type {code}; readable: {sorted(DTYPES)} (integers and real floats)")
    if ndim == 4 and swapped != 1:
        raise ValueError(f"{where}: its 4-D stack does not say it is in C order ({SWAPPED} = 1): an older file's stack"
                         " interleaves scan and detector axes and is not read; convert it with GMS 3 or LiberTEM's convert_transposed")
    stack = sizes if ndim == 4 else sizes[1:]
    shape = stack_shape(stack, source.scan_shape, where, "frames", "no scan shape")
    return FrameFile("dm", path, shape, DTYPES[code], offset)


FORMAT = Format("dm", is_dm, open_dm, "a DigitalMicrograph .dm3/.dm4 file")
