"""SSB on the GPU: calibrate, first ssb (preparation included), ssb after a C10 change, fit_aberrations, a series.

A 64 x 64 scan of a crystal (``qgpu_dask.phase.simulate``: 300 kV, 30 mrad,
0.52 A step, C10 = -50 A, C12 = 10 A, Poisson counts, 192 x 192 detector, a
bright-field disk of radius ~51 px: about 8000 pixels) is tiled to a
512 x 512 scan (19.3 GB of uint16) in an HDF5 file and loaded dense. Timed
from the client: calibrate, the first ``ssb`` (G of every bright-field pixel
prepared and cached; a first ssb on another bright-field selection before it
compiles the kernels, and is reported as the cold time), ``ssb`` again after a C10 change (only the fused
sideband sum and the inverse FFT), fit_aberrations (G cached), and a series
of ``--series`` compressed acquisitions in one call (first ssb each), time per
acquisition. Baselines from the same run, on the owner: one read of the
dense counts (``read_sum``, the HBM bound of any pass over the data), and the
stages timed alone on the owner: the bright-field pixels, G (``prepare_ms``)
against its pixel images then rfft2, the sideband sum, the inverse FFT, and the whole phase
from a kept G (what an ssb after a C10 change asks of the owner: the client's
figure less it is the service's part). The phase is checked against the
simulated object.

    python benchmarks/ssb_gpu.py                 # on the GPU machine
    python benchmarks/ssb_gpu.py --small         # seconds, on CPU workers too: what CI runs
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

import qgpu_dask as qd
from qgpu_dask.device import cupy_or_none
from qgpu_dask.phase import simulate
from qgpu_dask.phase.calibration import correlation
from qgpu_dask.phase.optics import interaction_constant, wavelength_A

import record
from timing import device_clock, median_ms

TRUTH = {"C10": -50.0, "C12": 10.0, "phi12": 0.3}


def stages(resident, optics) -> dict:
    """On the owner: the preparation and the final step of one ssb, stage by stage (ms), and one read of the counts."""
    from qgpu_dask.phase import sideband

    xp = resident.xp
    clock = device_clock(xp)

    (indices, ky, kx), pixels_ms = clock(lambda: sideband.bright_field_pixels(optics, resident.det_shape))
    rows, cols = resident.scan_shape
    images, images_ms = clock(lambda: resident.pixel_images(indices[:1024]))
    _, fft_ms = clock(lambda: xp.fft.rfft2(images.reshape(-1, rows, cols)))
    spec, prepare_ms = clock(lambda: sideband.spectrum(resident, indices))
    by_chunk = {mb: clock(lambda: sideband.spectrum(resident, indices, mb << 20))[1] for mb in (32, 128, 512)} if xp is not np else None
    (total, weight), sum_ms = clock(lambda: sideband.corrected_sum(spec, ky, kx, optics, xp))
    _, inverse_ms = clock(lambda: xp.fft.irfft2(-1j * total / xp.where(weight > 0, weight, 1.0), s=(rows, cols)))
    _, phase_ms = clock(lambda: sideband.phase(spec, ky, kx, optics, xp))
    out = {"bright_field_pixels": int(len(indices)), "bright_field_pixels_ms": pixels_ms, "pixel_images_ms": images_ms * len(indices) / 1024,
           "rfft2_ms": fft_ms * len(indices) / 1024, "prepare_ms": prepare_ms, "prepare_ms_by_chunk_MB": by_chunk, "sideband_sum_ms": sum_ms,
           "inverse_fft_ms": inverse_ms, "phase_ms": phase_ms, "G_bytes": spec.nbytes}
    if xp is np:
        read = lambda: resident.flat.sum(dtype=np.uint64)  # noqa: E731  the CPU twin's full read
    else:
        from qgpu_dask.resident.cuda.dense import read_sum

        read = lambda: read_sum(resident.flat)  # noqa: E731
    _, read_ms = clock(read)
    return out | {"read_counts_ms": read_ms, "read_GBps": resident.nbytes / read_ms / 1e6}


def write_tiled(path: Path, counts: np.ndarray, shape: tuple[int, int]) -> Path:
    """The simulated scan repeated (and cut) to a scan of ``shape`` as /data (uint16), row by row."""
    scan = counts.shape[:2]
    reps = -(-shape[1] // scan[1])
    with h5py.File(path, "w") as f:
        d = f.create_dataset("data", shape=(*shape, *counts.shape[2:]), dtype=np.uint16)
        for r in range(shape[0]):
            d[r] = np.tile(counts[r % scan[0]], (reps, 1, 1))[: shape[1]].astype(np.uint16)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=64, help="simulated scan side (tiled --tile times)")
    ap.add_argument("--det", type=int, default=192)
    ap.add_argument("--tile", type=int, default=8)
    ap.add_argument("--series", type=int, default=16, help="compressed acquisitions in the series (0: none)")
    ap.add_argument("--repeat", type=int, default=10)
    args = record.parse(ap, small={"scan": 16, "det": 32, "tile": 1, "series": 1, "repeat": 2})
    over, step, semiangle = 4, 0.52, 30.0
    scan, det = (args.scan, args.scan), (args.det, args.det)
    truth_optics = qd.Optics(300e3, semiangle, step, aberrations=TRUTH)
    t0 = time.perf_counter()
    potential = simulate.atoms_potential((scan[0] * over, scan[1] * over), step / over, 3.9)
    truth = np.tile(simulate.band_limited(interaction_constant(300e3) * potential, over), (args.tile, args.tile))
    counts = simulate.acquisition(truth_optics, scan, det, potential, over, dose=1e5, seed=1)
    print(f"simulated {scan} x {det} in {time.perf_counter() - t0:.1f} s", flush=True)
    sampling = wavelength_A(300e3) * 1e3 / (scan[0] * step)
    results: dict = {"scan": [args.scan * args.tile] * 2, "det": list(det), "simulated_scan": list(scan), "truth": TRUTH,
                     "semiangle_mrad": semiangle, "scan_step_A": step, "disk_radius_px": semiangle / sampling}
    with tempfile.TemporaryDirectory() as tmp, qd.Service.local() as svc:
        path = write_tiled(Path(tmp) / "ssb.h5", counts, (args.scan * args.tile, args.scan * args.tile))
        acq = svc.load(path, dataset="/data", name="ssb", layout="dense", progress=False)
        optics = qd.Optics(300e3, semiangle, step)
        t0 = time.perf_counter()
        cal = acq.calibrate(optics)
        results["calibrate_cold_ms"] = (time.perf_counter() - t0) * 1e3  # kernels compiled on first use included
        results["calibrate_ms"] = median_ms(lambda: acq.calibrate(optics), 3, warmup=0)
        results["calibration"] = {"det_sampling_mrad": cal.det_sampling_mrad, "expected_mrad": sampling,
                                  "rotation_deg": cal.rotation_deg, "flip": cal.flip, "bf_center_px": list(cal.bf_center_px)}
        cal = cal.with_(aberrations=TRUTH)
        shifted = cal.with_(bf_center_px=(cal.bf_center_px[0] + 0.5, cal.bf_center_px[1]))  # other pixels: another G
        t0 = time.perf_counter()
        acq.ssb(shifted)
        results["first_ssb_cold_ms"] = (time.perf_counter() - t0) * 1e3  # kernels compiled, FFT plans made
        t0 = time.perf_counter()
        phase = acq.ssb(cal)
        results["first_ssb_ms"] = (time.perf_counter() - t0) * 1e3
        results["correlation_with_object"] = correlation(phase, truth)
        c10 = iter(np.linspace(-45.0, -55.0, 200))
        results["ssb_after_c10_change_ms"] = median_ms(lambda: acq.ssb(cal.with_(aberrations={**TRUTH, "C10": next(c10)})), args.repeat)
        t0 = time.perf_counter()
        fitted = acq.fit_aberrations(cal.with_(aberrations={}), c10_range_A=200.0)
        results["fit_aberrations_ms"] = (time.perf_counter() - t0) * 1e3
        results["fitted"] = {**fitted.aberrations, "rotation_deg": fitted.rotation_deg, "uncertainties": fitted.uncertainties}
        results["stages"] = svc.submit(stages, acq, cal).result()
        results["ssb_cache_bytes"] = max(s["ssb_cache_bytes"] for s in svc.info()["shards"])
        results["correlation_after_fit"] = correlation(acq.ssb(fitted), truth)
        acq.release()
        results["series"] = series_ssb(svc, path, args.series, cal, phase) if args.series else None
    finish(results)


def series_ssb(svc: qd.Service, path: Path, n: int, cal: qd.Optics, phase: np.ndarray) -> dict:
    """``n`` compressed copies loaded, then one ``ssb`` call for the whole series: time per acquisition, and
    the same image as the dense one."""
    acquisitions = []
    for lo in range(0, n, 4):  # a load reserves the dense size while it encodes: a few at a time
        names = [f"t{i}" for i in range(lo, min(n, lo + 4))]
        acquisitions.extend(svc.load([path] * len(names), dataset="/data", name=names, layout="compressed", progress=False))
    series = qd.Series(svc, acquisitions)
    t0 = time.perf_counter()
    phases = series.ssb(cal)
    series_s = time.perf_counter() - t0
    assert all((p == phases[0]).all() for p in phases), "the series' phases differ"
    return {"acquisitions": n, "representation": "compressed", "shards": len({a.owner for a in series}),
            "first_ssb_s": series_s, "per_acquisition_ms": series_s * 1e3 / n,
            "compressed_ratio": float(np.mean([a.record["ratio"] for a in series])),
            "dense_and_compressed_equal": bool(np.abs(phases[0] - phase).max() <= 1e-5 * np.abs(phase).max())}


def finish(results: dict) -> None:
    """Ratios against the baselines; write and print."""
    st = results["stages"]
    results["first_ssb_over_one_read"] = results["first_ssb_ms"] / st["read_counts_ms"]
    results["repeat_over_one_read"] = results["ssb_after_c10_change_ms"] / st["read_counts_ms"]
    results["repeat_over_sideband_sum"] = results["ssb_after_c10_change_ms"] / st["sideband_sum_ms"]
    results["first_over_preparation_stages"] = results["first_ssb_ms"] / (st["prepare_ms"] + st["sideband_sum_ms"] + st["inverse_fft_ms"])
    device = "cuda" if cupy_or_none() is not None else "cpu"
    out = record.write(f"ssb_{device}", results)
    for key in ("calibrate_cold_ms", "calibrate_ms", "first_ssb_cold_ms", "first_ssb_ms", "ssb_after_c10_change_ms", "fit_aberrations_ms", "correlation_with_object", "correlation_after_fit"):
        print(f"{key}: {results[key]:.4g}")
    print("stages:", {k: round(v, 3) if isinstance(v, float) else v for k, v in st.items()})
    print("fitted:", results["fitted"])
    print("series:", results["series"])
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
