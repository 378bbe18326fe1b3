"""The field's libraries on our residents (issue 27): a resident as a Dask array computed where it is held,
and HyperSpy and pyxem working on it; every count compared with ours."""

from __future__ import annotations

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
        persisted = svc.client.persist(array, optimize_graph=False)  # unoptimized, the chunks stay where they are read: the owner
        wait(persisted)
        assert set(svc.client.who_has(persisted).values()) == {(acq.owner,)}
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


def test_an_export_reads_in_hyperspy_rosettasciio_libertem_and_h5py(svc, names, rng, tmp_path):
    import h5py
    import hyperspy.api as hs
    from rsciio.hspy import file_reader

    import qgpu_dask as qd
    from peers import libertem_counts

    counts = rng.poisson(0.6, (5, 7, 16, 12)).astype(np.uint16)
    optics = qd.Optics(300e3, 20.0, 0.8, det_sampling_mrad=1.5)
    for layout in ("dense", "compressed"):
        acq = svc.put(counts, name=names(), layout=layout)
        path = acq.export(tmp_path / f"{layout}.hspy", optics)
        signal = hs.load(path)
        assert (signal.data == counts).all() and signal.metadata.General.title == acq.name
        nav, sig = signal.axes_manager.navigation_axes, signal.axes_manager.signal_axes
        assert [a.scale for a in nav] == [0.08, 0.08] and [a.units for a in nav] == ["nm", "nm"]
        assert [a.scale for a in sig] == [1.5, 1.5] and sig[0].units == "mrad"
        assert signal.metadata.Acquisition_instrument.TEM.beam_energy == 300.0
        assert (file_reader(path)[0]["data"] == counts).all()
        assert (libertem_counts("hdf5", path=path, ds_path=f"Experiments/{acq.name}/data") == counts).all()
        with h5py.File(path) as f:
            data = f[f"Experiments/{acq.name}/data"]
            assert data.chunks == (1, 1, 16, 12) and data.id.get_create_plist().get_filter(0)[0] == 32008  # bitshuffle
        acq.release()
    plain = svc.put(counts, name=names())
    with pytest.raises(ValueError, match="an export is HyperSpy's HDF5 layout, named .hspy"):
        plain.export(tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists() and not list(tmp_path.glob("*.partial"))
    assert str(hs.load(plain.export(tmp_path / "plain.hspy")).axes_manager.navigation_axes[0].units) == "<undefined>"  # pixels
    plain.release()
