"""EMD 1.0 (.emd) as py4DSTEM 0.14 writes a DataCube, through its file layer emdfile: the file's header
attributes, a root group ``<name>_root`` whose metadata bundle holds py4DSTEM's ``calibration`` (R_pixel_size
and R_pixel_units: the scan step in nm; Q_pixel_size and Q_pixel_units: the detector pixel in mrad, else 1
pixel; convergence_semiangle_mrad; the calibration's links to the datacube), and the DataCube node
``<name>_root/<name>`` with its counts (``data``, one bitshuffle-LZ4 chunk a frame) and dim vectors.

``py4DSTEM.read(path)`` gives a DataCube with that calibration. ``emdfile.read`` gives the same node once the
class names DataCube and Calibration are known to it (py4DSTEM registers them by its ``_emd_hook``); without,
emdfile refuses the file, as it refuses every file py4DSTEM writes. LiberTEM reads the counts as an HDF5
dataset (``ds_path="<name>_root/<name>/data"``). py4DSTEM's Calibration has no key for the beam energy: it is
kept there as ``beam_energy_keV`` (the Calibration is an open dictionary of values).
"""

from __future__ import annotations

from pathlib import Path
from uuid import uuid4

import h5py
import numpy as np

from .base import Calibration, Counts, hdf5_counts, node_name, write_counts, written_in_place


def group(parent: h5py.Group, name: str, group_type: str, python_class: str | None = None) -> h5py.Group:
    """A new EMD group: its ``emd_group_type`` and the Python class that reads it."""
    made = parent.create_group(name)
    made.attrs["emd_group_type"] = group_type
    if python_class:
        made.attrs["python_class"] = python_class
    return made


def metadata_item(metadata: h5py.Group, key: str, value: float | str | bool | list[str]) -> None:
    """One value of an EMD metadata dictionary, typed as emdfile reads it (``type``: number, string, bool, or
    list_of_strings)."""
    if isinstance(value, list):
        items = metadata.create_group(key)
        items.attrs.update({"type": b"list_of_strings", "length": len(value)})
        for i, text in enumerate(value):
            items.create_dataset(str(i), data=text.encode())
    elif isinstance(value, bool):
        metadata.create_dataset(key, data=value, dtype=bool).attrs["type"] = b"bool"
    elif isinstance(value, str):
        metadata.create_dataset(key, data=value.encode()).attrs["type"] = b"string"
    else:
        metadata.create_dataset(key, data=float(value)).attrs["type"] = b"number"


def write_emd(counts: Counts, path: Path, calibration: Calibration | None) -> None:
    """Write the counts to ``path`` as py4DSTEM's DataCube in an EMD 1.0 file."""
    name = node_name(counts)
    det = calibration.det_sampling_mrad if calibration else None
    scan = (calibration.scan_step_nm, "nm") if calibration else (1.0, "pixels")
    detector = (det, "mrad") if det else (1.0, "pixels")
    values = {"R_pixel_size": scan[0], "R_pixel_units": scan[1], "Q_pixel_size": detector[0], "Q_pixel_units": detector[1],
              "QR_flip": False, "_root_treepath": "", "_target_paths": [f"/{name}"]}
    if calibration:
        values.update({"convergence_semiangle_mrad": calibration.semiangle_mrad, "beam_energy_keV": calibration.energy_keV})
    with written_in_place(path) as partial, h5py.File(partial, "w") as f:
        f.attrs.update({"emd_group_type": "file", "version_major": 1, "version_minor": 0, "UUID": str(uuid4()),
                        "authoring_program": "qgpu_dask", "authoring_user": ""})
        root = group(f, f"{name}_root", "root", "Root")
        cal = group(group(root, "metadatabundle", "metadatabundle"), "calibration", "metadata", "Calibration")
        for key, value in values.items():
            metadata_item(cal, key, value)
        cube = group(root, name, "array", "DataCube")
        for i, (dim, (step, units)) in enumerate(zip(("Rx", "Ry", "Qx", "Qy"), (scan, scan, detector, detector))):
            vector = cube.create_dataset(f"dim{i}", data=np.array([0.0, step]))  # a linear dim vector: its first two values
            vector.attrs.update({"name": dim, "units": units})
        data = hdf5_counts(cube, "data", counts)
        data.attrs["units"] = "pixel intensity"
        write_counts(counts, data)
