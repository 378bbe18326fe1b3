"""Merlin .mib / .hdr files for tests, written here from the format's description (formats/merlin.py's
docstring): MQ1 headers as Merlin software 1.x writes them, counts big-endian, raw (R64) frames packed and
word-reversed, raw quads in the chips' readout order. LiberTEM's own reader checks these files in
test_merlin.py, so they are not only read back by the code that they test."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHIP = 256


def frame_header(seq: int, shape: tuple[int, int], pixel: str, depth: int, chips: int = 1, layout: str = "1x1") -> bytes:
    """The MQ1 header of frame ``seq`` (from 1): 384 bytes for one chip, 768 for four, NUL-padded."""
    size = 384 if chips == 1 else 768
    dacs = ",".join(["3RX"] + ["000"] * 27)
    fields = ["MQ1", f"{seq:06d}", f"{size:05d}", f"{chips:02d}", f"{shape[1]:04d}", f"{shape[0]:04d}", pixel, f"{layout:>6}",
              "01" if chips == 1 else "0F", "2026-12-03 12:00:00.000000", "0.001000", "0", "0", "0",
              *["1.200000E+2"] + ["0.000000E+0"] * 7, *[dacs] * chips, "MQ1A", "2026-12-03T12:00:00.000000000Z", "1000000ns", str(depth), ""]
    text = ",".join(fields).encode()
    assert len(text) <= size
    return text + bytes(size - len(text))


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


def hdr_text(frames: int, per_trigger: int, depth: int, chips: int = 1, scan: tuple[int, int] | None = None) -> bytes:
    lines = ["HDR,\t", "Time and Date Stamp (day, mnth, yr, hr, min, s):\t03/12/2026 12:00:00", "Chip ID:\tW529_F5,-,-,-",
             "Chip Type (Medipix 3.0, Medipix 3.1, Medipix 3RX):\tMedipix 3RX",
             f"Assembly Size (NX1, 2X2):\t{'   1x1' if chips == 1 else '   2x2'}", "Chip Mode  (SPM, CSM, CM, CSCM):\tSPM",
             f"Counter Depth (number):\t{depth}", "Gain:\tSLGM", "Active Counters:\tAlternating",
             "Acquisition Type (Normal, Th_scan, Config):\tNormal", f"Frames in Acquisition (Number):\t{frames}",
             f"Frames per Trigger (Number):\t{per_trigger}", "Trigger Start (Positive, Negative, Internal):\tRising Edge LVDS",
             "Readout System:\tMerlin Quad", "Software Version:\t1.6.0"]
    if scan is not None:
        lines += [f"ScanX:\t{scan[1]}", f"ScanY:\t{scan[0]}"]
    return ("\n".join(lines + ["End\t"])).encode("latin-1")


def write_mib(folder: Path, stem: str, counts: np.ndarray, pixel: str = "U16", depth: int = 12, chips: int = 1,
              layout: str = "1x1", files: int = 1, scan_in_header: bool = True) -> Path:
    """``counts`` (rows, cols, det_rows, det_cols) as ``stem.hdr`` and ``stem1.mib`` .. ``stem{files}.mib`` in
    ``folder`` (frames split evenly, in scan order); returns the .hdr path."""
    rows, cols = counts.shape[:2]
    frames = counts.reshape(rows * cols, *counts.shape[2:])
    pixels, (height, width) = encoded(frames, pixel, depth, chips)
    per_file = -(-len(frames) // files)
    for k in range(files):
        with open(folder / f"{stem}{k + 1}.mib", "wb") as f:
            for i in range(k * per_file, min((k + 1) * per_file, len(frames))):
                f.write(frame_header(i + 1, (height, width), pixel, depth, chips, layout))
                f.write(pixels[i].tobytes())
    hdr = folder / f"{stem}.hdr"
    hdr.write_bytes(hdr_text(len(frames), cols, depth, chips, (rows, cols) if scan_in_header else None))
    return hdr
