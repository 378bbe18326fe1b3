"""Time-series ptychography fed from residents: a shifted crystal's frames spread over the shards, against
the truth and SSB, the same objects however the frames are spread, checkpoints, a lost worker, bad input."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.phase import simulate
from qgpu_dask.phase.calibration import correlation
from qgpu_dask.phase.optics import interaction_constant

from conftest import BACKENDS, cupy_available, make_service
from test_recovery import wait_for, worker_pid

SCAN, OVER, DET, STEP = (18, 18), 3, (54, 54), 1.0  # object pixels of 1/3 A: the scan step is 3 of them
# (18 x 18 positions, the detector spanning +/- 29.5 mrad as at any scan size: ptychography leads SSB by as much
# as on 24 x 24, in a third of the time)
OPTICS = qd.Optics(300e3, 20.0, STEP, aberrations={"C10": -30.0})
FIT = OPTICS.with_(det_sampling_mrad=OPTICS.wavelength_A * 1e3 / (SCAN[0] * STEP), rotation_deg=0.0, flip=False,
                   bf_center_px=(DET[0] // 2, DET[1] // 2))


@pytest.fixture(scope="module")
def crystal():
    """Three frames of one crystal shifted between them (projected potentials, V A) and their counts."""
    potential = simulate.atoms_potential((SCAN[0] * OVER, SCAN[1] * OVER), STEP / OVER, 3.9)
    frames = [np.roll(potential, (2 * f, 5 * f), axis=(0, 1)) for f in range(3)]
    counts = [simulate.acquisition(OPTICS, SCAN, DET, p, OVER, dose=1e6, seed=f).astype(np.uint16) for f, p in enumerate(frames)]
    return frames, counts


def put_series(svc, names, counts, workers, layout="auto") -> qd.Series:
    return qd.Series(svc, [svc.put(c, name=names("f"), worker=w, layout=layout) for c, w in zip(counts, workers)])


def window_phase(result: qd.ptycho.Reconstruction, f: int) -> np.ndarray:
    """Frame f's phase over the scanned area: a scan position's probe centre is half a window from its corner."""
    h = DET[0] // 2, DET[1] // 2
    return result.phase[f][h[0] : h[0] + SCAN[0] * OVER, h[1] : h[1] + SCAN[1] * OVER]


def test_frames_on_several_shards_beat_ssb_and_match_one_shard(svc, names, crystal):
    frames, counts = crystal
    workers = sorted(svc.client.scheduler_info()["workers"])
    together = put_series(svc, names, counts, [workers[0]] * 3, "dense")
    spread = put_series(svc, names, counts, workers[:3], "compressed")
    one = qd.ptycho.reconstruct(together, FIT, iterations=8, batch=96, progress=False)
    many = qd.ptycho.reconstruct(spread, FIT, iterations=8, batch=96, progress=False)
    assert one.objects.shape == (3, 17 * 3 + DET[0], 17 * 3 + DET[1]) and one.objects.dtype == np.complex64
    assert one.pixel_A == pytest.approx((STEP / OVER, STEP / OVER))
    # the same arithmetic in the same order (no atomics on the GPU either): the same bits
    assert (one.objects == many.objects).all() and (one.probe == many.probe).all()
    assert one.errors.shape == (8, 3) and (one.errors[-1] < one.errors[0]).all()
    ssb = spread.ssb(FIT)
    sigma = interaction_constant(300e3)
    for f in range(3):
        truth = sigma * frames[f]
        ptycho = correlation(window_phase(many, f), truth)
        assert ptycho >= 0.95 and ptycho > correlation(ssb[f], simulate.band_limited(truth, OVER)) + 0.01


def test_a_checkpoint_resumes_the_same_run(svc, names, crystal, tmp_path):
    _, counts = crystal
    workers = sorted(svc.client.scheduler_info()["workers"])
    series = put_series(svc, names, counts[:2], workers[1:3])
    straight = qd.ptycho.reconstruct(series, FIT, iterations=5, batch=200, progress=False)
    path = tmp_path / "run.npz"
    first = qd.ptycho.reconstruct(series, FIT, iterations=3, batch=200, checkpoint=path, checkpoint_every=2, progress=False)
    assert path.exists() and first.errors.shape == (3, 2)
    resumed = qd.ptycho.reconstruct(series, FIT, iterations=5, batch=200, checkpoint=path, progress=False)
    assert resumed.errors.shape == (5, 2) and (resumed.errors[:3] == first.errors).all()
    if svc.backend == "cpu":
        assert (resumed.objects == straight.objects).all() and (resumed.probe == straight.probe).all()
    with pytest.raises(ValueError, match="checkpoint"):
        qd.ptycho.reconstruct(series[:1], FIT, iterations=6, checkpoint=path, progress=False)


def test_bad_reconstruction_input(svc, names, crystal):
    _, counts = crystal
    series = put_series(svc, names, counts[:1], [None])
    for kwargs, word in (({"iterations": 0}, "iterations"), ({"batch": 2.5}, "batch"), ({"object_step": 3}, "object_step"),
                         ({"probe_step": "x"}, "probe_step"), ({"depth": -1}, "depth"), ({"checkpoint_every": 0}, "checkpoint_every")):
        with pytest.raises(ValueError, match=word):
            qd.ptycho.reconstruct(series, FIT, progress=False, **kwargs)
    with pytest.raises(ValueError, match="calibrate"):
        qd.ptycho.reconstruct(series, OPTICS, progress=False)
    other = put_series(svc, names, [counts[0][:12]], [None])
    with pytest.raises(ValueError, match="scan_shape"):
        qd.ptycho.reconstruct(qd.Series(svc, [series[0], other[0]]), FIT, progress=False)
    blank = put_series(svc, names, [np.zeros_like(counts[0])], [None])
    with pytest.raises(ValueError, match="no counts"):
        qd.ptycho.reconstruct(blank, FIT, progress=False)
    sparse = put_series(svc, names, [np.random.default_rng(3).poisson(1.0, (64, 64, 8, 8)).astype(np.uint16)], [None])
    wide = FIT.with_(scan_step_A=100 * FIT.wavelength_A * 1e3 / (8 * FIT.det_sampling_mrad))  # 100 object pixels a step
    with pytest.raises(ValueError, match="objects of reconstruction .* need .* budget"):
        qd.ptycho.reconstruct(sparse, wide, progress=False)
    assert qd.ptycho.reconstruct(series, FIT, iterations=1, progress=False).objects.shape[0] == 1  # still usable


def test_a_cropped_or_binned_detector_is_the_same_run_as_counts_reduced_before(svc, names, crystal):
    """crop and bin reduce each block of the feed on the owner: the objects, probe and errors are those of a
    run on counts cropped or binned beforehand (put as such, with the optics of the reduced detector)."""
    _, counts = crystal
    series = put_series(svc, names, counts[:2], [None, None])
    for crop, bin in ((None, 2), (36, 3)):  # binning alone; a crop binned
        reduced = qd.ptycho.reconstruct(series, FIT, iterations=2, batch=100, crop=crop, bin=bin, progress=False)
        top = DET[0] // 2 - (crop or DET[0]) // 2 if crop else 0
        side = crop or DET[0]
        kept = [c[:, :, top : top + side, top : top + side] for c in counts[:2]]
        n = side // bin
        before = [k.reshape(*SCAN, n, bin, n, bin).sum(axis=(3, 5), dtype=np.uint32) for k in kept]
        center = (DET[0] // 2 - top - (bin - 1) / 2) / bin
        fit = FIT.with_(det_sampling_mrad=FIT.det_sampling_mrad * bin, bf_center_px=(center, center))
        plain = qd.ptycho.reconstruct(put_series(svc, names, before, [None, None]), fit, iterations=2, batch=100, progress=False)
        step = OVER * side // DET[0]  # object pixels a scan step: a smaller far field has larger pixels, binned or not
        assert reduced.objects.shape == plain.objects.shape == (2, 17 * step + n, 17 * step + n)
        assert (reduced.objects == plain.objects).all() and (reduced.probe == plain.probe).all(), (crop, bin)
        assert (reduced.errors == plain.errors).all() and reduced.pixel_A == plain.pixel_A
        assert reduced.pixel_A[0] == pytest.approx(STEP / step)
    for kwargs, words in (({"crop": 60}, "wider than the 54 x 54 detector"), ({"crop": 1}, "crop must be"),
                          ({"bin": 0}, "bin must be"), ({"bin": 5}, "bin 5 does not divide the 54 x 54"),
                          ({"crop": 36, "bin": 5}, "does not divide the 36 x 36"), ({"crop": 2.5}, "crop must be")):
        with pytest.raises(ValueError, match=words):
            qd.ptycho.reconstruct(series, FIT, progress=False, **kwargs)
    off = FIT.with_(bf_center_px=(10.0, 40.0))
    with pytest.raises(ValueError, match="passes the 54 x 54 detector's edge: choose at most 20"):
        qd.ptycho.reconstruct(series, off, crop=30, progress=False)


def test_the_feed_runs_next_to_the_data(svc, names, crystal):
    _, counts = crystal
    acq = svc.put(counts[0], name=names("f"), layout="compressed")

    def sums(resident, block):
        return np.concatenate([resident.xp.asnumpy(b.sum(axis=(1, 2))) if resident.xp is not np else b.sum(axis=(1, 2))
                               for b in resident.feed(block, amplitude=False)])

    got = svc.submit(sums, acq, 100).result()
    assert (got == counts[0].reshape(-1, *DET).sum(axis=(1, 2))).all()

    workers = sorted(svc.client.scheduler_info()["workers"])
    series = put_series(svc, names, counts, [workers[0], workers[1], workers[0]], "compressed")

    def totals(part, block):
        seen = {}
        for position, b in part.feed(block, amplitude=False, depth=1):
            seen[position] = seen.get(position, 0) + int(b.sum(dtype=part[0].xp.uint64))
        return seen

    replies = svc.submit(totals, series, 128).result()
    assert [positions for positions, _ in replies] == [[0, 2], [1]]
    merged = {k: v for _, seen in replies for k, v in seen.items()}
    assert merged == {f: int(c.sum(dtype=np.uint64)) for f, c in enumerate(counts)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lost_worker_resumes_from_the_last_checkpoint(backend, crystal, tmp_path):
    _, counts = crystal
    svc = make_service(backend, n_workers=3, budget="256 MiB")
    try:
        workers = sorted(svc.client.scheduler_info()["workers"])
        series = qd.Series(svc, [svc.put(c, name=f"lost-{f}", worker=w) for f, (c, w) in enumerate(zip(counts, workers))])
        iterations = 8 if backend == "cpu" else 300  # a GPU iteration takes milliseconds: the kill must land mid-run
        straight = qd.ptycho.reconstruct(series, FIT, iterations=iterations, batch=96, progress=False)
        outcome = {}

        path = tmp_path / "lost.npz"

        def run():
            outcome["result"] = qd.ptycho.reconstruct(series, FIT, iterations=iterations, batch=96, checkpoint=path, checkpoint_every=2,
                                                      progress=False)

        pid = worker_pid(svc, workers[2])
        runner = threading.Thread(target=run)
        runner.start()
        wait_for(lambda: path.exists() or not runner.is_alive(), 120, "the first checkpoint")
        os.kill(pid, signal.SIGKILL)
        runner.join(300)
        assert not runner.is_alive()
        result = outcome["result"]
        assert result.restarts >= 1, "the kill came after the run: nothing was tested"
        assert (result.objects == straight.objects).all() and (result.probe == straight.probe).all()
    finally:
        svc.close()


def test_detector_axes_turned_against_the_scan():
    """Scan vectors go to detector axes by the inverse of calibration.to_scan, for any turn and flip."""
    from qgpu_dask.phase.iterative.geometry import to_detector
    from qgpu_dask.phase.calibration import to_scan

    vectors = np.random.default_rng(2).normal(size=(2, 50))
    for rotation in (0.0, 33.0, -90.0, 180.0):
        for flip in (False, True):
            assert np.abs(to_scan(to_detector(vectors, rotation, flip), rotation, flip) - vectors).max() < 1e-12


def test_a_transposed_detector_gives_the_transposed_object(svc, names, crystal):
    """With rows and columns of the detector swapped (flip), the object, which lives in detector axes,
    comes out transposed: still the crystal."""
    frames, counts = crystal
    flipped = np.ascontiguousarray(counts[0].transpose(0, 1, 3, 2))
    series = put_series(svc, names, [flipped], [None])
    result = qd.ptycho.reconstruct(series, FIT.with_(flip=True), iterations=8, batch=96, progress=False)
    truth = interaction_constant(300e3) * frames[0]
    assert correlation(window_phase(result, 0), truth.T) >= 0.95


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("window", [(24, 20), (45, 64), (192, 192), (22, 14)], ids=["6x4,5x4", "9x5,8x8", "16x12", "cufft"])  # 11, 7: cuFFT
def test_cuda_batch_kernels_match_their_twins(window):
    """Irregular, repeated windows; more positions than a gather block lists at once (256); every path of the
    far-field update that takes the windows (cuFFT; three fused passes; a pair of CTAs per position, even R)."""
    import cupy

    from qgpu_dask.phase.iterative import cpu, cuda
    from qgpu_dask.phase.iterative.geometry import Geometry
    from qgpu_dask.phase.iterative.update import batch_of

    rng = np.random.default_rng(5)
    corners = rng.integers(0, 40, (400, 2))
    corners[50:60] = corners[49]
    geo = Geometry(corners, (40 + window[0], 40 + window[1]), window, (1.0, 1.0), (5, 7))
    cplx = lambda *shape: (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(np.complex64)
    obj, probe = cplx(*geo.object_shape), cplx(*window)
    batch = batch_of(geo, 37, 300)
    on = lambda a: cupy.asarray(a)
    close = lambda got, want, tol: np.abs(cupy.asnumpy(got) - want).max() <= tol * np.abs(want).max()

    assert close(cuda.exit_waves(on(obj), on(probe), on(corners), batch), cpu.exit_waves(obj, probe, corners, batch), 1e-6)
    amplitude = rng.random((batch.n, *window)).astype(np.float32)
    counts = rng.poisson(30.0, (batch.n, *window)).astype(np.uint16)  # the projection takes their square roots itself
    for measured in (amplitude, counts):
        far = cpu.fft2(cpu.exit_waves(obj, probe, corners, batch))
        far_gpu = on(far)
        error = cpu.project(far, measured, geo.center, 0.25)
        assert abs(float(cuda.project(far_gpu, on(measured), geo.center, 0.25)) - error) <= 1e-6 * error
        assert close(far_gpu, far, 1e-6)
        sums = [np.zeros(window, np.complex64), np.zeros(window, np.float32)]
        updated, error = cpu.updated_waves(obj, probe, measured, corners, batch, geo.center, 0.25, *sums)
        kind = cuda.measured_ctype(measured)
        paths = ["fused"] * (cuda.fused_launches(*window, batch.n, kind) is not None) + ["pair"] * (cuda.pair_launch(*window, batch.n, kind) is not None)
        paths.append("cufft")
        assert cuda.path_of(*window, batch.n, kind) == paths[0]
        for path in paths:
            sums_gpu = [on(np.zeros_like(s)) for s in sums]
            updated_gpu, error_gpu = cuda.updated_waves(on(obj), on(probe), on(measured), on(corners), batch, geo.center, 0.25, *sums_gpu,
                                                        path=path)
            assert abs(float(error_gpu) - error) <= 1e-5 * error and close(updated_gpu, updated, 1e-5), path
            assert close(sums_gpu[0], sums[0], 1e-5) and close(sums_gpu[1], sums[1], 1e-5), path
    roots = np.sqrt(counts, dtype=np.float32)
    far = cpu.fft2(cpu.exit_waves(obj, probe, corners, batch))
    assert cpu.project(far.copy(), roots, geo.center, 0.25) == cpu.project(far.copy(), counts, geo.center, 0.25)
    sums = [np.zeros(window, np.complex64), np.zeros(window, np.float32)]
    sums_gpu = [on(s) for s in sums]
    cpu.probe_sums(obj, probe, updated, corners, batch, *sums)
    cuda.probe_sums(on(obj), on(probe), on(updated), on(corners), batch, *sums_gpu)
    assert close(sums_gpu[0], sums[0], 1e-5) and close(sums_gpu[1], sums[1], 1e-5)
    obj_gpu = on(obj)
    cpu.object_update(obj, probe, updated, corners, batch, 0.7, 3.0)
    cuda.object_update(obj_gpu, on(probe), on(updated), on(corners), batch, 0.7, 3.0)
    assert close(obj_gpu, obj, 1e-5)
    outside = np.ones(geo.object_shape, bool)
    row0, row1, col0, col1 = batch.box
    outside[row0:row1, col0:col1] = False
    assert (cupy.asnumpy(obj_gpu)[outside] == obj[outside]).all()
