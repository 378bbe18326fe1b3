"""Raw binary frames with no header of their own, described by a TOML descriptor beside them (the layout of
LiberTEM's raw_csr descriptor, ``filetype = "raw"``)::

    [params]
    filetype = "raw"
    nav_shape = [256, 256]
    sig_shape = [128, 128]

    [raw]
    data_file = "scan.bin"
    dtype = ">u2"       # any NumPy dtype, its byte order included
    offset = 0          # bytes before the first frame (optional)
    stride = 32832      # bytes from one frame's start to the next (optional: the frame's bytes)

Frames are read as any frames at a stride are (``FrameFile``): a header per frame is skipped by a stride
past the frame's bytes. The file may hold more frames than the scan (those after it are not read), not
fewer.
"""

from __future__ import annotations

from pathlib import Path

from ..source import Source
from .base import Format
from .descriptor import data_file, descriptor, dtype_of, shape_of, table
from .frame_file import FrameFile

FILETYPE = "raw"


def is_raw(path: Path, dataset: str | None = None) -> bool:
    """Whether ``path`` is a TOML descriptor of ``filetype = "raw"``."""
    return descriptor(path, FILETYPE) is not None


def open_raw(path: Path, source: Source) -> FrameFile:
    where = str(path)
    conf = descriptor(path, FILETYPE)
    params, layout = conf["params"], table(conf, FILETYPE, ["data_file", "dtype"], where)
    dtype = dtype_of(layout["dtype"], "dtype", where)
    shape = shape_of(params, source.scan_shape, None, where)
    offset, stride = layout.get("offset", 0), layout.get("stride")
    if not isinstance(offset, int) or offset < 0 or not (stride is None or isinstance(stride, int) and stride > 0):
        raise ValueError(f"{where!r}: offset must be a whole number of bytes >= 0 and stride one > 0 (found {offset!r}, {stride!r})")
    return FrameFile(FILETYPE, data_file(path, layout["data_file"], "data file"), shape, dtype, offset, stride)


FORMAT = Format(FILETYPE, is_raw, open_raw, "a raw descriptor (.toml)")
