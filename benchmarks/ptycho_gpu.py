"""The feed and one ptychography iteration on the owner (issue 8's measurements).

A resident of Poisson counts (``--scan`` x ``--scan`` positions, ``--det`` x ``--det`` uint16 pixels, mean
``--dose`` counts per pixel), dense and compressed. Measured, each against a baseline of the same run:
- the feed: every block of ``--block`` positions made (native counts, and float32 amplitudes), in counts
  per second, against a plain read of the dense counts (the device's bandwidth in practice); compressed
  amplitudes also at the ``--feed-doses`` (the decoder's cost grows with the nonzero counts);
- each step of one batch (``stages_us_per_batch``);
- one pass of ``phase.iterative.update.frame_pass`` over all positions (a scan step of 2 object pixels): fed from
  the compressed resident's counts as the shards feed it, and with the blocks made beforehand (the update
  alone), so the overlap of feed and update is (feed + update - fed pass) / feed; and fed with the detector
  reduced in the feed as ``qd.ptycho.reconstruct(crop=, bin=)`` does: cropped to 2/3 (128 of 192), binned 2 x 2.

    python benchmarks/ptycho_gpu.py                     # on the GPU machine: 512 x 512 x 192 x 192
    python benchmarks/ptycho_gpu.py --small             # seconds, on the CPU too: what CI runs
"""

from __future__ import annotations

import argparse

import numpy as np

import qgpu_dask as qd
from qgpu_dask.device import array_module
from qgpu_dask.phase.iterative import geometry, update, window
from qgpu_dask.resident.compressed import CompressedCounts
from qgpu_dask.resident.dense import DenseCounts

import record
from compressed import full_read, poisson_counts, release, synced
from timing import median_ms


def seconds(xp, fn, repeats: int = 3) -> float:
    """Median wall seconds of ``fn`` (device work included), after one warm-up."""
    return median_ms(synced(xp, fn), repeats) / 1e3


def drain(resident, block: int, amplitude: bool, depth: int):
    """Every block of the feed, touched by a sum so the consumer's stream waits for each."""
    return lambda: [b[:1, :1, :1].sum() for b in resident.feed(block, amplitude=amplitude, depth=depth)][-1]


