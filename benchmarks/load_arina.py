"""Loading an Arina-layout master (bitshuffle-LZ4 frames in linked data files) against h5py and the raw read.

Writes a master of Poisson counts (default 256 x 256 x 192 x 192 uint16 at 0.3
counts per pixel, 10000 frames per data file as the detector writes them),
reads it once so it sits in the page cache, then measures in the same run, as
GB/s of decompressed counts:

- raw read: the data files' bytes read into memory in one thread (what any reader must at least do),
  given both as file bytes per second and as counts per second at that pace;
- h5py + hdf5plugin reading every frame in one thread (HDF5's own filter path);
- our ArinaReader (stored chunks, Numba decoder on every core) into host memory;
- ``svc.load`` of the master into a resident on a one-worker cluster (dense, the default layout and compressed),
  and the compressed load against a dense load plus the encode of its counts measured alone (issue 24: <= 1).

    python benchmarks/load_arina.py                    # GPU machine: full size
    python benchmarks/load_arina.py --scan 64 64 --repeats 5   # the 2-core CPU machine
    python benchmarks/load_arina.py --small            # seconds: what CI runs
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import record

import qgpu_dask as qd
from qgpu_dask.io.readers.arina import ArinaReader
from qgpu_dask.resident.compressed import CompressedCounts

FRAMES_PER_FILE = 10000
POOL_FRAMES = 8192  # distinct frames a master's frames are drawn from
POOL_PART = 256  # pool frames a drawing task draws
shared: dict = {}  # in a worker process: write_master's pool and Poisson means (see share)


def write_master(folder: Path, scan: tuple[int, int], det: tuple[int, int], dose: float, seed: int, stem: str = "scan",
                 mean: np.ndarray | None = None) -> tuple[Path, list[Path], str]:
    """A master and its data files of Poisson counts (``mean`` per detector pixel, default ``dose`` everywhere);
    (master, data files, SHA-256 of the counts in scan order).

    Frame i is ``pool[index[i]]``, ``POOL_FRAMES`` distinct frames drawn once and ``index`` drawn from ``seed``
    (drawing a Poisson value for every pixel of every frame took most of the time); each frame is its own
    chunk, so compressing and decoding cost as much as for frames all distinct. The pool is drawn and the data
    files are written in worker processes (h5py runs one call at a time per process) while this one hashes."""
    rng = np.random.default_rng(seed)
    mean = np.full(det, dose) if mean is None else mean
    n = scan[0] * scan[1]
    # anonymous shared memory: the forked workers draw into it and all read it
    pool = np.frombuffer(mmap.mmap(-1, min(POOL_FRAMES, n) * det[0] * det[1] * 2), np.uint16).reshape(-1, *det)
    index = rng.integers(0, len(pool), n)
    parts = range(0, len(pool), POOL_PART)
    starts = range(0, n, FRAMES_PER_FILE)
    files = [folder / f"{stem}_data_{k:06d}.h5" for k in range(1, len(starts) + 1)]
    with ProcessPoolExecutor(min(os.cpu_count() or 1, max(len(parts), len(files))), mp_context=multiprocessing.get_context("fork"),
                             initializer=share, initargs=(pool, mean)) as workers:
        list(workers.map(draw, parts, rng.spawn(len(parts))))
        written = [workers.submit(write_data_file, path, index[lo : lo + FRAMES_PER_FILE]) for path, lo in zip(files, starts)]
        digest = hashlib.sha256()
        for i in index:
            digest.update(pool[i])
        for w in written:
            w.result()
    with h5py.File(folder / f"{stem}_master.h5", "w") as master:
        for k, path in enumerate(files, start=1):
            master[f"/entry/data/data_{k:06d}"] = h5py.ExternalLink(path.name, "/entry/data/data")
    return folder / f"{stem}_master.h5", files, digest.hexdigest()


def share(pool: np.ndarray, mean: np.ndarray) -> None:
    """In a worker process: keep write_master's pool (memory shared with it) and Poisson means for the tasks below."""
    shared.update(pool=pool, mean=mean)


def draw(start: int, rng: np.random.Generator) -> None:
    """Draw the pool's frames from ``start`` on, ``POOL_PART`` of them (the pool is the same on any core count)."""
    part = shared["pool"][start : start + POOL_PART]
    part[:] = rng.poisson(shared["mean"], part.shape)


def write_data_file(path: Path, index: np.ndarray) -> None:
    """A data file of the pool's frames ``index``, one bitshuffle-LZ4 chunk a frame."""
    pool = shared["pool"]
    with h5py.File(path, "w") as f:
        d = f.create_dataset("/entry/data/data", shape=(len(index), *pool.shape[1:]), dtype=np.uint16, chunks=(1, *pool.shape[1:]),
                             **hdf5plugin.Bitshuffle(nelems=0, cname="lz4"))
        for a in range(0, len(index), 1000):
            d[a : a + 1000] = pool[index[a : a + 1000]]


