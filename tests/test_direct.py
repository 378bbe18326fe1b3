"""Regularized direct ptychography: the normal equations against explicit per-frequency matrices and
np.linalg.solve, noise-free data of the model back to the truth, and the service on a forward-model
acquisition scanned coarser than the probe's information limit."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import qgpu_dask as qd
from conftest import asked_into, cupy_available
from qgpu_dask.phase import direct, direct_cpu, simulate
from qgpu_dask.phase.calibration import correlation
from qgpu_dask.phase.optics import chi, chi_table, interaction_constant, probe_spectrum
from qgpu_dask.phase.sideband import Spectrum
from qgpu_dask.queries.results import RESULT_PREFIX, memory_of

OPTICS = qd.Optics(300e3, 20.0, 1.0, det_sampling_mrad=1.0, rotation_deg=0.0, flip=False, bf_center_px=(0.0, 0.0),
                   aberrations={"C10": -50.0, "C12": 20.0, "phi12": 0.3})
SCAN, U = (10, 8), 3
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # direct_gpu's aberrations


def bright_field(optics: qd.Optics) -> tuple[np.ndarray, np.ndarray]:
    """(k_y, k_x) of a square detector's pixels inside the aperture, 1/A."""
    kmax = optics.aperture_k
    side = np.arange(-21, 22) * optics.k_per_pixel()
    ky, kx = np.meshgrid(side, side, indexing="ij")
    inside = np.hypot(ky, kx) <= kmax
    return ky[inside], kx[inside]


def transfer(ky, kx, qy, qx, optics):
    """(Gamma_plus, Gamma_minus) of every pixel at frequency (q_y, q_x)."""
    here = probe_spectrum(kx, ky, optics)
    return np.conj(here) * probe_spectrum(kx - qx, ky - qy, optics), here * np.conj(probe_spectrum(kx + qx, ky + qy, optics))


