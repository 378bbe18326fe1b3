"""The SSB kernels against plain references: the bright-field pixel images of both layouts (==), the fused
sideband sum (CPU twin against explicit NumPy, CUDA against the CPU twin) and the phase on both devices."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import cupy_available
from qgpu_dask import Optics
from qgpu_dask.resident.compressed import CompressedCounts
from qgpu_dask.resident.dense import DenseCounts
from qgpu_dask.phase import cpu, sideband, simulate
from qgpu_dask.phase.optics import chi, chi_table, probe_spectrum

needs_gpu = pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
OPTICS = Optics(300e3, 25.0, 0.4, aberrations={"C10": -80.0, "C12": 30.0, "phi12": 0.4, "C21": 900.0, "phi21": 1.0, "C30": 2e5})


def residents(counts: np.ndarray, xp=np) -> list:
    flat = xp.asarray(counts.reshape(counts.shape[0] * counts.shape[1], -1))
    return [DenseCounts("d", flat, counts.shape), CompressedCounts.encode("c", flat, counts.shape)]


def random_counts(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = rng.poisson(0.4, (9, 11, 12, 10)).astype(np.uint16)
    counts[2, 3, 4] = 65535  # a saturated row of counts
    return counts


def sideband_inputs(seed: int = 1):
    """Random G on a 14 x 12 scan (half spectrum) and 60 pixels in and around the aperture."""
    rng = np.random.default_rng(seed)
    rows, cols, n = 14, 12, 60
    kmax = OPTICS.aperture_k
    ky, kx = rng.uniform(-1.1 * kmax, 1.1 * kmax, (2, n))
    G = (rng.standard_normal((n, rows, cols // 2 + 1)) + 1j * rng.standard_normal((n, rows, cols // 2 + 1))).astype(np.complex64)
    dqy, dqx = 1 / (rows * OPTICS.scan_step_A), 1 / (cols * OPTICS.scan_step_A)
    return G, ky, kx, dqy, dqx, kmax


def plain_sideband_sum(G, ky, kx, dqy, dqx):
    """The sum written out with probe_spectrum on every (k, Q): the reference of both twins."""
    n, rows, half = G.shape
    qy = np.fft.fftfreq(rows) * rows * dqy
    qx = np.arange(half) * dqx
    total = np.zeros((rows, half), np.complex128)
    weight = np.zeros((rows, half))
    for k in range(n):
        here = probe_spectrum(kx[k], ky[k], OPTICS)
        for r in range(rows):
            for c in range(half):
                gamma = np.conj(here) * probe_spectrum(kx[k] - qx[c], ky[k] - qy[r], OPTICS) - here * np.conj(probe_spectrum(kx[k] + qx[c], ky[k] + qy[r], OPTICS))
                if abs(gamma) > sideband.GAMMA_FLOOR:
                    total[r, c] += G[k, r, c] * np.conj(gamma) / abs(gamma)
                    weight[r, c] += abs(gamma)
    return total, weight


def test_pixel_images_of_both_layouts():
    counts = random_counts()
    pixels = np.array([0, 7, 8, 9, 44, 45, 119, 3])
    expected = counts.reshape(99, 120)[:, pixels].T.astype(np.float32)
    for resident in residents(counts):
        images = resident.pixel_images(pixels)
        assert images.dtype == np.float32 and images.flags.c_contiguous and (images == expected).all(), resident.layout


@pytest.mark.gpu
@needs_gpu
def test_pixel_images_on_the_gpu():
    counts = random_counts(2)
    pixels = np.arange(120)[::-3].copy()
    expected = counts.reshape(99, 120)[:, pixels].T.astype(np.float32)
    import cupy

    for resident in residents(counts, cupy):
        images = resident.pixel_images(pixels)
        assert images.dtype == np.float32 and images.flags.c_contiguous and (images.get() == expected).all(), resident.layout


def test_chi_table_evaluation_in_the_cpu_twin():
    x, y = 0.31, -0.47
    assert abs(cpu.chi_at(x, y, chi_table(OPTICS)) - float(chi(x, y, OPTICS))) <= 1e-12 * abs(float(chi(x, y, OPTICS)))


def test_cpu_sideband_sum_against_the_plain_sum():
    G, ky, kx, dqy, dqx, kmax = sideband_inputs()
    total, weight = cpu.sideband_sum(G, ky, kx, chi(kx, ky, OPTICS), chi_table(OPTICS), dqy, dqx, kmax**2, sideband.GAMMA_FLOOR)
    ref_total, ref_weight = plain_sideband_sum(G, ky, kx, dqy, dqx)
    assert (weight > 0).sum() > 0.3 * weight.size and (weight == 0).sum() > 0  # both kinds of frequency occur
    assert np.abs(total - ref_total).max() <= 1e-9 * np.abs(ref_total).max()
    assert np.abs(weight - ref_weight).max() <= 1e-9 * ref_weight.max()


@pytest.mark.gpu
@needs_gpu
def test_cuda_sideband_sum_against_the_cpu_twin():
    import cupy

    from qgpu_dask.phase import cuda

    G, ky, kx, dqy, dqx, kmax = sideband_inputs(3)
    args = (chi(kx, ky, OPTICS), chi_table(OPTICS), dqy, dqx, kmax**2, sideband.GAMMA_FLOOR)
    total, weight = cpu.sideband_sum(G, ky, kx, *args)
    on_gpu = cuda.sideband_sum(cupy.asarray(G), ky, kx, *args)
    # chi and Gamma in float32 registers: agreement to float32 rounding of the terms
    assert np.abs(on_gpu[0].get() - total).max() <= 1e-5 * np.abs(total).max()
    assert np.abs(on_gpu[1].get() - weight).max() <= 1e-5 * weight.max()


@pytest.mark.gpu
@needs_gpu
def test_ssb_phase_on_cpu_and_gpu():
    import cupy

    optics = Optics(300e3, 20.0, 0.5, aberrations={"C10": -40.0})
    potential = simulate.atoms_potential((96, 96), 0.125, 3.9)
    counts = simulate.acquisition(optics, (24, 24), (48, 48), potential, 4, dose=1e5, seed=2)
    cal = optics.with_(det_sampling_mrad=optics.wavelength_A * 1e3 / (24 * 0.5), rotation_deg=0.0, flip=False, bf_center_px=(24.0, 24.0))
    indices, ky, kx = sideband.bright_field_pixels(cal, (48, 48))
    images = []
    for xp in (np, cupy):
        for resident in residents(counts, xp):
            images.append(cupy.asnumpy(sideband.phase(sideband.spectrum(resident, indices), ky, kx, cal, xp)))
    assert (images[0] == images[1]).all() and (images[2] == images[3]).all()  # both layouts, same device: same bits
    assert np.abs(images[2] - images[0]).max() <= 1e-5 * np.abs(images[0]).max()
