"""Direct ptychography on the GPU: preparation per method, strength-only changes, and the Gram's precision.

A 64 x 64 scan of a simulated crystal (300 kV, 31.5 mrad, 0.52 A step, all
14 aberration terms of the physics notes small but nonzero, 192 x 192
detector, a bright-field disk of ~53 px: about 9000 pixels) tiled to
512 x 512 and loaded dense. Timed from the client at u = 3: the first
``direct_ptycho`` of each method (G made before, so this is the preparation of
the equations and one solve), then strength-only calls; and in the same run,
on the owner, the Gram of a few scan-frequency rows against the float64 CPU
twin (relative error), and one ``ssb`` as the baseline a preparation is
compared with.

    python benchmarks/direct_gpu.py            # on the GPU machine
    python benchmarks/direct_gpu.py --scan 24 --det 64 --tile 1 --upsampling 2   # a small dry run
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import qgpu_dask as qd
from qgpu_dask.device import cupy_or_none
from qgpu_dask.ssb import simulate
from qgpu_dask.ssb.calibration import correlation
from qgpu_dask.ssb.optics import TERMS, interaction_constant, wavelength_A

import record
from ssb_gpu import write_tiled
from timing import median_ms

ABERRATIONS = {f"C{n}{m}": c for (n, m), c in zip(TERMS, (-30.0, 5.0, 50.0, 40.0, 1e4, 1e4, 1e4, 1e5, 1e5, 1e5, 1e6, 1e6, 1e6, 1e6))}
ABERRATIONS |= {f"phi{n}{m}": 0.1 * i for i, (n, m) in enumerate(TERMS) if m}


def gram_precision(resident, optics, u: int, rows: int) -> dict:
    """On the owner: the GPU Gram and right side of the first ``rows`` scan-frequency rows against the CPU twin (float64)."""
    from qgpu_dask.device import to_host
    from qgpu_dask.ssb import cpu, direct, sideband
    from qgpu_dask.ssb.optics import chi, chi_table

    xp = resident.xp
    indices, ky, kx = sideband.bright_field_pixels(optics, resident.det_shape)
    spec = sideband.spectrum(resident, indices)
    q, _, valid = direct.aliases(spec.scan_shape, optics, u)
    kmax = optics.aperture_k
    weights = 1.0 / np.maximum(to_host(spec.G[:, 0, 0].real) * spec.scale / (spec.scan_shape[0] * spec.scan_shape[1]), 1e-12)
    out = {"bright_field_pixels": int(len(indices)), "aliases_per_frequency": int(valid.shape[-1])}
    for method in direct.METHODS:
        args = (weights, chi(kx, ky, optics), chi_table(optics), q[:rows], valid[:rows], method == "complex", u, kmax**2)
        part = xp.ascontiguousarray(spec.G[:, :rows])
        device = sideband.sum_kernels(xp).normal_equations(part, ky, kx, *args)
        reference = cpu.normal_equations(to_host(part), ky, kx, *args)
        out[method] = {"gram_relative_error": float(np.abs(to_host(device[0]) - reference[0]).max() / np.abs(reference[0]).max()),
                       "rhs_relative_error": float(np.abs(to_host(device[1]) - reference[1]).max() / np.abs(reference[1]).max())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=64)
    ap.add_argument("--det", type=int, default=192)
    ap.add_argument("--tile", type=int, default=8)
    ap.add_argument("--upsampling", type=int, default=3)
    ap.add_argument("--precision-rows", type=int, default=2, help="scan-frequency rows checked against the CPU twin")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    over, step, semiangle = 6, 0.52, 31.5
    scan, det = (args.scan, args.scan), (args.det, args.det)
    truth_optics = qd.Optics(300e3, semiangle, step, aberrations=ABERRATIONS)
    potential = simulate.atoms_potential((scan[0] * over, scan[1] * over), step / over, 3.9)
    counts = simulate.acquisition(truth_optics, scan, det, potential, over, dose=1e5, seed=1)
    sampling = wavelength_A(300e3) * 1e3 / (scan[0] * step)
    optics = truth_optics.with_(det_sampling_mrad=sampling, rotation_deg=0.0, flip=False, bf_center_px=(det[0] // 2, det[1] // 2))
    truth = np.tile(simulate.band_limited(interaction_constant(300e3) * potential, over // args.upsampling), (args.tile, args.tile))
    u = args.upsampling
    results: dict = {"scan": [args.scan * args.tile] * 2, "det": list(det), "upsampling": u, "aberration_terms": len(TERMS)}
    with tempfile.TemporaryDirectory() as tmp, qd.Service.local() as svc:
        acq = svc.load(write_tiled(Path(tmp) / "direct.h5", counts, args.tile), dataset="/data", name="direct", representation="dense", progress=False)
        acq.direct_ptycho(optics.with_(bf_center_px=(det[0] // 2 + 0.5, det[1] // 2)), "phase", u)  # compiles the kernels
        acq.direct_ptycho(optics.with_(bf_center_px=(det[0] // 2 + 0.5, det[1] // 2)), "complex", u)
        t0 = time.perf_counter()
        acq.ssb(optics)
        results["first_ssb_ms"] = (time.perf_counter() - t0) * 1e3  # makes G: the preparations below start from it
        results["ssb_ms"] = median_ms(lambda: acq.ssb(optics), args.repeat)
        strengths = iter(np.geomspace(0.01, 1.0, 500))
        for method in ("phase", "complex"):
            t0 = time.perf_counter()
            result = acq.direct_ptycho(optics, method, u, 0.1)
            prepare_ms = (time.perf_counter() - t0) * 1e3
            assert result.prepared
            strength_ms = median_ms(lambda m=method: acq.direct_ptycho(optics, m, u, float(next(strengths))), args.repeat)
            results[method] = {"prepare_ms": prepare_ms, "strength_only_ms": strength_ms,
                               "prepare_over_ssb": prepare_ms / results["ssb_ms"],
                               "correlation_with_object": correlation(result.phase, truth)}
        results["precision"] = svc.submit(gram_precision, acq, optics, u, args.precision_rows).result()
    device = "cuda" if cupy_or_none() is not None else "cpu"
    out = record.write(f"direct_{device}", results)
    for key, value in results.items():
        print(f"{key}: {value}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
