"""DigitalMicrograph DM3/DM4 files written by the published tag-file layout, for tests (no library writes
them): a tag tree of groups and data tags, big-endian structure words (4 bytes in DM3, 8 in DM4, where each
tag also says its size), little-endian payloads, one image under ImageList."""

from __future__ import annotations

import struct

import numpy as np

IMAGE_TYPES = {np.dtype(k): v for k, v in {"int16": 1, "float32": 2, "uint8": 6, "int32": 7, "int8": 9, "uint16": 10, "uint32": 11,
                                          "float64": 12}.items()}  # an image's DataType
ELEMENT_TYPES = {np.dtype(k): v for k, v in {"int16": 2, "int32": 3, "uint16": 4, "uint32": 5, "float32": 6, "float64": 7, "int8": 9,
                                            "uint8": 10}.items()}  # a tag array's element type


def word(value: int, version: int) -> bytes:
    return struct.pack(">Q" if version == 4 else ">I", value)


def data_tag(value, version: int) -> bytes:
    """``%%%%``, the type words and the payload of a data tag holding ``value``."""
    if isinstance(value, np.ndarray):
        info, payload = [20, ELEMENT_TYPES[value.dtype.newbyteorder("=")], value.size], value.astype(value.dtype.newbyteorder("<")).tobytes()
    elif isinstance(value, str):  # text as an array of UTF-16 code units, as GMS keeps it
        units = np.frombuffer(value.encode("utf-16-le"), "<u2")
        info, payload = [20, 4, units.size], units.tobytes()
    elif isinstance(value, bool):
        info, payload = [8], struct.pack("<B", value)
    elif isinstance(value, int):
        info, payload = [5], struct.pack("<I", value)
    else:
        info, payload = [6], struct.pack("<f", value)
    return b"%%%%" + word(len(info), version) + b"".join(word(i, version) for i in info) + payload


def group(entries: list[tuple[str, object]], version: int) -> bytes:
    """A tag group of (label, value) entries: a value that is a list is a group."""
    out = b"\x01\x00" + word(len(entries), version)
    for label, value in entries:
        body = group(value, version) if isinstance(value, list) else data_tag(value, version)
        out += struct.pack(">BH", 20 if isinstance(value, list) else 21, len(label)) + label.encode("latin-1")
        out += (struct.pack(">Q", len(body)) if version == 4 else b"") + body
    return out


def write_dm(path, data: np.ndarray, version: int = 4, swapped: bool = True, thumbnail: bool = True):
    """``data`` (C order) as the image of a DM file, after a 2-D thumbnail where asked; ``swapped``: tag the
    image's order as C (``Data Order Swapped``)."""
    def image(array: np.ndarray, meta: list, code: int | None = None) -> list:
        dims = [("", int(d)) for d in array.shape[::-1]]  # fastest first
        calibration = [("", [("Origin", 0.0), ("Scale", 1.0), ("Units", "")]) for _ in dims]
        return [("ImageData", [("Calibrations", [("Brightness", [("Origin", 0.0), ("Scale", 1.0), ("Units", "")]), ("Dimension", calibration)]),
                               ("Data", array), ("DataType", code or IMAGE_TYPES[array.dtype]), ("Dimensions", dims),
                               ("PixelDepth", array.dtype.itemsize)]),
                ("ImageTags", [("Meta Data", meta)]), ("Name", "test")]

    meta = [("Format", "Diffraction image")] + ([("Data Order Swapped", True)] if swapped else [])
    rgba = 23  # a thumbnail's DataType: 8-bit RGBA, a uint32 a pixel
    images = ([("", image(np.zeros((8, 8), np.uint32), [], rgba))] if thumbnail else []) + [("", image(data, meta))]
    thumbnails = [("Thumbnails", [("", [("ImageIndex", 0)])])] if thumbnail else []  # how a reader knows image 0 for one
    body = group([("ImageList", images)] + thumbnails, version)
    with open(path, "wb") as f:
        f.write(struct.pack(">I", version) + word(len(body) + 8, version) + struct.pack(">I", 1) + body + bytes(8))
    return path