def best(fn, repeats: int) -> float:
    """Fastest of ``repeats`` runs, in seconds (the page cache warm)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def read_with_h5py(master: Path, out: np.ndarray) -> None:
    """Every frame of the master's data files into ``out`` through h5py and hdf5plugin (HDF5's filter path, one thread)."""
    with h5py.File(master, "r") as f:
        at = 0
        for name in sorted(f["/entry/data"]):
            d = f["/entry/data"][name]
            d.read_direct(out, dest_sel=np.s_[at : at + d.shape[0]])
            at += d.shape[0]


def encode_alone(counts: np.ndarray, shape: tuple, repeats: int) -> float:
    """Seconds the encode of ``counts`` (frames, rows, cols) takes on this process's device, the fastest of
    ``repeats`` after a first run that compiles: what a dense load plus an encode would add."""
    flat = qd.device.array_module().asarray(counts.reshape(len(counts), -1))

    def encode():
        CompressedCounts.encode("alone", flat, shape)
        qd.device.synchronize()

    encode()
    return best(encode, repeats)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, nargs=2, default=(256, 256))
    ap.add_argument("--det", type=int, nargs=2, default=(192, 192))
    ap.add_argument("--dose", type=float, default=0.3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--folder", type=Path, default=None, help="where to write the files (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=None, help="results JSON path (default: record.py's folder)")
    args = record.parse(ap, small={"scan": (8, 8), "det": (16, 16), "repeats": 1})
    scan, det = tuple(args.scan), tuple(args.det)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="qgpu-arina-"))
    counts_bytes = scan[0] * scan[1] * det[0] * det[1] * 2
    try:
        master, files, _ = write_master(folder, scan, det, args.dose, seed=0)
        file_bytes = sum(p.stat().st_size for p in files)
        print(f"{scan + det} uint16, {counts_bytes / 1e9:.2f} GB of counts in {len(files)} data file(s) of "
              f"{file_bytes / 1e9:.3f} GB (ratio {counts_bytes / file_bytes:.1f})", flush=True)

        buffer = np.empty(max(p.stat().st_size for p in files), np.uint8)

        def raw_read():  # one thread, into one buffer reused (its pages already mapped)
            for p in files:
                with open(p, "rb", buffering=0) as f:
                    f.readinto(memoryview(buffer)[: p.stat().st_size])

        out = np.empty((scan[0] * scan[1], *det), np.uint16)

        def h5py_read():
            read_with_h5py(master, out)

        def ours():
            reader = ArinaReader(master, scan)
            try:
                reader.read_into(out)
            finally:
                reader.close()

        raw_read()  # into the page cache
        t_raw = best(raw_read, args.repeats)
        t_h5 = best(h5py_read, args.repeats)
        reference = out.copy()
        t_ours = best(ours, args.repeats)
        exact = bool((out == reference).all())

        t_encode = encode_alone(reference, (*scan, *det), args.repeats)
        loads = {}
        with qd.Service.local(n_workers=1) as svc:
            for representation in ("dense", "auto", "compressed"):
                times = []
                for r in range(args.repeats):
                    t0 = time.perf_counter()
                    acq = svc.load(master, name=f"{representation}-{r}", scan_shape=scan, layout=representation)
                    times.append(time.perf_counter() - t0)
                    layout = acq.info()["layout"]
                    acq.release()
                loads[representation] = {"layout": layout, "s": min(times), "GBps": counts_bytes / min(times) / 1e9}

        gbps = lambda t: counts_bytes / t / 1e9  # noqa: E731
        results = {
            "shape": [*scan, *det], "dtype": "uint16", "dose": args.dose, "counts_bytes": counts_bytes,
            "file_bytes": file_bytes, "data_files": len(files), "exact_against_h5py": exact,
            "raw_read": {"s": t_raw, "file_GBps": file_bytes / t_raw / 1e9, "counts_GBps": gbps(t_raw)},
            "h5py_hdf5plugin_1_thread": {"s": t_h5, "GBps": gbps(t_h5)},
            "arina_reader": {"s": t_ours, "GBps": gbps(t_ours), "over_h5py": t_h5 / t_ours, "over_raw_read": t_raw / t_ours},
            "service_load": {k: v | {"over_h5py": t_h5 / v["s"], "over_raw_read": t_raw / v["s"]} for k, v in loads.items()},
            "encode_alone": {"s": t_encode},
            "compressed_over_dense_plus_encode": loads["compressed"]["s"] / (loads["dense"]["s"] + t_encode),
        }
        path = record.write(args.out.stem, results, args.out.parent) if args.out else record.write(f"load_arina_{'cuda' if qd.device.has_gpu() else 'cpu'}", results)
        print(f"raw read            {t_raw:8.3f} s  {file_bytes / t_raw / 1e9:7.2f} GB/s of file bytes ({gbps(t_raw):.2f} GB/s of counts)")
        print(f"h5py+hdf5plugin     {t_h5:8.3f} s  {gbps(t_h5):7.2f} GB/s of counts (1 thread)")
        print(f"ArinaReader         {t_ours:8.3f} s  {gbps(t_ours):7.2f} GB/s  {t_h5 / t_ours:.2f}x h5py, {t_raw / t_ours:.2f}x raw read time")
        for k, v in loads.items():
            print(f"svc.load {k:5s} ({v['layout']:10s}) {v['s']:8.3f} s  {v['GBps']:7.2f} GB/s  "
                  f"{t_h5 / v['s']:.2f}x h5py, {t_raw / v['s']:.2f}x raw read time")
        print(f"compressed load over a dense load plus the encode alone ({t_encode:.3f} s): "
              f"{results['compressed_over_dense_plus_encode']:.2f}  (issue 24: <= 1)")
        print(f"exact against h5py: {'yes' if exact else 'NO'}\nresults: {path}")
        return 0 if exact else 1
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
