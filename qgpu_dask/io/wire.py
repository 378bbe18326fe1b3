"""The frame stream's wire format, ``qgpu-frames-1`` (plain TCP), which the receiver (``io.stream``) and the
detector simulator (``io.simulator``) share.

The sender writes one header line, UTF-8 JSON ending in ``\\n``, ``{"format": "qgpu-frames-1", "scan_shape":
[rows, cols], "det_shape": [rows, cols], "dtype": "uint16", "compression": "none"}``, then the frames, scan
positions in C order, and closes the connection after the last one. With ``"compression": "none"`` (the
default when absent) a frame is ``det_rows * det_cols`` counts of that dtype, little-endian, C order, frames
back to back; with ``"bitshuffle-lz4"`` the frames come as HDF5 bitshuffle-LZ4 chunks (filter 32008, one a
frame, as DECTRIS detectors write and send them: about 9 times fewer bytes on the wire at low dose) in
messages of 1 to MESSAGE_FRAMES frames: a uint32 little-endian frame count n, n uint32 little-endian chunk
byte counts, then the n chunks back to back (so neither end handles frames one at a time). A stream that
ends inside a frame is an error (the complete frames before it are kept).
"""

from __future__ import annotations

import json

import numpy as np

FORMAT = "qgpu-frames-1"
COMPRESSIONS = ("none", "bitshuffle-lz4")
MESSAGE_FRAMES = 4096  # the most frames a message of chunks may carry


def header_line(scan_shape: tuple[int, int], det_shape: tuple[int, int], dtype, compression: str = "none") -> bytes:
    """The header line a sender writes first."""
    return (json.dumps({"format": FORMAT, "scan_shape": list(scan_shape), "det_shape": list(det_shape), "dtype": str(np.dtype(dtype)),
                        "compression": compression}) + "\n").encode()
