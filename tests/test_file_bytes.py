"""A file's byte ranges read in pieces side by side: plainly where the page cache holds them, direct from the
drive where it does not (when asked for), plainly otherwise; every byte the file's."""

from __future__ import annotations

import os
from pathlib import Path

import dask.config
import numpy as np
import pytest

from conftest import evicted
from qgpu_dask.io.readers import file_bytes
from qgpu_dask.io.readers.file_bytes import ALIGN, FileBytes

RANGES = [(0, 1), (1, 3 * ALIGN), (ALIGN - 5, 10), (777, 5 * ALIGN + 123), (3 * ALIGN, 2 * ALIGN), (0, 9 * ALIGN + 17)]


def written(path: Path, rng, nbytes: int = 9 * ALIGN + 17) -> bytes:
    """A file of ``nbytes`` random bytes, on the disk (so its pages can leave the cache)."""
    content = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    return content


def test_ranges_come_from_the_cache_or_the_drive_byte_for_byte(rng, tmp_path, monkeypatch):
    """With direct reads asked for: cached pages plainly, evicted ones direct (memory off its pages too)."""
    monkeypatch.setitem(dask.config.config["qgpu"], "direct-reads", True)
    monkeypatch.setattr(file_bytes, "READ_PIECE", 2 * ALIGN)  # several pieces a range, read side by side
    path = tmp_path / "bytes.bin"
    content = written(path, rng)
    reader = FileBytes(str(path))
    try:
        for position, nbytes in RANGES:  # cached (just written): plain reads only
            data, got = reader.read(position, nbytes)
            assert got == nbytes and data.tobytes() == content[position : position + nbytes]
        assert reader.direct_bytes == 0
        if not reader.direct:
            pytest.skip(f"the filesystem of {tmp_path} refuses direct I/O: the plain reads are checked above")
        for position, nbytes in RANGES:
            if not evicted(path):
                pytest.skip("the page cache kept the file's pages after POSIX_FADV_DONTNEED")
            data, got = reader.read(position, nbytes, lambda n: np.zeros(n + 1, np.uint8)[1:])  # memory off its pages
            assert got == nbytes and data.tobytes() == content[position : position + nbytes]
        assert reader.direct_bytes > 0
    finally:
        reader.close()


@pytest.mark.parametrize("direct", [False, True])
def test_a_range_past_the_end_gives_the_bytes_there_are(rng, tmp_path, monkeypatch, direct):
    monkeypatch.setitem(dask.config.config["qgpu"], "direct-reads", direct)
    path = tmp_path / "short.bin"
    content = written(path, rng, 3 * ALIGN + 100)
    reader = FileBytes(str(path))
    try:
        for cold in (False, True):
            if cold:
                evicted(path)
            data, got = reader.read(2 * ALIGN + 50, 4 * ALIGN)
            assert got == ALIGN + 50 and data[:got].tobytes() == content[2 * ALIGN + 50 :]
            assert reader.read(len(content) + ALIGN, 10)[1] == 0
    finally:
        reader.close()


@pytest.mark.parametrize("how", ["not asked", "no O_DIRECT"])
def test_without_direct_reads_every_range_is_read_plainly(rng, tmp_path, monkeypatch, how):
    """Direct reads not asked for (the default), or a platform without O_DIRECT: no direct descriptor, plain
    reads of cached and cold pages alike."""
    if how == "no O_DIRECT":
        monkeypatch.setitem(dask.config.config["qgpu"], "direct-reads", True)
        monkeypatch.setattr(file_bytes, "DIRECT", 0)
    else:
        monkeypatch.setitem(dask.config.config["qgpu"], "direct-reads", False)
    path = tmp_path / "plain.bin"
    content = written(path, rng)
    reader = FileBytes(str(path))
    try:
        assert not reader.direct and reader.direct_fd is None
        for position, nbytes in RANGES:
            evicted(path)
            data, got = reader.read(position, nbytes)
            assert got == nbytes and data.tobytes() == content[position : position + nbytes]
        assert reader.direct_bytes == 0
    finally:
        reader.close()
