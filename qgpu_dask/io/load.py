"""Stream a source into a resident block by block, never holding the whole acquisition on the host."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

import numpy as np

from ..device import passing_memory
from ..formats import codec
from ..formats.bitshuffle_lz4 import ChunkError, decompress_stored
from ..resident.base import Resident, check_dtype
from ..resident.dense import DenseCounts
from ..resident.live import APPEND_BYTES, PROBE, Coding, LiveCounts, append_frames
from ..resident.staging import PinnedStaging
from .batches import AHEAD, decoded, host_buffers, prefetched
from .readers.base import BLOCK_BYTES, DecodesInto, KeepsPositions, Reader, ReadsFrames, ScanShapeNeeded, SendsChunks, frames_per_block
from .readers.chunk_index import callback
from .registry import open_reader
from .saved import describe_saved, is_saved, uploads
from .source import Source, disk_bytes

GPU_BATCH_BYTES = APPEND_BYTES  # counts a GPU decodes (thousands of chunks, a warp each) and codes (several blocks) at a time
SAMPLE_RUNS, SAMPLE_FRAMES = 8, 1024  # a coded load's model is chosen from runs of consecutive frames (a chunk read each)
SAMPLE_SHARE = 8  # of a smaller scan, an eighth is sampled (the sample is coded once more, to measure it)


def describe(reader: Reader) -> dict:
    """Shape, dtype (checked), raw bytes and the bytes a load reserves (the dense counts) of an open source, and
    the positions of a scan that is not a raster (``KeepsPositions``: [row, col] of each, a list, as records hold them)."""
    dtype = check_dtype(reader.dtype)
    shape = reader.shape
    n = shape[0] * shape[1] * shape[2] * shape[3]
    kept = {"positions": reader.positions.tolist()} if isinstance(reader, KeepsPositions) else {}
    return {"shape": shape, "dtype": str(dtype), "raw_bytes": n * dtype.itemsize, "load_bytes": n * dtype.itemsize, **kept}


def inspect(source: Source) -> dict:
    """:func:`describe` of a source, opened and closed again; a saved resident is described from its header."""
    if is_saved(source):
        return describe_saved(source)
    reader = open_reader(source)
    try:
        return describe(reader)
    finally:
        reader.close()


def inspect_file(path, dataset: str | None = None, scan_shape=None) -> dict:
    """What a file holds, without reading its counts: format, shape, dtype, compression, bytes on disk
    and bytes of the counts (``qd.inspect``). A frame stack whose scan shape the file does not give is
    described by its frames ("frames", "det_shape"; "shape" None) and "needs" says to give ``scan_shape``; a scan
    that is not a raster, as one scan row (1, n) with its "positions" ((n, 2) row, col in scan pixels)."""
    source = Source(str(Path(path).expanduser().resolve()), dataset, tuple(scan_shape) if scan_shape else None)
    where = Path(source.path)
    on_disk = disk_bytes(where)
    if is_saved(source):
        meta = describe_saved(source)
        return {"format": f"saved resident ({meta['layout']})", "shape": meta["shape"], "dtype": meta["dtype"],
                "compression": codec.FORMAT if meta["layout"] == "compressed" else "none",
                "file_bytes": on_disk, "raw_bytes": meta["raw_bytes"]}
    needs = {}
    try:
        reader = open_reader(source)
    except ScanShapeNeeded as err:  # read it as one scan row of every frame, to describe them
        reader = open_reader(Source(source.path, source.dataset, (1, err.frames)))
        needs = {"frames": err.frames, "needs": str(err)}
    try:
        meta = describe(reader)
        shape = meta["shape"]
        found = {"shape": None, "det_shape": shape[2:], **needs} if needs else {"shape": shape}
        kept = {"positions": reader.positions} if isinstance(reader, KeepsPositions) else {}
        return {"format": reader.kind, **found, "dtype": meta["dtype"], "compression": reader.compression,
                "file_bytes": on_disk, "raw_bytes": meta["raw_bytes"], **kept}
    finally:
        reader.close()


def read_dense(name: str, reader: Reader, xp: ModuleType | None = None, block_bytes: int = BLOCK_BYTES,
               progress: Callable[[int], None] = lambda frames: None) -> DenseCounts:
    """A DenseCounts filled from ``reader`` in blocks, ``progress(frames read so far)`` after each; a failed
    read names the first frame it did not get."""
    resident = DenseCounts.empty(name, reader.shape, check_dtype(reader.dtype), xp)
    if isinstance(reader, DecodesInto):  # the reader decodes into host memory, or pinned buffers bound for the device
        if resident.xp is np:
            frames = resident.flat.reshape(resident.n_frames, *resident.det_shape)
            for start, block in reader.blocks_into(lambda start, n: frames[start : start + n], block_bytes):
                progress(start + len(block))
            return resident
        staging = PinnedStaging(resident.flat, frames_per_block(reader.shape, resident.dtype, block_bytes), resident.det_shape)
        try:
            for start, block in reader.blocks_into(staging.buffer, block_bytes):
                staging.send(start, block)
                progress(start + len(block))
        finally:
            staging.finish()  # no copy may still run into memory freed after a failed read
        return resident
    read_blocks(reader.blocks(block_bytes), resident.write, progress)
    return resident


def read_coded(name: str, reader: Reader, coding: Coding | None, xp: ModuleType, block_bytes: int = BLOCK_BYTES,
               progress: Callable[[int], None] = lambda frames: None, reserved: int = 0,
               beyond: Callable[[int], None] = lambda nbytes: None) -> Resident:
    """A compressed resident on ``xp``'s device, coded scan block by scan block as ``reader``'s frames arrive
    (as a live acquisition is), so a load never holds the dense counts: a few batches of frames at most. Coded
    with ``coding`` (chosen from frames spread over the scan, ``model_sample``), else with a model from the
    first frames. For a GPU, a reader of bitshuffle-LZ4 frames hands on their stored chunks, read into pinned
    buffers and decoded there, in batches of GPU_BATCH_BYTES of counts; the reads run AHEAD of the decoding
    and coding in a thread of their own. ``progress(frames held so far)`` follows each append of coded blocks
    (a load's stop raises there: a batch of a large scan takes seconds to code on a CPU). ``beyond(nbytes)``
    raises where the resident would hold ``nbytes`` more than the ``reserved`` (nothing is added then). Its buffers come from the passing pool, what the resident
    keeps from the held one (``device.passing_memory``)."""
    with passing_memory():
        live = LiveCounts(name, reader.shape, check_dtype(reader.dtype), "compressed", xp, coding)
        live.room = lambda nbytes: beyond(live.nbytes + nbytes - reserved)
        det_shape = reader.shape[2:]
        if xp is np:
            batches = reader.blocks(block_bytes)
        elif isinstance(reader, SendsChunks):
            batches = prefetched(reader.chunk_batches(host_buffers(xp), GPU_BATCH_BYTES), AHEAD)
        else:
            batches = prefetched(reader.blocks(block_bytes), AHEAD)

        def append(start: int, batch) -> None:
            frames, bad = decoded(batch, det_shape, live.dtype, xp)
            if bad is not None:  # a chunk the GPU found malformed (only SendsChunks readers hand chunks on)
                raise ValueError(f"{reader.where(start + bad.index)}: {bad.problem}")
            step = append_frames(live.shape, live.dtype, live.block or codec.MAX_BLOCK)
            for at in range(0, len(frames), step):  # whole blocks coded in one pass each
                live.append(frames[at : at + step])
                progress(start + min(at + step, len(frames)))

        try:
            read_blocks(batches, append, progress)
            return live.finished()
        finally:
            live.room = lambda nbytes: None  # its check held the acquisition: without the cycle, its buffers go with it


def warm_up(xp: ModuleType) -> Resident:
    """Compile what a coded load runs on ``xp``'s device, or load it from the caches CuPy and Numba keep on
    disk (the first process on a machine compiles, the next ones read): the chunk index's callback, the coding of a sample, an append
    of its blocks, the stored-chunk decoder (fed a chunk too short to decode: the compile is what counts) and,
    on a GPU, the leaf digests a saved resident's reopen checks on the device, and pins the host slots
    saved residents are reopened through. A shard runs it as it starts (``service.warm_up``), so its first
    load or reopen does not wait for the compiler or for pinning (an H200's first reopen took 0.90 s, the
    third 0.085). Returns the tiny compressed resident it coded."""
    callback()  # the chunk index's compiled callback
    frames = np.random.default_rng(0).poisson(0.5, (256, 16, 16)).astype(np.uint16)
    live = LiveCounts("warm-up", (16, 16, 16, 16), frames.dtype, "compressed", xp, Coding.chosen(frames, (16, 16), xp))
    live.append(xp.asarray(frames))
    coded = live.finished()
    if xp is np:
        try:
            decompress_stored(np.zeros(16, np.uint8), np.zeros(1, np.int64), np.full(1, 16, np.int64), np.empty((1, 16, 16), np.uint16))
        except ChunkError:
            pass
    else:
        from ..formats.bitshuffle_lz4_cuda import outcomes

        from ..formats.sha256_cuda import range_digests

        outcomes(np.zeros(16, np.uint8), np.zeros(1, np.int64), np.full(1, 16, np.int64), xp.empty((1, 16, 16), np.uint16))
        range_digests(xp.zeros(64, np.uint8), np.zeros(1, np.uint64), np.full(1, 64, np.uint64))
        uploads()
    return coded


def sample_runs(n_frames: int) -> list[tuple[int, int]]:
    """(first frame, frames) of each run ``model_sample`` reads: SAMPLE_RUNS runs spread evenly over the scan,
    SAMPLE_FRAMES frames in all, or an eighth of a smaller scan (at least PROBE frames; all of a scan that
    short). The sample is coded once to measure it: a 64 x 64 scan sampled at 1024 frames coded a quarter of
    itself twice, where 512 frames give a model 1.1% larger and cost 0.4 s less on 2 cores."""
    total = min(n_frames, max(PROBE, min(SAMPLE_FRAMES, n_frames // SAMPLE_SHARE)))
    if total == n_frames:
        return [(0, n_frames)]
    run = total // SAMPLE_RUNS
    return [(int(start), run) for start in np.linspace(0, n_frames - run, SAMPLE_RUNS).astype(int)]


def model_sample(reader: Reader) -> np.ndarray | None:
    """The frames of ``sample_runs`` of the scan, for a reader that reads any frames (``ReadsFrames``); None for
    the others. A model from the first frames alone fits a scan whose dose or thickness drifts badly: 1.22x
    the bytes of a model from every frame for a dose ramp of 0.5x to 1.5x, against 1.008x from 8 runs of 128
    frames."""
    if not isinstance(reader, ReadsFrames):
        return None
    try:
        return np.concatenate([reader.frames(start, length) for start, length in sample_runs(reader.shape[0] * reader.shape[1])])
    except (OSError, RuntimeError) as err:  # the file library's own read errors
        raise ValueError(f"reading frames spread over the scan for the coding model failed: {err}") from err


def read_blocks(batches: Iterator[tuple[int, object]], write: Callable[[int, object], object], progress: Callable[[int], None]) -> None:
    """``write(first frame, batch)`` for every batch of frames (``batches``, closed after: a read running ahead
    stops), then ``progress(frames read so far)``; a failed read names the first frame it did not get."""
    done = 0
    try:
        for start, batch in batches:
            write(start, batch)
            done = start + len(batch)
            progress(done)
    except (OSError, RuntimeError) as err:  # the file library's own read errors (HDF5 filters, Zarr codecs)
        raise ValueError(f"reading frame {done} or one after it failed: {err}") from err
    finally:
        batches.close()
