"""An ASI Timepix3 server's sparse-frame stream (TCP, 8283 by default): frames as CSR matrices, one row a frame.

The stream is a run of 32-byte headers, little-endian, the first byte saying which: an acquisition start
(format: CSR, or CSR of time over threshold; the scan and detector shapes; the widths of the row pointers
and column indices), a scan start (then as many bytes of JSON metadata as it says), array chunks (the
values' width, frames, non-zeros, and where indices and values start in the payload that follows: row
pointers from 0, indices, values, padding allowed between them), a scan end and an acquisition end.
Acquisition after acquisition may follow on one connection; each scan is one acquisition here (as
LiberTEM-live reads it), of the frames its acquisition start's scan shape gives.

The receiver reads whole chunks on a thread of its own, checks their row pointers end at the non-zeros
and hands them on in pieces of at most ``frames_per_read`` frames as ``SparseFrames``, whose pixels and
counts are checked as they are held: a sparse acquisition holds them as they are, a dense or compressed one
makes them dense on its device (a scatter of the non-zeros).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator

import numpy as np

from ..batches import AHEAD, prefetched
from ...resident.sparse import SparseFrames
from ..stream import SeriesSource, check_reading, read_exactly

PORT = 8283
HEADER_BYTES = 32
ACQUISITION_START, SCAN_START, ARRAY_CHUNK, SCAN_END, ACQUISITION_END = range(5)
HEADERS = ("acquisition start", "scan start", "array chunk", "scan end", "acquisition end")
DTYPES = {2: np.dtype("<u1"), 3: np.dtype("<u2"), 4: np.dtype("<u4"), 5: np.dtype("<u8")}  # the wire's codes (0, 1: packed bits, not sent)
FORMATS = {0: "CSR", 1: "CSR of time over threshold"}
METADATA_LIMIT = 1 << 24  # bytes of scan metadata read at most


@dataclass(frozen=True)
class AcquisitionStart:
    """What an acquisition start says of the scans after it."""

    scan_shape: tuple[int, int]
    det_shape: tuple[int, int]
    indptr: np.dtype
    indices: np.dtype


@dataclass(frozen=True)
class TimepixSource(SeriesSource):
    """An ASI Timepix3 server's sparse-frame stream at ``host``:``port``, handed on ``frames_per_read`` frames at a
    time at most (a few bytes a frame, so many a piece: a dense or compressed acquisition makes them dense 256
    at a time)."""

    host: str
    port: int = PORT
    frames_per_read: int = 65536
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        check_reading(self)

    def describe(self) -> str:
        return f"tcp://{self.host}:{self.port} (ASI Timepix3)"

    def series(self, det_shape: tuple[int, int], dtype, counts: list[int | None], xp: ModuleType = np) -> Iterator[tuple[int, object]]:
        """(k, frames) of ``len(counts)`` consecutive scans on one connection, the k-th of ``counts[k]`` frames
        (None: as its acquisition start says), ``SparseFrames`` read ahead in a thread of their own (``xp``:
        any, they stay on the host; ``dtype``: the acquisition's, their counts checked against it as they
        are held); ValueError naming the scan and frame if nothing listens, a header is unknown or out of
        order, the frames are not ``det_shape``, a scan has another frame count or ends short, a chunk is
        malformed, or the stream closes or goes quiet inside a scan (the frames before it handed on first)."""
        yield from prefetched(self.pieces(tuple(det_shape), list(counts)), AHEAD)

    def pieces(self, det_shape: tuple[int, int], counts: list[int | None]) -> Iterator[tuple[int, SparseFrames]]:
        """(k, SparseFrames) of at most ``frames_per_read`` frames of scan k, checked."""
        try:
            conn = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as err:
            raise ValueError(f"no Timepix3 stream at {self.describe()}: {err}") from None
        with conn:
            start = None
            for k, count in enumerate(counts):
                where = self.where(k, len(counts))
                start = self.scan_start(conn, start, where)
                if start.det_shape != det_shape:
                    raise ValueError(f"{where} sends frames of {start.det_shape}, the acquisition holds {det_shape}")
                total = start.scan_shape[0] * start.scan_shape[1]
                if count is not None and total != count:
                    raise ValueError(f"{where}: its scan of {start.scan_shape} is {total} frames, the acquisition holds {count}")
                for piece in self.scan(conn, start, total, where):
                    yield k, piece

    def scan_start(self, conn: socket.socket, start: AcquisitionStart | None, where: str) -> AcquisitionStart:
        """Read up to the next scan start (an acquisition start before it gives the scan's shapes and widths; an
        acquisition's end is passed over) and its metadata; the acquisition start the scan belongs to."""
        while True:
            tag, header = self.header(conn, where, 0)
            if tag == ACQUISITION_START:
                start = acquisition_start(header, where)
            elif tag == ACQUISITION_END and start is not None:
                continue
            elif tag == SCAN_START and start is not None:
                metadata = int(np.frombuffer(header, "<u8", 1, 5)[0])
                if metadata > METADATA_LIMIT:
                    raise ValueError(f"{where}: a scan start announces {metadata} bytes of metadata (at most {METADATA_LIMIT})")
                read_exactly(conn, metadata, self.timeout_s, where, 0)
                return start
            else:
                raise ValueError(f"{where}: expected {'a scan start' if start else 'an acquisition start'}, got "
                                 f"{HEADERS[tag] if tag < len(HEADERS) else f'a header of unknown type {tag}'}")

    def scan(self, conn: socket.socket, start: AcquisitionStart, total: int, where: str) -> Iterator[SparseFrames]:
        """The scan's chunks, checked and cut into pieces, until its end (which must come after ``total`` frames)."""
        sent = 0
        while True:
            tag, header = self.header(conn, where, sent)
            if tag == SCAN_END or tag == ACQUISITION_END:
                if sent != total:
                    raise ValueError(f"{where}: the scan ended ({HEADERS[tag]}) after {sent} of its {total} frames")
                return
            if tag != ARRAY_CHUNK:
                raise ValueError(f"{where}: frame {sent} came as {HEADERS[tag] if tag < len(HEADERS) else f'a header of unknown type {tag}'}"
                                 ", not an array chunk")
            values_dtype, n, nnz, at_indices, at_values = chunk_header(header, where, sent)
            if sent + n > total:
                raise ValueError(f"{where}: a chunk of frames {sent} to {sent + n - 1} goes past the scan's {total} frames")
            indptr_end = (n + 1) * start.indptr.itemsize
            indices_end = at_indices + nnz * start.indices.itemsize
            if at_indices < indptr_end or at_values < indices_end:
                raise ValueError(f"{where}: the chunk of frame {sent} puts its indices at byte {at_indices} and values at"
                                 f" {at_values}, inside the parts before them")
            payload = read_exactly(conn, at_values + nnz * values_dtype.itemsize, self.timeout_s, where, sent)
            indptr = np.frombuffer(payload, start.indptr, n + 1)
            indices = np.frombuffer(payload, start.indices, nnz, at_indices)
            values = np.frombuffer(payload, values_dtype, nnz, at_values)
            check_chunk(indptr, nnz, sent, where)
            yield from SparseFrames(indptr, indices, values).pieces(self.frames_per_read)
            sent += n

    def header(self, conn: socket.socket, where: str, frame: int) -> tuple[int, bytearray]:
        header = read_exactly(conn, HEADER_BYTES, self.timeout_s, where, frame)
        return header[0], header


def acquisition_start(header: bytes, where: str) -> AcquisitionStart:
    """What an acquisition start header says; ValueError for a format or width not read."""
    fmt, indptr, indices = header[2], header[7], header[12]
    if fmt not in FORMATS:
        raise ValueError(f"{where}: an acquisition of format {fmt} (readable: {', '.join(f'{k} {v}' for k, v in FORMATS.items())})")
    for what, code in (("row pointers", indptr), ("indices", indices)):
        if code not in DTYPES:
            raise ValueError(f"{where}: {what} of type code {code} (readable: {sorted(DTYPES)}: unsigned 8 to 64 bits)")
    scan = tuple(int(v) for v in np.frombuffer(header, "<u2", 2, 3))
    det = tuple(int(v) for v in np.frombuffer(header, "<u2", 2, 8))
    return AcquisitionStart(scan, det, DTYPES[indptr], DTYPES[indices])


def chunk_header(header: bytes, where: str, frame: int) -> tuple[np.dtype, int, int, int, int]:
    """(values' dtype, frames, non-zeros, indices' byte offset, values' byte offset) of an array chunk."""
    if header[1] not in DTYPES:
        raise ValueError(f"{where}: the chunk of frame {frame} has values of type code {header[1]} (readable: {sorted(DTYPES)})")
    n, nnz, at_indices, at_values = (int(v) for v in np.frombuffer(header, "<u4", 4, 2))
    if n == 0:
        raise ValueError(f"{where}: a chunk of no frames at frame {frame}")
    return DTYPES[header[1]], n, nnz, at_indices, at_values


def check_chunk(indptr: np.ndarray, nnz: int, first: int, where: str) -> None:
    """ValueError naming the first frame of a chunk whose row pointers do not start at 0 and end at its non-zeros
    (that they rise, and the pixels and counts, are checked as the pieces are held: ``SparseFrames.on``)."""
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise ValueError(f"{where}: the chunk's row pointers do not run from 0 to its {nnz} non-zeros (frame {first})")
