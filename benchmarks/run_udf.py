"""LiberTEM UDFs run on residents (``qd.run_udf``) against LiberTEM running them on the file (issue 27's measure).

One file of ``--scan`` x ``--det`` uint16 Poisson counts at ``--dose`` (LiberTEM's raw layout, written by
``qd.samples.write_raw`` beside its descriptor) is loaded into a one-worker service (``layout``: dense, what
"auto" holds on a CPU worker where it fits, and compressed), and read once by LiberTEM so it sits in the page
cache. Then, for each UDF (LiberTEM's SumUDF, SumSigUDF, ApplyMasksUDF with a disk and a ring, its centre of
mass, and a per-frame UDF as a user writes one), each the best of ``--repeats``:

- ours: ``qd.run_udf(udf, acq)`` from the client: the UDF sent, answered on the owner (LiberTEM's SumUDF,
  SumSigUDF and ApplyMasksUDF by the engine's exact sums, any other by LiberTEM's runner over the held
  counts), its results back; and with ``engine=False``, every UDF through LiberTEM's runner;
- LiberTEM 0.16: ``ctx.run_udf(dataset=ctx.load("raw", ...), udf=udf)`` with each of its executors: the
  default ``Context()`` (Dask, one process a core), "threads" and "inline"; the data set loaded once.

Every result buffer is compared with LiberTEM's (within its float tolerance). The figures are LiberTEM's time
over ours: against its default Context (target: at least 5x) and against its fastest executor.

    python benchmarks/run_udf.py            # 64 x 64 x 128 x 128 (128 MiB of counts)
    python benchmarks/run_udf.py --small    # seconds: what CI runs
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import qgpu_dask as qd
from qgpu_dask import samples

sys.path.insert(0, str(Path(__file__).resolve().parent))

import record

EXECUTORS = ("default", "threads", "inline")


def udfs(det: int) -> dict:
    """A maker of each UDF measured, by name (a UDF instance is run once)."""
    from libertem.udf.base import UDF
    from libertem.udf.com import CoMUDF
    from libertem.udf.masks import ApplyMasksUDF
    from libertem.udf.sum import SumUDF
    from libertem.udf.sumsigudf import SumSigUDF

    class PeakUDF(UDF):
        """The brightest count of each frame, as a user writes a UDF."""

        def get_result_buffers(self):
            return {"peak": self.buffer(kind="nav", dtype=np.float32)}

        def process_frame(self, frame):
            self.results.peak[:] = frame.max()

    yy, xx = np.mgrid[:det, :det]
    r2 = (yy - det / 2) ** 2 + (xx - det / 2) ** 2
    disk, ring = (r2 <= (det / 8) ** 2).astype(np.float32), ((r2 > (det / 4) ** 2) & (r2 <= (det / 2) ** 2)).astype(np.float32)
    return {"sum": SumUDF, "sumsig": SumSigUDF, "masks": lambda: ApplyMasksUDF(mask_factories=[lambda: disk, lambda: ring]),
            "com": lambda: CoMUDF.with_params(cy=det / 2, cx=det / 2), "user_peak": PeakUDF}


def same(ours: dict, theirs: dict) -> bool:
    """Every result buffer equal within LiberTEM's float tolerance."""
    return ours.keys() == theirs.keys() and all(
        np.allclose(np.asarray(ours[k].raw_data), np.asarray(theirs[k].raw_data), rtol=1e-5, atol=1e-6, equal_nan=True) for k in theirs)


def best(run, repeats: int) -> tuple[float, object]:
    """The shortest of ``repeats`` timed ``run()`` and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, nargs=2, default=(64, 64))
    ap.add_argument("--det", type=int, default=128)
    ap.add_argument("--dose", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=5)
    args = record.parse(ap, small={"scan": (6, 5), "det": 16, "repeats": 1})
    from libertem.api import Context

    counts = np.random.default_rng(0).poisson(args.dose, (*args.scan, args.det, args.det)).astype(np.uint16)
    folder = Path(tempfile.mkdtemp(prefix="qgpu-udf-"))
    results: dict = {"scan": list(args.scan), "det": args.det, "dose": args.dose, "repeats": args.repeats, "counts_bytes": counts.nbytes, "udfs": {}}
    try:
        descriptor = samples.write_raw(folder, counts, "<u2")
        makers = udfs(args.det)
        contexts = {kind: Context() if kind == "default" else Context.make_with(kind) for kind in EXECUTORS}
        datasets = {kind: ctx.load("raw", path=str(folder / "scan.bin"), nav_shape=tuple(args.scan), sig_shape=(args.det, args.det), dtype="<u2")
                    for kind, ctx in contexts.items()}
        with qd.Service.local(n_workers=1) as svc:
            held = {layout: svc.load(descriptor, name=layout, layout=layout, progress=False) for layout in ("dense", "compressed")}
            for name, make in makers.items():
                theirs, reference = {}, None
                for kind, ctx in contexts.items():
                    ctx.run_udf(dataset=datasets[kind], udf=make())  # warm: the first run compiles and starts what it needs
                    theirs[kind], reference = best(lambda: ctx.run_udf(dataset=datasets[kind], udf=make()), args.repeats)
                entry: dict = {"libertem_s": theirs}
                for run, (acq, engine) in {"dense": (held["dense"], True), "dense_runner": (held["dense"], False),
                                           "compressed": (held["compressed"], True)}.items():
                    qd.run_udf(make(), acq, engine=engine)
                    s, got = best(lambda: qd.run_udf(make(), acq, engine=engine), args.repeats)
                    entry[run] = {"s": s, "equal": same(got, reference), "over_default": theirs["default"] / s,
                                  "over_fastest": min(theirs.values()) / s}
                results["udfs"][name] = entry
                print(name, {k: round(v, 4) for k, v in theirs.items()},
                      {run: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in entry[run].items()} for run in entry if run != "libertem_s"},
                      flush=True)
        for ctx in contexts.values():
            ctx.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    record.publish("run_udf_" + ("cuda" if qd.device.has_gpu() else "cpu"), results)


if __name__ == "__main__":
    main()
