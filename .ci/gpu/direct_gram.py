"""Issue 58's profile driver: the Gram kernels of direct ptychography alone, at the benchmark's size, in one process.

Builds what ``phase.direct.prepare`` hands ``phase.cuda.normal_equations`` for a 512 x 512 scan, 192 x 192
detector (the bright-field disk of benchmarks/direct_gpu.py, about 9,100 pixels), u = 3, 14 aberration terms:
the alias groups of the real geometry and a random G (the kernels' work depends on the geometry, not on G's
values). Times each method's kernels group by group (CUDA events, median), and the same kernels with one stage
made nearly free (``--ablate``: the float64 tensor-core products, the sincos, chi), which places the time without
counters; under ncu it is the program to profile:

    python3 .ci/gpu/direct_gram.py
    ncu --clock-control none -k regex:normal_equations --launch-skip 5 --launch-count 2 --set full \\
        python3 .ci/gpu/direct_gram.py --methods complex --repeat 1 --ablate none
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cupy
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import qgpu_dask as qd  # noqa: E402
from qgpu_dask import compile  # noqa: E402
from qgpu_dask.phase import cuda, direct, sideband  # noqa: E402
from qgpu_dask.phase.optics import chi, chi_table, wavelength_A  # noqa: E402

from direct_gpu import ABERRATIONS  # noqa: E402
from timing import event_times  # noqa: E402

# Text replaced in kernels/ssb.cu (after mma.cuh is inlined) to make one stage nearly free.
ABLATIONS = {
    "none": [],
    "mma": [('asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\\n"\n'
             '                 : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])\n'
             '                 : "d"(a0), "d"(a1), "d"(b));',
             "d[0] += a0; d[1] += a1; d[2] += b;")],
    "sincos": [("__sincosf(fmaf(-turns, 0.0019353071795864769f, fmaf(-turns, 6.28125f, v)), s, c);", "*s = v; *c = turns;")],
    "chi": [("float total = 0.f;\n#pragma unroll\n    for (int b = N; b >= 0; --b) {", "float total = x + y;\n    for (int b = -1; b >= 0; --b) {")],
}


def patched(ablate: str) -> str:
    text = compile.source("ssb.cu")
    for old, new in ABLATIONS[ablate]:
        if old not in text:
            raise SystemExit(f"ablation {ablate}: its text is not in kernels/ssb.cu any more")
        text = text.replace(old, new)
    return text


def use_source(text: str) -> None:
    """Make phase.cuda compile its kernels from ``text``."""
    cache: dict = {}

    def kernel(name_expr: str) -> cupy.RawKernel:
        if name_expr not in cache:
            module = cupy.RawModule(code=text, options=("-std=c++17", *cuda.DEFINES), name_expressions=[name_expr])
            kern = module.get_function(name_expr)
            kern.max_dynamic_shared_size_bytes = compile.limits(cupy.cuda.Device().id)[1] - kern.shared_size_bytes
            cache[name_expr] = kern
        return cache[name_expr]

    cuda.kernel = kernel


def inputs(scan: int, det: int, u: int, step: float):
    semiangle = 31.5
    sampling = wavelength_A(300e3) * 1e3 / (84 * step)
    optics = qd.Optics(300e3, semiangle, step, aberrations=ABERRATIONS, det_sampling_mrad=sampling, rotation_deg=0.0, flip=False,
                       bf_center_px=(det // 2, det // 2))
    indices, ky, kx = sideband.bright_field_pixels(optics, (det, det))
    found = direct.aliases((scan, scan), optics, u, cupy)
    rng = cupy.random.default_rng(0)
    G = cupy.empty((len(indices), scan, scan // 2 + 1), np.complex64)
    G.view(np.float32)[...] = rng.standard_normal(G.shape[:2] + (2 * G.shape[2],), dtype=np.float32)
    weights = 1.0 / (0.5 + np.random.default_rng(1).random(len(indices)))
    return optics, G, ky, kx, weights, chi(kx, ky, optics), chi_table(optics), found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=512)
    ap.add_argument("--det", type=int, default=192)
    ap.add_argument("--upsampling", type=int, default=3)
    ap.add_argument("--step", type=float, default=0.4)
    ap.add_argument("--methods", nargs="+", default=list(direct.METHODS))
    ap.add_argument("--ablate", nargs="+", default=list(ABLATIONS), choices=list(ABLATIONS))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    optics, G, ky, kx, weights, chi_k, table, found = inputs(args.scan, args.det, args.upsampling, args.step)
    kmax2 = optics.aperture_k**2
    print(f"{G.shape[0]} bright-field pixels; alias groups {[(g.count, int(g.freq.size)) for g in found.groups]}")
    rows = []
    for ablate in args.ablate:
        use_source(patched(ablate))
        for method in args.methods:
            per_group = [event_times(lambda g=g: cuda.group_equations(G, ky, kx, weights, chi_k, table, g.freq, g.q, method == "complex",
                                                                      args.upsampling, kmax2), args.repeat, warmup=1)["median_ms"]
                         for g in found.groups]
            rows.append((ablate, method, sum(per_group), per_group))
    print(f"{'made cheap':>10} {'method':>8} {'total ms':>9}  per group (aliases: ms)")
    for ablate, method, total, per_group in rows:
        groups = "  ".join(f"{g.count}: {t:.2f}" for g, t in zip(found.groups, per_group))
        print(f"{ablate:>10} {method:>8} {total:9.2f}  {groups}")


if __name__ == "__main__":
    main()
