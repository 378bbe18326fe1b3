"""A resident written out for the field's other programs (``acq.export``), in the layout the path's suffix
names: .hspy/.h5/.hdf5 HyperSpy's HDF5 layout, .zspy HyperSpy's Zarr (format 3) layout, .emd EMD 1.0 as
py4DSTEM writes a DataCube (io/writers/: one module per layout). Each is written by the owner a block of scan
rows at a time from the resident (any layout: a compressed one is decoded block by block), so it never passes
through memory whole, under ``<path>.partial`` until it is complete. With a ``Calibration`` (``acq.export(path,
optics)`` makes it from the optics) the scan step, detector pixel, beam energy and convergence angle go where
each layout keeps them; without, every axis is in pixels.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..resident.base import Resident
from .source import disk_bytes
from .writers.base import Calibration
from .writers.emd import write_emd
from .writers.hyperspy import write_hspy, write_zspy

WRITERS = {".hspy": write_hspy, ".h5": write_hspy, ".hdf5": write_hspy, ".zspy": write_zspy, ".emd": write_emd}


def export_resident(resident: Resident, path: str | os.PathLike, calibration: Calibration | None = None) -> int:
    """Write ``resident`` to ``path`` in the layout its suffix names; the bytes written."""
    path = Path(path)
    writer = WRITERS.get(path.suffix.lower())
    if writer is None:
        raise ValueError(f"{str(path)!r}: an export is named .hspy, .h5 or .hdf5 (HyperSpy's HDF5 layout), .zspy (HyperSpy's "
                         f"Zarr v3 layout) or .emd (EMD 1.0, py4DSTEM's DataCube): give the path one of these suffixes")
    try:
        writer(resident, path, calibration)
    except OSError as err:  # the file system's error, named as the export's (as a load names the file it failed on)
        raise ValueError(f"writing the export {str(path)!r} failed: {err}") from err
    return disk_bytes(path)
