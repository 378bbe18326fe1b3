"""The viewer's messages, the same in a notebook (anywidget custom messages) and a web page (a WebSocket).

The browser asks with JSON objects; the viewer answers with a JSON header and binary buffers (images and
patterns as little-endian typed arrays, never counts). Over a WebSocket one answer is one binary frame:
``uint32 LE header length | header (UTF-8 JSON, space-padded to a multiple of 8 bytes) | buffers``, the
header's ``"buffers"`` giving each buffer's byte length (each starts 8-byte aligned; the lengths are
multiples of 8, padded). Through anywidget the header is the message and the buffers are its buffers.

Asks (``seq`` a number the page increases; an answer carries the seq of the ask it answers):

- ``{"type": "hello"}``: a ``state`` answer, then an ``image`` and a ``pattern``.
- ``{"type": "detector", "seq", "detector": {...}}``: the virtual image of that detector (``image``).
- ``{"type": "mode", "seq", "mode": "detector" | "com_row" | "com_col" | "dpc" | "ssb"}``: what the left
  image shows (the last three need Optics): an ``image``.
- ``{"type": "index", "seq", "index": i}``: show acquisition i of the series: ``state``, ``image``, ``pattern``.
- ``{"type": "cursor", "seq", "row", "col"}``: the pattern at that scan position (``pattern``).
- ``{"type": "region", "seq", "rect": [top, left, bottom, right], "op": "sum" | "mean" | "max"}``: the
  reduction over scan rows top..bottom-1 and columns left..right-1 (``pattern``).
- ``{"type": "grid", "seq", "detector"?}``: every acquisition's image of the detector (given: it becomes the
  current one; else the current one), binned to at most GRID_SIDE pixels a side by exact sums (``grid``;
  32-bit integers where every sum fits).
- ``{"type": "phase", "seq", "method"?, "upsampling"?, "strength"?, "c10_A"?, "c12_A"?, "phi12_deg"?,
  "spectrum"?, "go_on"?}``: the phase panel's controls given change (``phase.py``); the phase image with them
  (``phase``). Where a CPU owner would take more than a few seconds the answer is an ``error`` with
  ``"seconds"`` (the expected time) until an ask with ``"go_on": true``.
- ``{"type": "fit", "seq"}``: fit the aberrations and rotation on the acquisition shown (``progress``, then
  ``state`` with the sliders at the fit, then ``phase``). ``{"type": "reset", "seq"}``: the sliders back
  to the fit (``state``, ``phase``).
- ``{"type": "phase_grid", "seq"}``: every acquisition's phase image with the sliders now, block-averaged to
  at most GRID_SIDE pixels a side (``grid`` with ``"of": "phase"``).

Answers: ``state`` (no buffers), ``image`` / ``pattern`` / ``grid`` (one buffer, with ``dtype`` and
``shape``; ``image`` also ``detector``, ``mode``, ``index``, ``min``, ``max``; ``pattern`` its ``source``),
``phase`` (one float32 buffer (layers, rows, cols), ``layers`` naming each: "phase", "amplitude" for direct
complex, "spectrum" where asked; ``ranges`` their [min, max]; ``pixel_A``, ``upsampling``, the ``steering``
and ``index`` it was made with), ``progress`` (``what`` is being computed, no buffers) and ``error``
(``seq``, ``message``, the ask's ``ask`` type): the page shows it and stays usable.

A detector is ``{"kind": "disk", "center": [row, col], "radius"}``, ``{"kind": "annulus", "center",
"inner", "outer"}``, ``{"kind": "sector", "center", "inner", "outer", "start_deg", "stop_deg"}``,
``{"kind": "rectangle", "top", "left", "bottom", "right"}`` (pixel centres inside, bottom and right
excluded) or ``{"kind": "polygon", "vertices": [[row, col], ...]}`` (at least 3).
"""

from __future__ import annotations

import json
import struct

import numpy as np

ASKS = ("hello", "detector", "mode", "index", "cursor", "region", "grid", "phase", "fit", "reset", "phase_grid")
MODES = ("detector", "com_row", "com_col", "dpc", "ssb")
OPS = ("sum", "mean", "max")
GRID_SIDE = 128  # pixels a side of a grid tile at most (an image binned by exact sums to fit)
WIRE_TYPES = {  # dtypes that cross to the browser, as JavaScript typed arrays read them
    "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
    "int16": np.int16, "int32": np.int32, "int64": np.int64, "float32": np.float32, "float64": np.float64,
}


def array_answer(kind: str, seq: int | None, array: np.ndarray, **fields) -> tuple[dict, list[memoryview]]:
    """An answer carrying one array: its header (dtype, shape) and its little-endian bytes (a view, no copy)."""
    array = np.ascontiguousarray(array)
    name = array.dtype.name
    if name not in WIRE_TYPES:
        raise TypeError(f"the viewer sends {sorted(WIRE_TYPES)}, not {name}")
    data = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"), copy=False))
    return {"type": kind, "seq": seq, "dtype": name, "shape": list(array.shape), **fields}, [memoryview(data).cast("B")]


def frame(header: dict, buffers: list) -> bytes:
    """One WebSocket binary frame of an answer (see the module's text for the layout), the buffers copied once
    into it (a phase answer is tens of MB)."""
    views = [memoryview(b).cast("B") for b in buffers]
    pads = [b"\0" * (-len(v) % 8) for v in views]
    text = json.dumps({**header, "buffers": [len(v) + len(pad) for v, pad in zip(views, pads)]}).encode()
    text += b" " * (-(4 + len(text)) % 8)
    return b"".join([struct.pack("<I", len(text)), text, *(part for pair in zip(views, pads) for part in pair)])


def unframe(data: bytes) -> tuple[dict, list[np.ndarray]]:
    """An answer read back from a frame (tests and Python clients): the header and its arrays."""
    (length,) = struct.unpack_from("<I", data)
    header = json.loads(data[4 : 4 + length])
    arrays, at = [], 4 + length
    whole = memoryview(data)
    for size in header["buffers"]:
        chunk = whole[at : at + size]  # the arrays are views of the frame
        at += size
        if "dtype" in header:
            dtype = np.dtype(WIRE_TYPES[header["dtype"]]).newbyteorder("<")
            n = int(np.prod(header["shape"]))
            arrays.append(np.frombuffer(chunk, dtype, n).reshape(header["shape"]))
    return header, arrays


def ask_of(message) -> dict:
    """A browser's ask checked for its type (ValueError naming what is wrong); its fields are checked where used."""
    if isinstance(message, (str, bytes)):
        try:
            message = json.loads(message)
        except json.JSONDecodeError as err:
            raise ValueError(f"a viewer ask is a JSON object: {err}") from None
    if not isinstance(message, dict) or message.get("type") not in ASKS:
        raise ValueError(f"a viewer ask is a JSON object whose type is one of {', '.join(ASKS)}, got {str(message)[:80]!r}")
    return message
