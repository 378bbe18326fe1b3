"""Sources: where an acquisition's counts come from, described so that a shard can open them itself.

A ``Source`` is a small picklable description (path, dataset, scan shape) that
a shard opens itself, so counts go from the file straight to the owning worker
and an acquisition can be read again from it later. A saved resident is
opened whole (``io.saved``); any other file by the reader of its format, found
from the file's content (``io.registry``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Source:
    """A file (or Zarr store) holding one acquisition."""

    path: str
    dataset: str | None = None
    scan_shape: tuple[int, int] | None = None

    def describe(self) -> dict:
        return {"path": self.path, "dataset": self.dataset, "scan_shape": self.scan_shape}


def disk_bytes(path: Path) -> int:
    """Bytes a file takes on disk, or every file of a directory (a Zarr store)."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size
