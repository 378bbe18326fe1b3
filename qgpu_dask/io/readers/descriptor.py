"""TOML descriptors of files that say nothing of themselves: a ``[params]`` table with the ``filetype``, the
scan and detector shapes (``nav_shape``, ``sig_shape``), and a table named after the filetype saying where
the bytes are, as LiberTEM's raw_csr descriptor does (``readers.raw_csr``, ``readers.raw``)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np

DESCRIPTOR_LIMIT = 1 << 20  # bytes: a descriptor is a few lines; a larger file is not read as one


def descriptor(path: Path, filetype: str) -> dict | None:
    """The TOML at ``path`` if its ``[params]`` say ``filetype``, else None."""
    if not path.is_file() or path.stat().st_size > DESCRIPTOR_LIMIT:
        return None
    try:
        conf = tomllib.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    params = conf.get("params")
    if not isinstance(params, dict) or str(params.get("filetype", "")).lower() != filetype:
        return None
    return conf


def table(conf: dict, filetype: str, keys: list[str], where: str) -> dict:
    """The descriptor's table named after its filetype (any case); ValueError naming what it lacks."""
    found = next((v for k, v in conf.items() if k.lower() == filetype and isinstance(v, dict)), None)
    if found is None:
        raise ValueError(f"{where!r} has no [{filetype}] table saying where its counts are")
    missing = [k for k in keys if k not in found]
    if missing:
        raise ValueError(f"{where!r}: its [{filetype}] table lacks {', '.join(missing)}")
    return found


def data_file(path: Path, name: str, what: str) -> Path:
    """The file a descriptor at ``path`` names, beside it; ValueError if it does not exist."""
    found = path.parent / name
    if not found.is_file():
        raise ValueError(f"{str(path)!r} names {what} {str(found)!r}, which does not exist")
    return found


def shape_of(params: dict, scan_shape: tuple[int, int] | None, frames: int | None, where: str) -> tuple[int, int, int, int]:
    """(scan rows, scan cols, det rows, det cols): ``scan_shape`` or the descriptor's ``nav_shape``, its
    ``sig_shape``; ValueError unless the scan holds ``frames`` frames (where the files say how many)."""
    det = tuple(int(v) for v in params.get("sig_shape", ()))
    scan = tuple(int(v) for v in (scan_shape or params.get("nav_shape", ())))
    if len(det) != 2 or len(scan) != 2:
        raise ValueError(f"{where!r}: nav_shape and sig_shape must each be two numbers (found {params.get('nav_shape')}, {params.get('sig_shape')})")
    if frames is not None and scan[0] * scan[1] != frames:
        raise ValueError(f"{where!r} holds {frames} frames, but the scan {scan} has {scan[0] * scan[1]} positions")
    return (*scan, *det)


def dtype_of(value, key: str, where: str) -> np.dtype:
    """``value`` as a NumPy dtype; ValueError naming ``key`` where it is not one."""
    try:
        return np.dtype(value)
    except TypeError:
        raise ValueError(f"{where!r}: {key} {value!r} is not a dtype") from None
