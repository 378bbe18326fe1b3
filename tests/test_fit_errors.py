"""Whether the numbers of calibrate and fit_aberrations can be trusted: their quoted standard errors against the
truth of simulated acquisitions (``qgpu_dask.phase.simulate``).

Most fits run in this process on a real CPU resident with the functions the shard calls (``calibration``,
``sideband``, ``fit``), so that 20 of them fit in CI's time; one goes through the service and must give the
same optics.
"""

from __future__ import annotations

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.device import cupy_or_none
from qgpu_dask.resident.dense import DenseCounts
from qgpu_dask.phase import calibration, fit, sideband, simulate
from qgpu_dask.phase.optics import wavelength_A

SCAN, DET, OVER, STEP, DOSE = (16, 16), (32, 32), 4, 0.5, 1e5
SAMPLING = wavelength_A(300e3) * 1e3 / (SCAN[0] * STEP)  # the simulation's detector sampling, mrad per pixel
START = {"C10": -55.0}  # the fits search C10 within +/- 50 A of it


def acquisition(truth: dict, turn: int, seed: int, spacing_A: float) -> np.ndarray:
    """Poisson counts of a jittered lattice seen through ``truth``'s aberrations, the detector turned by
    ``turn`` x 90 deg (a rotation_deg of -90 x turn)."""
    potential = simulate.atoms_potential((SCAN[0] * OVER, SCAN[1] * OVER), STEP / OVER, spacing_A, seed=seed)
    counts = simulate.acquisition(qd.Optics(300e3, 20.0, STEP, aberrations=truth), SCAN, DET, potential, OVER, dose=DOSE, seed=seed + 100)
    return np.ascontiguousarray(np.rot90(counts, turn, axes=(2, 3)))


def resident(counts: np.ndarray, xp=np) -> DenseCounts:
    """The counts as a dense resident of this process, on the device of array module ``xp``."""
    return DenseCounts("sim", xp.asarray(counts.reshape(SCAN[0] * SCAN[1], -1)), counts.shape)


def calibrate(r: DenseCounts, optics: qd.Optics) -> qd.Optics:
    """``Acquisition.calibrate`` in this process."""
    disk = calibration.bright_field_disk(r.reduce(op="mean"))
    images = r.virtual_images(np.concatenate([calibration.moment_masks(r.det_shape), calibration.dark_field_ring(r.det_shape, disk)[None]]))
    return calibration.calibrated(optics, disk, images[:3], images[3])[0]


def fit_aberrations(r: DenseCounts, optics: qd.Optics, c10_range_A: float = 50.0) -> qd.Optics:
    """``Acquisition.fit_aberrations`` in this process."""
    spec = sideband.spectrum(r, sideband.bright_field_pixels(optics, r.det_shape)[0])
    k0 = sideband.bright_field_pixels(optics.with_(rotation_deg=0.0), r.det_shape)[1:]
    return fit.fit(spec, k0, optics, c10_range_A, r.xp)["optics"]


def off(found: float, truth: float, period: float) -> float:
    """found - truth, wrapped into [-period / 2, period / 2)."""
    return (found - truth + period / 2) % period - period / 2


def test_fit_standard_errors_cover_the_truth():
    rng = np.random.default_rng(0)
    within = {"rotation_deg": [], "C10": [], "C12": [], "phi12": []}
    for i in range(20):
        truth = {"C10": rng.uniform(-80, -30), "C12": rng.uniform(4, 20), "phi12": rng.uniform(-1.5, 1.5)}
        turn = int(rng.integers(0, 4))
        r = resident(acquisition(truth, turn, seed=i, spacing_A=rng.uniform(3, 5)))
        fitted = fit_aberrations(r, calibrate(r, qd.Optics(300e3, 20.0, STEP, det_sampling_mrad=SAMPLING, aberrations=START)))
        errors = {"rotation_deg": off(fitted.rotation_deg, -90.0 * turn, 360), "C10": fitted.aberrations["C10"] - truth["C10"],
                  "C12": fitted.aberrations["C12"] - truth["C12"], "phi12": off(fitted.aberrations["phi12"], truth["phi12"], np.pi)}
        for name, error in errors.items():
            within[name].append(abs(error) <= 2 * fitted.uncertainties[name] < np.inf)
    # measured: rotation 0.90, C10 0.80, C12 0.90, phi12 0.95; C10 is short (its errors have tails the jackknife misses: docs/physics.md)
    wanted = {"rotation_deg": 0.9, "C10": 0.8, "C12": 0.9, "phi12": 0.9}
    assert {name: np.mean(w) >= wanted[name] for name, w in within.items()} == dict.fromkeys(within, True), within


@pytest.mark.parametrize("c10, turn", [(-40.0, 0), (-100.0, 1)])
def test_defocus_only_calibration_is_an_estimate_with_its_error(c10, turn):
    r = resident(acquisition({"C10": c10}, turn, seed=7, spacing_A=3.9))
    cal = calibrate(r, qd.Optics(300e3, 20.0, STEP, det_sampling_mrad=SAMPLING, aberrations=START))
    error = off(cal.rotation_deg, -90.0 * turn, 360)  # 2.1 deg at -40 A, -6.1 deg at -100 A
    assert 0 < cal.uncertainties["rotation_deg"] and abs(error) <= 2 * cal.uncertainties["rotation_deg"]
    fitted = fit_aberrations(r, cal)  # -100 A: a standard error above 3 deg, so the fit searches +/- 90 deg
    assert abs(off(fitted.rotation_deg, -90.0 * turn, 360)) <= 2.0 and abs(fitted.aberrations["C10"] - c10) <= 0.05 * abs(c10)


def test_fit_through_the_service_is_the_fit_here(svc, names):
    truth = {"C10": -60.0, "C12": 12.0, "phi12": 0.4}
    counts = acquisition(truth, 0, seed=3, spacing_A=3.9)
    acq = svc.put(counts, name=names())
    optics = qd.Optics(300e3, 20.0, STEP, det_sampling_mrad=SAMPLING, aberrations=START)
    cal = acq.calibrate(optics)
    here = calibrate(resident(counts), optics)
    assert cal == here and cal.uncertainties["rotation_deg"] > 0
    fitted = acq.fit_aberrations(cal, c10_range_A=50.0)
    xp = cupy_or_none() if svc.backend == "gpu" else np  # the arithmetic of the shard, to the bit
    assert fitted == fit_aberrations(resident(counts, xp), here)
    assert all(abs(fitted.aberrations[k] - truth[k]) <= 2 * fitted.uncertainties[k] for k in truth)
    moments = resident(counts).virtual_images(calibration.moment_masks(DET))
    assert np.array_equal(acq.dpc(fitted), calibration.dpc(moments, fitted))  # dpc turns the CoM by the fitted rotation
