"""SSB on CPU workers against ptychography40's SSB_UDF (LiberTEM) on the same simulated acquisition.

A 64 x 64 scan x 64 x 64 detector acquisition of a phase object in focus
(``qgpu_dask.ssb.simulate``, 300 kV, 20 mrad, 0.5 A step, Poisson counts of
1e5 electrons per position). In the same run: ptychography40's trotter masks
(timed alone) and its UDF on a LiberTEM inline context (which makes the
masks again, so its time includes them), and
our ``acq.ssb`` (first call, preparation included, and a repeat) on a
one-worker CPU cluster. Reported: times and their ratios, each phase's
correlation with the object's band-limited phase, and the two phases'
correlation with each other. ptychography40 does not correct aberrations, so
the data are in focus.

    pip install ptychography40      # not a dependency of qgpu-dask
    python benchmarks/ssb_vs_ptychography40.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import qgpu_dask as qd
from qgpu_dask.ssb import simulate
from qgpu_dask.ssb.calibration import correlation
from qgpu_dask.ssb.optics import interaction_constant, wavelength_A

import record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=64)
    ap.add_argument("--det", type=int, default=64)
    args = ap.parse_args()
    import libertem.api as lt
    from ptychography40.reconstruction.ssb import SSB_UDF, generate_masks

    scan, det, over, step = (args.scan, args.scan), (args.det, args.det), 4, 0.5
    optics = qd.Optics(300e3, 20.0, step)
    potential = simulate.atoms_potential((scan[0] * over, scan[1] * over), step / over, 3.9)
    truth = simulate.band_limited(interaction_constant(300e3) * potential, over)
    counts = simulate.acquisition(optics, scan, det, potential, over, dose=1e5, seed=1)
    lam = wavelength_A(300e3)
    sampling = lam * 1e3 / (scan[0] * step)  # mrad per pixel of the simulation
    radius_px = 20.0 / sampling

    t0 = time.perf_counter()
    generate_masks(reconstruct_shape=scan, mask_shape=det, dtype=np.float32, lamb=lam * 1e-10, dpix=step * 1e-10,
                           semiconv=20e-3, semiconv_pix=radius_px, cy=det[0] // 2, cx=det[1] // 2, method="subpix")
    masks_s = time.perf_counter() - t0
    ctx = lt.Context.make_with("inline")
    ds = ctx.load("memory", data=counts.astype(np.float32), sig_dims=2)
    udf = SSB_UDF(lamb=lam * 1e-10, dpix=step * 1e-10, semiconv=20e-3, semiconv_pix=radius_px, dtype=np.float32,
                  cy=det[0] // 2, cx=det[1] // 2)  # makes its masks again inside the run: the UDF time includes them
    t0 = time.perf_counter()
    result = ctx.run_udf(dataset=ds, udf=udf)
    theirs_s = time.perf_counter() - t0
    theirs = np.angle(np.fft.ifft2(result["fourier"].data))

    with qd.Service.local(n_workers=1, threads_per_worker=1) as svc:
        acq = svc.put(counts, name="ssb")
        cal = optics.with_(det_sampling_mrad=sampling, rotation_deg=0.0, flip=False, bf_center_px=(det[0] // 2, det[1] // 2))
        t0 = time.perf_counter()
        ours = acq.ssb(cal)
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        acq.ssb(cal.with_(aberrations={"C10": 1.0}))
        repeat_s = time.perf_counter() - t0

    results = {
        "shape": [*scan, *det], "dose": 1e5,
        "ptychography40": {"masks_s": masks_s, "udf_s": theirs_s, "correlation_with_object": correlation(theirs, truth)},
        "ours": {"first_ssb_s": first_s, "repeat_ssb_s": repeat_s, "correlation_with_object": correlation(ours, truth)},
        "phases_correlation": correlation(ours, theirs),
        "first_over_udf": first_s / theirs_s, "repeat_over_udf": repeat_s / theirs_s,
    }
    path = record.write("ssb_vs_ptychography40_cpu", results)
    print(f"ptychography40: masks alone {masks_s:.2f} s, UDF (masks included) {theirs_s:.2f} s, "
          f"correlation with the object {results['ptychography40']['correlation_with_object']:.3f}")
    print(f"qgpu-dask: first ssb {first_s:.2f} s ({results['first_over_udf']:.2f} x their UDF), "
          f"repeat {repeat_s:.2f} s, correlation with the object {results['ours']['correlation_with_object']:.3f}")
    print(f"the two phases correlate {results['phases_correlation']:.3f}\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
