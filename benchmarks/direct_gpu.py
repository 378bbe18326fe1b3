"""Direct ptychography on the GPU: preparation per method, strength-only changes, and the Gram's precision.

An 84 x 84 scan of a simulated crystal (300 kV, 31.5 mrad, 0.4 A step: u = 3
is the automatic upsampling, and 3 to 7 aliases carry signal per frequency,
5.2 on average, the physics notes' typical case; all 14 aberration terms small
but nonzero; 192 x 192 detector, a bright-field disk of ~53 px: about 9000
pixels) repeated and cut to 512 x 512, loaded dense. ``--step 0.4625``
(scan 72) keeps u = 3 automatic with 7 aliases on average. Timed from the
client at u = 3: the first ``direct_ptycho`` of each method (G made before, so
this is the preparation of the equations and one solve), then strength-only
calls, against the same run's ``ssb`` and the fetch of a blank image of the
same size. On the owner, stage by stage: the alias geometry, the Gram kernels,
the preparation, one solve, and the Gram of the first frequencies of each alias
group against the float64 CPU twin (relative error).

    python benchmarks/direct_gpu.py            # on the GPU machine
    python benchmarks/direct_gpu.py --small    # seconds, on CPU workers too: what CI runs
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import qgpu_dask as qd
from qgpu_dask.device import cupy_or_none
from qgpu_dask.phase import direct, simulate
from qgpu_dask.phase.calibration import correlation
from qgpu_dask.phase.optics import TERMS, interaction_constant, wavelength_A

import record
from ssb_gpu import write_tiled
from timing import device_clock, median_ms

ABERRATIONS = {f"C{n}{m}": c for (n, m), c in zip(TERMS, (-30.0, 5.0, 50.0, 40.0, 1e4, 1e4, 1e4, 1e5, 1e5, 1e5, 1e6, 1e6, 1e6, 1e6))}
ABERRATIONS |= {f"phi{n}{m}": 0.1 * i for i, (n, m) in enumerate(TERMS) if m}


def first_frequencies(found, rows: int, to):
    """The aliases of the first ``rows`` frequencies of each group of ``found``, their arrays through ``to``."""
    from qgpu_dask.phase.direct import AliasGroup, Aliases

    return Aliases(found.scan_shape, found.upsampling,
                   [AliasGroup(g.count, to(g.freq[:rows]), to(g.q[:rows]), to(g.here_at[: rows * g.count]), to(g.mirror_at[: rows * g.count]))
                    for g in found.groups], None, None, found.q_step)


def owner_stages(resident, optics, u: int, rows: int) -> dict:
    """On the owner, stage by stage (ms, second calls: the first compiles), and the Gram and right side of the
    first ``rows`` frequencies of each alias group against the CPU twin (float64)."""
    from qgpu_dask.device import to_host
    from qgpu_dask.phase import direct, direct_cpu, sideband
    from qgpu_dask.phase.optics import chi, chi_table

    xp = resident.xp
    clock = device_clock(xp)

    indices, ky, kx = sideband.bright_field_pixels(optics, resident.det_shape)
    spec = sideband.spectrum(resident, indices)
    found, aliases_ms = clock(lambda: direct.aliases(spec.scan_shape, optics, u, xp))
    kmax = optics.aperture_k
    weights, chi_k, table = to_host(direct.pixel_weights(spec, xp)), chi(kx, ky, optics), chi_table(optics)
    out = {"bright_field_pixels": int(len(indices)), "aliases_ms": aliases_ms,
           "alias_groups": {g.count: int(g.freq.size) for g in found.groups}}
    kernels = direct.equation_kernels(xp)
    head, head_host = first_frequencies(found, rows, lambda a: a), first_frequencies(found, rows, to_host)
    for method in direct.METHODS:
        complex_method = method == "complex"
        _, gram_ms = clock(lambda: kernels.normal_equations(spec.G, ky, kx, weights, chi_k, table, found, complex_method, kmax**2))
        prep, prepare_ms = clock(lambda: direct.prepare(spec, ky, kx, optics, found, method, xp))
        result, solve_ms = clock(lambda: direct.solve(prep, 0.1, xp))
        _, fetch_ms = clock(lambda: to_host(result.phase))
        gram_error = rhs_error = 0.0
        device = kernels.normal_equations(spec.G, ky, kx, weights, chi_k, table, head, complex_method, kmax**2)
        reference = direct_cpu.normal_equations(to_host(spec.G), ky, kx, weights, chi_k, table, head_host, complex_method, kmax**2)
        for (gram, rhs), (want_gram, want_rhs) in zip(device, reference, strict=True):
            gram_error = max(gram_error, float(np.abs(to_host(gram) - want_gram).max() / np.abs(want_gram).max()))
            rhs_error = max(rhs_error, float(np.abs(to_host(rhs) - want_rhs).max() / np.abs(want_rhs).max()))
        out[method] = {"gram_kernels_ms": gram_ms, "prepare_ms": prepare_ms, "solve_ms": solve_ms, "image_to_host_ms": fetch_ms,
                       "equations_bytes": prep.nbytes, "gram_relative_error": gram_error, "rhs_relative_error": rhs_error}
    return out


def blank_image(resident, shape: tuple[int, int]) -> np.ndarray:
    """An image of ``shape`` made on the owner: fetching it is the transfer every result pays."""
    return np.zeros(shape, np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=84, help="simulated scan side (repeated to --size)")
    ap.add_argument("--step", type=float, default=0.4, help="scan step, A")
    ap.add_argument("--det", type=int, default=192)
    ap.add_argument("--size", type=int, default=512, help="scan side loaded")
    ap.add_argument("--upsampling", type=int, default=3)
    ap.add_argument("--precision-rows", type=int, default=256, help="frequencies of each alias group checked against the CPU twin")
    ap.add_argument("--repeat", type=int, default=10)
    args = record.parse(ap, small={"scan": 16, "det": 32, "size": 16, "upsampling": 2, "precision_rows": 16, "repeat": 2})
    over, step, semiangle = 6, args.step, 31.5
    scan, det, size, u = (args.scan, args.scan), (args.det, args.det), (args.size, args.size), args.upsampling
    truth_optics = qd.Optics(300e3, semiangle, step, aberrations=ABERRATIONS)
    potential = simulate.atoms_potential((scan[0] * over, scan[1] * over), step / over, 3.9)
    counts = simulate.acquisition(truth_optics, scan, det, potential, over, dose=1e5, seed=1)
    sampling = wavelength_A(300e3) * 1e3 / (scan[0] * step)
    optics = truth_optics.with_(det_sampling_mrad=sampling, rotation_deg=0.0, flip=False, bf_center_px=(det[0] // 2, det[1] // 2))
    reps = -(-size[0] // scan[0])
    truth = np.tile(simulate.band_limited(interaction_constant(300e3) * potential, over // u), (reps, reps))[: size[0] * u, : size[1] * u]
    results: dict = {"scan": list(size), "simulated_scan": list(scan), "det": list(det), "scan_step_A": step, "semiangle_mrad": semiangle,
                     "upsampling": u, "auto_upsampling": direct.auto_upsampling(optics), "aberration_terms": len(TERMS)}
    with tempfile.TemporaryDirectory() as tmp, qd.Service.local() as svc:
        acq = svc.load(write_tiled(Path(tmp) / "direct.h5", counts, size), dataset="/data", name="direct", layout="dense", progress=False)
        shifted = optics.with_(bf_center_px=(det[0] // 2 + 0.5, det[1] // 2))  # other pixels, another G: compiles the kernels
        for method in direct.METHODS:
            t0 = time.perf_counter()
            acq.direct_ptycho(shifted, method, u)
            results[f"{method}_cold_ms"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        acq.ssb(optics)
        results["first_ssb_ms"] = (time.perf_counter() - t0) * 1e3  # makes G: the preparations below start from it
        results["ssb_ms"] = median_ms(lambda: acq.ssb(optics), args.repeat)
        image_shape = (size[0] * u, size[1] * u)
        results["image_fetch_ms"] = median_ms(lambda: svc.submit(blank_image, acq, image_shape).result(), args.repeat)
        strengths = iter(np.geomspace(0.01, 1.0, 500))
        for method in direct.METHODS:
            t0 = time.perf_counter()
            result = acq.direct_ptycho(optics, method, u, 0.1)
            prepare_ms = (time.perf_counter() - t0) * 1e3
            assert result.prepared
            strength_ms = median_ms(lambda m=method: acq.direct_ptycho(optics, m, u, float(next(strengths))), args.repeat)
            images = 2 if method == "complex" else 1
            results[method] = {"prepare_ms": prepare_ms, "strength_only_ms": strength_ms, "prepare_over_ssb": prepare_ms / results["ssb_ms"],
                               "strength_only_over_image_fetch": strength_ms / (images * results["image_fetch_ms"]),
                               "correlation_with_object": correlation(result.phase, truth)}
        results["owner"] = svc.submit(owner_stages, acq, optics, u, args.precision_rows).result()
    device = "cuda" if cupy_or_none() is not None else "cpu"
    record.publish(f"direct_{device}", results)


if __name__ == "__main__":
    main()