def stages(xp, geo, probe, obj, measured) -> dict:
    """Median microseconds of each step of one batch on the first block: ``updated_waves`` (on the GPU its
    default path; the pair of CTAs per position apart) and ``object_update`` (``update.frame_pass``'s loop body), and the
    steps ``updated_waves`` takes one by one through cuFFT (its baseline)."""
    k = update.kernels(xp)
    corners = xp.asarray(geo.corners)
    batch = update.batch_of(geo, 0, measured.shape[0])
    far = k.exit_waves(obj, probe, corners, batch)
    sums = xp.zeros(geo.window, xp.complex64), xp.zeros(geo.window, xp.float32)
    steps = {
        "exit_waves": lambda: k.exit_waves(obj, probe, corners, batch),
        "fft2": lambda: k.fft2(far),
        "project": lambda: k.project(far, measured, geo.center, 1.0),
        "ifft2": lambda: k.ifft2(far),
        "probe_sums": lambda: k.probe_sums(obj, probe, far, corners, batch, *sums),
        "updated_waves": lambda: k.updated_waves(obj, probe, measured, corners, batch, geo.center, 1.0, *sums),
        "object_update": lambda: k.object_update(obj, probe, far, corners, batch, 1.0, 1.0),
    }
    if xp is not np and k.pair_launch(*geo.window, batch.n, k.measured_ctype(measured)) is not None:
        steps["updated_waves_pair"] = lambda: k.updated_waves(obj, probe, measured, corners, batch, geo.center, 1.0, *sums, path="pair")
    return {name: seconds(xp, fn, 20) * 1e6 for name, fn in steps.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=512)
    ap.add_argument("--det", type=int, default=192)
    ap.add_argument("--dose", type=float, default=0.5, help="mean counts per pixel")
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--feed-doses", type=float, nargs="*", default=[0.05, 0.2], help="more doses to feed compressed residents at")
    args = record.parse(ap, small={"scan": 16, "det": 16, "block": 32})
    xp = array_module()
    shape = (args.scan, args.scan, args.det, args.det)
    n_frames, frame_len = args.scan * args.scan, args.det * args.det
    counts = n_frames * frame_len
    flat = poisson_counts(xp, xp.empty((n_frames, frame_len), np.uint16), args.dose, seed=1)
    results: dict = {"shape": list(shape), "dose": args.dose, "block": args.block, "depth": args.depth}
    read_s = seconds(xp, full_read(xp, flat))
    results["read_GBps"] = flat.nbytes / read_s / 1e9
    compressed = CompressedCounts.encode("compressed", flat, shape)
    results["compressed_ratio"] = compressed.raw_bytes / compressed.nbytes
    dense = DenseCounts("dense", flat, shape)
    for label, resident in (("dense", dense), ("compressed", compressed)):
        for amplitude in (False, True):
            s = seconds(xp, drain(resident, args.block, amplitude, args.depth))
            results[f"feed_{label}_{'amplitude' if amplitude else 'counts'}"] = {
                "G_counts_per_s": counts / s / 1e9, "ms": s * 1e3, "over_read": (flat.nbytes / s / 1e9) / results["read_GBps"]}
    del dense, flat
    release(xp)
    results["feed_compressed_by_dose"] = {str(args.dose): dict(results["feed_compressed_amplitude"], ratio=results["compressed_ratio"])}
    for dose in args.feed_doses:
        other = CompressedCounts.encode("other", poisson_counts(xp, xp.empty((n_frames, frame_len), np.uint16), dose, seed=2), shape)
        release(xp)
        s = seconds(xp, drain(other, args.block, True, args.depth))
        results["feed_compressed_by_dose"][str(dose)] = {"G_counts_per_s": counts / s / 1e9, "ms": s * 1e3,
                                                         "ratio": other.raw_bytes / other.nbytes}
        del other
        release(xp)

    wavelength = qd.Optics(300e3, 20.0, 1.0).wavelength_A
    pixel = 0.25  # object pixel (A); the scan step is 2 of them
    fit = qd.Optics(300e3, 20.0, 2 * pixel, det_sampling_mrad=wavelength * 1e3 / (args.det * pixel), rotation_deg=0.0, flip=False,
                    bf_center_px=(args.det // 2, args.det // 2), aberrations={"C10": -50.0})
    geo = geometry.geometry(fit, shape[:2], shape[2:])
    probe = xp.asarray(geometry.starting_probe(fit, geo, args.dose * frame_len))
    fresh = lambda: xp.ones(geo.object_shape, np.complex64)
    fed_s = seconds(xp, lambda: update.frame_pass(fresh(), probe, compressed.feed(args.block, False, args.depth), geo, 1.0, xp), 2)
    feed_s = results["feed_compressed_counts"]["ms"] / 1e3  # as the shards feed it: counts, rooted by the projection
    made = [b.copy() for b in compressed.feed(args.block, False, args.depth)] if counts * 2 < 64e9 else None  # the blocks, made beforehand
    alone_s = seconds(xp, lambda: update.frame_pass(fresh(), probe, made, geo, 1.0, xp), 2) if made else None
    results["stages_us_per_batch"] = stages(xp, geo, probe, fresh(), made[0] if made else next(iter(compressed.feed(args.block, False))))
    reduced = {}
    for label, crop, bin in (("crop", args.det * 2 // 3 // 2 * 2, 1), ("bin", None, 2)):
        part = window.window(shape[2:], fit, crop, bin)
        small_fit = part.optics_of(fit)
        small = geometry.geometry(small_fit, shape[:2], part.det_shape)
        small_probe = xp.asarray(geometry.starting_probe(small_fit, small, args.dose * frame_len))
        s = seconds(xp, lambda: update.frame_pass(xp.ones(small.object_shape, np.complex64), small_probe,
                                                  (part.reduce(b, xp) for b in compressed.feed(args.block, False, args.depth)),
                                                  small, 1.0, xp), 2)
        reduced[label] = {"det": list(part.det_shape), "fed_ms": s * 1e3, "ms_per_262144_positions": s * 1e3 * 262144 / n_frames,
                          "over_full_detector": s / fed_s}
    results["iteration"] = {
        "reduced": reduced,
        "positions": n_frames, "object_shape": list(geo.object_shape),
        "fed_ms": fed_s * 1e3, "ms_per_262144_positions": fed_s * 1e3 * 262144 / n_frames,
        "update_alone_ms": alone_s * 1e3 if alone_s else None, "feed_ms": feed_s * 1e3,
        "overlap": (feed_s + alone_s - fed_s) / feed_s if alone_s else None,
        "counts_read_over_fed": n_frames * frame_len * 2 / (results["read_GBps"] * 1e9) / fed_s,
    }
    record.publish(f"ptycho_{'cuda' if xp is not np else 'cpu'}", results)


if __name__ == "__main__":
    main()
