"""Quantum Detectors Merlin .mib files (and the .hdr beside them): MQ1 frames, memory-mapped and decoded a
block at a time (``formats.merlin``: counts of every depth, raw one-chip and quad readouts).

Given a .hdr, its acquisition is every ``<stem>*.mib`` beside it, ordered by their first frame's number (Merlin
splits long acquisitions into several files); given a .mib, that file alone. The scan shape is ``scan_shape``
where given, else the header's ScanY x ScanX, else its frames per trigger as a scan row.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Iterator

import numpy as np

from ...formats import merlin
from ..source import Source
from .base import BLOCK_BYTES, Format, as_4d, frame_blocks


def is_merlin(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is a file starting with an MQ1 frame header (a .mib) or an HDR acquisition header that
    announces its frames (a .hdr)."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        start = f.read(merlin.HDR_LIMIT)
    try:
        if start[:4] == merlin.MAGIC:
            return merlin.header_size(start, str(path)) > 0
        return start[:4] == merlin.HDR_MAGIC and merlin.hdr_frames(merlin.parse_hdr(start)) >= 0
    except merlin.MerlinError:
        return False


def companion_header(mib: Path) -> Path | None:
    """The .hdr written beside a .mib: ``<stem>.hdr``, or with the file number at the stem's end (and a ``_``
    before it) taken off."""
    for stem in (mib.stem, re.sub(r"\d+$", "", mib.stem), re.sub(r"_\d+$", "", mib.stem)):
        hdr = mib.with_name(f"{stem}.hdr")
        if hdr.is_file():
            return hdr
    return None


class MerlinFile:
    """One .mib file: its first header and its frames as (n, frame_bytes) uint8, memory-mapped."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            peek = f.read(merlin.HEADER_PEEK)
            size = merlin.header_size(peek, repr(str(path)))
            self.header = merlin.parse_frame_header(peek + f.read(size - len(peek)), repr(str(path)))
        self.path = path
        self.count, self.cut = divmod(path.stat().st_size, self.header.frame_bytes)
        self.data = np.memmap(path, np.uint8, "r", shape=(self.count, self.header.frame_bytes)) if self.count else None


class MerlinReader:
    """A Merlin acquisition of one or more .mib files."""

    kind = "merlin mib"
    compression = "none"

    def __init__(self, path: Path, scan_shape: tuple[int, int] | None):
        with open(path, "rb") as f:
            hdr = path if f.read(4) == merlin.HDR_MAGIC else companion_header(path)
        fields = merlin.parse_hdr(hdr.read_bytes()) if hdr is not None else {}
        if path == hdr:
            names = sorted(path.parent.glob(f"{glob.escape(path.stem)}*.mib"))
            if not names:
                raise ValueError(f"{str(path)!r} is a Merlin header, but no {path.stem}*.mib files are beside it")
            files = sorted((MerlinFile(p) for p in names), key=lambda f: f.header.seq)
        else:
            files = [MerlinFile(path)]
        first = files[0].header
        for f in files[1:]:
            if f.header.frame_bytes != first.frame_bytes or f.header.det_shape != first.det_shape or f.header.dtype != first.dtype:
                raise ValueError(f"{str(f.path)!r} holds {f.header.det_shape} {f.header.dtype} frames, {str(files[0].path)!r} "
                                 f"{first.det_shape} {first.dtype}: one acquisition's files must agree")
        self.files, self.header = files, first
        self.dtype = first.dtype
        found = sum(f.count for f in files)
        scan = scan_shape or (merlin.hdr_scan_shape(fields) if fields else None)
        where = f"the Merlin acquisition {str(path)!r}"
        self.shape = as_4d((found, *first.det_shape) if scan is None else (scan[0] * scan[1], *first.det_shape), scan, where)
        needed = self.shape[0] * self.shape[1]
        if needed > found:
            cut = next((f for f in files if f.cut), None)
            tail = f"; {str(cut.path)!r} ends {cut.cut} bytes into frame {cut.count + 1} of {cut.header.frame_bytes} bytes" if cut else ""
            raise ValueError(f"{where} holds {found} whole frames, the scan {self.shape[:2]} needs {needed}{tail}")
        self.starts = np.cumsum([0] + [f.count for f in files])

    def frames(self, start: int, n: int) -> np.ndarray:
        """Frames start .. start + n, decoded (their headers checked)."""
        parts, at = [], start
        while at < start + n:
            k = int(np.searchsorted(self.starts, at, side="right")) - 1
            f = self.files[k]
            stop = min(start + n, int(self.starts[k + 1]))
            raw = f.data[at - self.starts[k] : stop - self.starts[k]]
            bad = np.flatnonzero((raw[:, :4] != np.frombuffer(merlin.MAGIC, np.uint8)).any(axis=1))
            if bad.size:
                frame = at - int(self.starts[k]) + int(bad[0])
                raise ValueError(f"{str(f.path)!r}: frame {frame} of the file (scan position {at + int(bad[0])}) has no MQ1 header:"
                                 " the file is damaged, or its frames are not all the same size")
            parts.append(merlin.decode(raw[:, f.header.data_offset :], f.header))
            at = stop
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        return frame_blocks(self.frames, self.shape, self.dtype, block_bytes)

    def close(self) -> None:
        self.files = []


def open_merlin(path: Path, source: Source) -> MerlinReader:
    return MerlinReader(path, source.scan_shape)


FORMAT = Format("merlin", is_merlin, open_merlin, "a Merlin .mib or .hdr file")
