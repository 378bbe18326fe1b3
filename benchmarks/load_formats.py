"""Loading the field's file formats against RosettaSciIO's and LiberTEM's readers on the same files (issue 27's measure).

For each format, one file of the same counts (``--scan`` x ``--det`` uint16 Poisson counts at ``--dose``;
8-bit for .blo, which holds no more) is written (by RosettaSciIO's writer for .blo and TVIPS, mrcfile's for
MRC, ``qd.samples`` by the published layout for the others), read once so it sits in the page cache, then,
each the best of ``--repeats`` (K2 IS frames are 1860 x 2048 whatever ``--det`` says: a square scan of about
as many counts, 12-bit packed in eight sector files):

- ours: ``svc.load(path, layout="dense")`` on a one-worker cluster (the counts held in the worker; the dense
  index it then builds in the background is not timed: each load starts on an idle worker);
- RosettaSciIO: its ``file_reader`` of the format, not lazy, and, where the array it gives is still backed by
  the file (a memory map), a copy of it into memory: every count in memory, as a load holds them;
- LiberTEM 0.16: ``ctx.load`` of the format and a UDF keeping every frame in its result buffer, on its
  threaded executor.

Every count is compared: our resident's checksum against the counts written, the peers' arrays against them
(==). The figure is our time against the faster peer's (target: at least 2x on files of at least 1 GB).

    python benchmarks/load_formats.py              # 128 x 64 x 256 x 256: 1 GiB a file
    python benchmarks/load_formats.py --small      # seconds: what CI runs
"""

from __future__ import annotations

import argparse
import hashlib
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

FORMATS = ("mrc", "dm", "ser", "blo", "tvips", "seq", "frms6", "raw", "k2is")
K2IS_FRAME = (1860, 2048)  # a K2 IS frame, whatever --det says
RSCIIO = {"mrc": "mrc", "dm": "digitalmicrograph", "ser": "tia", "blo": "blockfile", "tvips": "tvips"}


