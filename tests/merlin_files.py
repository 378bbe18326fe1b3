"""Merlin .mib / .hdr files of every pixel encoding for tests, encoded here from the format's description
(formats/merlin.py's docstring): counts big-endian, raw (R64) frames packed and word-reversed, raw quads in
the chips' readout order; the headers and files are the samples' (``qd.samples.write_merlin``). LiberTEM's own
reader checks these files in test_merlin.py, so they are not only read back by the code that they test."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qgpu_dask.samples import write_merlin

CHIP = 256


def raw_words(data: np.ndarray) -> np.ndarray:
    """(n, bytes) with each 8-byte word reversed (the raw readout's order)."""
    n = data.shape[0]
    return np.ascontiguousarray(data.reshape(n, -1, 8)[:, :, ::-1]).reshape(n, -1)


def raw_values(values: np.ndarray, depth: int) -> np.ndarray:
    """(n, bytes) of raw readout pixel values (n, pixels) in readout order at ``depth`` bits."""
    n = values.shape[0]
    if depth == 1:
        return raw_words(np.packbits(values.astype(np.uint8), axis=1, bitorder="little"))
    if depth == 6:
        return raw_words(values.astype(np.uint8))
    if depth == 12:
        return raw_words(values.astype("<u2").view(np.uint8).reshape(n, -1))
    high, low = (values.astype(np.uint32) >> 12) & 0xFFF, values.astype(np.uint32) & 0xFFF
    return np.concatenate([raw_values(high, 12), raw_values(low, 12)], axis=1)


def encoded(counts: np.ndarray, pixel: str, depth: int, chips: int) -> tuple[np.ndarray, tuple[int, int]]:
    """(n, pixel bytes) of frames ``counts`` (n, rows, cols), and the (height, width) their headers give."""
    n, rows, cols = counts.shape
    if pixel != "R64":
        dtype = {"U08": ">u1", "U16": ">u2", "U32": ">u4"}[pixel]
        return counts.astype(dtype).view(np.uint8).reshape(n, -1), (rows, cols)
    if chips == 1:
        return raw_values(counts.reshape(n, -1), depth), (CHIP, CHIP * (2 if depth == 24 else 1))
    readout = np.empty((n, CHIP, 4, CHIP), counts.dtype)  # chips 4, 3, 2, 1
    readout[:, :, 3] = counts[:, :CHIP, :CHIP]
    readout[:, :, 2] = counts[:, :CHIP, CHIP:]
    readout[:, :, 1] = counts[:, CHIP:, :CHIP][:, ::-1, ::-1]
    readout[:, :, 0] = counts[:, CHIP:, CHIP:][:, ::-1, ::-1]
    return raw_values(readout.reshape(n, -1), depth), (CHIP, 4 * CHIP)


def write_mib(folder: Path, stem: str, counts: np.ndarray, pixel: str = "U16", depth: int = 12, chips: int = 1,
              layout: str = "1x1", files: int = 1, scan_in_header: bool = True) -> Path:
    """``counts`` (rows, cols, det_rows, det_cols) encoded as ``pixel`` at ``depth`` bits, written as ``stem.hdr``
    and ``stem_1.mib`` .. ``stem_{files}.mib`` in ``folder``; returns the .hdr path."""
    rows, cols = counts.shape[:2]
    pixels, shape = encoded(counts.reshape(rows * cols, *counts.shape[2:]), pixel, depth, chips)
    return write_merlin(folder, stem, pixels, shape, (rows, cols), pixel, depth, chips, layout, files, scan_in_header)
