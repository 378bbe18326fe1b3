"""Calibration, aberration fit and SSB against an independent simulator: abTEM multislice of SrTiO3 [001].

One unit cell thick (3.9 A), 4 x 4 cells scanned on 40 x 40 positions, 300 kV,
20 mrad, defocus and twofold astigmatism known, Poisson noise of 1e5
electrons per position. abTEM indexes arrays (x, y): its x is our row axis,
so its azimuth is measured from our rows and phi12 maps to pi/2 - phi12 here
(C10 and |C12| are the same). The simulation is cached in the session's
temporary directory.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.ssb.calibration import correlation
from qgpu_dask.ssb.optics import interaction_constant, wavelength_A

A = 3.905  # SrTiO3 lattice constant, A
CELLS, POSITIONS = 4, 40
STEP = CELLS * A / POSITIONS
ABERRATIONS = {"C10": -60.0, "C12": 20.0, "phi12": 0.5}  # abTEM's frame


@pytest.fixture(scope="session")
def strontium_titanate(tmp_path_factory):
    """(counts (40, 40, 65, 65) uint32, abTEM's detector sampling in mrad, sigma V_proj on the scan grid)."""
    abtem = pytest.importorskip("abtem")
    from ase import Atoms

    cache = tmp_path_factory.getbasetemp() / "abtem-srtio3.npz"
    if not cache.exists():
        abtem.config.set({"device": "cpu"})
        cell = Atoms("SrTiO3", scaled_positions=[(0, 0, 0), (0.5, 0.5, 0.5), (0.5, 0.5, 0), (0.5, 0, 0.5), (0, 0.5, 0.5)],
                     cell=[A, A, A], pbc=True)
        potential = abtem.Potential(cell * (CELLS, CELLS, 1), sampling=0.05, slice_thickness=A / 2, projection="infinite")
        probe = abtem.Probe(energy=300e3, semiangle_cutoff=20, aberrations=ABERRATIONS)
        scan = abtem.GridScan(start=(0, 0), end=(CELLS * A, CELLS * A), gpts=(POSITIONS, POSITIONS), endpoint=False)
        measured = probe.scan(potential, scan=scan, detectors=abtem.PixelatedDetector(max_angle=40)).compute()
        projected = potential.project().compute()
        np.savez(cache, intensity=np.asarray(measured.array), sampling=np.asarray(measured.sampling), projected=np.asarray(projected.array))
    saved = np.load(cache)
    intensity = saved["intensity"]
    counts = np.random.default_rng(0).poisson(intensity / intensity.sum(axis=(2, 3), keepdims=True) * 1e5).astype(np.uint32)
    sampling_mrad = float(saved["sampling"][0]) * wavelength_A(300e3) * 1e3
    return counts, sampling_mrad, interaction_constant(300e3) * on_scan_grid(saved["projected"])


def on_scan_grid(fine: np.ndarray) -> np.ndarray:
    """A periodic image over the scanned cells, low-passed to the scan's band and evaluated at the scan positions."""
    n = fine.shape[0]
    spectrum = np.fft.fft2(fine)
    index = np.fft.fftfreq(n) * n
    keep = (np.abs(index)[:, None] < POSITIONS / 2) & (np.abs(index)[None, :] < POSITIONS / 2)
    rows, cols = np.nonzero(keep)
    at = np.arange(POSITIONS) / POSITIONS  # scan positions as fractions of the period
    ey = np.exp(2j * np.pi * np.outer(at, index[rows]))
    ex = np.exp(2j * np.pi * np.outer(at, index[cols]))
    return ((ey * spectrum[keep]) @ ex.T).real / n**2


def test_calibration_matches_abtem(svc, names, strontium_titanate):
    counts, sampling_mrad, _ = strontium_titanate
    for turn, rotation, flip in (("none", 0.0, False), ("rot90", -90.0, False), ("transposed", 0.0, True)):
        seen = {"none": counts, "rot90": np.rot90(counts, 1, axes=(2, 3)), "transposed": counts.transpose(0, 1, 3, 2)}[turn]
        acq = svc.put(np.ascontiguousarray(seen), name=names())
        cal = acq.calibrate(qd.Optics(300e3, 20.0, STEP))
        assert abs(cal.det_sampling_mrad / sampling_mrad - 1) <= 0.03
        assert abs((cal.rotation_deg - rotation + 180) % 360 - 180) <= 2.0 and cal.flip is flip, (turn, cal)
        acq.release()


def test_fit_and_ssb_match_abtem(svc, names, strontium_titanate):
    counts, _, truth = strontium_titanate
    acq = svc.put(counts, name=names())
    cal = acq.calibrate(qd.Optics(300e3, 20.0, STEP))
    fitted = acq.fit_aberrations(cal, c10_range_A=300.0)
    assert abs(fitted.rotation_deg) <= 1.0 and fitted.flip is False
    assert abs(fitted.aberrations["C10"] / ABERRATIONS["C10"] - 1) <= 0.10
    assert abs(fitted.aberrations["C12"] / ABERRATIONS["C12"] - 1) <= 0.20
    ours = math.pi / 2 - ABERRATIONS["phi12"]
    assert abs((fitted.aberrations["phi12"] - ours + math.pi / 2) % math.pi - math.pi / 2) <= 0.1
    phase = acq.ssb(fitted)
    assert correlation(phase, truth) >= 0.9  # atoms positive: the sign is right
