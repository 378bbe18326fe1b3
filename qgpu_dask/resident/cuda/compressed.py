"""CUDA codec and query kernels (kernels/compressed.cu through CuPy) for compressed counts.

The twins of ``qgpu_dask.resident.cpu.compressed``: same functions, same
arguments, same bytes and bits (see its docstring). Arrays are CuPy arrays on
the current device; launches go to the current stream. Every decoding kernel
reports the first malformed stream it meets; the host turns that into a
ValueError, so no partial result leaves.
"""

from __future__ import annotations

import cupy
import cupyx
import numpy as np

from ...formats import codec
from ...formats.codec import HIST_BINS, TOKEN_SLOTS, pack_index
from ..cpu import compressed as twin
from ..cpu.compressed import ERRORS
from . import groups
from ... import compile
from ...compile import Launch, limits

__all__ = ["Model", "Streams", "SeriesStreams", "value_histogram", "token_histogram", "encode", "mask_sums", "mask_sums_async", "roi_reduce", "frame", "decode_pixels", "decode_frames", "decode_all", "check", "fill_streams"]

THREADS = 256
HIST_FRAMES = 1024  # frames per histogram block
MASK_THREADS = 128  # pixels per mask_sums block: each thread decodes one stream
MASK_GROUP = 4  # masks accumulated in one pass over the streams (one template instantiation each)
MASK_SMEM = 64 * 1024  # shared accumulator bytes per mask_sums block
NO_ERROR = 2**64 - 1
ERROR_CODE_BITS = 8  # a kernel's error word: (stream << ERROR_CODE_BITS) | code, NO_ERROR when none
LUT_SIZE = 64  # starting symbols per table of a pixel's lookup tables
TILE_BYTES = 16 * 1024  # counts an encoder CTA stages in shared memory at a time (two such buffers)
DECODE_RING = 32  # rows of a decode_rows warp's ring of decoded counts: how far its lanes may run apart
DECODE_FLUSH = 8  # rows of the ring a decode_rows warp stores at a time
DECODE_WARPS = 4  # warps of a decode_rows block
LUT_PITCH = 2 * LUT_SIZE + 4  # bytes between two pixels' LUTs in decode_rows' shared memory: an odd number of words
CTYPES = {np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short", np.dtype(np.uint32): "unsigned int"}
DECODED_TYPES = {**CTYPES, np.dtype(np.float32): "float"}  # what decoded counts may be written as
DEFINES = compile.defines(  # the constants kernels/compressed.cu takes from Python
    PROB_BITS=codec.PROB_BITS,
    STATE_LOW=f"{codec.STATE_LOW}u",
    HIST_BINS=codec.HIST_BINS,
    RUN_SLOT=codec.RUN_SLOT,
    TOKEN_SLOTS=codec.TOKEN_SLOTS,
    FORM_SHIFT=codec.FORM_SHIFT,
    OFFSET_MASK=f"{codec.OFFSET_MASK}u",
    EMPTY=codec.EMPTY,
    CONSTANT=codec.CONSTANT,
    SPARSE=codec.SPARSE,
    ANS=codec.ANS,
    RAW=codec.RAW,
    SLOT_MASK=f"{twin.SLOT_MASK}u",
    E_LENGTH=twin.E_LENGTH,
    E_TRUNCATED=twin.E_TRUNCATED,
    E_STATE=twin.E_STATE,
    E_POSITION=twin.E_POSITION,
    E_VALUE=twin.E_VALUE,
    E_SPARSE=twin.E_SPARSE,
    E_FORM=twin.E_FORM,
    LUT_SIZE=LUT_SIZE,
    ERROR_CODE_BITS=ERROR_CODE_BITS,
    TILE_BYTES=TILE_BYTES,
    DECODE_RING=DECODE_RING,
    DECODE_FLUSH=DECODE_FLUSH,
    LUT_PITCH=LUT_PITCH,
    DESC_WORDS=twin.DESC_WORDS,
)


def kernel(name_expr: str) -> cupy.RawKernel:
    return compile.kernel("compressed.cu", name_expr, DEFINES)


def counts_type(flat: cupy.ndarray) -> str:
    if flat.dtype not in CTYPES:
        raise ValueError(f"compressed counts are uint8, uint16 or uint32, got {flat.dtype}")
    if not flat.flags.c_contiguous or flat.ndim != 2:
        raise ValueError("counts must be a C-contiguous (n_frames, frame_len) array")
    return CTYPES[flat.dtype]


def grid(n: int, threads: int = THREADS) -> int:
    return max(1, -(-n // threads))


class Model(twin.Model):
    """The CPU twin's model plus, per pixel, lookup tables that start each symbol search near its answer."""

    def __init__(self, *args):
        super().__init__(*args)
        frame_len = self.run.shape[0]
        self.lut = cupy.empty(frame_len * 2 * LUT_SIZE, dtype=np.uint8)
        kernel("build_lut")(
            (grid(self.lut.size),), (THREADS,), (self.run, self.values, self.table_start, self.cum, np.int32(frame_len), self.lut)
        )
        self.table_stride = table_stride(self.run, self.values)
        modes = self.run > 0
        self.frame_order = cupy.concatenate([cupy.flatnonzero(~modes), cupy.flatnonzero(modes)]).astype(np.int32)  # value-mode pixels first


class Streams(twin.Streams):
    """The CPU twin's streams, with the payload's allocation padded to whole 16-byte lines (the decoder reads lines)."""

    def __init__(self, index, block_base, payload):
        offset = payload.data.ptr - payload.data.mem.ptr
        if payload.data.mem.size < offset + padded(payload.size):
            copy = cupy.zeros(padded(payload.size), dtype=np.uint8)
            copy[: payload.size] = payload
            payload = copy[: payload.size]
        super().__init__(index, block_base, payload)


def table_stride(run, values) -> int:
    """u16 entries that hold any pixel's value and run tables (even, so the LUT copies stay aligned)."""
    entries = values.astype(np.int64) + 2 + (run > 0) * (run.astype(np.int64) + 3)  # NumPy or CuPy arrays
    return int(entries.max()) + 1 & ~1


def padded(n: int) -> int:
    return -(-n // 16) * 16


# ---------------------------------------------------------------- encoding


def value_histogram(flat: cupy.ndarray) -> cupy.ndarray:
    """(frame_len, HIST_BINS) uint64: how often each pixel holds 0..254, and >= 255 in the last bin."""
    t = counts_type(flat)
    n_frames, frame_len = flat.shape
    hist = cupy.zeros((frame_len, HIST_BINS), dtype=np.uint64)
    chunks = grid(n_frames, HIST_FRAMES)
    kernel(f"value_histogram<{t}>")(
        (grid(frame_len), chunks), (THREADS,), (flat, np.int64(n_frames), np.int32(frame_len), np.int64(HIST_FRAMES), hist)
    )
    return hist


def token_histogram(flat: cupy.ndarray, block: int, run, values) -> cupy.ndarray:
    """(frame_len, TOKEN_SLOTS) uint64 token counts under the per-pixel models (run, values)."""
    t = counts_type(flat)
    n_frames, frame_len = flat.shape
    n_blocks = grid(n_frames, block)
    hist = cupy.zeros((frame_len, TOKEN_SLOTS), dtype=np.uint64)
    kernel(f"token_histogram<{t}>")(
        (grid(frame_len), n_blocks),
        (THREADS,),
        (flat, np.int64(n_frames), np.int32(frame_len), np.int32(block), np.int32(n_blocks), cupy.asarray(run), cupy.asarray(values), hist),
    )
    return hist


def model_params(run, values, table_start, cum, lut, dtype) -> tuple:
    dtype = np.dtype(dtype)
    return (run, values, table_start, cum, lut, np.int32(2 if dtype.itemsize == 4 else 1), np.int32(dtype.itemsize), np.uint32(np.iinfo(dtype).max))


def slot_room(n_frames: int, frame_len: int, block: int, itemsize: int) -> int:
    """Bytes of the slots the sizing pass codes into: each stream's raw counts, padded to an even length."""
    whole, last = divmod(n_frames, block)
    return frame_len * (whole * codec.stream_raw_bytes(block, itemsize) + codec.stream_raw_bytes(last, itemsize))


def encode(flat: cupy.ndarray, block: int, run, values, table_start, cum, out: cupy.ndarray | None = None) -> Streams:
    """Encode every stream: a sizing pass (form and bytes) that codes each stream once, into a slot at the end of
    ``out`` where it has room for them (``slot_room``); offsets by prefix sums; then a writing pass that moves the
    ANS streams from their slots and writes the others from the counts (all of them, ANS coded again, where
    there are no slots or the payload would reach them), into ``out`` where given: its first bytes become the
    payload. One wait for the device, for the payload's size."""
    t = counts_type(flat)
    n_frames, frame_len = flat.shape
    n_blocks = grid(n_frames, block)
    model = model_params(run, values, table_start, cum, cupy.empty(1, dtype=np.uint8), flat.dtype)  # encoders need no LUT
    stride = table_stride(run, values)
    smem = THREADS * 2 * stride + 2 * TILE_BYTES  # tables, then two tiles of counts
    room = slot_room(n_frames, frame_len, block, flat.dtype.itemsize)
    slots = out[(out.size - room) & ~1 :] if out is not None and out.size > room else None
    forms = cupy.empty((n_blocks, frame_len), dtype=np.uint8)
    sizes = cupy.empty((n_blocks, frame_len), dtype=np.int64)
    launch = (grid(frame_len), n_blocks)
    counts = (flat, np.int64(n_frames))
    kernel(f"encode_sizes<{t}>")(
        launch, (THREADS,), (*counts, np.int32(frame_len), np.int32(block), np.int32(stride), *model, forms, sizes, pointer(slots)),
        shared_mem=smem,
    )
    offsets = cupy.zeros_like(sizes)
    cupy.cumsum(sizes[:, :-1], axis=1, out=offsets[:, 1:])
    base = cupy.zeros(n_blocks + 1, dtype=np.uint64)
    cupy.cumsum(sizes.sum(axis=1), out=base[1:])
    index = pack_index(forms, offsets, frame_len * codec.stream_bound(min(block, n_frames), flat.dtype.itemsize))
    total = int(base[-1])
    if slots is not None and total > out.size - slots.size:
        slots = None  # the payload would run into them
    payload = cupy.zeros(padded(total), dtype=np.uint8)[:total] if out is None else codec.payload_in(out, total)
    kernel(f"encode_write<{t}>")(
        launch,
        (THREADS,),
        (*counts, np.int32(block), np.int32(stride), index, base, payload, np.int64(payload.size), np.int32(frame_len), *model, payload,
         pointer(slots)),
        shared_mem=smem,
    )
    return Streams(index, base, payload)


def pointer(a: cupy.ndarray | None):
    """A kernel's pointer argument: the array, or null for None."""
    return np.uint64(0) if a is None else a


# ---------------------------------------------------------------- decoding


def stream_params(streams: Streams, model: Model) -> tuple:
    frame_len = streams.index.shape[1]
    dtype = np.dtype(f"u{model.itemsize}")
    return (
        streams.index, streams.block_base, streams.payload, np.int64(streams.payload.size), np.int32(frame_len),
        *model_params(model.run, model.values, model.table_start, model.cum, model.lut, dtype),
    )


def table_bytes(model: Model, threads: int) -> int:
    """Shared memory for ``threads`` copies of a pixel's tables and LUTs."""
    return threads * (2 * model.table_stride + 2 * LUT_SIZE)


def raise_error(err: cupy.ndarray, frame_len: int) -> None:
    """ValueError for the first malformed stream a kernel reported."""
    check_word(int(err.get()[0]), frame_len)


def check_word(value: int, frame_len: int, where=None) -> None:
    """ValueError for a kernel's error word (NO_ERROR: none); ``where(stream)`` gives (acquisition, scan block,
    pixel) for a series kernel's stream numbers."""
    if value != NO_ERROR:
        stream, code = value >> ERROR_CODE_BITS, value & ((1 << ERROR_CODE_BITS) - 1)
        reason = ERRORS.get(-code, "unknown error")
        if where is None:
            b, p = divmod(stream, frame_len)
            raise ValueError(f"malformed compressed stream (scan block {b}, detector pixel {p}): {reason}")
        a, b, p = where(stream)
        raise twin.SeriesError(a, f"malformed compressed stream (scan block {b}, detector pixel {p}): {reason}")


def raise_error_later(err: cupy.ndarray, frame_len: int, where=None):
    """A ``done()`` that raises for ``err`` once the current stream has got this far, waiting for nothing else
    (the word comes back through pinned memory on this stream)."""
    host = cupyx.empty_pinned(1, np.uint64)
    stream = cupy.cuda.get_current_stream()
    cupy.cuda.runtime.memcpyAsync(host.ctypes.data, err.data.ptr, 8, cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
    reached = stream.record()

    def done() -> None:
        reached.synchronize()
        check_word(int(host[0]), frame_len, where)

    return done


def mask_sums(streams: Streams, model: Model, pixels: cupy.ndarray, weights: cupy.ndarray, narrow: bool = False) -> cupy.ndarray:
    """``out[m, f] = sum_k weights[m, k] * count[f, pixels[k]]`` in weights.dtype (uint64 wraps; float64).

    ``narrow``: only the result modulo 2**32 is wanted, so integer sums are
    accumulated (and returned) in wrapping uint32, which halves the shared memory and atomics.
    """
    out, done = mask_sums_async(streams, model, pixels, weights, narrow)
    done()
    return out


def mask_sums_async(streams: Streams, model: Model, pixels: cupy.ndarray, weights: cupy.ndarray, narrow: bool = False):
    """:func:`mask_sums` launched on the current stream without waiting: (out, done); ``done()`` waits
    and raises for a malformed stream. Several acquisitions' sums can so run at once on several streams."""
    if narrow and weights.dtype == np.uint64:
        weights = weights.astype(np.uint32)
    n_blocks, frame_len = streams.index.shape
    n_masks, n_pix = weights.shape
    wtype = {np.dtype(np.uint32): "unsigned int", np.dtype(np.uint64): "unsigned long long", np.dtype(np.float64): "double"}[weights.dtype]
    block = model.block
    out = cupy.zeros((n_masks, model.n_frames), dtype=weights.dtype)
    err = cupy.full(1, NO_ERROR, dtype=np.uint64)
    chunks = grid(n_pix, MASK_THREADS)
    group = max(1, min(n_masks, MASK_GROUP, MASK_SMEM // (block * weights.itemsize)))
    tables = table_bytes(model, MASK_THREADS)
    params = stream_params(streams, model)
    pixels = cupy.ascontiguousarray(pixels, dtype=np.int64)
    for m0 in range(0, n_masks, group):
        nm = min(group, n_masks - m0)
        w = cupy.ascontiguousarray(weights[m0 : m0 + nm])
        kernel(f"mask_sums<{wtype}, {nm}>")(
            (n_blocks, chunks),
            (MASK_THREADS,),
            (*params, np.int64(model.n_frames), np.int32(block), pixels, np.int64(n_pix), np.int32(model.table_stride), w,
             out[m0:], err),
            shared_mem=nm * block * weights.itemsize + tables,
        )
    return out, lambda: raise_error(err, frame_len)


class SeriesStreams:
    """The streams of a series' compressed acquisitions as one table on the device (pointers, block sizes,
    coding), and the work list of their (acquisition, scan block) items: what one launch over the whole
    series reads. Made once per series plan; frame_len and n_frames are the same for every member."""

    def __init__(self, members: list[tuple[Streams, Model, cupy.ndarray, object]]):
        self.members = members  # (streams, model, frame totals, group index) of each acquisition
        streams, model, _, _ = members[0]
        self.frame_len = int(streams.index.shape[1])
        self.n_frames = model.n_frames
        rows = []
        for streams, model, totals, _ in members:
            fields = {
                "index": streams.index.data.ptr, "block_base": streams.block_base.data.ptr, "payload": streams.payload.data.ptr,
                "payload_bytes": streams.payload.size, "run": model.run.data.ptr, "values": model.values.data.ptr,
                "table_start": model.table_start.data.ptr, "cum": model.cum.data.ptr, "lut": model.lut.data.ptr,
                "totals": totals.data.ptr, "block": model.block, "coding": model.chunks | model.itemsize << 8, "maxval": model.maxval,
            }
            rows.append([fields[k] for k in twin.DESC_FIELDS])
        self.desc = cupy.asarray(np.array(rows, dtype=np.uint64))
        blocks = [int(s.index.shape[0]) for s, *_ in members]
        self.item_acq = np.repeat(np.arange(len(members), dtype=np.int32), blocks)
        self.item_block = np.concatenate([np.arange(n, dtype=np.int32) for n in blocks])
        self.items = (cupy.asarray(self.item_acq), cupy.asarray(self.item_block))
        self.max_block = max(m.block for _, m, *_ in members)
        self.table_stride = max(m.table_stride for _, m, *_ in members)
        self.groups_table = groups.table([(g.base, g.width, g.bits, g.start) for *_, g in members])

    def group_sums_into(self, geometry_of: np.ndarray, lists: list[tuple[np.ndarray, np.ndarray]], out: cupy.ndarray) -> None:
        """Add to ``out[a]`` member a's group sums of the (groups, coefficients) of its geometry, ``lists[geometry_of[a]]``:
        one launch for the series, on the current stream."""
        firsts = np.cumsum([0] + [g.size for g, _ in lists])[:-1]
        spans = np.stack([firsts[geometry_of], np.array([g.size for g, _ in lists])[geometry_of]], axis=1)
        groups.series_group_sums(self.groups_table, self.n_frames, spans, np.concatenate([g for g, _ in lists]),
                                 np.concatenate([c for _, c in lists], axis=1), out)

    def mask_sums_async(self, spans: np.ndarray, pixels: np.ndarray, weights: np.ndarray, offsets: np.ndarray | None, out: cupy.ndarray,
                        narrow: bool = False):
        """Add to ``out`` (n_acq, n_masks, n_frames) every member's ``sum_k weights[m, k] * count[f, pixels[k]]`` over
        its span (first, count) of the host lists ``pixels`` and ``weights`` (n_masks, pix_len) (uint64 wrapping or
        float64; uint32 with ``narrow``), plus ``offsets[m] * totals[f]`` when given: one upload, one launch per
        group of masks, on the current stream. Returns ``done()``, which raises for the first malformed stream."""
        wdtype = np.dtype(np.uint32) if narrow and weights.dtype == np.uint64 else weights.dtype
        wtype = {np.dtype(np.uint32): "unsigned int", np.dtype(np.uint64): "unsigned long long", np.dtype(np.float64): "double"}[wdtype]
        n_masks, pix_len = weights.shape
        parts = [np.ascontiguousarray(spans, dtype=np.int64).ravel(), np.ascontiguousarray(pixels, dtype=np.int64),
                 np.ascontiguousarray(weights.astype(wdtype, copy=False)).view(np.uint8).ravel()]
        if offsets is not None:
            parts.append(np.ascontiguousarray(offsets.astype(wdtype, copy=False)).view(np.uint8).ravel())
        sent = uploaded(parts)
        spans_d, pixels_d = sent[0].view(np.int64), sent[1].view(np.int64)
        weights_d = sent[2].view(wdtype)
        offsets_d = sent[3].view(wdtype) if offsets is not None else None
        err = cupy.full(1, NO_ERROR, dtype=np.uint64)
        most = int(np.asarray(spans).reshape(-1, 2)[:, 1].max(initial=0))
        chunks = max(1, grid(most, MASK_THREADS))
        group = max(1, min(n_masks, MASK_GROUP, MASK_SMEM // (self.max_block * wdtype.itemsize)))
        tables = MASK_THREADS * (2 * self.table_stride + 2 * LUT_SIZE)
        if most or offsets is not None:
            for m0 in range(0, n_masks, group):
                nm = min(group, n_masks - m0)
                kernel(f"series_mask_sums<{wtype}, {nm}>")(
                    (len(self.item_acq), chunks), (MASK_THREADS,),
                    (self.desc, *self.items, np.int32(self.frame_len), np.int64(self.n_frames), spans_d, pixels_d, np.int64(pix_len),
                     np.int32(self.table_stride), weights_d, offsets_d, np.int32(n_masks), np.int32(m0), out, err),
                    shared_mem=nm * self.max_block * wdtype.itemsize + tables,
                )
        return raise_error_later(err, self.frame_len, self.where)

    def where(self, stream: int) -> tuple[int, int, int]:
        """(acquisition, scan block, pixel) of a series kernel's error stream number."""
        item, p = divmod(stream, self.frame_len)
        return int(self.item_acq[item]), int(self.item_block[item]), p


def uploaded(parts: list[np.ndarray]) -> list[cupy.ndarray]:
    """Host byte arrays copied to the device in one transfer, each starting on an 8-byte boundary."""
    sizes = [p.nbytes for p in parts]
    starts = np.concatenate([[0], np.cumsum([-(-n // 8) * 8 for n in sizes])])
    host = np.zeros(int(starts[-1]), dtype=np.uint8)
    for p, at in zip(parts, starts):
        host[at : at + p.nbytes] = p.view(np.uint8).ravel()
    device = cupy.asarray(host)
    return [device[at : at + n] for at, n in zip(starts, sizes)]


def roi_reduce(streams: Streams, model: Model, mult: cupy.ndarray, op: str) -> cupy.ndarray:
    """Per-pixel sum (uint64, each frame counted ``mult`` times) or max (uint64) over frames with ``mult > 0``."""
    frame_len = streams.index.shape[1]
    host = cupy.asnumpy(mult)
    blocks = np.flatnonzero(np.add.reduceat(host.astype(np.int64), np.arange(0, model.n_frames, model.block)) > 0)
    out = cupy.zeros(frame_len, dtype=np.uint64)
    err = cupy.full(1, NO_ERROR, dtype=np.uint64)
    chunks = max(1, min(blocks.size, -(-fill_streams() // frame_len)))
    per_chunk = -(-blocks.size // chunks)
    kernel("roi_reduce")(
        (grid(frame_len, 128), chunks),
        (128,),
        (*stream_params(streams, model), np.int64(model.n_frames), np.int32(model.block), np.int32(model.table_stride),
         cupy.asarray(blocks.astype(np.int64)), np.int64(blocks.size), np.int64(per_chunk), cupy.asarray(mult, dtype=np.uint32),
         np.int32(op == "max"), out, err),
        shared_mem=table_bytes(model, 128),
    )
    raise_error(err, frame_len)
    return out


def frame(streams: Streams, model: Model, index: int) -> np.ndarray:
    """The counts of frame ``index`` (frame_len,) as uint32, on the host: they and the kernel's error word
    come back in one copy (a frame's time is mostly such steps beside its kernel)."""
    frame_len = streams.index.shape[1]
    at = frame_len + (frame_len & 1)  # the error word's place, 8-byte aligned
    both = cupy.empty(at + 2, dtype=np.uint32)
    err = both[at:].view(np.uint64)
    cupy.cuda.runtime.memsetAsync(err.data.ptr, 0xFF, 8, cupy.cuda.get_current_stream().ptr)  # NO_ERROR
    kernel("frame")(
        (grid(frame_len, 128),), (128,),
        (*stream_params(streams, model), np.int64(model.n_frames), np.int32(model.block), np.int32(model.table_stride), np.int64(index),
         model.frame_order, both[:frame_len], err),
        shared_mem=table_bytes(model, 128),
    )
    host = both.get()
    check_word(int(host[at:].view(np.uint64)[0]), frame_len)
    return host[:frame_len]


def decoded_type(dtype) -> str:
    """The C type decoders write counts of ``dtype`` as; ValueError for a dtype they do not write."""
    if np.dtype(dtype) not in DECODED_TYPES:
        raise ValueError(f"decoded counts are written as one of {', '.join(map(str, DECODED_TYPES))}, not {np.dtype(dtype)}")
    return DECODED_TYPES[np.dtype(dtype)]


def decode_pixels(streams: Streams, model: Model, pixels, dtype, pixel_major: bool, frames: tuple[int, int] | None = None) -> cupy.ndarray:
    """The counts of the host int64 ``pixels`` in ``dtype`` over ``frames`` = (lo, hi) (default: all):
    (n_pixels, hi - lo) when ``pixel_major``, else (hi - lo, n_pixels). Only the blocks holding the range
    are decoded."""
    n_pix = int(np.size(pixels))
    lo, hi, shape, strides = twin.decoded_layout(frames, model.n_frames, n_pix, pixel_major)
    out = cupy.zeros(shape, dtype=dtype)
    if hi > lo and n_pix:
        raise_error(launch_decode(streams, model, cupy.asarray(np.asarray(pixels, dtype=np.int64)), lo, hi, strides, out),
                    streams.index.shape[1])
    return out


def decode_frames(streams: Streams, model: Model, frames: tuple[int, int], out: cupy.ndarray, amplitude: bool):
    """Every pixel's counts of ``frames`` = (lo, hi) into ``out`` ((hi - lo, frame_len), every value written), or
    float32 sqrt(counts) with ``amplitude``, launched on the current stream: ``done()`` raises for a malformed
    stream once the decode is through, waiting for nothing else (the feed decodes ahead of its consumer so)."""
    frame_len = streams.index.shape[1]
    lo, hi = twin.frames_target(frames, model.n_frames, frame_len, out, amplitude)
    if hi <= lo:
        return lambda: None
    launch, stride = rows_launch(frame_len, model.block, lo, hi, model.table_stride, decoded_type(out.dtype), amplitude, model.itemsize)
    err = cupy.full(1, NO_ERROR, dtype=np.uint64)
    compile.run("compressed.cu", DEFINES, launch, (*stream_params(streams, model), np.int64(model.n_frames), np.int32(model.block),
                                                   np.int32(stride), np.int32(lo // model.block), np.int64(lo), np.int64(hi), out, err))
    return raise_error_later(err, frame_len)


def rows_launch(frame_len: int, block: int, lo: int, hi: int, table_stride: int, out_type: str, amplitude: bool,
                itemsize: int) -> tuple[Launch, int]:
    """decode_rows over frames [lo, hi) of counts of ``itemsize`` bytes into C type ``out_type``, and the u16
    entries a pixel's tables take there: the model's stride (even) made an odd number of words."""
    stride = table_stride | 2
    counts = CTYPES[np.dtype(f"u{itemsize}")]
    return Launch(f"decode_rows<{out_type}, {'true' if amplitude else 'false'}, {counts}>",
                  (grid(frame_len, 32 * DECODE_WARPS), -(-hi // block) - lo // block), 32 * DECODE_WARPS,
                  DECODE_WARPS * decode_rows_bytes(stride, itemsize)), stride


def decode_rows_bytes(stride: int, itemsize: int) -> int:
    """Shared memory of one decode_rows warp: its ring of counts of ``itemsize`` bytes, 32 tables of ``stride``
    entries, 32 LUTs."""
    return DECODE_RING * 32 * itemsize + 32 * 2 * stride + 32 * LUT_PITCH


def launch_decode(streams: Streams, model: Model, pixels: cupy.ndarray, lo: int, hi: int, strides, out: cupy.ndarray):
    """The decode kernel over frames [lo, hi) of ``pixels`` (device int64) into ``out`` at ``strides``; its error word."""
    first, last = lo // model.block, -(-hi // model.block)
    err = cupy.full(1, NO_ERROR, dtype=np.uint64)
    kernel(f"decode<{decoded_type(out.dtype)}>")(
        (grid(pixels.size, 128), last - first), (128,),
        (*stream_params(streams, model), np.int64(model.n_frames), np.int32(model.block), np.int32(model.table_stride),
         np.int32(first), np.int32(last - first), np.int64(lo), np.int64(hi), pixels, np.int64(pixels.size), np.int64(strides[0]),
         np.int64(strides[1]), out, err),
        shared_mem=table_bytes(model, 128),
    )
    return err


def fill_streams() -> int:
    """Streams decoded at once that fill the current GPU: 2048 threads on each multiprocessor."""
    return limits(cupy.cuda.Device().id)[0] * 2048


def decode_all(streams: Streams, model: Model, dtype, frames: tuple[int, int] | None = None) -> cupy.ndarray:
    """Every pixel's counts, (hi - lo, frame_len) in ``dtype`` over ``frames`` (default all: the dense counts back):
    whole rows by decode_rows (``decode_frames``)."""
    frame_len = streams.index.shape[1]
    lo, hi, shape, _ = twin.decoded_layout(frames, model.n_frames, frame_len, False)
    out = cupy.empty(shape, dtype=dtype)
    decode_frames(streams, model, (lo, hi), out, False)()
    return out


def check(streams: Streams, model: Model) -> None:
    """Decode every stream; ValueError at the first malformed one."""
    n_blocks, frame_len = streams.index.shape
    err = cupy.full(1, NO_ERROR, dtype=np.uint64)
    kernel("check")(
        (grid(frame_len, 128), n_blocks), (128,),
        (*stream_params(streams, model), np.int64(model.n_frames), np.int32(model.block), np.int32(model.table_stride),
         np.int32(n_blocks), err),
        shared_mem=table_bytes(model, 128),
    )
    raise_error(err, frame_len)
