"""Quantum Detectors Merlin frames: the MQ1 frame header, the HDR acquisition header, the MPX framing of the
detector's TCP ports, and the pixel encodings, decoded with NumPy or CuPy alike.

A .mib file is MQ1 frames back to back (each a NUL-padded ASCII header of ``data_offset`` bytes, then its
pixels); a .hdr file is the text of the acquisition header. On the data port every message is ``MPX,`` and
10 decimal digits (the bytes after them, the comma included), a comma, then an HDR or an MQ1 frame.

Pixels: U08 / U16 / U32 are counts, big-endian, rows as the detector sends them (row 0 first, as LiberTEM
and LiberTEM-live keep them; HyperSpy's reader flips them). R64 is the chips' raw readout at a counter depth
of 1, 6, 12 or 24 bits: each 8-byte word is byte-reversed, then holds 64, 8 or 4 pixels little-endian
(1 bit, 1 byte, 16 bits); 24 bits are two 12-bit images, the first the high bits. A raw quad (2 x 2 chips)
sends 256 rows of four chip rows, the chips in the order 4, 3, 2, 1; chips 1 and 2 are the top half, 3 and 4
the bottom half turned by 180 degrees (so a raw 2x2G frame decodes to 512 x 512, its gaps left out, as
LiberTEM's reader does). Decoding uses array operations only, so the same functions run on the GPU when
given CuPy arrays (the twin is the same code).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..device import module_of

MPX_BYTES = 15  # "MPX," + 10 digits + ","
MAGIC = b"MQ1,"
HDR_MAGIC = b"HDR,"
CHIP = 256  # pixels a side of one Medipix3 chip
COUNTS = {"U08": np.dtype(np.uint8), "U16": np.dtype(np.uint16), "U32": np.dtype(np.uint32)}
RAW = {1: np.dtype(np.uint8), 6: np.dtype(np.uint8), 12: np.dtype(np.uint16), 24: np.dtype(np.uint32)}
RAW_BYTES = {1: 1 / 8, 6: 1, 12: 2, 24: 2}  # stored bytes a raw pixel of the header's width takes (24 bits: two 12-bit images)
QUADS = ("2x2", "2x2G")
HEADER_PEEK = 16  # bytes that hold the magic and the header's size
HDR_LIMIT = 1 << 16  # the most bytes an acquisition header takes


class MerlinError(ValueError):
    """A Merlin header or message that cannot be read."""


@dataclass(frozen=True)
class FrameHeader:
    """What an MQ1 header says of its frame and of every frame after it in the acquisition."""

    data_offset: int  # bytes of the header: the pixels start there
    seq: int  # frame number, from 1
    chips: int
    width: int  # the header's X and Y: the counts' width and height, or the raw readout's
    height: int
    pixel: str  # "U08", "U16", "U32" or "R64"
    layout: str  # "1x1", "2x2", "2x2G", "Nx1", ...
    depth: int | None  # the counter depth, where the header has its MQ1A part

    @property
    def raw(self) -> bool:
        return self.pixel == "R64"

    @property
    def dtype(self) -> np.dtype:
        """The counts' dtype."""
        return RAW[self.depth] if self.raw else COUNTS[self.pixel]

    @property
    def det_shape(self) -> tuple[int, int]:
        """(rows, cols) of the decoded counts."""
        if not self.raw:
            return self.height, self.width
        if self.chips == 4:
            return 2 * CHIP, 2 * CHIP
        return self.height, self.width // 2 if self.depth == 24 else self.width

    @property
    def pixel_bytes(self) -> int:
        """Bytes of one frame's pixels after its header."""
        if self.raw:
            return int(self.width * self.height * RAW_BYTES[self.depth])
        return self.width * self.height * COUNTS[self.pixel].itemsize

    @property
    def frame_bytes(self) -> int:
        return self.data_offset + self.pixel_bytes


def header_size(peek: bytes, where: str) -> int:
    """The size of the MQ1 header starting ``peek`` (its first HEADER_PEEK bytes at least)."""
    if peek[:4] != MAGIC:
        raise MerlinError(f"{where} is not a Merlin MQ1 frame: it starts {peek[:16]!r}")
    try:
        size = int(peek[11:16])
    except ValueError:
        size = 0
    if size < HEADER_PEEK:
        raise MerlinError(f"{where}: the MQ1 header's size field is {peek[11:16]!r}")
    return size


def parse_frame_header(raw: bytes, where: str) -> FrameHeader:
    """The MQ1 header at the start of ``raw`` (at least its ``data_offset`` bytes); MerlinError naming ``where``
    unless it is one this reader decodes."""
    size = header_size(raw, where)
    if len(raw) < size:
        raise MerlinError(f"{where}: the MQ1 header of {size} bytes is cut at {len(raw)}")
    fields = raw[:size].rstrip(b"\0").decode("ascii", "replace").split(",")
    try:
        seq, chips, width, height = int(fields[1]), int(fields[3]), int(fields[4]), int(fields[5])
        pixel, layout = fields[6].strip(), fields[7].strip()
    except (IndexError, ValueError):
        raise MerlinError(f"{where}: a malformed MQ1 header {raw[:80]!r}") from None
    depth = None
    if "MQ1A" in fields:
        try:
            depth = int(fields[fields.index("MQ1A") + 3])
        except (IndexError, ValueError):
            raise MerlinError(f"{where}: the MQ1 header's extended part has no counter depth") from None
    header = FrameHeader(size, seq, chips, width, height, pixel, layout, depth)
    check_decodable(header, where)
    return header


