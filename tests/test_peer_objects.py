"""A peer's in-memory object on the service (issue 27): HyperSpy signals (eager, lazy, stacks) and py4DSTEM
DataCubes put as acquisitions, every count compared with ``==``, their calibration carried into Optics."""

from __future__ import annotations

import math

import dask
import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.phase.optics import wavelength_A
from qgpu_dask.service import peer_objects


def held(svc, acq) -> np.ndarray:
    """Every count of ``acq``, read back through its Dask array."""
    with dask.config.set(scheduler=svc.client):
        return acq.to_dask().compute()


def signal_of(counts, step=None, det=None, energy_keV=None, alpha=None):
    """A HyperSpy Signal2D of ``counts`` with (scale, units) of its scan and detector axes and the beam's metadata."""
    import hyperspy.api as hs

    signal = hs.signals.Signal2D(counts)
    for axes, calibration in ((signal.axes_manager.navigation_axes, step), (signal.axes_manager.signal_axes, det)):
        for axis in axes if calibration else ():
            axis.scale, axis.units = calibration
    if energy_keV is not None:
        signal.metadata.set_item("Acquisition_instrument.TEM.beam_energy", energy_keV)
    if alpha is not None:
        signal.metadata.set_item("Acquisition_instrument.TEM.convergence_angle", alpha)
    return signal


def same_optics(got: qd.Optics | None, want: qd.Optics) -> bool:
    """Equal optics, the floats to 1e-12 (units are converted on the way)."""
    floats = ("energy_eV", "semiangle_mrad", "scan_step_A", "det_sampling_mrad")
    close = got is not None and all(
        (getattr(got, f) is None) == (getattr(want, f) is None) and (getattr(want, f) is None or math.isclose(getattr(got, f), getattr(want, f), rel_tol=1e-12))
        for f in floats)
    return close and got.with_(**{f: getattr(want, f) for f in floats}) == want


def test_a_hyperspy_signal_with_its_calibration(svc, names, rng):
    counts = rng.poisson(0.8, (6, 7, 16, 12)).astype(np.uint16)
    signal = signal_of(counts, (0.05, "nm"), (1.2, "mrad"), 200, 25.0)
    signal.metadata.General.title = names()
    acq, optics = qd.from_hyperspy(svc, signal)
    assert acq.name == signal.metadata.General.title and acq.shape == counts.shape and acq.dtype == np.uint16
    assert (held(svc, acq) == counts).all()
    assert same_optics(optics, qd.Optics(200e3, 25.0, 0.5, det_sampling_mrad=1.2))

    for step, det, want_step, want_det in (((2.0, "Å"), (0.25, "1/nm"), 2.0, 0.025 * wavelength_A(300e3) * 1e3),
                                           ((0.001, "µm"), (0.02, "A^-1"), 10.0, 0.02 * wavelength_A(300e3) * 1e3),
                                           ((50.0, "pm"), (2e-3, "rad"), 0.5, 2.0)):
        other, optics = qd.from_hyperspy(svc, signal_of(counts, step, det, 300, 21.0), name=names(), layout="compressed")
        assert (held(svc, other) == counts).all() and other.info()["layout"] == "compressed"
        assert same_optics(optics, qd.Optics(300e3, 21.0, want_step, det_sampling_mrad=want_det))


def test_missing_calibration_gives_no_optics_and_given_values_fill_it(svc, names, rng):
    counts = rng.poisson(0.5, (4, 5, 8, 8)).astype(np.uint8)
    assert qd.from_hyperspy(svc, signal_of(counts), name=names())[1] is None  # pixels, no metadata
    assert qd.from_hyperspy(svc, signal_of(counts, energy_keV=300, alpha=20.0), name=names())[1] is None  # no scan step
    assert qd.from_hyperspy(svc, signal_of(counts, (0.5, "nm"), (1.0, "mrad"), 300), name=names())[1] is None  # no semi-angle
    _, optics = qd.from_hyperspy(svc, signal_of(counts, (0.5, "nm"), None, 300), name=names(), semiangle_mrad=20.0)
    assert same_optics(optics, qd.Optics(300e3, 20.0, 5.0))  # detector in pixels: det_sampling_mrad None
    _, optics = qd.from_hyperspy(svc, signal_of(counts, (0.5, "nm"), (0.1, "1/nm")), name=names(), energy_eV=80e3, semiangle_mrad=30.0)
    assert same_optics(optics, qd.Optics(80e3, 30.0, 5.0, det_sampling_mrad=0.01 * wavelength_A(80e3) * 1e3))
    with pytest.raises(ValueError, match=r"energy_eV=200000 was given, but metadata .*beam_energy \(keV\) says 300: leave it out"):
        qd.from_hyperspy(svc, signal_of(counts, energy_keV=300), name=names(), energy_eV=200e3)
    with pytest.raises(ValueError, match=r"the signal's calibration makes no Optics: energy_eV=3e\+08 is outside"):
        qd.from_hyperspy(svc, signal_of(counts, (0.5, "nm"), None, 300e3, 20.0), name=names())  # eV where HyperSpy keeps keV


