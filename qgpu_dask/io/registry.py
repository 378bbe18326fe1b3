"""The readers' formats, asked in turn which one a file is (from its content, never its name alone), and
``open_reader``, which opens a source with the reader of its format.

A new reader is one module of ``io.readers`` that declares its ``FORMAT`` and one line in ``READERS``. The
order is the order formats are asked in: the layouts of HDF5 files (an Arina/Eiger master, a stack of one
gzip chunk per frame) before plain HDF5; formats with a magic number before those with a weaker signature
(MRC's "MAP " at byte 208, DigitalMicrograph's version and byte-order words); TOML descriptors (raw_csr,
raw) after them; EMPAD .raw files, which have no signature, last.
"""

from __future__ import annotations

from pathlib import Path

from ..formats.container import is_container
from .readers import arina, blo, dm, empad, frms6, gzip_stack, hdf5, k2is, merlin, mrc, npy, raw, raw_csr, seq, ser, tvips, zarr_array
from .readers.base import Format, Reader
from .source import Source

READERS: tuple[Format, ...] = (
    arina.FORMAT,
    gzip_stack.FORMAT,
    hdf5.FORMAT,
    npy.FORMAT,
    zarr_array.FORMAT,
    merlin.FORMAT,
    blo.FORMAT,
    ser.FORMAT,
    seq.FORMAT,
    tvips.FORMAT,
    frms6.FORMAT,
    k2is.FORMAT,
    mrc.FORMAT,
    dm.FORMAT,
    raw_csr.FORMAT,
    raw.FORMAT,
    empad.FORMAT,
)


def detect_format(path: Path, dataset: str | None = None) -> Format:
    """The format of the content at ``path`` (``dataset``: the one asked for, which picks among the layouts
    of an HDF5 file); ValueError naming what was found when no reader's format matches."""
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {str(path)!r}")
    if is_container(path):
        raise ValueError(f"{str(path)!r} is a saved resident: it is opened whole (io.saved.open_resident), not read frame by frame")
    for found in READERS:
        if found.detect(path, dataset):
            return found
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a directory but not a Zarr store (no zarr.json or .zarray)")
    with open(path, "rb") as f:
        first = f.read(8)
    raise ValueError(f"{str(path)!r} is not {readable()} (first bytes {first!r})")


def readable() -> str:
    """What the readers read, in words: "an HDF5 file, ..., or a saved resident"."""
    kinds = [*dict.fromkeys(f.what for f in READERS), "a saved resident"]
    return ", ".join(kinds[:-1]) + " or " + kinds[-1]


def open_reader(source: Source) -> Reader:
    """Open ``source`` with the reader of its format; the shape and dtype are checked there."""
    path = Path(source.path).expanduser()
    return detect_format(path, source.dataset).open(path, source)
