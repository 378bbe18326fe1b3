"""Optics, detector calibration and DPC from the residents, on synthetic crystals through the service."""

from __future__ import annotations

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.io.synthetic import crystal, crystal_geometry, projected_potential
from qgpu_dask.phase import calibration
from qgpu_dask.phase.optics import chi, grad_chi, interaction_constant, wavelength_A

SCAN, DET = (48, 48), (40, 40)


def test_wavelength_and_interaction_constant():
    assert round(wavelength_A(300e3), 6) == 0.019687 and round(wavelength_A(200e3), 6) == 0.025079
    assert round(interaction_constant(300e3) * 1e4, 3) == 6.526  # rad / (V A)


def test_chi_and_its_gradient():
    optics = qd.Optics(300e3, 30, 0.4, aberrations={"C10": -150, "C12": 40, "phi12": 0.3, "C21": 300, "phi21": 1.0, "C30": 1e4})
    k = np.array([0.7, -0.2, 0.05]), np.array([-0.4, 0.9, 0.0])
    h = 1e-6
    gx, gy = grad_chi(*k, optics)
    assert np.allclose(gx, (chi(k[0] + h, k[1], optics) - chi(k[0] - h, k[1], optics)) / (2 * h), rtol=1e-6)
    assert np.allclose(gy, (chi(k[0], k[1] + h, optics) - chi(k[0], k[1] - h, optics)) / (2 * h), rtol=1e-6)
    defocus = qd.Optics(300e3, 30, 0.4, aberrations={"C10": -100})  # chi = pi lambda C10 |k|^2
    assert np.allclose(chi(0.3, 0.4, defocus), np.pi * wavelength_A(300e3) * -100 * 0.25)


@pytest.mark.parametrize("bad, match", [
    ({"scan_step_A": 0}, "scan_step_A must be a finite number > 0"),
    ({"energy_eV": "300kV"}, "energy_eV must be a number"),
    ({"semiangle_mrad": float("nan")}, "semiangle_mrad must be a finite number > 0"),
    ({"aberrations": {"C11": 3}}, r"unknown aberrations \['C11'\]"),
    ({"energy_eV": 300}, r"energy_eV=300 is outside the beam energies of electron microscopes \(1000 to 3\.5e\+06 eV\): "
                         r"the energy is in eV, so 300 keV is energy_eV=300e3"),
    ({"energy_eV": 3e9}, r"energy_eV=3e\+09 is outside the beam energies"),
])
def test_bad_optics(bad, match):
    with pytest.raises(ValueError, match=match):
        qd.Optics(**({"energy_eV": 300e3, "semiangle_mrad": 20, "scan_step_A": 0.5} | bad))


@pytest.fixture(scope="module")
def sample():
    data = crystal(SCAN, DET, dose=4000, seed=1)
    geometry = crystal_geometry(DET)
    return data, geometry, projected_potential(SCAN, geometry)[0]


@pytest.mark.parametrize("shape", [(6, 9), (7, 4), (64, 48)])
@pytest.mark.parametrize("odd_axis", [-1, 0, 1])
def test_reflected_spectrum_is_the_fft_of_the_reflected_field(shape, odd_axis):
    """The quadrant of the 2N-point FFT of a component reflected across its far edges (odd across odd_axis),
    computed from cosine and sine sums of the component itself."""
    x = np.random.default_rng(shape[0]).normal(size=shape)
    signs = [-1.0 if axis == odd_axis else 1.0 for axis in (0, 1)]
    top = np.concatenate([x, signs[1] * x[:, ::-1]], axis=1)
    reference = np.fft.fft2(np.concatenate([top, signs[0] * top[::-1]], axis=0))[: shape[0] + 1, : shape[1] + 1]
    got = calibration.reflected_spectrum(x, odd_axis)
    assert got.shape == reference.shape and np.abs(got - reference).max() <= 1e-13 * np.abs(reference).max()


@pytest.mark.parametrize("turn, rotation, flip", [
    ("none", 0, False),
    ("rot90", -90, False),
    ("rot180", 180, False),
    ("transposed", 0, True),
])
def test_calibrate_and_dpc(svc, names, sample, turn, rotation, flip):
    data, geometry, potential = sample
    seen = {"none": data, "rot90": np.rot90(data, 1, axes=(2, 3)), "rot180": np.rot90(data, 2, axes=(2, 3)),
            "transposed": data.transpose(0, 1, 3, 2)}[turn]
    acq = svc.put(np.ascontiguousarray(seen), name=names())
    cal = acq.calibrate(qd.Optics(300e3, 20.0, 0.5))
    assert abs(cal.det_sampling_mrad - 20.0 / geometry.bf_radius) <= 0.03 * 20.0 / geometry.bf_radius
    assert abs((cal.rotation_deg - rotation + 180) % 360 - 180) <= 2.0 and cal.flip is flip
    phase = acq.dpc(cal)
    assert phase.shape == SCAN and calibration.correlation(phase, potential) >= 0.95
    com = acq.center_of_mass()
    assert com.shape == (2, *SCAN) and np.isfinite(com).all()


def test_calibration_errors(svc, names, sample):
    acq = svc.put(np.full((4, 4, 16, 16), 5, np.uint16), name=names())  # flat patterns: no bright-field disk
    with pytest.raises(ValueError, match="has no bright-field disk"):
        acq.calibrate(qd.Optics(300e3, 20.0, 0.5))
    data = sample[0]
    real = svc.put(data, name=names())
    with pytest.raises(ValueError, match="dpc needs det_sampling_mrad, rotation_deg, flip, bf_center_px in the optics"):
        real.dpc(qd.Optics(300e3, 20.0, 0.5))
    assert (real.frame(0, 0) == data[0, 0]).all()
