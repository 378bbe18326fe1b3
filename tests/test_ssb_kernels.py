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
from qgpu_dask.phase.optics import chi, chi_table, monomials, probe_spectrum

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


def test_cpu_spectrum_in_threads_equals_one_rfft2(monkeypatch):
    """The CPU twin's spectrum gathers and transforms slices of the pixels in threads: the same bits as one rfft2
    of all the images, for dense counts and for images (compressed residents' path)."""
    rng = np.random.default_rng(6)
    counts = rng.poisson(20.0, (8, 6, 12, 10)).astype(np.uint16)
    pixels = np.array([0, 7, 8, 9, 44, 45, 119, 3, 60, 61, 62])
    monkeypatch.setattr(cpu, "SPECTRUM_BYTES", 2 * 4 * 48)  # two images a slice: six slices
    images = counts.reshape(48, 120)[:, pixels].T.astype(np.float32).reshape(-1, 8, 6)
    want = np.fft.rfft2(images).astype(np.complex64)
    assert (cpu.scan_spectrum(counts.reshape(48, 120), pixels, (8, 6)) == want).all()
    out = np.empty_like(want)
    cpu.spectrum_of(images, out)
    assert (out == want).all()


@pytest.mark.gpu
@needs_gpu
def test_spectrum_of_dense_counts_on_the_gpu():
    """G of dense counts on a GPU (images through cuFFT) against the CPU's (threads of NumPy's rfft2)."""
    import cupy

    rng = np.random.default_rng(4)
    counts = rng.poisson(20.0, (24, 20, 12, 10)).astype(np.uint16)
    pixels = np.array([0, 7, 8, 9, 44, 45, 119, 3])
    want = sideband.spectrum(residents(counts)[0], pixels)
    resident = residents(counts, cupy)[0]
    got = sideband.spectrum(resident, pixels)
    assert got.G.shape == want.G.shape and np.abs(got.G.get() - want.G).max() <= 2e-6 * np.abs(want.G).max()
    assert abs(got.scale - want.scale) <= 1e-6 * want.scale
    chunked = sideband.spectrum(resident, pixels, chunk_bytes=3 * 4 * 24 * 20)  # 3 images a chunk: 3, 3, 2
    assert np.abs(chunked.G.get() - want.G).max() <= 2e-6 * np.abs(want.G).max()


def test_bright_field_pixels_made_once_per_calibration():
    """Another aberration asks for the same pixels again: the same values, in new arrays a caller may change."""
    cal = OPTICS.with_(det_sampling_mrad=1.0, rotation_deg=12.0, flip=True, bf_center_px=(20.5, 23.0))
    first = sideband.bright_field_pixels(cal, (48, 50))
    kept = [a.copy() for a in first]
    for a in first:
        a[:] = 0
    again = sideband.bright_field_pixels(cal.with_(aberrations={"C10": 5.0}), (48, 50))
    assert all((a == b).all() for a, b in zip(again, kept)) and len(kept[0]) > 100
    turned = sideband.bright_field_pixels(cal.with_(rotation_deg=13.0), (48, 50))
    assert (turned[0] == kept[0]).all() and not (turned[1] == kept[1]).all()


def test_chi_monomials_evaluation_in_the_cpu_twin():
    x, y = 0.31, -0.47
    poly = monomials(chi_table(OPTICS))[1]
    assert abs(cpu.chi_of(x, y, poly) - float(chi(x, y, OPTICS))) <= 1e-12 * abs(float(chi(x, y, OPTICS)))


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


FIT_OPTICS = OPTICS.with_(det_sampling_mrad=0.9)  # a pixel a ramp of 0.046 1/A: about 4 % of the aperture


def fit_inputs(seed: int = 4):
    """Random G on 7 x 5 scan frequencies, 80 pixels in and around the aperture (k at rotation 0) and trial rows
    (C10, C12a, C12b, rotation_deg) of the aberration fit."""
    rng = np.random.default_rng(seed)
    n, kmax = 80, OPTICS.aperture_k
    k0 = rng.uniform(-1.05 * kmax, 1.05 * kmax, (2, n))
    qy = np.fft.fftfreq(14, OPTICS.scan_step_A)[::2]
    qx = np.fft.rfftfreq(9, OPTICS.scan_step_A)
    G = (rng.standard_normal((n, qy.size, qx.size)) + 1j * rng.standard_normal((n, qy.size, qx.size))).astype(np.complex64)
    rows = np.column_stack([rng.uniform(-300, 300, 5), rng.uniform(-40, 40, (5, 2)), rng.uniform(-30, 30, 5)])
    return G, k0, qy, qx, rows


