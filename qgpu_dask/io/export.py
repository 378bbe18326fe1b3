"""A resident written out for the field's other programs (``acq.export``), in the layout the path's suffix
names: .hspy/.h5/.hdf5 HyperSpy's HDF5 layout, .zspy HyperSpy's Zarr (format 3) layout, .emd EMD 1.0 as
py4DSTEM writes a DataCube (io/writers/: one module per layout). The owner decodes the resident a block of
scan rows at a time (any layout) and sends each block to a writer process of its own (``writers/process.py``):
the file never passes through memory whole, it is written under ``<path>.partial`` until complete, and a
writer that fails or crashes (a full disk) costs the export only, never the worker and what it holds. With a
``Calibration`` (``acq.export(path, optics)`` makes it from the optics) the scan step, detector pixel, beam
energy and convergence angle go where each layout keeps them; without, every axis is in pixels.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..device import to_host
from ..resident.base import Resident
from .source import disk_bytes
from .writers.base import Calibration, block_bounds, remove, rows_per_block
from .writers.process import STARTER, WRITERS, send

FULL_BYTES = 2**20  # a disk with less free is named full when a writer crashed on it (HDF5 crashes on ENOSPC)


def free_bytes(folder: Path) -> int | None:
    """Bytes free on ``folder``'s disk, None where it cannot be asked."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def export_resident(resident: Resident, path: str | os.PathLike, calibration: Calibration | None = None) -> int:
    """Write ``resident`` to ``path`` in the layout its suffix names, in a writer process; the bytes written."""
    path = Path(path)
    if path.suffix.lower() not in WRITERS:
        raise ValueError(f"{str(path)!r}: an export is named .hspy, .h5 or .hdf5 (HyperSpy's HDF5 layout), .zspy (HyperSpy's "
                         f"Zarr v3 layout) or .emd (EMD 1.0, py4DSTEM's DataCube): give the path one of these suffixes")
    header = {"suffix": path.suffix.lower(), "path": str(path), "calibration": calibration, "name": resident.name,
              "shape": tuple(resident.shape), "dtype": np.dtype(resident.dtype).str, "rows": rows_per_block(resident.shape, resident.dtype)}
    cols = resident.shape[1]
    with tempfile.TemporaryFile() as errors:
        starter = STARTER.format(package=str(Path(__file__).resolve().parents[1]))
        writer = subprocess.Popen([sys.executable, "-c", starter], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors)
        try:
            try:
                send(writer.stdin, pickle.dumps(header))
                for lo, hi in block_bounds(resident.shape[0], header["rows"]):
                    send(writer.stdin, np.ascontiguousarray(to_host(resident.frames_flat(lo * cols, hi * cols))))
                writer.stdin.close()
            except BrokenPipeError:
                pass  # the writer stopped early: its answer says why
            answer = writer.stdout.read()
            status = writer.wait()
        finally:
            if writer.poll() is None:  # this side failed (or was cancelled): the writer goes too
                writer.kill()
                writer.wait()
                remove(path.with_name(path.name + ".partial"))
        errors.seek(0)
        said = errors.read().decode(errors="replace").strip().splitlines()
    error = pickle.loads(answer) if answer else None
    if error is None and not answer:
        free = free_bytes(path.parent)  # before its partial file goes
        remove(path.with_name(path.name + ".partial"))  # a crashed writer removed nothing
        how = f"signal {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
        why = [said[-1]] if said else []
        if free is not None and free < FULL_BYTES:
            why.append(f"its disk is full: {free} bytes free")
        raise ValueError(f"writing the export {str(path)!r} failed: its writer process ended with {how}"
                         f"{' (' + '; '.join(why) + ')' if why else ''}; nothing was written, and {resident.name!r} is held as before")
    if error is not None:
        if error["type"] == "ValueError":
            raise ValueError(error["message"])
        raise ValueError(f"writing the export {str(path)!r} failed: {error['message']}")
    return disk_bytes(path)