def model_data(eps: np.ndarray, ky, kx, optics=OPTICS, scan=SCAN, u=U) -> Spectrum:
    """G of the weak-object model for a fine-grid eps, the unscattered beam at j = 0, as a Spectrum."""
    fine = (scan[0] * u, scan[1] * u)
    E, Ec = np.fft.fft2(eps), np.fft.fft2(np.conj(eps))
    G = np.zeros((len(ky), scan[0], scan[1] // 2 + 1), np.complex128)
    for jr in range(scan[0]):
        for jc in range(scan[1] // 2 + 1):
            for mr in range(u):
                for mc in range(u):
                    J = ((jr + mr * scan[0]) % fine[0], (jc + mc * scan[1]) % fine[1])
                    q = [(j if j < (n + 1) // 2 else j - n) / (s * optics.scan_step_A) for j, n, s in zip(J, fine, scan)]
                    plus, minus = transfer(ky, kx, q[0], q[1], optics)
                    G[:, jr, jc] += (plus * E[J] + minus * Ec[J]) / u**2
    G[:, 0, 0] += scan[0] * scan[1]
    return Spectrum(G.astype(np.complex64), 1.0, scan)


def band_limited_noise(shape, band_per_A: float, seed: int, optics=OPTICS, u=U) -> np.ndarray:
    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(shape[0], optics.scan_step_A / u)[:, None]
    fx = np.fft.fftfreq(shape[1], optics.scan_step_A / u)[None, :]
    return np.fft.ifft2(np.fft.fft2(rng.standard_normal(shape)) * (np.hypot(fy, fx) < band_per_A)).real


def explicit_columns(ky, kx, optics, q, complex_method) -> np.ndarray:
    """T of one frequency from ``transfer``: a column per alias (phase), or Gamma_plus then Gamma_minus (complex)."""
    columns = [transfer(ky, kx, qy, qx, optics) for qy, qx in q]
    if complex_method:
        return np.stack([p for p, _ in columns] + [m for _, m in columns], axis=1) / U**2
    return np.stack([1j * (p - m) for p, m in columns], axis=1) / U**2


def explicit_equations(G, ky, kx, weights, optics, q, complex_method):
    """The plain NumPy reference of one frequency: T^H W T and T^H W g."""
    T = explicit_columns(ky, kx, optics, q, complex_method)
    return T.conj().T @ (weights[:, None] * T), T.conj().T @ (weights * G)


def some_frequencies(group, n: int = 3) -> list[int]:
    """The first, a middle and the last frequency of an alias group (positions in it)."""
    return sorted({0, len(group.freq) // 2, len(group.freq) - 1})[:n]


def test_aliases_cover_each_fine_frequency_once():
    found = direct.aliases(SCAN, OPTICS, U)
    counts = [g.count for g in found.groups]
    assert counts == sorted(set(counts)) and max(counts) >= 3
    freq = np.concatenate([g.freq for g in found.groups])
    assert 0 not in freq and len(freq) == len(set(freq.tolist()))  # j = 0 is left out
    here = np.concatenate([g.here_at for g in found.groups])
    assert len(here) == len(set(here.tolist())) and len(here) == sum(g.q.shape[0] * g.count for g in found.groups)
    for g in found.groups:
        assert (np.hypot(g.q[..., 0], g.q[..., 1]) < 2 * OPTICS.aperture_k).all()
    assert set(np.unique(found.share).tolist()) <= {0.0, 0.5, 1.0}
    assert found.nbytes >= found.share.nbytes + sum(g.here_at.nbytes for g in found.groups)
    # kept across a change of aberrations (the shard's cache reuses them), not across one of the band or grid
    key = direct.aliases_key(SCAN, OPTICS, U)
    assert direct.aliases_key(SCAN, OPTICS.with_(aberrations={"C10": -80.0, "C30": 1e4}), U) == key
    for other in (direct.aliases_key(SCAN, OPTICS, U + 1), direct.aliases_key((SCAN[0] + 2, SCAN[1]), OPTICS, U),
                  direct.aliases_key(SCAN, OPTICS.with_(semiangle_mrad=OPTICS.semiangle_mrad + 1), U)):
        assert other != key


@pytest.mark.parametrize("terms", ["C10 C12", "all"])
def test_normal_equations_against_explicit_matrices(terms):
    """Every frequency's equations (the transfers as running products along lines of aliases) against explicit
    matrices: chi of degree 2, and of degree 6 (all 14 aberration terms, as the GPU benchmark's)."""
    from direct_gpu import ABERRATIONS  # all 14 terms

    optics = OPTICS.with_(aberrations=ABERRATIONS) if terms == "all" else OPTICS
    ky, kx = bright_field(optics)
    rng = np.random.default_rng(0)
    G = (rng.standard_normal((len(ky), *SCAN[:1], SCAN[1] // 2 + 1)) + 1j * rng.standard_normal((len(ky), SCAN[0], SCAN[1] // 2 + 1))).astype(np.complex64)
    weights = rng.uniform(0.5, 2.0, len(ky))
    found = direct.aliases(SCAN, optics, U)
    for complex_method in (False, True):
        equations = direct_cpu.normal_equations(G, ky, kx, weights, chi(kx, ky, optics), chi_table(optics), found, complex_method,
                                                optics.aperture_k**2)
        for g, (gram, rhs) in zip(found.groups, equations, strict=True):
            for f in range(len(g.freq)):
                A, b = explicit_equations(G.reshape(len(ky), -1)[:, g.freq[f]], ky, kx, weights, optics, g.q[f], complex_method)
                assert np.abs(gram[f] - A).max() <= 1e-12 * np.abs(A).max()
                assert np.abs(rhs[f] - b).max() <= 1e-9 * np.abs(b).max()


def shifted_systems(rng, n: int, C: int, rank: int):
    """n Hermitian positive semi-definite C x C matrices of the given rank (singular below C) and right sides."""
    A = rng.normal(size=(n, rank, C)) + 1j * rng.normal(size=(n, rank, C))
    return np.einsum("nki,nkj->nij", A.conj(), A), rng.normal(size=(n, C)) + 1j * rng.normal(size=(n, C))


@pytest.mark.parametrize("C, rank", [(1, 1), (5, 5), (14, 14), (7, 3)])
def test_shifted_solve_against_numpy(C, rank):
    """The Cholesky solve of (M + s I) x = b equals np.linalg.solve to rounding times the condition number,
    singular M and small shifts included."""
    matrix, rhs = shifted_systems(np.random.default_rng(C), 50, C, rank)
    for shift in (1e-6, 0.1, 10.0):
        shifted = matrix + shift * np.eye(C)
        want = np.linalg.solve(shifted, rhs[..., None])[..., 0]
        got = direct_cpu.shifted_solve(matrix, rhs, shift)
        error = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
        assert got.shape == want.shape and (error <= 1e-14 * np.linalg.cond(shifted)).all()


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("C, n", [(1, 3), (6, 300), (16, 130), (17, 20)], ids=["1", "6", "16", "17-cusolver"])
def test_cuda_shifted_solve_against_the_cpu_twin(C, n):
    import cupy

    from qgpu_dask.phase import cuda

    matrix, rhs = shifted_systems(np.random.default_rng(C), n, C, C)
    want = direct_cpu.shifted_solve(matrix, rhs, 0.05)
    got = cuda.shifted_solve(cupy.asarray(matrix), cupy.asarray(rhs), 0.05).get()
    assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max()


@pytest.mark.parametrize("method", ["phase", "complex"])
def test_strengths_solve_the_regularized_equations(method):
    """Each strength's unknowns equal np.linalg.solve of (A + s level D) x = b from explicit matrices."""
    ky, kx = bright_field(OPTICS)
    fine = (SCAN[0] * U, SCAN[1] * U)
    eps = 1j * band_limited_noise(fine, 1.5, 1) - 0.3 * band_limited_noise(fine, 1.5, 2)
    spec = model_data(eps, ky, kx)
    found = direct.aliases(SCAN, OPTICS, U)
    prep = direct.prepare(spec, ky, kx, OPTICS, found, method)
    kmax = OPTICS.aperture_k
    weights = 1 / (spec.G[:, 0, 0].real / (SCAN[0] * SCAN[1]))
    for strength in (1e-3, 0.1, 1.0):
        s = strength * prep.level
        x = direct.unknowns(prep, strength)
        for g, xg in zip(found.groups, x):
            for f in some_frequencies(g):
                A, b = explicit_equations(spec.G.reshape(len(ky), -1)[:, g.freq[f]], ky, kx, weights, OPTICS, g.q[f], method == "complex")
                prior = (1 + (g.q[f, :, 0] ** 2 + g.q[f, :, 1] ** 2) / kmax**2) ** 2
                prior = np.concatenate([prior, prior]) if method == "complex" else prior
                solved = np.linalg.solve(A + s * np.diag(prior), b)
                assert np.abs(xg[f] - solved).max() <= 1e-8 * np.abs(solved).max()
        # j = 0's aliases: the beam's c |psi|^2 a free unknown beside them, their prior BEAM_PRIOR times as strong
        q = found.beam.q[0]
        X = np.concatenate([np.abs(probe_spectrum(kx, ky, OPTICS))[:, None] ** 2 + 0j, explicit_columns(ky, kx, OPTICS, q, method == "complex")], axis=1)
        prior = direct.BEAM_PRIOR * (1 + (q[:, 0] ** 2 + q[:, 1] ** 2) / kmax**2) ** 2
        prior = np.concatenate([prior, prior]) if method == "complex" else prior
        g0 = spec.G[:, 0, 0].astype(np.complex128)
        solved = np.linalg.solve(X.conj().T @ (weights[:, None] * X) + np.diag(np.concatenate([[0.0], s * prior])), X.conj().T @ (weights * g0))[1:]
        assert np.abs(x[-1][0] - solved).max() <= 1e-8 * np.abs(solved).max()


@pytest.mark.parametrize("method", ["phase", "complex"])
def test_noise_free_model_data_come_back(method):
    ky, kx = bright_field(OPTICS)
    fine = (SCAN[0] * U, SCAN[1] * U)
    kmax = OPTICS.aperture_k
    phase = band_limited_noise(fine, 1.7 * kmax, 3)  # inside the band every frequency has bright-field pixels in its trotters
    absorption = band_limited_noise(fine, 1.7 * kmax, 4) if method == "complex" else 0 * phase
    found = direct.aliases(SCAN, OPTICS, U)
    result = direct.solve(direct.prepare(model_data(1j * phase - absorption, ky, kx), ky, kx, OPTICS, found, method), 1e-9)
    truth = phase - phase.mean()  # every frequency, the multiples of the scan frequency (j = 0's aliases) too
    assert result.phase.shape == fine and result.phase.dtype == np.float32
    assert np.linalg.norm(result.phase - truth) <= 1e-3 * np.linalg.norm(truth)
    if method == "complex":
        amplitude = absorption.mean() - absorption
        assert np.linalg.norm(result.amplitude - 1 - amplitude) <= 1e-3 * np.linalg.norm(amplitude)


def test_auto_upsampling_and_bad_input():
    assert direct.auto_upsampling(OPTICS) == 5  # 2 alpha / lambda = 2.03 / A needs u / (2 x 1 A) >= 2.03
    assert direct.auto_upsampling(OPTICS.with_(scan_step_A=0.2)) == 1
    for bad, message in ((0, "upsampling must be 'auto' or an integer from 1 to 8, got 0"), (2.5, "got 2.5"), ("x", "got 'x'")):
        with pytest.raises(ValueError, match=message):
            direct.upsampling_of(OPTICS, bad)
    with pytest.raises(ValueError, match="method must be one of"):
        direct.check_method("amplitude")
    for bad in (-1, 0, float("nan")):
        with pytest.raises(ValueError, match=rf"strength must be a finite number > 0 \(.*\), got {bad}"):
            direct.check_strength(bad)


SIM_SCAN, SIM_DET, OVER, STEP = (24, 24), (64, 64), 6, 1.0


@pytest.fixture(scope="module")
def coarse_scan():
    """A forward-model crystal scanned at 1 A with 20 mrad (information limit 0.49 A, scan Nyquist 1 A);
    a phase object and an absorbing one."""
    optics = qd.Optics(300e3, 20.0, STEP, aberrations={"C10": -40.0})
    potential = simulate.atoms_potential((SIM_SCAN[0] * OVER, SIM_SCAN[1] * OVER), STEP / OVER, 3.9)
    counts = {a: simulate.acquisition(optics, SIM_SCAN, SIM_DET, potential, OVER, dose=1e6, seed=1, absorption=a) for a in (0.0, 0.3)}
    sampling = optics.wavelength_A * 1e3 / (SIM_SCAN[0] * STEP)
    cal = optics.with_(det_sampling_mrad=sampling, rotation_deg=0.0, flip=False, bf_center_px=(32.0, 32.0))
    return counts, cal, interaction_constant(300e3) * potential


def test_direct_ptycho_beyond_the_scan_nyquist(svc, names, coarse_scan):
    counts, cal, phase = coarse_scan
    acq = svc.put(counts[0.0], name=names())
    for u in (2, 3):
        result = acq.direct_ptycho(cal, "phase", upsampling=u, strength=0.1)
        assert result.phase.shape == (SIM_SCAN[0] * u, SIM_SCAN[1] * u) and result.amplitude is None
        assert correlation(result.phase, simulate.band_limited(phase, OVER // u)) >= 0.95
    coarse = acq.ssb(cal)
    assert correlation(coarse, simulate.band_limited(phase, OVER)) < correlation(result.phase, simulate.band_limited(phase, OVER // 3))


def test_direct_ptycho_keeps_its_equations(svc, names, coarse_scan):
    counts, cal, _ = coarse_scan
    acq = svc.put(counts[0.0], name=names())
    steps = [("phase", cal, 0.1, True), ("phase", cal, 0.03, False), ("complex", cal, 0.1, True), ("phase", cal, 0.3, False),
             ("complex", cal, 0.01, False), ("phase", cal.with_(aberrations={"C10": -41.0}), 0.1, True),
             ("complex", cal.with_(aberrations={"C10": -41.0}), 0.1, True), ("phase", cal, 0.1, True)]
    for method, optics, strength, prepared in steps:
        result = acq.direct_ptycho(optics, method, upsampling=2, strength=strength)
        assert result.prepared is prepared and result.method == method and result.strength == strength, (method, strength)
    owner = {s["worker"]: s for s in svc.info()["shards"]}[acq.owner]
    assert owner["ssb_cache_bytes"] > 0
    with pytest.raises(ValueError, match="method must be one of"):
        acq.direct_ptycho(cal, "amplitude")
    with pytest.raises(ValueError, match="direct_ptycho needs|ssb needs|needs det_sampling_mrad"):
        acq.direct_ptycho(qd.Optics(300e3, 20.0, STEP))
    assert acq.direct_ptycho(cal, "phase", upsampling=2).phase.shape == (48, 48)  # still usable


def test_direct_ptycho_refuses_equations_larger_than_the_cache(svc, names):
    counts = np.random.default_rng(0).poisson(2.0, (32, 32, 32, 32)).astype(np.uint16)
    acq = svc.put(counts, name=names())
    cal = qd.Optics(300e3, 20.0, 2.0, det_sampling_mrad=1.5, rotation_deg=0.0, flip=False, bf_center_px=(16.0, 16.0))
    # a 2 A step at u = 8: 544 systems of 2 x 47 to 2 x 54 unknowns, 265 MiB of equations; the test shards keep 128 MiB
    with pytest.raises(ValueError, match=r"upsampling 8 \(complex\) needs 265\.\d+ MiB for its equations, more than the 128.00 MiB"):
        acq.direct_ptycho(cal, "complex", upsampling=8)
    assert (acq.frame(3, 4) == counts[3, 4]).all()


def test_direct_ptycho_of_a_series(svc, names, coarse_scan):
    counts, cal, _ = coarse_scan
    series = qd.Series(svc, [svc.put(counts[0.0], name=names(), layout="dense"), svc.put(counts[0.0], name=names(), layout="compressed")])
    result = series.direct_ptycho(cal, "complex", upsampling=2, strength=0.1)
    assert result.phase.shape == result.amplitude.shape == (2, 48, 48) and result.prepared
    assert (result.phase[0] == result.phase[1]).all() and (result.amplitude[0] == result.amplitude[1]).all()  # dense, compressed
    again = series.direct_ptycho(cal, "complex", upsampling=2, strength=0.05)
    assert not again.prepared and not (again.phase == result.phase).all()


def test_direct_ptycho_images_go_straight_into_the_clients_result(svc, names):
    """A series' images of at least SEGMENT_BYTES: each owner writes its acquisitions' images into the client's
    result (a segment in /dev/shm), equal to those an acquisition alone gets inline."""
    rng = np.random.default_rng(3)
    data = [rng.poisson(2.0, (96, 96, 16, 16)).astype(np.uint16) for _ in range(4)]
    series = qd.Series(svc, [svc.put(d, name=names()) for d in data])
    assert len({a.owner for a in series}) > 1
    cal = qd.Optics(300e3, 20.0, 1.0, det_sampling_mrad=3.0, rotation_deg=0.0, flip=False, bf_center_px=(8.0, 8.0))
    result = series.direct_ptycho(cal, "complex", upsampling=2, strength=0.1)
    assert result.phase.shape == result.amplitude.shape == (4, 192, 192) and result.phase.dtype == np.float32
    assert memory_of(result.phase).name.startswith(RESULT_PREFIX)
    for i, acq in enumerate(series):
        alone = acq.direct_ptycho(cal, "complex", upsampling=2, strength=0.1)  # 295 KB: inline
        assert memory_of(alone.phase).name is None
        assert (alone.phase == result.phase[i]).all() and (alone.amplitude == result.amplitude[i]).all()
    out, mine, reply = asked_into(svc, series, (4, 2, 192, 192), "direct_ptycho", cal, "complex", 2, 0.1)
    assert [images for images, _ in reply] == [None] * len(mine)  # the images were written, not sent
    assert (out[mine, 0] == result.phase[mine]).all() and (np.delete(out, mine, axis=0) == 7).all()


def test_complex_method_sees_absorption(svc, names, coarse_scan):
    counts, cal, phase = coarse_scan
    acq = svc.put(counts[0.3], name=names())
    result = acq.direct_ptycho(cal, "complex", upsampling=2, strength=0.1)
    amplitude = simulate.band_limited(np.exp(-0.3 * phase), OVER // 2)
    assert correlation(result.amplitude, amplitude) >= 0.9
    assert correlation(result.phase, simulate.band_limited(phase, OVER // 2)) >= 0.9


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("complex_method", [False, True])
def test_cuda_normal_equations_against_the_cpu_twin(complex_method):
    import cupy

    from qgpu_dask.phase import cuda

    ky, kx = bright_field(OPTICS)
    rng = np.random.default_rng(5)
    shape = (len(ky), SCAN[0], SCAN[1] // 2 + 1)
    G = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    weights = rng.uniform(0.5, 2.0, len(ky))
    args = (weights, chi(kx, ky, OPTICS), chi_table(OPTICS), direct.aliases(SCAN, OPTICS, U), complex_method, OPTICS.aperture_k**2)
    for (gram, rhs), on_gpu in zip(direct_cpu.normal_equations(G, ky, kx, *args), cuda.normal_equations(cupy.asarray(G), ky, kx, *args),
                                   strict=True):
        # transfers in float32 registers, sums in float64: agreement to float32 rounding of the terms
        assert np.abs(on_gpu[0].get() - gram).max() <= 1e-5 * np.abs(gram).max()
        assert np.abs(on_gpu[1].get() - rhs).max() <= 1e-5 * np.abs(rhs).max()


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
def test_cuda_normal_equations_with_many_aliases():
    """u = 8 under a wide aperture: up to about 50 aliases per frequency, the complex method's Y^T Y in several
    passes over the pixels and fewer warps per block (its buffer is large), still the twin's equations."""
    import cupy

    from qgpu_dask.phase import cuda

    optics = qd.Optics(300e3, 40.0, 1.0, det_sampling_mrad=2.0, rotation_deg=0.0, flip=False, bf_center_px=(0.0, 0.0),
                       aberrations={"C10": -50.0, "C30": 1e4})
    side = np.arange(-21, 22) * optics.k_per_pixel()
    ky, kx = (a.ravel() for a in np.meshgrid(side, side, indexing="ij"))
    inside = np.hypot(ky, kx) <= optics.aperture_k
    ky, kx = ky[inside], kx[inside]
    scan, u = (4, 4), 8
    rng = np.random.default_rng(8)
    shape = (len(ky), scan[0], scan[1] // 2 + 1)
    G = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    weights = rng.uniform(0.5, 2.0, len(ky))
    found = direct.aliases(scan, optics, u)
    assert max(g.count for g in found.groups) >= 40
    for complex_method in (False, True):
        args = (weights, chi(kx, ky, optics), chi_table(optics), found, complex_method, optics.aperture_k**2)
        for (gram, rhs), on_gpu in zip(direct_cpu.normal_equations(G, ky, kx, *args), cuda.normal_equations(cupy.asarray(G), ky, kx, *args),
                                       strict=True):
            assert np.abs(on_gpu[0].get() - gram).max() <= 1e-5 * np.abs(gram).max()
            assert np.abs(on_gpu[1].get() - rhs).max() <= 1e-5 * np.abs(rhs).max()
