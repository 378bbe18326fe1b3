"""DECTRIS stream2 messages: one CBOR map (RFC 8949) a ZeroMQ message, its first key ``type`` ("start",
"image", "end"), most often behind CBOR's self-describe tag 55799.

An image's ``data`` maps each channel to a multi-dimensional array (tag 40: [[rows, cols], typed array]);
the typed array (RFC 8746 tags 64-87: element type and byte order) holds the pixels as bytes, or DECTRIS's
compressed bytes (tag 56500: [algorithm, element size, bytes]): "bslz4", bitshuffle-LZ4 in the HDF5
filter's framing (the chunks an Arina file stores), or "lz4", the HDF5 LZ4 filter's framing (a 12-byte
header, big-endian total and block bytes, then per block its big-endian length and an LZ4 block, stored
as it is where the length equals the block's). Decoding needs cbor2 (``pip install 'qgpu-dask[detectors]'``);
the pixels are left as they came, to be decoded where the acquisition lives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bitshuffle_lz4 import HEADER_BYTES, OK, WILD, lz4_block, message

SELF_DESCRIBE = b"\xd9\xd9\xf7"  # tag 55799
MULTI_DIM, COMPRESSED = 40, 56500
TYPED = {64: "u1", 65: ">u2", 66: ">u4", 67: ">u8", 68: "u1", 69: "<u2", 70: "<u4", 71: "<u8",
         72: "i1", 73: ">i2", 74: ">i4", 75: ">i8", 77: "<i2", 78: "<i4", 79: "<i8",
         80: ">f2", 81: ">f4", 82: ">f8", 84: "<f2", 85: "<f4", 86: "<f8"}  # RFC 8746's typed arrays (128-bit floats left out)


@dataclass(frozen=True)
class Compressed:
    """Tag 56500: bytes compressed with ``algorithm`` ("bslz4": ``element`` is the size bitshuffle moved)."""

    algorithm: str
    element: int
    data: bytes


@dataclass(frozen=True)
class Typed:
    dtype: np.dtype
    content: bytes | Compressed


@dataclass(frozen=True)
class MultiDim:
    dims: tuple
    array: Typed | object


def is_cbor(part: bytes) -> bool:
    """Whether a message is stream2's (CBOR: the self-describe tag, or a map) rather than version 1's JSON."""
    return part[:3] == SELF_DESCRIBE or (len(part) > 0 and part[0] >> 5 == 5)


def decoded(part: bytes, where: str) -> dict:
    """The message's map, its arrays as MultiDim / Typed / Compressed; ValueError for one that is not a
    stream2 message."""
    try:
        import cbor2
    except ImportError:
        raise ValueError("reading a DECTRIS stream2 (CBOR) needs cbor2 on the worker: pip install 'qgpu-dask[detectors]'") from None
    try:
        value = cbor2.loads(part, tag_hook=tagged)
    except (cbor2.CBORDecodeError, ValueError) as err:
        raise ValueError(f"{where}: a message that is not CBOR ({err}; it starts {part[:16]!r})") from None
    if not isinstance(value, dict) or "type" not in value:
        raise ValueError(f"{where}: a CBOR message without a 'type' (it starts {part[:16]!r})")
    return value


def tagged(decoder, tag):
    """cbor2's hook for the tags stream2 uses (ValueError for one holding what stream2 never sends); others are
    left as cbor2's CBORTag."""
    value = tag.value
    if tag.tag == COMPRESSED:
        if not (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str) and type(value[1]) is int
                and isinstance(value[2], bytes)):
            raise ValueError(f"tag {COMPRESSED} holds {value!r:.80}, not [algorithm, element size, bytes]")
        return Compressed(value[0], value[1], value[2])
    if tag.tag in TYPED:
        if not isinstance(value, (bytes, Compressed)):
            raise ValueError(f"tag {tag.tag} (a typed array) holds {value!r:.80}, not bytes or a compressed array")
        return Typed(np.dtype(TYPED[tag.tag]), value)
    if tag.tag == MULTI_DIM:
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list) and all(type(d) is int for d in value[0])):
            raise ValueError(f"tag {MULTI_DIM} holds {value!r:.80}, not [dimensions, array]")
        return MultiDim(tuple(value[0]), value[1])
    return tag


def lz4_frame(data: bytes, nbytes: int, out: np.ndarray) -> str | None:
    """Decode "lz4" bytes (the HDF5 LZ4 filter's framing) of ``nbytes`` into ``out`` (``nbytes`` + WILD uint8);
    what is wrong with them, or None."""
    src = np.frombuffer(data, np.uint8)
    if src.size < HEADER_BYTES:
        return f"{src.size} bytes, less than the 12-byte header"
    total, block = int.from_bytes(data[:8], "big"), int.from_bytes(data[8:12], "big")
    if total != nbytes or (block == 0 and total):
        return f"a header of {total} bytes in blocks of {block}, the frame is {nbytes} bytes"
    at, done = HEADER_BYTES, 0
    while done < total:
        size = min(block, total - done)
        if at + 4 > src.size:
            return f"it ends at byte {at}, before the block of bytes {done}.."
        length = int.from_bytes(data[at : at + 4], "big")
        at += 4
        if at + length > src.size:
            return f"a block of {length} bytes at byte {at}, past its end"
        if length == size:
            out[done : done + size] = src[at : at + size]
        else:
            code, a, b, c = lz4_block(src[at : at + length], out[done : done + size + WILD], size)
            if code != OK:
                return message(code, done // block, a, b, c)
        at += length
        done += size
    return None if at == src.size else f"{src.size - at} bytes after its blocks"
