"""FEI/Thermo TIA .ser files of 2-D data elements (a diffraction pattern per scan position; the .emi beside
them holds the microscope's metadata). The series header, its dimensions and the offsets of its elements are
parsed by ncempy (the ``formats`` extra; LiberTEM reads .ser through it too); each element is a 50-byte
header (calibrations, data type, width, height) and its pixels, stored last row first, read as any frames
at a stride are (``FrameFile``, rows put back in order). Elements must lie evenly spaced, as TIA writes them.

The scan is the series' two dimensions (the second the slower: rows), or ``scan_shape`` for a series of
one dimension.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..source import Source
from .base import Format, stack_shape
from .frame_file import FrameFile, bottom_up

IMAGES = 0x4122  # DataTypeID of a series of 2-D elements
ELEMENT_HEAD = 50  # calibrations (40 bytes), then <i2 data type, <i4 width, <i4 height
DTYPES = {1: "u1", 2: "<u2", 3: "<u4", 4: "i1", 5: "<i2", 6: "<i4", 7: "<f4", 8: "<f8"}  # element data types read


def is_ser(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` starts with a TIA series header (byte order 0x4949, series id 0x0197, version 0x0210 or 0x0220)."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(6)
    return len(head) == 6 and struct.unpack("<HHH", head)[:2] == (0x4949, 0x0197) and struct.unpack_from("<H", head, 4)[0] in (0x210, 0x220)


def checked_heads(heads: np.ndarray, first: int, expected: bytes, where: str) -> None:
    """ValueError naming the first element whose data type and size are not the first element's."""
    bad = np.flatnonzero((heads[:, 40:ELEMENT_HEAD] != np.frombuffer(expected, np.uint8)).any(axis=1))
    if bad.size:
        raise ValueError(f"{where}: element {first + int(bad[0])} is not of the first element's data type and size")


def open_ser(path: Path, source: Source) -> FrameFile:
    where = repr(str(path))
    try:
        from ncempy.io.ser import fileSER
    except ImportError:
        raise ValueError(f"reading {where} (TIA .ser) needs ncempy: pip install 'qgpu-dask[formats]'") from None
    with fileSER(str(path)) as ser:
        head = ser.head
        kind, valid = int(head["DataTypeID"]), int(head["ValidNumberElements"])
        offsets = np.asarray(head["DataOffsetArray"][:valid], np.int64)
        dims = [int(d["DimensionSize"]) for d in head["Dimensions"]]
    if kind != IMAGES:
        raise ValueError(f"{where} is a series of spectra (data type id {kind:#x}), not of 2-D patterns")
    if valid == 0:
        raise ValueError(f"{where} holds no elements")
    steps = np.diff(offsets)
    if steps.size and (steps != steps[0]).any():
        raise ValueError(f"{where}: its elements are not evenly spaced in the file (element {int(np.flatnonzero(steps != steps[0])[0]) + 1}"
                         " is not where the others' spacing puts it)")
    with open(path, "rb") as f:
        f.seek(int(offsets[0]) + 40)
        expected = f.read(10)
    code, width, height = struct.unpack("<hii", expected)
    if code not in DTYPES:
        raise ValueError(f"{where}: its elements hold data type {code}; readable: {sorted(DTYPES)} (integers and real floats)")
    scan = tuple(reversed(dims)) if len(dims) == 2 and dims[0] * dims[1] == valid else None
    shape = stack_shape((valid, height, width) if scan is None else (*scan, height, width), source.scan_shape, where, "elements",
                        f"dimensions {dims}, not a scan of them")
    return FrameFile("ser", path, shape, DTYPES[code], int(offsets[0]), int(steps[0]) if steps.size else None, ELEMENT_HEAD,
                     lambda heads, first: checked_heads(heads, first, expected, where), arrange=bottom_up)


FORMAT = Format("ser", is_ser, open_ser, "a TIA .ser file")
