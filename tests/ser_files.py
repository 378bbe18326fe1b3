"""TIA .ser files written by the format's published layout, for tests (neither ncempy nor RosettaSciIO writes
them): the series header and its dimensions, each 2-D element (calibrations, data type, size, pixels last
row first) followed by its tag (time and scan position), then the offset arrays."""

from __future__ import annotations

import struct

import numpy as np

TYPES = {np.dtype(k): v for k, v in {"uint8": 1, "uint16": 2, "uint32": 3, "int8": 4, "int16": 5, "int32": 6, "float32": 7,
                                    "float64": 8}.items()}


def write_ser(path, data: np.ndarray, version: int = 0x220):
    """``data`` (scan rows, scan cols, det...) or (frames, det...) as a .ser file; ``version`` 0x220 (8-byte
    offsets) or 0x210 (4-byte)."""
    scan, (height, width) = data.shape[:-2], data.shape[-2:]
    frames = data.reshape(-1, height, width)
    offset = "<q" if version == 0x220 else "<i"
    dims = list(scan[::-1])  # the first dimension is the faster (x)
    out = bytearray(struct.pack("<HHHiiii", 0x4949, 0x0197, version, 0x4122, 0x4142, len(frames), len(frames)))
    arrays_at = len(out)
    out += struct.pack(offset, 0) + struct.pack("<i", len(dims))
    for size in dims:
        out += struct.pack("<iddi", size, 0.0, 1e-9, 0) + struct.pack("<i", 8) + b"Position" + struct.pack("<i", 6) + b"meters"
    elements, tags = [], []
    for k, frame in enumerate(frames):
        elements.append(len(out))
        out += struct.pack("<ddiddi", 0.0, 1.0, 0, 0.0, 1.0, 0) + struct.pack("<hii", TYPES[frame.dtype], width, height)
        out += frame[::-1].astype(frame.dtype.newbyteorder("<")).tobytes()
        tags.append(len(out))
        y, x = divmod(k, dims[0]) if len(dims) == 2 else (0, k)
        out += struct.pack("<HHIdd", 0x4142, 0, 0, x * 1e-9, y * 1e-9)
    struct.pack_into(offset, out, arrays_at, len(out))
    out += np.array(elements + tags, offset).tobytes()
    path.write_bytes(bytes(out))
    return path
