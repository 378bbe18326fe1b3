"""A resident written out for the field's other programs (``acq.export``): HyperSpy's HDF5 layout (.hspy, format
3.3), which HyperSpy and RosettaSciIO read as a signal with its axes, LiberTEM as an HDF5 dataset
(``ds_path="Experiments/<name>/data"``) and h5py as it is.

The counts are one chunk a frame, bitshuffle-LZ4 (HDF5 filter 32008, as DECTRIS detectors write them), written
a block of frames at a time as the resident gives them (any layout: a compressed one is decoded block by
block), so the file never passes through memory whole. With a ``Calibration`` (``acq.export(path, optics)``
makes it from the optics), the scan axes are in nm and the detector axes in mrad where known, and the beam
energy and convergence angle are in the signal's metadata as HyperSpy keeps them; without, every axis is in
pixels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import hdf5plugin

from ..device import to_host
from ..resident.base import Resident

BLOCK_BYTES = 64 * 2**20  # counts written at a time
FORMAT_VERSION = "3.3"


@dataclass(frozen=True)
class Calibration:
    """What an export says of the axes and the beam: scan step (nm), detector pixel (mrad, None: not known),
    beam energy (keV), convergence semi-angle (mrad)."""

    scan_step_nm: float
    det_sampling_mrad: float | None
    energy_keV: float
    semiangle_mrad: float


def axis(group: h5py.Group, index: int, size: int, navigate: bool, name: str, scale: float, units: str) -> None:
    attrs = group.create_group(f"axis-{index}").attrs
    attrs.update({"_type": "UniformDataAxis", "is_binned": False, "name": name, "navigate": navigate, "offset": 0.0, "scale": scale,
                  "size": size, "units": units})


def export_hspy(resident: Resident, path: str | os.PathLike, calibration: Calibration | None = None) -> int:
    """Write ``resident`` to ``path`` in HyperSpy's HDF5 layout (its signal named after it); the file's bytes."""
    path = Path(path)
    if path.suffix.lower() not in (".hspy", ".h5", ".hdf5"):
        raise ValueError(f"{str(path)!r}: an export is HyperSpy's HDF5 layout, named .hspy (or .h5, .hdf5)")
    rows, cols, det_rows, det_cols = resident.shape
    step = calibration.scan_step_nm if calibration else 1.0
    det = calibration.det_sampling_mrad if calibration else None
    scan_units = "nm" if calibration else "_None_"
    partial = path.with_name(path.name + ".partial")
    try:
        with h5py.File(partial, "w") as f:
            f.attrs.update({"file_format": "HyperSpy", "file_format_version": FORMAT_VERSION})
            signal = f.create_group(f"Experiments/{resident.name}")
            signal.attrs.update({"package": "", "package_version": ""})
            signal.create_group("attributes").attrs.update({"_lazy": False, "ragged": False})
            for i, (size, navigate, name, scale, units) in enumerate((
                    (rows, True, "y", step, scan_units), (cols, True, "x", step, scan_units),
                    (det_rows, False, "ky", det or 1.0, "mrad" if det else "_None_"), (det_cols, False, "kx", det or 1.0, "mrad" if det else "_None_"))):
                axis(signal, i, size, navigate, name, scale, units)
            metadata = signal.create_group("metadata")
            metadata.create_group("General").attrs["title"] = resident.name
            metadata.create_group("Signal").attrs["signal_type"] = "electron_diffraction"
            if calibration:
                metadata.create_group("Acquisition_instrument/TEM").attrs.update(
                    {"beam_energy": calibration.energy_keV, "convergence_angle": calibration.semiangle_mrad})
            signal.create_group("original_metadata")
            data = signal.create_dataset("data", resident.shape, resident.dtype, chunks=(1, 1, det_rows, det_cols),
                                         **hdf5plugin.Bitshuffle(nelems=0, cname="lz4"))
            frame_bytes = det_rows * det_cols * resident.dtype.itemsize
            per = max(1, BLOCK_BYTES // (cols * frame_bytes))  # whole scan rows a block
            for lo in range(0, rows, per):
                hi = min(rows, lo + per)
                data[lo:hi] = to_host(resident.frames_flat(lo * cols, hi * cols)).reshape(hi - lo, cols, det_rows, det_cols)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path.stat().st_size