def test_float_counts_and_stacks(svc, names, rng):
    """Floats are held as svc.put holds them (float32, float64: exactly, not only whole values); a stack of frames
    takes its scan shape."""
    weights = rng.random((3, 4, 6, 5)).astype(np.float32)
    acq, _ = qd.from_hyperspy(svc, signal_of(weights), name=names())
    assert acq.dtype == np.float32 and (held(svc, acq) == weights).all()
    counts = rng.poisson(2.0, (12, 9, 10)).astype(np.uint16)
    stack = signal_of(counts, (0.5, "nm"), (1.0, "mrad"), 300, 20.0)
    acq, optics = qd.from_hyperspy(svc, stack, name=names(), scan_shape=(3, 4))
    assert acq.shape == (3, 4, 9, 10) and (held(svc, acq) == counts.reshape(3, 4, 9, 10)).all() and optics is None  # no scan step


def test_bad_signals_are_refused_and_leave_nothing(svc, names, rng):
    import hyperspy.api as hs

    counts = rng.poisson(0.5, (4, 5, 8, 8)).astype(np.uint16)
    name = names()
    for signal, kwargs, error, message in (
            (signal_of(counts[0]), {}, ValueError, r"stack of 5 frames: give scan_shape=\(rows, cols\)"),
            (signal_of(counts[0]), {"scan_shape": (2, 3)}, ValueError, r"scan_shape \(2, 3\) makes 6 positions, the stack has 5 frames"),
            (signal_of(counts, (0.5, "s")), {}, ValueError, r"the signal's array axis 0 is in 's', not a length \(pm, Å, .*\): convert it, or set its units to ''"),
            (signal_of(counts, None, (1.0, "eV")), {}, ValueError, r"array axis 2 is in 'eV', not an angle \(mrad, rad\) or a spatial frequency \(1/Å"),
            (hs.signals.Signal1D(counts), {}, ValueError, r"1 signal axes, a 4D-STEM signal two .*signal.transpose\(signal_axes=2\)"),
            (signal_of(counts.astype(np.int64)), {}, ValueError, r"dtype int64 is not supported .*: convert the counts first \(signal.change_dtype"),
            (counts, {}, TypeError, "from_hyperspy takes a HyperSpy signal"),
    ):
        with pytest.raises(error, match=message):
            qd.from_hyperspy(svc, signal, name=name, **kwargs)
        assert name not in svc
    mixed = signal_of(counts, (0.5, "nm"))
    mixed.axes_manager.navigation_axes[0].scale = 0.6
    with pytest.raises(ValueError, match=r"the scan step differs between the signal's array axis 0 and the signal's array axis 1 "
                                         r"\(0.5 nm, 0.6 nm\), and Optics holds one: resample"):
        qd.from_hyperspy(svc, mixed, name=name)
    mixed.axes_manager.navigation_axes[0].units = ""
    with pytest.raises(ValueError, match=r"array axis 1 is in 'pixels', not a length"):
        qd.from_hyperspy(svc, mixed, name=name)
    uneven = signal_of(counts, (0.5, "nm"))
    uneven.axes_manager.navigation_axes[0].convert_to_non_uniform_axis()
    with pytest.raises(ValueError, match=r"array axis 1 is not uniform, and Optics holds one step: set its units to ''"):
        qd.from_hyperspy(svc, uneven, name=name)
    assert name not in svc


def test_a_lazy_signal_goes_block_by_block(svc, names, rng, monkeypatch):
    counts = rng.poisson(0.6, (7, 5, 12, 10)).astype(np.uint16)
    monkeypatch.setattr(peer_objects, "BLOCK_BYTES", 2 * 5 * 12 * 10 * 2)  # two scan rows a block: 4 appends
    appended = []
    append = qd.Acquisition.append
    monkeypatch.setattr(qd.Acquisition, "append", lambda self, frames: appended.append(len(frames)) or append(self, frames))
    for layout in ("auto", "dense", "compressed"):
        appended.clear()
        lazy = signal_of(counts, (0.5, "nm"), (1.0, "mrad"), 300, 20.0).as_lazy()
        acq, optics = qd.from_hyperspy(svc, lazy, name=names(), layout=layout)
        assert appended == [10, 10, 10, 5] and not acq.info()["live"]
        assert (held(svc, acq) == counts).all() and same_optics(optics, qd.Optics(300e3, 20.0, 5.0, det_sampling_mrad=1.0))
        if layout != "auto" or svc.backend == "cpu":  # auto on a CPU shard where it fits: dense
            assert acq.info()["layout"] == ("dense" if layout == "auto" else layout)

    def unreadable(block, block_info=None):
        if block_info[0]["array-location"][0][0] >= 4:
            raise OSError("scan rows 4 and after are unreadable")
        return block

    bad = signal_of(counts).as_lazy()
    bad.data = bad.data.rechunk((1, 5, 12, 10)).map_blocks(unreadable, dtype=np.uint16)
    name = names()
    appended.clear()
    with pytest.raises(OSError, match="scan rows 4 and after are unreadable"):
        qd.from_hyperspy(svc, bad, name=name)
    assert appended == [10, 10] and name not in svc  # released after the first two blocks went


