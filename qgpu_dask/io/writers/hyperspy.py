"""HyperSpy's layouts (format 3.3), in HDF5 (.hspy) and in Zarr (.zspy): a signal group
``Experiments/<name>`` holding the counts (``data``), one ``axis-<i>`` group per dimension (the scan axes in
nm and the detector axes in mrad where calibrated, else pixels), and ``metadata`` with the title and, with a
Calibration, the beam energy and convergence angle where HyperSpy keeps them (``Acquisition_instrument.TEM``).
HyperSpy (``hs.load``), RosettaSciIO and LiberTEM (``ds_path="Experiments/<name>/data"``, HDF5) read them.
The signal type is left empty, as HyperSpy writes a Signal2D: plain HyperSpy knows no diffraction type and warns
on one it does not know; with pyxem, ``signal.set_signal_type("electron_diffraction")`` makes it pyxem's.

The .zspy store is Zarr format 3. RosettaSciIO 0.15 reads it (its zspy reader opens the store with
``zarr.open``, which reads formats 2 and 3) but, with zarr-python 3, cannot write it (its writer asks for
zarr 2's NestedDirectoryStore). Its chunks are one frame each, blosc LZ4 with bitshuffle, inside shards of
one written block each (a block of scan rows: one file per block, not per frame); frames equal to zero are
left out, as Zarr does, and read back as the fill value 0.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import zarr
from zarr.codecs import BloscCodec

from ..readers.zarr_array import is_store
from .base import Calibration, Counts, hdf5_counts, node_name, write_counts, written_in_place

FORMAT_VERSION = "3.3"
UNKNOWN = "_None_"  # how HyperSpy writes an attribute that is None (pixels: no unit)


def signal_group(root, file_format: str, counts: Counts, calibration: Calibration | None):
    """Write HyperSpy's tree for the counts' signal under ``root`` (an h5py or Zarr group: both make groups
    and take attributes alike); its group, for the ``data``."""
    rows, cols, det_rows, det_cols = counts.shape
    step = float(calibration.scan_step_nm) if calibration else 1.0
    det = float(calibration.det_sampling_mrad) if calibration and calibration.det_sampling_mrad else None
    root.attrs.update({"file_format": file_format, "file_format_version": FORMAT_VERSION})
    signal = root.require_group("Experiments").require_group(node_name(counts))
    signal.attrs.update({"package": "", "package_version": ""})
    signal.require_group("attributes").attrs.update({"_lazy": False, "ragged": False})
    for i, (size, navigate, name, scale, units) in enumerate((
            (rows, True, "y", step, "nm" if calibration else UNKNOWN), (cols, True, "x", step, "nm" if calibration else UNKNOWN),
            (det_rows, False, "ky", det or 1.0, "mrad" if det else UNKNOWN), (det_cols, False, "kx", det or 1.0, "mrad" if det else UNKNOWN))):
        signal.require_group(f"axis-{i}").attrs.update({"_type": "UniformDataAxis", "is_binned": False, "name": name, "navigate": navigate,
                                                        "offset": 0.0, "scale": scale, "size": size, "units": units})
    metadata = signal.require_group("metadata")
    metadata.require_group("General").attrs["title"] = counts.name
    metadata.require_group("Signal").attrs["signal_type"] = ""  # a plain Signal2D (see the module's text)
    if calibration:
        metadata.require_group("Acquisition_instrument").require_group("TEM").attrs.update(
            {"beam_energy": float(calibration.energy_keV), "convergence_angle": float(calibration.semiangle_mrad)})
    signal.require_group("original_metadata")
    return signal


def write_hspy(counts: Counts, path: Path, calibration: Calibration | None) -> None:
    """Write the counts to ``path`` in HyperSpy's HDF5 layout."""
    with written_in_place(path) as partial, h5py.File(partial, "w") as f:
        write_counts(counts, hdf5_counts(signal_group(f, "HyperSpy", counts, calibration), "data", counts))


def write_zspy(counts: Counts, path: Path, calibration: Calibration | None) -> None:
    """Write the counts to ``path`` in HyperSpy's Zarr layout (a directory store, Zarr format 3); an earlier
    Zarr store there is replaced, anything else is left alone."""
    if path.exists() and not is_store(path):
        raise ValueError(f"{str(path)!r} exists and is not a Zarr store: remove it or export to another path")
    rows, cols, det_rows, det_cols = counts.shape
    with written_in_place(path) as partial:
        root = zarr.open_group(str(partial), mode="w", zarr_format=3)
        signal = signal_group(root, "ZSpy", counts, calibration)
        data = signal.create_array("data", shape=counts.shape, dtype=counts.dtype, chunks=(1, 1, det_rows, det_cols),
                                   shards=(min(rows, counts.rows), cols, det_rows, det_cols), fill_value=0,
                                   compressors=BloscCodec(cname="lz4", shuffle="bitshuffle"), dimension_names=("y", "x", "ky", "kx"))
        write_counts(counts, data)
