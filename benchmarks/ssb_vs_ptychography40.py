"""SSB on CPU workers against ptychography40's SSB_UDF (LiberTEM) on the same simulated acquisition.

A 64 x 64 scan x 64 x 64 detector acquisition of a phase object in focus
(``qgpu_dask.phase.simulate``, 300 kV, 20 mrad, 0.5 A step, Poisson counts of
1e5 electrons per position). In the same run:
our ``acq.ssb`` (first call, preparation included, and a repeat) on a
one-worker CPU cluster, then ptychography40's trotter masks (timed alone) and
its UDF on a LiberTEM inline context (which makes the masks again, so its time
includes them). Reported: times and their ratios, each phase's
correlation with the object's band-limited phase, and the two phases'
correlation with each other. ptychography40 does not correct aberrations, so
the data are in focus.

    pip install ptychography40      # not a dependency of qgpu-dask
    python benchmarks/ssb_vs_ptychography40.py
    python benchmarks/ssb_vs_ptychography40.py --small   # seconds (what CI runs); without ptychography40 only our side
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import qgpu_dask as qd
from qgpu_dask.phase import simulate
from qgpu_dask.phase.calibration import correlation
from qgpu_dask.phase.optics import interaction_constant, wavelength_A

import record


def theirs(counts: np.ndarray, scan, det, step: float, lam: float, radius_px: float) -> tuple[dict, np.ndarray]:
    """ptychography40's masks timed alone, then its SSB_UDF on a LiberTEM inline context: times and phase."""
    import libertem.api as lt
    from ptychography40.reconstruction.ssb import SSB_UDF, generate_masks

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
    udf_s = time.perf_counter() - t0
    return {"masks_s": masks_s, "udf_s": udf_s}, np.angle(np.fft.ifft2(result["fourier"].data))


def have_ptychography40() -> bool:
    try:
        import libertem.api  # noqa: F401
        import ptychography40.reconstruction.ssb  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=64)
    ap.add_argument("--det", type=int, default=64)
    args = record.parse(ap, small={"scan": 16, "det": 32})
    if not have_ptychography40() and not args.small:
        raise SystemExit("ptychography40 (and LiberTEM) are not installed: pip install ptychography40, "
                         "or run --small, which skips their side")
    scan, det, over, step = (args.scan, args.scan), (args.det, args.det), 4, 0.5
    optics = qd.Optics(300e3, 20.0, step)
    potential = simulate.atoms_potential((scan[0] * over, scan[1] * over), step / over, 3.9)
    truth = simulate.band_limited(interaction_constant(300e3) * potential, over)
    counts = simulate.acquisition(optics, scan, det, potential, over, dose=1e5, seed=1)
    lam = wavelength_A(300e3)
    sampling = lam * 1e3 / (scan[0] * step)  # mrad per pixel of the simulation
    radius_px = 20.0 / sampling

    with qd.Service.local(n_workers=1, threads_per_worker=1) as svc:
        acq = svc.put(counts, name="ssb")
        cal = optics.with_(det_sampling_mrad=sampling, rotation_deg=0.0, flip=False, bf_center_px=(det[0] // 2, det[1] // 2))
        t0 = time.perf_counter()
        ours = acq.ssb(cal)
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        acq.ssb(cal.with_(aberrations={"C10": 1.0}))
        repeat_s = time.perf_counter() - t0

    results: dict = {
        "shape": [*scan, *det], "dose": 1e5,
        "ours": {"first_ssb_s": first_s, "repeat_ssb_s": repeat_s, "correlation_with_object": correlation(ours, truth)},
    }
    if have_ptychography40():
        timing, phase = theirs(counts, scan, det, step, lam, radius_px)
        results["ptychography40"] = timing | {"correlation_with_object": correlation(phase, truth)}
        results |= {"phases_correlation": correlation(ours, phase), "first_over_udf": first_s / timing["udf_s"],
                    "repeat_over_udf": repeat_s / timing["udf_s"]}
        print(f"ptychography40: masks alone {timing['masks_s']:.2f} s, UDF (masks included) {timing['udf_s']:.2f} s, "
              f"correlation with the object {results['ptychography40']['correlation_with_object']:.3f}")
    else:
        results["skipped"] = ["ptychography40's SSB_UDF: ptychography40 and LiberTEM are not installed"]
        print("skipped:", *results["skipped"])
    path = record.write("ssb_vs_ptychography40_cpu", results)
    print(f"qgpu-dask: first ssb {first_s:.2f} s, repeat {repeat_s:.2f} s, "
          f"correlation with the object {results['ours']['correlation_with_object']:.3f}")
    if "phases_correlation" in results:
        print(f"{results['first_over_udf']:.3f} x their UDF; the two phases correlate {results['phases_correlation']:.3f}")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
