"""An export's writer in a process of its own. HDF5 (and third-party) writers are not safe to fail: h5py 3.16
writing bitshuffle-LZ4 to a full disk has crashed the process it ran in (``free(): invalid pointer``, a
segfault at exit), and the owner's process holds residents, some with no other home. So the owner starts a
Python running ``main`` here (``STARTER``), sends it a header and then the counts block by block on its stdin,
and reads its answer on its stdout: a crash costs the export, never the worker.

On stdin, each message an 8-byte little-endian length and its bytes: first the pickled header {"suffix",
"path", "calibration", "name", "shape", "dtype", "rows"}, then each block of ``block_bounds`` in order, its raw
counts. On stdout, once: a pickled {"type", "message"} of the error that stopped it, or None when the file is
complete. A writer that stops early stops reading, so the owner's next send fails and it reads the answer.
"""

from __future__ import annotations

import importlib
import os
import pickle
import struct
import sys
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from .base import Counts, block_bounds

# The writer of each suffix ("module:function" here), imported only where used (Zarr's import takes 1.6 s)
WRITERS = {".hspy": "hyperspy:write_hspy", ".h5": "hyperspy:write_hspy", ".hdf5": "hyperspy:write_hspy",
           ".zspy": "hyperspy:write_zspy", ".emd": "emd:write_emd"}
# What the owner runs: the writers alone, not the package's __init__, which brings the service, Dask and CuPy
# (9 s on two busy cores, against 0.8 s for an HDF5 writer); {package} is the package's folder
STARTER = ("import sys, types; package = types.ModuleType('qgpu_dask'); package.__path__ = [{package!r}]; "
           "sys.modules['qgpu_dask'] = package; from qgpu_dask.io.writers.process import main; main()")
LENGTH = struct.Struct("<Q")


def send(stream: BinaryIO, payload) -> None:
    """Write one message (bytes or a buffer) to ``stream``."""
    view = memoryview(payload).cast("B")
    stream.write(LENGTH.pack(len(view)))
    stream.write(view)


def receive(stream: BinaryIO) -> bytes:
    """Read one message from ``stream``; EOFError where it ends before one is whole."""
    head = stream.read(LENGTH.size)
    if len(head) < LENGTH.size:
        raise EOFError("the owner's stream ended before a message")
    size = LENGTH.unpack(head)[0]
    body = stream.read(size)
    if len(body) < size:
        raise EOFError(f"the owner's stream ended inside a message of {size} bytes")
    return body


def blocks(stream: BinaryIO, shape: tuple[int, ...], dtype: np.dtype, rows: int) -> Iterator[np.ndarray]:
    """The counts' blocks as they arrive, each checked against the size its scan rows give."""
    _, cols, det_rows, det_cols = shape
    for lo, hi in block_bounds(shape[0], rows):
        block = np.frombuffer(receive(stream), dtype)
        if block.size != (hi - lo) * cols * det_rows * det_cols:
            raise ValueError(f"scan rows {lo}..{hi} came as {block.size} values, not {(hi - lo) * cols * det_rows * det_cols}")
        yield block


def main() -> None:
    """Write the export the header on stdin describes; the answer on stdout. After a failure the process ends
    at once, answer sent: freeing a failed HDF5 file's objects is what crashes (``Can't decrement id ref count``)."""
    source, answer = sys.stdin.buffer, sys.stdout.buffer
    try:
        header = pickle.loads(receive(source))
        dtype = np.dtype(header["dtype"])
        shape = tuple(header["shape"])
        module, function = WRITERS[header["suffix"]].split(":")
        writer = getattr(importlib.import_module(f"{__package__}.{module}"), function)
        rows = header["rows"]
        writer(Counts(header["name"], shape, dtype, rows, blocks(source, shape, dtype, rows)), Path(header["path"]), header["calibration"])
    except BaseException as err:  # whatever stopped the writer goes back to the owner, named
        plain = isinstance(err, OSError) and err.errno and not err.filename  # HDF5's own text of ENOSPC runs over lines
        message = f"[Errno {err.errno}] {os.strerror(err.errno)}" if plain else str(err)
        answer.write(pickle.dumps({"type": type(err).__name__, "message": message}))
        answer.flush()
        os._exit(1)
    answer.write(pickle.dumps(None))
    answer.flush()