def check_decodable(h: FrameHeader, where: str) -> None:
    """MerlinError unless frames of ``h`` can be decoded here, naming what is not."""
    if h.pixel not in COUNTS and h.pixel != "R64":
        raise MerlinError(f"{where}: Merlin pixel type {h.pixel!r} is not read (readable: {', '.join(COUNTS)}, R64)")
    if min(h.width, h.height) < 1:
        raise MerlinError(f"{where}: the MQ1 header gives a frame of {h.width} x {h.height} pixels")
    if not h.raw:
        return
    if h.depth not in RAW:
        raise MerlinError(f"{where}: a raw (R64) frame needs its counter depth (1, 6, 12 or 24) in the header's MQ1A part,"
                          f" found {h.depth}")
    if h.chips == 1:
        if (h.height, h.width) != (CHIP, CHIP * (2 if h.depth == 24 else 1)):
            raise MerlinError(f"{where}: a raw single-chip frame of {h.width} x {h.height} pixels (expected {CHIP} rows)")
    elif h.chips == 4 and h.layout in QUADS and h.depth != 24:
        if (h.height, h.width) != (CHIP, 4 * CHIP):
            raise MerlinError(f"{where}: a raw quad frame of {h.width} x {h.height} (expected {4 * CHIP} x {CHIP})")
    else:
        raise MerlinError(f"{where}: raw frames of {h.chips} chips in layout {h.layout!r} at {h.depth} bits are not read"
                          " (raw: one chip at 1, 6, 12 or 24 bits, or a 2x2 quad at 1, 6 or 12)")


def parse_hdr(text: bytes | bytearray | str) -> dict[str, str]:
    """The keys and values of an HDR acquisition header (``Key:<tab>Value`` lines between ``HDR,`` and ``End``)."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("latin-1")
    if not text.startswith("HDR,"):
        raise MerlinError(f"not a Merlin acquisition header: it starts {text[:16]!r}")
    fields = {}
    for line in text.splitlines()[1:]:
        if line.strip() == "End":
            break
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def hdr_frames(fields: dict[str, str]) -> int:
    """Frames the acquisition header announces (0: a continuous acquisition, no end)."""
    try:
        return int(fields["Frames in Acquisition (Number)"])
    except (KeyError, ValueError):
        raise MerlinError("the Merlin acquisition header has no 'Frames in Acquisition (Number)'") from None


def hdr_scan_shape(fields: dict[str, str]) -> tuple[int, int] | None:
    """(rows, cols) of the scan: ScanY x ScanX where the header has them, else frames per trigger make a row."""
    if "ScanX" in fields and "ScanY" in fields:
        return int(fields["ScanY"]), int(fields["ScanX"])
    frames, per_trigger = hdr_frames(fields), int(fields.get("Frames per Trigger (Number)", "0") or 0)
    if frames > 0 and per_trigger > 0 and frames % per_trigger == 0:
        return frames // per_trigger, per_trigger
    return None


def mpx_length(prefix: bytes, where: str) -> int:
    """Bytes of the message after an MPX prefix (``MPX,`` + 10 digits + ``,``)."""
    if len(prefix) < MPX_BYTES or prefix[:4] != b"MPX," or prefix[14:15] != b",":
        raise MerlinError(f"{where}: expected an MPX message, got {prefix[:MPX_BYTES]!r}")
    try:
        return int(prefix[4:14]) - 1
    except ValueError:
        raise MerlinError(f"{where}: an MPX message length that is not a number: {prefix[:MPX_BYTES]!r}") from None


def decode(pixels, h: FrameHeader):
    """(n, rows, cols) counts of ``pixels``, the (n, h.pixel_bytes) uint8 pixel bytes of n frames (NumPy or
    CuPy: the result is on the same device)."""
    n = pixels.shape[0]
    if not h.raw:
        return swapped(pixels, h.dtype.itemsize).reshape(n, *h.det_shape)
    words = swapped(pixels, 8).view(np.uint8)  # each 8-byte word's bytes reversed
    if h.depth == 1:
        bits = words[:, :, None] >> module_of(words).arange(8, dtype=np.uint8)
        values = (bits & 1).reshape(n, -1)
    elif h.depth == 6:
        values = words
    elif h.depth == 12:
        values = words.view("<u2")
    else:  # 24: the first 12-bit image holds the high bits
        half = words.view("<u2").reshape(n, 2, -1).astype(np.uint32)
        values = (half[:, 0] << 12) | half[:, 1]
    if h.chips == 1:
        return values.reshape(n, *h.det_shape)
    rows = values.reshape(n, CHIP, 4, CHIP)  # chips 4, 3, 2, 1 along axis 2
    out = module_of(values).empty((n, 2 * CHIP, 2 * CHIP), values.dtype)
    out[:, :CHIP, :CHIP] = rows[:, :, 3]
    out[:, :CHIP, CHIP:] = rows[:, :, 2]
    out[:, CHIP:, :CHIP] = rows[:, ::-1, 1, ::-1]
    out[:, CHIP:, CHIP:] = rows[:, ::-1, 0, ::-1]
    return out


def swapped(pixels, size: int):
    """(n, bytes // size) unsigned integers of ``size`` bytes read big-endian from ``pixels`` (n, bytes) uint8: on
    NumPy one vectorized byte swap straight from the rows (a frame's pixels within its message: no copy of
    them first), on CuPy (native byte order only) a strided copy that reverses each group."""
    native, xp = np.dtype(f"<u{size}"), module_of(pixels)
    if xp is np:
        rows = pixels if pixels.strides[-1] == 1 else np.ascontiguousarray(pixels)
        return rows.view(native.newbyteorder(">")).astype(native)
    return xp.ascontiguousarray(pixels.reshape(pixels.shape[0], -1, size)[:, :, ::-1]).view(native).reshape(pixels.shape[0], -1)