def plain_fit_terms(G, k0, qy, qx, rows, step):
    """The fit's signal terms written out with ``chi`` of the whole optics: the reference of both twins."""
    pixel, cutoff = FIT_OPTICS.k_per_pixel(), FIT_OPTICS.aperture_k

    def inside(x, y):
        return np.clip((cutoff - np.hypot(x, y)) / pixel + 0.5, 0, 1)

    out = np.zeros((len(rows), qy.size * qx.size))
    for p, (c10, a, b, turn) in enumerate(rows):
        optics = FIT_OPTICS.with_(aberrations={**FIT_OPTICS.aberrations, "C10": c10, "C12": np.hypot(a, b), "phi12": np.arctan2(b, a) / 2})
        t = np.radians(turn)
        y = np.cos(t) * k0[0][::step] - np.sin(t) * k0[1][::step]
        x = np.sin(t) * k0[0][::step] + np.cos(t) * k0[1][::step]
        for i, (fy, fx) in enumerate((fy, fx) for fy in qy for fx in qx):
            om, op = inside(x, y) * inside(x - fx, y - fy), inside(x, y) * inside(x + fx, y + fy)
            here = chi(x, y, optics)
            gamma = om * np.exp(1j * (here - chi(x - fx, y - fy, optics))) - op * np.exp(1j * (chi(x + fx, y + fy, optics) - here))
            size = np.abs(gamma)
            kept = size > sideband.GAMMA_FLOOR
            g = G.reshape(len(G), -1)[::step, i]
            out[p, i] = abs((g * np.conj(gamma) * np.maximum(om, op) / np.where(kept, size, 1))[kept].sum())
    return out


def fit_arguments(G, k0, qy, qx, rows):
    """``fit_terms``'s arguments as ``phase.fit.Signal`` makes them, the fixed ones (``fit_setup``'s) as a tuple (the
    rest of chi: OPTICS without C10 and C12)."""
    rest = FIT_OPTICS.with_(aberrations={k: v for k, v in FIT_OPTICS.aberrations.items() if k not in ("C10", "C12", "phi12")})
    t = np.radians(rows[:, 3])
    params = np.column_stack([rows[:, :3] * np.pi * FIT_OPTICS.wavelength_A, np.cos(t), np.sin(t)])
    Gt = np.ascontiguousarray(G.reshape(len(G), -1).T)
    fixed = np.stack(k0, axis=1), qy, qx, chi_table(rest)
    return Gt, fixed, params, FIT_OPTICS.aperture_k, FIT_OPTICS.k_per_pixel(), sideband.GAMMA_FLOOR


@pytest.mark.parametrize("step", [1, 3])
def test_cpu_fit_terms_against_the_plain_signal(step):
    G, k0, qy, qx, rows = fit_inputs()
    Gt, fixed, *rest = fit_arguments(G, k0, qy, qx, rows)
    terms = cpu.fit_terms(Gt, cpu.fit_setup(*fixed), *rest, step)
    reference = plain_fit_terms(G, k0, qy, qx, rows, step)
    assert (reference > 0).sum() == reference.size - len(rows) and terms.shape == reference.shape  # zero at Q = 0 only
    assert np.abs(terms - reference).max() <= 1e-9 * reference.max()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("step", [1, 3])
def test_cuda_fit_terms_against_the_cpu_twin(step):
    import cupy

    from qgpu_dask.phase import cuda

    G, k0, qy, qx, rows = fit_inputs(5)
    Gt, fixed, *rest = fit_arguments(G, k0, qy, qx, rows)
    terms = cpu.fit_terms(Gt, cpu.fit_setup(*fixed), *rest, step)
    on_gpu = cuda.fit_terms(cupy.asarray(Gt), cuda.fit_setup(*fixed), *rest, step).get()
    # chi and Gamma in float32 registers: agreement to float32 rounding of the phases (about 1e-6 rad of ~100)
    assert np.abs(on_gpu - terms).max() <= 1e-4 * terms.max()