def written(kind: str, folder: Path, counts: np.ndarray) -> tuple[Path, dict, dict]:
    """The file of ``kind`` holding ``counts``: (path, what ``svc.load`` takes beside it, LiberTEM's load parameters)."""
    scan, frames = counts.shape[:2], counts.reshape(-1, *counts.shape[2:])
    if kind == "mrc":
        return samples.write_mrc(folder / "scan.mrc", frames), {"scan_shape": scan}, {"nav_shape": scan}
    if kind == "dm":
        return samples.write_dm(folder / "scan.dm4", counts), {}, {}
    if kind == "ser":
        return samples.write_ser(folder / "scan_1.ser", counts), {}, {}
    if kind == "blo":
        return samples.write_blo(folder / "scan.blo", counts), {}, {}
    if kind == "tvips":
        return samples.write_tvips(folder, frames, stem="scan"), {"scan_shape": scan}, {"nav_shape": scan, "sync_offset": 0}
    if kind == "seq":
        return samples.write_seq(folder / "scan.seq", frames), {"scan_shape": scan}, {"nav_shape": scan}
    if kind == "k2is":  # the shutter open from the first whole frame and no scan in the .gtg: how LiberTEM reads a file under 2.3 GB
        return samples.write_k2is(folder, counts, lead=0, scan_in_gtg=False), {"scan_shape": scan}, {"nav_shape": scan}
    if kind == "frms6":
        return samples.write_frms6(folder, counts, per_file=len(frames) // 2 + 1), {}, {"enable_offset_correction": False}
    return samples.write_raw(folder, counts, "<u2"), {}, {}


def in_memory(data: np.ndarray) -> np.ndarray:
    """``data`` itself where its bytes are in memory, else (a view of a memory-mapped file) a copy of it."""
    import mmap

    base = data
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return np.array(data)
        base = getattr(base, "base", None)
    return data


def libertem_read(kind: str, path: Path, params: dict, ctx, shape: tuple) -> np.ndarray:
    """Every frame of ``path`` as LiberTEM reads it (a UDF keeping each frame in its result buffer)."""
    from libertem.udf.base import UDF

    class Frames(UDF):
        def get_result_buffers(self):
            return {"frames": self.buffer(kind="nav", extra_shape=tuple(self.meta.dataset_shape.sig), dtype=self.meta.input_dtype)}

        def process_frame(self, frame):
            self.results.frames[:] = frame

    if kind == "raw":  # LiberTEM's raw reader takes the data file and its layout
        dataset = ctx.load("raw", path=str(path.with_name("scan.bin")), nav_shape=shape[:2], sig_shape=shape[2:], dtype="<u2")
    else:
        dataset = ctx.load(kind, path=str(path), **params)
    return ctx.run_udf(dataset=dataset, udf=Frames())["frames"].data


def best(run, repeats: int, before=lambda: None) -> float:
    """The shortest of ``repeats`` timed ``run()``, each after an untimed ``before()``."""
    times = []
    for _ in range(repeats):
        before()
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, nargs=2, default=(128, 64))
    ap.add_argument("--det", type=int, default=256)
    ap.add_argument("--dose", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    args = record.parse(ap, small={"scan": (4, 6), "det": 16, "repeats": 1})
    from libertem.api import Context

    rng = np.random.default_rng(0)
    wide = rng.poisson(args.dose, (*args.scan, args.det, args.det)).astype(np.uint16)
    narrow = np.minimum(wide, 255).astype(np.uint8)
    k2_scan = max(1, round((wide.nbytes / (2 * np.prod(K2IS_FRAME))) ** 0.5))  # a square scan of about as many bytes of counts
    k2 = rng.poisson(args.dose, (k2_scan, k2_scan, *K2IS_FRAME)).astype(np.uint16)
    results: dict = {"scan": list(args.scan), "det": args.det, "dose": args.dose, "repeats": args.repeats, "formats": {}}
    ctx = Context.make_with("threads")
    with qd.Service.local(n_workers=1) as svc:
        for kind in args.formats:
            counts = {"blo": narrow, "k2is": k2}.get(kind, wide)
            digest = hashlib.sha256(counts.tobytes()).hexdigest()
            folder = Path(tempfile.mkdtemp(prefix=f"qgpu-{kind}-"))
            try:
                path, ours_args, theirs = written(kind, folder, counts)
                file_bytes = sum(p.stat().st_size for p in folder.iterdir())
                qd.inspect(path, **ours_args)
                names = iter(range(1 << 30))
                loaded = []

                def ours():
                    loaded.append(svc.load(path, name=f"{kind}-{next(names)}", layout="dense", progress=False, **ours_args))

                def idle():  # the last one released and its index built: each load is timed on an idle worker
                    while loaded:
                        loaded.pop().release()
                    time.sleep(1.0)

                peers = {}
                got = []
                if kind in RSCIIO:
                    import importlib

                    reader = importlib.import_module(f"rsciio.{RSCIIO[kind]}").file_reader
                    keywords = {"scan_shape": tuple(args.scan)} if kind == "tvips" else {}
                    if kind == "mrc":
                        keywords = {"navigation_shape": tuple(args.scan)[::-1]}

                    def rosettasciio():
                        got[:] = [in_memory(reader(str(path), **keywords)[0]["data"])]

                    rosettasciio()
                    peers["rosettasciio"] = {"s": best(rosettasciio, args.repeats), "counts_equal": bool((got[0].reshape(counts.shape) == counts).all())}

                def libertem():
                    got[:] = [libertem_read(kind, path, theirs, ctx, counts.shape)]

                libertem()
                peers["libertem"] = {"s": best(libertem, args.repeats), "counts_equal": bool((got[0] == counts).all())}
                got.clear()
                ours()
                s = best(ours, args.repeats, idle)
                equal = loaded[0].checksum() == digest
                loaded.pop().release()
                faster = min(p["s"] for p in peers.values())
                results["formats"][kind] = {"file_bytes": file_bytes, "counts_bytes": counts.nbytes, "ours_s": s,
                                            "GBps": counts.nbytes / s / 1e9, "counts_equal": equal, "peers": peers,
                                            "over_faster_peer": faster / s}
                print(kind, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in results["formats"][kind].items() if k != "peers"},
                      {k: round(v["s"], 3) for k, v in peers.items()}, flush=True)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    ctx.close()
    record.publish("load_formats_" + ("cuda" if qd.device.has_gpu() else "cpu"), results)


if __name__ == "__main__":
    main()