def test_an_export_read_by_hyperspy_comes_back_the_same(svc, names, rng, tmp_path):
    import hyperspy.api as hs

    counts = rng.poisson(0.7, (5, 6, 16, 12)).astype(np.uint16)
    for optics in (qd.Optics(300e3, 20.0, 0.8, det_sampling_mrad=1.5), qd.Optics(60e3, 31.5, 1.7)):
        acq = svc.put(counts, name=names())
        path = acq.export(tmp_path / f"{optics.energy_eV:.0f}.hspy", optics)
        for lazy in (False, True):
            back, got = qd.from_hyperspy(svc, hs.load(path, lazy=lazy), name=names())
            assert (held(svc, back) == counts).all() and same_optics(got, optics)
    plain = svc.put(counts, name=names())
    back, got = qd.from_hyperspy(svc, hs.load(plain.export(tmp_path / "plain.hspy")), name=names())
    assert got is None and (held(svc, back) == counts).all()


def test_a_py4dstem_datacube(svc, names, rng):
    py4DSTEM = pytest.importorskip("py4DSTEM", reason="py4DSTEM 0.14 pins numpy<2, so it is not installed beside this package: "
                                   "pip install --no-deps py4DSTEM==0.14.18 (and what it imports) into a folder on PYTHONPATH")
    counts = rng.poisson(0.9, (5, 4, 10, 12)).astype(np.uint16)
    datacube = py4DSTEM.DataCube(data=counts, name=names())
    acq, optics = qd.from_py4dstem(svc, datacube, energy_eV=300e3)
    assert acq.name == datacube.name and (held(svc, acq) == counts).all() and optics is None  # pixels, no semi-angle
    datacube.calibration.set_R_pixel_size(0.7)
    datacube.calibration.set_R_pixel_units("A")
    datacube.calibration.set_Q_pixel_size(0.02)
    datacube.calibration.set_Q_pixel_units("A^-1")
    datacube.calibration.set_convergence_semiangle_mrad(22.0)
    _, optics = qd.from_py4dstem(svc, datacube, name=names(), energy_eV=300e3)
    assert same_optics(optics, qd.Optics(300e3, 22.0, 0.7, det_sampling_mrad=0.02 * wavelength_A(300e3) * 1e3))
    assert qd.from_py4dstem(svc, datacube, name=names())[1] is None  # a DataCube holds no beam energy
    datacube.calibration.set_R_pixel_units("nm")
    datacube.calibration.set_Q_pixel_units("mrad")
    _, optics = qd.from_py4dstem(svc, datacube, name=names(), energy_eV=200e3, layout="compressed")
    assert same_optics(optics, qd.Optics(200e3, 22.0, 7.0, det_sampling_mrad=0.02))
    datacube.calibration.set_R_pixel_units("s")
    with pytest.raises(ValueError, match=r"the R pixel is in 's', not a length .*set_R_pixel_units\('pixels'\)"):
        qd.from_py4dstem(svc, datacube, name=names(), energy_eV=200e3)
    with pytest.raises(TypeError, match="from_py4dstem takes a py4DSTEM DataCube"):
        qd.from_py4dstem(svc, counts)


def test_an_emd_export_read_by_py4dstem_comes_back_with_its_optics(svc, names, rng, tmp_path):
    py4DSTEM = pytest.importorskip("py4DSTEM", reason="py4DSTEM 0.14 pins numpy<2, so it is not installed beside this package: "
                                   "pip install --no-deps py4DSTEM==0.14.18 (and what it imports) into a folder on PYTHONPATH")
    counts = rng.poisson(0.9, (5, 4, 10, 12)).astype(np.uint16)
    optics = qd.Optics(300e3, 20.0, 0.8, det_sampling_mrad=1.5)
    acq = svc.put(counts, name=names())
    datacube = py4DSTEM.read(acq.export(tmp_path / "scan.emd", optics))
    back, got = qd.from_py4dstem(svc, datacube, name=names())  # the energy from the export's calibration
    assert (held(svc, back) == counts).all() and same_optics(got, optics)
    with pytest.raises(ValueError, match=r"energy_eV=200000 was given, but the calibration's beam_energy_keV says 300"):
        qd.from_py4dstem(svc, datacube, name=names(), energy_eV=200e3)
