"""The field's libraries on our residents (issue 27): a resident as a Dask array computed where it is held,
and HyperSpy and pyxem working on it; every count compared with ours."""

from __future__ import annotations

import logging

import dask
import numpy as np
import pytest
from distributed import wait


def test_a_resident_as_a_dask_array(svc, names, rng):
    counts = rng.poisson(0.7, (9, 5, 12, 10)).astype(np.uint16)
    for layout in ("dense", "compressed"):
        acq = svc.put(counts, name=names(), layout=layout)
        array = acq.to_dask(chunk_bytes=2 * 5 * 12 * 10 * 2)  # two scan rows a chunk
        assert array.shape == counts.shape and array.dtype == np.uint16 and array.chunks[0] == (2, 2, 2, 2, 1)
        persisted = svc.client.persist(array, optimize_graph=False)  # unoptimized, each chunk's task asks for the owner
        wait(persisted)
        keys = [str(k) for k in svc.client.who_has(persisted)]  # placed there unless Dask's work stealing moved it (loose:
        restrictions = svc.client.run_on_scheduler(  # a chunk must still run once its owner is lost, to say so)
            lambda dask_scheduler: {(tuple(ts.worker_restrictions or ()), ts.loose_restrictions)
                                    for key, ts in dask_scheduler.tasks.items() if str(key) in keys})
        assert restrictions == {((acq.owner,), True)}
        del persisted
        with dask.config.set(scheduler=svc.client):
            assert (array.compute() == counts).all()
            assert (array[3, 4].compute() == counts[3, 4]).all()
            assert (array.sum(axis=(0, 1), dtype=np.uint64).compute() == acq.reduce(None, "sum")).all()
        assert (array[8].compute(scheduler="sync") == counts[8]).all()  # in this process, through the service's client
        acq.release()
        with dask.config.set(scheduler=svc.client), pytest.raises(RuntimeError, match="is not held on .* make its array again"):
            array.compute()


def test_hyperspy_works_lazily_on_a_resident(svc, names, rng):
    """HyperSpy's lazy signal on ``acq.to_dask()``: a sum over the scan and a rectangular virtual image (its
    signal-space slicing), each equal to ours. (pyxem 0.21 pins zarr below 3, which this package and abTEM
    need: it cannot be installed beside them.)"""
    import hyperspy.api as hs

    counts = rng.poisson(0.7, (6, 7, 16, 12)).astype(np.uint16)
    acq = svc.put(counts, name=names(), layout="compressed")
    signal = hs.signals.Signal2D(acq.to_dask(chunk_bytes=3 * 7 * 16 * 12 * 2)).as_lazy()
    assert signal._lazy and signal.data.shape == counts.shape
    with dask.config.set(scheduler=svc.client):
        total = signal.sum(axis=(0, 1))
        total.compute()
        assert (total.data == acq.reduce(None, "sum")).all()
        box = signal.isig[2:9, 4:11].sum(axis=(2, 3))  # x 2..8, y 4..10
        box.compute()
    mask = np.zeros((16, 12), bool)
    mask[4:11, 2:9] = True
    assert (box.data == acq.virtual_image(mask)).all()
    acq.release()


OPTICS = dict(energy_eV=300e3, semiangle_mrad=20.0, scan_step_A=0.8, det_sampling_mrad=1.5)


def export_counts(rng) -> np.ndarray:
    """Counts to export, with one frame of zeros (a chunk Zarr leaves out)."""
    counts = rng.poisson(0.6, (5, 7, 16, 12)).astype(np.uint16)
    counts[1, 2] = 0
    return counts


def quietly_loaded(path, caplog):
    """``hs.load(path)``, which must neither warn nor log a warning (an unknown signal type would)."""
    import warnings

    import hyperspy.api as hs

    caplog.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        signal = hs.load(path)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    return signal


def assert_calibrated_signal(signal, acq, counts: np.ndarray) -> None:
    """A HyperSpy signal read from an export with OPTICS: the counts, the title, axes in nm and mrad, the beam."""
    assert (signal.data == counts).all() and signal.metadata.General.title == acq.name
    nav, sig = signal.axes_manager.navigation_axes, signal.axes_manager.signal_axes
    assert [a.scale for a in nav] == [0.08, 0.08] and [a.units for a in nav] == ["nm", "nm"]
    assert [a.scale for a in sig] == [1.5, 1.5] and [a.units for a in sig] == ["mrad", "mrad"]
    tem = signal.metadata.Acquisition_instrument.TEM
    assert tem.beam_energy == 300.0 and tem.convergence_angle == 20.0


def test_an_export_reads_in_hyperspy_rosettasciio_libertem_and_h5py(svc, names, rng, tmp_path, caplog):
    import h5py
    import hyperspy.api as hs
    from rsciio.hspy import file_reader

    import qgpu_dask as qd
    from peers import libertem_counts

    counts = export_counts(rng)
    optics = qd.Optics(**OPTICS)
    for layout in ("dense", "compressed"):
        acq = svc.put(counts, name=names(), layout=layout)
        path = acq.export(tmp_path / f"{layout}.hspy", optics)
        assert_calibrated_signal(quietly_loaded(path, caplog), acq, counts)
        assert (file_reader(path)[0]["data"] == counts).all()
        assert (libertem_counts("hdf5", path=path, ds_path=f"Experiments/{acq.name}/data") == counts).all()
        with h5py.File(path) as f:
            data = f[f"Experiments/{acq.name}/data"]
            assert data.chunks == (1, 1, 16, 12) and data.id.get_create_plist().get_filter(0)[0] == 32008  # bitshuffle
        acq.release()
    plain = svc.put(counts, name=names())
    with pytest.raises(ValueError, match=r"an export is named .hspy, .h5 or .hdf5 .*, .zspy .* or .emd"):
        plain.export(tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists() and not list(tmp_path.glob("*.partial"))
    with pytest.raises(ValueError, match="writing the export .*/missing/out.hspy' failed: .*No such file or directory"):
        plain.export(tmp_path / "missing" / "out.hspy")  # the file system's error, not taken for a lost worker
    assert str(hs.load(plain.export(tmp_path / "plain.hspy")).axes_manager.navigation_axes[0].units) == "<undefined>"  # pixels
    plain.release()


def test_a_zspy_export_reads_in_hyperspy_rosettasciio_zarr_and_our_loader(svc, names, rng, tmp_path, caplog):
    import hyperspy.api as hs
    import zarr
    from rsciio.zspy import file_reader

    import qgpu_dask as qd

    counts = export_counts(rng)
    optics = qd.Optics(**OPTICS)
    for layout in ("dense", "compressed"):
        acq = svc.put(counts, name=names(), layout=layout)
        path = acq.export(tmp_path / f"{layout}.zspy", optics)
        assert_calibrated_signal(quietly_loaded(path, caplog), acq, counts)
        assert (file_reader(path)[0]["data"] == counts).all()
        data = zarr.open(path, mode="r")[f"Experiments/{acq.name}/data"]
        assert data.metadata.zarr_format == 3 and data.chunks == (1, 1, 16, 12) and (data[:] == counts).all()
        blosc = data.metadata.codecs[0].codecs[1]  # inside the sharding codec: bytes, then blosc
        assert (blosc.cname.value, blosc.shuffle.value) == ("lz4", "bitshuffle")
        loaded = svc.load(path, dataset=f"Experiments/{acq.name}/data", name=names(), progress=False)
        assert loaded.shape == counts.shape and loaded.dtype == np.uint16
        assert (loaded.to_dask().compute(scheduler="sync") == counts).all()
        loaded.release()
        acq.release()
    plain = svc.put(counts[::-1].copy(), name=names())
    again = plain.export(tmp_path / "dense.zspy")  # replaces the store there
    assert (zarr.open(again, mode="r")[f"Experiments/{plain.name}/data"][:] == counts[::-1]).all()
    assert "Experiments" in zarr.open(again, mode="r") and len(zarr.open(again, mode="r")["Experiments"]) == 1
    assert str(hs.load(again).axes_manager.signal_axes[0].units) == "<undefined>"  # pixels
    (tmp_path / "mine.zspy").mkdir()
    (tmp_path / "mine.zspy" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="exists and is not a Zarr store: remove it or export to another path"):
        plain.export(tmp_path / "mine.zspy")
    assert (tmp_path / "mine.zspy" / "notes.txt").read_text() == "mine" and not list(tmp_path.glob("*.partial"))
    plain.release()


def emdfile_with_py4dstem_names(monkeypatch):
    """emdfile, knowing the class names py4DSTEM writes (DataCube, an Array; Calibration, a Metadata) as
    py4DSTEM makes them known: a module with ``_emd_hook = True``. (emdfile alone refuses every file py4DSTEM
    writes; py4DSTEM 0.14 pins numpy below 2 and cannot be installed beside this package.)"""
    import sys
    import types

    import emdfile

    names = types.ModuleType("py4dstem_names")
    names._emd_hook = True
    names.DataCube = type("DataCube", (emdfile.Array,), {})
    names.Calibration = type("Calibration", (emdfile.Metadata,), {})
    monkeypatch.setitem(sys.modules, names.__name__, names)
    # emdfile looks for those modules by asking every module in sys.modules for the attribute while it iterates
    # over them; a lazily importing module (HyperSpy's, SciPy's) imports on that question, and the iteration fails
    # ("dictionary changed size"). Ask them all first, until asking imports nothing more.
    seen = -1
    while seen != len(sys.modules):
        seen = len(sys.modules)
        for module in list(sys.modules.values()):
            hasattr(module, "_emd_hook")
    return emdfile


def test_an_emd_export_reads_as_a_py4dstem_datacube_in_emdfile_and_libertem(svc, names, rng, tmp_path, monkeypatch):
    import h5py
    import hdf5plugin  # the bitshuffle filter, for h5py in this process

    import qgpu_dask as qd
    from peers import libertem_counts

    emdfile = emdfile_with_py4dstem_names(monkeypatch)
    counts = export_counts(rng)
    optics = qd.Optics(**OPTICS)
    for layout in ("dense", "compressed"):
        acq = svc.put(counts, name=names(), layout=layout)
        path = acq.export(tmp_path / f"{layout}.emd", optics)
        cube = emdfile.read(path)
        assert type(cube).__name__ == "DataCube" and cube.name == acq.name and (cube.data == counts).all()
        assert list(cube.dim_names) == ["Rx", "Ry", "Qx", "Qy"] and list(cube.dim_units) == ["nm", "nm", "mrad", "mrad"]
        assert cube.dims[1][1] == 0.08 and cube.dims[3][1] == 1.5
        calibration = cube.root.metadata["calibration"]
        assert type(calibration).__name__ == "Calibration" and calibration._params == {
            "R_pixel_size": 0.08, "R_pixel_units": "nm", "Q_pixel_size": 1.5, "Q_pixel_units": "mrad", "QR_flip": False,
            "convergence_semiangle_mrad": 20.0, "beam_energy_keV": 300.0, "_root_treepath": "", "_target_paths": [f"/{acq.name}"]}
        assert emdfile._get_EMD_version(path) == (1, 0, 0)
        assert (libertem_counts("hdf5", path=path, ds_path=f"{acq.name}_root/{acq.name}/data") == counts).all()
        with h5py.File(path) as f:
            data = f[f"{acq.name}_root/{acq.name}/data"]
            assert data.chunks == (1, 1, 16, 12) and data.id.get_create_plist().get_filter(0)[0] == hdf5plugin.BSHUF_ID
        acq.release()
    plain = svc.put(counts, name=names())
    calibration = emdfile.read(plain.export(tmp_path / "plain.emd")).root.metadata["calibration"]
    assert calibration._params == {"R_pixel_size": 1.0, "R_pixel_units": "pixels", "Q_pixel_size": 1.0, "Q_pixel_units": "pixels",
                                   "QR_flip": False, "_root_treepath": "", "_target_paths": [f"/{plain.name}"]}
    plain.release()


def test_an_export_is_written_a_block_of_scan_rows_at_a_time(rng, tmp_path, monkeypatch):
    """With blocks of two scan rows (five rows: blocks of 2, 2, 1; Zarr shards alike), every layout holds
    every count; in this process, where the block size can be set."""
    import h5py
    import zarr

    from qgpu_dask.io.export import Calibration, export_resident
    from qgpu_dask.io.writers import base
    from qgpu_dask.resident.dense import DenseCounts

    counts = export_counts(rng)
    monkeypatch.setattr(base, "BLOCK_BYTES", 2 * counts[0].nbytes)
    resident = DenseCounts("blocks", counts.reshape(35, -1).copy(), counts.shape)
    calibration = Calibration(0.08, 1.5, 300.0, 20.0)
    for suffix, where in ((".hspy", "Experiments/blocks/data"), (".emd", "blocks_root/blocks/data")):
        assert export_resident(resident, tmp_path / f"b{suffix}", calibration) == (tmp_path / f"b{suffix}").stat().st_size
        with h5py.File(tmp_path / f"b{suffix}") as f:
            assert (f[where][:] == counts).all()
    assert export_resident(resident, tmp_path / "b.zspy", calibration) > 0
    data = zarr.open(str(tmp_path / "b.zspy"), mode="r")["Experiments/blocks/data"]
    assert data.shards == (2, 7, 16, 12) and (data[:] == counts).all()
    assert len(list((tmp_path / "b.zspy" / "Experiments" / "blocks" / "data").rglob("c/*/0/0/0"))) == 3  # a file a shard
