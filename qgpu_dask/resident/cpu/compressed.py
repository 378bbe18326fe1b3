"""CPU codec and query kernels (Numba) for compressed counts: the twins of kernels/compressed.cu.

Shared contract with ``qgpu_dask.resident.cuda.compressed`` (same arguments,
same bytes, same bits):

- ``value_histogram(flat) -> (frame_len, HIST_BINS) uint64``;
- ``token_histogram(flat, block, run, values) -> (frame_len, TOKEN_SLOTS) uint64``;
- ``encode(flat, block, run, values, table_start, cum) -> Streams`` (index, block_base, payload);
- ``mask_sums(streams, model, pixels, weights) -> (n_masks, n_frames)`` in uint64
  (wrapping: the caller casts) or float64, from the streams of ``pixels`` only;
- ``roi_reduce(streams, model, mult, op)``: per-pixel sum (uint64) or max over
  the frames with multiplicity ``mult > 0``;
- ``frame(streams, model, index)``: one frame, uint32;
- ``SeriesStreams(members).mask_sums_async(spans, pixels, weights, offsets, out)``: the mask sums of
  every acquisition of a series added into one (n_acq, n_masks, n_frames) result (one launch on a GPU);
- any malformed stream raises ValueError naming the scan block and pixel (``SeriesError``, which also
  names the series member, from the series sums).

``flat`` is (n_frames, frame_len) unsigned integer counts; the stream of pixel
``p`` in scan block ``b`` holds ``flat[b * block : (b + 1) * block, p]``.
"""

from __future__ import annotations

import numba
import numpy as np

from ...formats.codec import (
    ANS,
    CONSTANT,
    EMPTY,
    FORM_SHIFT,
    HIST_BINS,
    OFFSET_MASK,
    PROB_BITS,
    PROB_SCALE,
    RAW,
    RUN_SLOT,
    SPARSE,
    STATE_LOW,
    TOKEN_SLOTS,
    pack_index,
    payload_in,
    raw_chunks,
    stream_bound,
)

SLOT_MASK = PROB_SCALE - 1
WHOLE = 2**31 - 1  # decode_stream's ``upto`` for a whole stream
# Decoding errors: the Numba decoders return -code, the CUDA ones (kernels/compressed.cu) report code.
E_LENGTH, E_TRUNCATED, E_STATE, E_POSITION, E_VALUE, E_SPARSE, E_FORM = 1, 2, 3, 4, 5, 6, 7
ERRORS = {
    -E_LENGTH: "a stream's length does not fit its form",
    -E_TRUNCATED: "a stream is truncated (its coder reads past its end)",
    -E_STATE: "a stream's coder does not end in its initial state (corrupted bytes)",
    -E_POSITION: "a stream decodes past its block of scan positions",
    -E_VALUE: "a stream decodes a count beyond the data type",
    -E_SPARSE: "a sparse stream's positions are not increasing",
    -E_FORM: "a stream has an unknown form",
}
jit = numba.njit(cache=True, nogil=True)
pjit = numba.njit(cache=True, nogil=True, parallel=True)


# ---------------------------------------------------------------- histograms


TILE = 64  # pixels a CPU task takes at once: their counts are read frame by frame, a row segment at a time


@jit
def tile_columns(flat, lo, n, p0, p1):
    """Frames lo .. lo + n of pixels p0 .. p1 transposed: row j is pixel p0 + j's stream, contiguous."""
    cols = np.empty((p1 - p0, n), dtype=flat.dtype)
    for i in range(n):
        row = flat[lo + i]
        for j in range(p1 - p0):
            cols[j, i] = row[p0 + j]
    return cols


@pjit
def value_histogram_loop(flat, hist):
    n_frames, frame_len = flat.shape
    n_tiles = (frame_len + TILE - 1) // TILE
    for t in numba.prange(n_tiles):
        p0, p1 = t * TILE, min(frame_len, (t + 1) * TILE)
        for f in range(n_frames):
            row = flat[f]
            for p in range(p0, p1):
                hist[p, min(np.int64(row[p]), HIST_BINS - 1)] += 1


def value_histogram(flat: np.ndarray) -> np.ndarray:
    """(frame_len, HIST_BINS): how often each pixel holds 0..254, and >= 255 in the last bin."""
    hist = np.zeros((flat.shape[1], HIST_BINS), dtype=np.uint64)
    value_histogram_loop(flat, hist)
    return hist


@jit
def value_symbol(v, run, nv):
    """The value-table symbol of count ``v`` (nonzero in run mode)."""
    base = 1 if run > 0 else 0
    return min(v - base, nv)


@jit
def count_tokens(col, r, nv, h):
    """Add the tokens of one stream to its pixel's histogram row ``h``."""
    if r == 0:
        for i in range(col.shape[0]):
            h[value_symbol(np.int64(col[i]), r, nv)] += 1
        return
    zeros = 0
    for i in range(col.shape[0]):
        v = np.int64(col[i])
        if v == 0:
            zeros += 1
            continue
        h[RUN_SLOT + r] += zeros // r
        h[RUN_SLOT + zeros % r] += 1
        h[value_symbol(v, r, nv)] += 1
        zeros = 0
    if zeros:
        h[RUN_SLOT + r + 1] += 1


@pjit
def token_histogram_loop(flat, block, run, values, hist):
    n_frames, frame_len = flat.shape
    n_blocks = (n_frames + block - 1) // block
    n_tiles = (frame_len + TILE - 1) // TILE
    for t in numba.prange(n_tiles):
        p0, p1 = t * TILE, min(frame_len, (t + 1) * TILE)
        for b in range(n_blocks):
            lo = b * block
            cols = tile_columns(flat, lo, min(block, n_frames - lo), p0, p1)
            for p in range(p0, p1):
                count_tokens(cols[p - p0], np.int64(run[p]), np.int64(values[p]), hist[p])


def token_histogram(flat: np.ndarray, block: int, run: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(frame_len, TOKEN_SLOTS): value symbols at [0, V], run symbols at [RUN_SLOT, RUN_SLOT + R + 1]."""
    hist = np.zeros((flat.shape[1], TOKEN_SLOTS), dtype=np.uint64)
    token_histogram_loop(flat, block, run, values, hist)
    return hist


# ---------------------------------------------------------------- rANS encoder


@jit
def put_word(payload, w, x):
    """The low 16 bits of ``x`` at ``payload[w:w + 2]``, little-endian."""
    payload[w] = x & 0xFF
    payload[w + 1] = (x >> 8) & 0xFF


@jit
def encode_ans(col, run, nv, vt, cum, chunks, payload, at, ktot):
    """rANS-code one stream backwards (its tokens of §3, last first); returns (words emitted, final state).
    Emitted word ``k`` lands at word ``2 + ktot - 1 - k`` of the stream at ``payload[at:]`` (the decoder reads
    forward). One loop, the coder written out: Numba's calls between small helpers cost more than the coding."""
    n = col.shape[0]
    x = np.int64(STATE_LOW)
    k = 0
    rt = vt + nv + 2
    base = 1 if run > 0 else 0
    last = at + 2 * (2 + ktot - 1)  # where emitted word 0 goes
    i = n - 1
    rest = -1  # run mode: a run token still to code before the next value (-1: none)
    rep = 0  # run mode: R-zero run tokens still to code
    if run > 0:
        while i >= 0 and col[i] == 0:
            i -= 1
        if i < n - 1:
            rest = run + 1  # the rest of the stream is zeros
    while True:
        if run > 0 and rest >= 0:
            t, s = rt, rest
            rest = -1
        elif rep > 0:
            t, s = rt, run
            rep -= 1
        else:
            if i < 0:
                break
            v = np.int64(col[i])
            if run > 0:
                j = i - 1
                while j >= 0 and col[j] == 0:
                    j -= 1
                zeros = i - j - 1
                rest, rep = zeros % run, zeros // run
                i = j
            else:
                i -= 1
            t, s = vt, value_symbol(v, run, nv)
            if s == nv:  # escape chunks, coded before the symbol (uint32: the high chunk first)
                excess = v - nv - base
                for c in range(chunks - 1, -1, -1):
                    put_word(payload, last - 2 * k, x)
                    k += 1
                    x = ((x >> 16) << 16) | ((excess >> (16 * c)) & 0xFFFF)
        c = np.int64(cum[t + s])
        f = np.int64(cum[t + s + 1]) - c
        if x >= (f << (32 - PROB_BITS)):
            put_word(payload, last - 2 * k, x)
            k += 1
            x >>= 16
        q = np.int64(np.uint32(x) // np.uint32(f))  # a 32-bit division: the state fits, and it is the costly step
        x = (q << PROB_BITS) + (x - q * f) + c
    return k, x


@jit
def even(n):
    return n + (n & 1)


@jit
def choose_form(col, itemsize, ans_words):
    """(form, bytes) of one stream: the smallest exact form (ties: ans, sparse, raw)."""
    n = col.shape[0]
    nnz = 0
    lo = np.int64(col[0])
    hi = lo
    for i in range(n):
        v = np.int64(col[i])
        nnz += v != 0
        lo = min(lo, v)
        hi = max(hi, v)
    if nnz == 0:
        return EMPTY, 0
    if lo == hi:
        return CONSTANT, 4
    ans = 4 + 2 * ans_words
    sparse = even(nnz * (2 + itemsize))
    raw = even(n * itemsize)
    if ans <= sparse and ans <= raw:
        return ANS, ans
    if sparse <= raw:
        return SPARSE, sparse
    return RAW, raw


@jit
def put_le(payload, at, v, nbytes):
    for i in range(nbytes):
        payload[at + i] = (v >> (8 * i)) & 0xFF


@jit
def ans_capacity(n):
    """Words an rANS stream of ``n`` counts can emit at most: a run and a value token per count, two escape
    chunks each, the R-zero runs and the end."""
    return 5 * n + 8


@jit
def encode_stream(col, run, nv, vt, cum, chunks, itemsize, scratch, out, at):
    """Encode one stream into ``out[at:]`` in its smallest exact form; returns (form, bytes).

    The rANS words are emitted into the end of ``scratch`` backwards, so they
    lie there in reading order, and are copied behind the final state if rANS wins.
    """
    cap = ans_capacity(col.shape[0])
    k, x = encode_ans(col, run, nv, vt, cum, chunks, scratch, 0, cap)
    form, size = choose_form(col, itemsize, k)
    if form == ANS:
        put_le(out, at, x, 4)
        first = 2 * (2 + cap - k)
        out[at + 4 : at + 4 + 2 * k] = scratch[first : first + 2 * k]
    elif form == CONSTANT:
        put_le(out, at, np.int64(col[0]), 4)
    elif form == SPARSE:
        nnz = 0
        for i in range(col.shape[0]):
            nnz += col[i] != 0
        j = 0
        for i in range(col.shape[0]):
            if col[i] != 0:
                put_le(out, at + 2 * j, i, 2)
                put_le(out, at + 2 * nnz + itemsize * j, np.int64(col[i]), itemsize)
                j += 1
        if size > nnz * (2 + itemsize):
            out[at + size - 1] = 0
    elif form == RAW:
        for i in range(col.shape[0]):
            put_le(out, at + itemsize * i, np.int64(col[i]), itemsize)
        if size > col.shape[0] * itemsize:
            out[at + size - 1] = 0
    return form, size


@pjit
def encode_block_loop(flat, lo, n, run, values, table_start, cum, chunks, itemsize, slot, staging, forms, sizes):
    """Every stream of one scan block into its slot of ``staging`` (slot bytes each), by tiles of pixels."""
    frame_len = flat.shape[1]
    n_tiles = (frame_len + TILE - 1) // TILE
    for t in numba.prange(n_tiles):
        p0, p1 = t * TILE, min(frame_len, (t + 1) * TILE)
        cols = tile_columns(flat, lo, n, p0, p1)
        scratch = np.empty(2 * (2 + ans_capacity(n)), dtype=np.uint8)
        for p in range(p0, p1):
            form, size = encode_stream(
                cols[p - p0], np.int64(run[p]), np.int64(values[p]), np.int64(table_start[p]), cum, chunks, itemsize, scratch, staging, p * slot
            )
            forms[p] = form
            sizes[p] = size


@pjit
def compact_loop(staging, slot, sizes, offsets, piece):
    """Streams from their slots to their places in the block's payload."""
    for p in numba.prange(sizes.shape[0]):
        piece[offsets[p] : offsets[p] + sizes[p]] = staging[p * slot : p * slot + sizes[p]]


class Streams:
    """Encoded streams: ``index`` (n_blocks, frame_len) uint32, ``block_base`` (n_blocks + 1) uint64, ``payload`` uint8."""

    def __init__(self, index, block_base, payload):
        self.index = index
        self.block_base = block_base
        self.payload = payload


def encode(flat, block, run, values, table_start, cum, out: np.ndarray | None = None) -> Streams:
    """Encode every stream, one scan block at a time: each stream once, into a slot as large as its raw
    counts (the most any chosen form takes), then the block's streams packed behind each other (into ``out``
    where given: its first bytes become the payload)."""
    n_frames, frame_len = flat.shape
    n_blocks = -(-n_frames // block)
    itemsize = flat.dtype.itemsize
    chunks = raw_chunks(flat.dtype)
    index = np.zeros((n_blocks, frame_len), dtype=np.uint32)
    base = np.zeros(n_blocks + 1, dtype=np.uint64)
    pieces = []
    for b in range(n_blocks):
        lo = b * block
        n = min(block, n_frames - lo)
        slot = stream_bound(n, itemsize)
        staging = np.empty(frame_len * slot, dtype=np.uint8)
        forms = np.zeros(frame_len, dtype=np.uint8)
        sizes = np.zeros(frame_len, dtype=np.int64)
        encode_block_loop(flat, lo, n, run, values, table_start, cum, chunks, itemsize, slot, staging, forms, sizes)
        offsets = np.zeros(frame_len, dtype=np.int64)
        np.cumsum(sizes[:-1], out=offsets[1:])
        piece = np.empty(int(sizes.sum()), dtype=np.uint8)
        compact_loop(staging, slot, sizes, offsets, piece)
        index[b] = pack_index(forms, offsets)
        base[b + 1] = base[b] + np.uint64(piece.size)
        pieces.append(piece)
    total = int(base[-1])
    payload = np.empty(total, dtype=np.uint8) if out is None else payload_in(out, total)
    if pieces:
        np.concatenate(pieces, out=payload)
    return Streams(index, base, payload)


# ---------------------------------------------------------------- decoder
#
# A decoder turns one stream into either every count of its block (``dense``: value-mode rANS, raw and
# constant streams, val[0:n]) or its nonzero counts as (pos, val) pairs (run-mode rANS, sparse, empty), so
# a caller adds a dense stream with a branch-free loop and a sparse one by its positions.
#
# Speed (instructions and dependent steps per coded symbol): a symbol is found through a slot -> symbol table
# per pixel (``lut``, filled when the pixel changes: one load instead of a search over the cumulative
# frequencies, whose branches mispredict); a value token refills the state without a branch (a stream read
# past its end is noticed from its word count and reported as the same error); run-mode streams test the
# commonest run symbol first (usually "R zeros, go on", which rarely refills), without the table's loads; and
# the value-mode streams of two pixels are decoded in lockstep (a token per count: the same number), so the
# core overlaps their dependent chains. Work items are (scan block, pixel group) or pixel groups, a few per
# thread, so that an acquisition of one scan block still uses every core.


@jit
def stream_bounds(index, block_base, b, p):
    """(start, end, form) of stream (b, p) in the payload."""
    base = np.int64(block_base[b])
    entry = np.int64(index[b, p])
    start = base + (entry & OFFSET_MASK)
    if p + 1 < index.shape[1]:
        end = base + (np.int64(index[b, p + 1]) & OFFSET_MASK)
    else:
        end = np.int64(block_base[b + 1])
    return start, end, entry >> FORM_SHIFT


@jit
def get_le(payload, at, nbytes):
    v = np.int64(0)
    for i in range(nbytes):
        v |= np.int64(payload[at + i]) << (8 * i)
    return v


@jit
def word_at(payload, at):
    return np.int64(payload[at]) | (np.int64(payload[at + 1]) << 8)


LUT_BYTES = 2 * PROB_SCALE  # one table set: a pixel's value table's slots, then its run table's
HELD = 4  # per table set: the pixel it holds (-1: none), its run table's commonest symbol, that symbol's T[s] and f


@jit
def fill_lut(cum, t, nsym, lut, at):
    """``lut[at + slot]`` = the symbol of the table at ``cum[t:]`` that owns ``slot`` (tables are checked
    when a resident is built: they cover every slot)."""
    for s in range(nsym):
        lut[at + np.int64(cum[t + s]) : at + np.int64(cum[t + s + 1])] = s


@jit
def load_tables(cum, p, r, nv, vt, lut, held, k):
    """Table set ``k`` (``lut[k * LUT_BYTES:]``, ``held[k * HELD:]``) made to hold pixel ``p``'s tables."""
    h = k * HELD
    if held[h] == p:
        return
    at = k * LUT_BYTES
    fill_lut(cum, vt, nv + 1, lut, at)
    if r > 0:
        rt = vt + nv + 2
        fill_lut(cum, rt, r + 2, lut, at + PROB_SCALE)
        top = 0
        for s in range(r + 2):
            if np.int64(cum[rt + s + 1]) - np.int64(cum[rt + s]) > np.int64(cum[rt + top + 1]) - np.int64(cum[rt + top]):
                top = s
        held[h + 1] = top
        held[h + 2] = cum[rt + top]
        held[h + 3] = np.int64(cum[rt + top + 1]) - np.int64(cum[rt + top])
    held[h] = p


@jit
def next_token(x, w, payload, start, last, t, cum, lut, at):
    """(symbol, state, next word) of one token of the table at ``cum[t:]`` (slots at ``lut[at:]``). The
    refill takes no branch: with no word left it reads the stream's last word (``last``) and the word count
    passes the stream's, which :func:`finished` reports as truncation."""
    slot = x & SLOT_MASK
    s = np.int64(lut[at + slot])
    c = np.int64(cum[t + s])
    x = (np.int64(cum[t + s + 1]) - c) * (x >> PROB_BITS) + slot - c
    need = np.int64(x < STATE_LOW)
    x = (x << (16 * need)) | (word_at(payload, start + 2 * min(w, last)) * need)
    return s, x, w + need


@jit
def truncated_or(code, w, n_words):
    """An error met after a read past the stream's end is reported as that truncation, as a decoder that
    stopped there would."""
    return -E_TRUNCATED if w > n_words else code


@jit
def finished(x, w, n_words, cnt):
    """``cnt``, or the error of a stream that was read past its end or does not end in the initial state."""
    if w > n_words:
        return -E_TRUNCATED
    if x != STATE_LOW or w != n_words:
        return -E_STATE
    return cnt


@jit
def escaped(nv, base, x, w, payload, start, n_words, chunks, maxval):
    """(count, state, next word) of an escape symbol: ``base + nv`` plus the excess in its raw chunks; a
    negative count is an ERRORS code."""
    if w > n_words:
        return -E_TRUNCATED, x, w
    excess = np.int64(0)
    for c in range(chunks):
        excess |= (x & 0xFFFF) << (16 * c)
        if w >= n_words:
            return -E_TRUNCATED, x, w
        x = ((x >> 16) << 16) | word_at(payload, start + 2 * w)
        w += 1
    v = base + nv + excess
    if v > maxval:
        return -E_VALUE, x, w
    return v, x, w


@jit
def decode_values(payload, start, n_words, n, nv, vt, cum, chunks, maxval, val, lut, at, upto):
    """Every count of a value-mode rANS stream into val[0:n]; n, or a negative ERRORS code. With ``upto < n``
    only val[0:upto] is decoded and checked."""
    x = get_le(payload, start, 4)
    if x < STATE_LOW:
        return -E_STATE
    w = 2
    last = n_words - 1
    for i in range(min(n, upto)):
        s, x, w = next_token(x, w, payload, start, last, vt, cum, lut, at)
        if s == nv:
            s, x, w = escaped(nv, 0, x, w, payload, start, n_words, chunks, maxval)
            if s < 0:
                return s
        val[i] = s
    if upto < n:
        return truncated_or(n, w, n_words)
    return finished(x, w, n_words, n)


@jit
def decode_value_pair(payload, start0, n_words0, start1, n_words1, n, nv0, vt0, nv1, vt1, cum, chunks, maxval, val0, val1, lut, at0, at1):
    """Two value-mode rANS streams of n counts each, in lockstep: (result of the first, of the second), each
    n or a negative ERRORS code; after an error the other's result is 0 and its counts incomplete."""
    x0 = get_le(payload, start0, 4)
    if x0 < STATE_LOW:
        return -E_STATE, 0
    x1 = get_le(payload, start1, 4)
    if x1 < STATE_LOW:
        return 0, -E_STATE
    w0 = 2
    w1 = 2
    last0 = n_words0 - 1
    last1 = n_words1 - 1
    for i in range(n):
        s0, x0, w0 = next_token(x0, w0, payload, start0, last0, vt0, cum, lut, at0)
        s1, x1, w1 = next_token(x1, w1, payload, start1, last1, vt1, cum, lut, at1)
        if s0 == nv0:
            s0, x0, w0 = escaped(nv0, 0, x0, w0, payload, start0, n_words0, chunks, maxval)
            if s0 < 0:
                return s0, 0
        if s1 == nv1:
            s1, x1, w1 = escaped(nv1, 0, x1, w1, payload, start1, n_words1, chunks, maxval)
            if s1 < 0:
                return 0, s1
        val0[i] = s0
        val1[i] = s1
    return finished(x0, w0, n_words0, n), finished(x1, w1, n_words1, n)


@jit
def decode_runs(payload, start, n_words, n, run, nv, vt, cum, chunks, maxval, pos, val, lut, at, top, top_c, top_f, upto):
    """The nonzero counts of a run-mode rANS stream into (pos, val); their number, or a negative ERRORS code.
    ``top`` is the run table's commonest symbol (``top_c`` = its T[s], ``top_f`` its frequency). Decoding
    stops (unchecked from there) once the position reaches ``upto``."""
    x = get_le(payload, start, 4)
    if x < STATE_LOW:
        return -E_STATE
    rt = vt + nv + 2
    w = 2
    last = n_words - 1
    cnt = 0
    i = 0
    skips = top == run  # the commonest run symbol is "R zeros, go on": its tokens get a loop of their own
    while i < n:
        if i >= upto:
            return truncated_or(cnt, w, n_words)
        slot = x & SLOT_MASK
        d = slot - top_c
        if skips:
            while d >= 0 and d < top_f:
                x = top_f * (x >> PROB_BITS) + d
                if x < STATE_LOW:
                    if w >= n_words:
                        return -E_TRUNCATED
                    x = (x << 16) | word_at(payload, start + 2 * w)
                    w += 1
                i += run
                if i >= n:
                    return truncated_or(-E_POSITION, w, n_words)
                slot = x & SLOT_MASK
                d = slot - top_c
        if d >= 0 and d < top_f:
            r = top
            x = top_f * (x >> PROB_BITS) + d
        else:
            r = np.int64(lut[at + PROB_SCALE + slot])
            c = np.int64(cum[rt + r])
            x = (np.int64(cum[rt + r + 1]) - c) * (x >> PROB_BITS) + slot - c
        if x < STATE_LOW:  # rare after a likely run symbol: a branch costs less than a read each time
            if w >= n_words:
                return -E_TRUNCATED
            x = (x << 16) | word_at(payload, start + 2 * w)
            w += 1
        if r == run:
            i += run
            if i >= n:
                return truncated_or(-E_POSITION, w, n_words)
            continue
        if r == run + 1:
            break
        i += r
        if i >= n:
            return truncated_or(-E_POSITION, w, n_words)
        s, x, w = next_token(x, w, payload, start, last, vt, cum, lut, at)
        if s == nv:
            s, x, w = escaped(nv, 1, x, w, payload, start, n_words, chunks, maxval)
            if s < 0:
                return s
        else:
            s += 1
        pos[cnt] = i
        val[cnt] = s
        cnt += 1
        i += 1
    return finished(x, w, n_words, cnt)


@jit
def decode_stream(payload, start, end, form, n, run, nv, vt, cum, chunks, itemsize, maxval, pos, val, lut, held, k, upto):
    """(count, dense) of one stream: dense, its n counts in val[0:n]; else its ``count`` nonzero counts in
    (pos, val). A negative count is an ERRORS code. Table set ``k`` holds the pixel's tables (``load_tables``).
    A rANS stream is decoded and checked up to position ``upto`` (``WHOLE``: all of it) at least, as the GPU's."""
    length = end - start
    if length < 0:
        return -E_LENGTH, False
    if form == EMPTY:
        return (0 if length == 0 else -E_LENGTH), False
    if form == CONSTANT:
        if length != 4:
            return -E_LENGTH, False
        v = get_le(payload, start, 4)
        if v == 0 or v > maxval:
            return -E_VALUE, True
        val[:n] = v
        return n, True
    if form == RAW:
        if length != even(n * itemsize):
            return -E_LENGTH, True
        for i in range(n):
            val[i] = get_le(payload, start + itemsize * i, itemsize)
        return n, True
    if form == SPARSE:
        nnz = length // (2 + itemsize)
        if length != even(nnz * (2 + itemsize)) or nnz > n:
            return -E_LENGTH, False
        last = -1
        for j in range(nnz):
            i = word_at(payload, start + 2 * j)
            if i <= last or i >= n:
                return -E_SPARSE, False
            last = i
            pos[j] = i
            val[j] = get_le(payload, start + 2 * nnz + itemsize * j, itemsize)
        return nnz, False
    if form != ANS:
        return -E_FORM, False
    n_words = length // 2
    if length % 2 or n_words < 2:
        return -E_LENGTH, False
    at = k * LUT_BYTES
    if run == 0:
        return decode_values(payload, start, n_words, n, nv, vt, cum, chunks, maxval, val, lut, at, upto), True
    h = k * HELD
    return decode_runs(payload, start, n_words, n, run, nv, vt, cum, chunks, maxval, pos, val, lut, at, held[h + 1], held[h + 2], held[h + 3], upto), False


class Model:
    """A resident's per-pixel coding model, as the decoders take it."""

    def __init__(self, n_frames, block, run, values, table_start, cum, dtype):
        self.n_frames = int(n_frames)
        self.block = int(block)
        self.run = run
        self.values = values
        self.table_start = table_start
        self.cum = cum
        dtype = np.dtype(dtype)
        self.itemsize = dtype.itemsize
        self.chunks = raw_chunks(dtype)
        self.maxval = int(np.iinfo(dtype).max)


@jit
def decode_at(index, block_base, payload, b, p, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval, pos, val, lut, held, k,
              upto=WHOLE):
    """(count, dense) of stream (b, p), as :func:`decode_stream`, with table set ``k``."""
    start, end, form = stream_bounds(index, block_base, b, p)
    n = min(block, n_frames - b * block)
    if start < 0 or end > payload.shape[0]:
        return -E_LENGTH, False
    r, nv, vt = np.int64(run[p]), np.int64(values[p]), np.int64(table_start[p])
    if form == ANS:
        load_tables(cum, p, r, nv, vt, lut, held, k)
    return decode_stream(payload, start, end, form, n, r, nv, vt, cum, chunks, itemsize, maxval, pos, val, lut, held, k, upto)


@jit
def lockstep_ready(start, end, form, size):
    """Whether a stream can join a lockstep pair: rANS with a length that fits (else the single decoder reports it)."""
    length = end - start
    return form == ANS and start >= 0 and end <= size and length >= 4 and length % 2 == 0


@jit
def decode_pair_at(index, block_base, payload, b, p0, p1, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval,
                   pos0, val0, pos1, val1, lut, held):
    """(count, dense) of streams (b, p0) and (b, p1) of two value-mode pixels (table sets 1 and 2), in lockstep
    when both are rANS; on an error the first count is negative, or the second (and the first is left as it is)."""
    start0, end0, form0 = stream_bounds(index, block_base, b, p0)
    start1, end1, form1 = stream_bounds(index, block_base, b, p1)
    size = payload.shape[0]
    if lockstep_ready(start0, end0, form0, size) and lockstep_ready(start1, end1, form1, size):
        n = min(block, n_frames - b * block)
        nv0, vt0 = np.int64(values[p0]), np.int64(table_start[p0])
        nv1, vt1 = np.int64(values[p1]), np.int64(table_start[p1])
        load_tables(cum, p0, 0, nv0, vt0, lut, held, 1)
        load_tables(cum, p1, 0, nv1, vt1, lut, held, 2)
        c0, c1 = decode_value_pair(payload, start0, (end0 - start0) // 2, start1, (end1 - start1) // 2, n, nv0, vt0, nv1, vt1, cum, chunks,
                                   maxval, val0, val1, lut, LUT_BYTES, 2 * LUT_BYTES)
        return c0, True, c1, True
    c0, d0 = decode_at(index, block_base, payload, b, p0, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval,
                       pos0, val0, lut, held, 1)
    if c0 < 0:
        return c0, d0, 0, False
    c1, d1 = decode_at(index, block_base, payload, b, p1, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval,
                       pos1, val1, lut, held, 2)
    return c0, d0, c1, d1


@jit
def failed(errors, item, b, p, cnt):
    """Record a decode error (cnt < 0) of stream (b, p) in work item ``item``'s row; whether there was one."""
    if cnt < 0:
        errors[item, 0] = cnt
        errors[item, 1] = b
        errors[item, 2] = p
    return cnt < 0


class SeriesError(ValueError):
    """A malformed stream met by a series kernel: ``member`` is the acquisition's place in the series."""

    def __init__(self, member: int, message: str):
        super().__init__(message)
        self.member = member

    def __reduce__(self):
        return SeriesError, (self.member, str(self))


DESC_FIELDS = ("index", "block_base", "payload", "payload_bytes", "run", "values", "table_start", "cum", "lut", "totals", "block",
               "coding", "maxval")  # a series member's row in the CUDA twin's table (kernels/compressed.cu's D_*)
DESC_WORDS = len(DESC_FIELDS)


class SeriesStreams:
    """The streams of a series' compressed acquisitions, for sums over all of them at once (the CUDA twin
    makes one table and one work list of them; here each member's sums run in turn, in parallel inside)."""

    def __init__(self, members: list[tuple[Streams, "Model", np.ndarray, object]]):
        self.members = members  # (streams, model, frame totals, group index) of each acquisition

    def group_sums_into(self, geometry_of: np.ndarray, lists: list[tuple[np.ndarray, np.ndarray]], out: np.ndarray) -> None:
        """Add to ``out[a]`` member a's group sums of the (groups, coefficients) of its geometry, ``lists[geometry_of[a]]``."""
        for a, (_, _, _, index) in enumerate(self.members):
            groups, coef = lists[geometry_of[a]]
            if groups.size:
                out[a] += index.group_sums(groups, coef).astype(out.dtype, copy=False)

    def mask_sums_async(self, spans: np.ndarray, pixels: np.ndarray, weights: np.ndarray, offsets: np.ndarray | None, out: np.ndarray,
                        narrow: bool = False):
        """Add to ``out`` (n_acq, n_masks, n_frames) each member's sums of ``weights`` over its span (first, count)
        of ``pixels``, plus ``offsets[m] * totals[f]`` when given (``narrow`` is the CUDA twin's: unused here)."""
        for a, ((streams, model, totals, _), (first, count)) in enumerate(zip(self.members, np.asarray(spans).reshape(-1, 2))):
            if count:
                try:
                    sums, _ = mask_sums_async(streams, model, pixels[first : first + count], weights[:, first : first + count])
                except ValueError as err:
                    raise SeriesError(a, str(err)) from None
                out[a] += sums
            if offsets is not None:
                out[a] += offsets.astype(out.dtype)[:, None] * totals.astype(out.dtype)[None, :]
        return lambda: None


def raise_errors(errors: np.ndarray) -> None:
    """ValueError for the first malformed stream a kernel met (errors: (n_items, 3) code, scan block, pixel)."""
    bad = np.flatnonzero(errors[:, 0] < 0)
    if bad.size:
        code, b, p = (int(v) for v in errors[bad[0]])
        raise ValueError(f"malformed compressed stream (scan block {b}, detector pixel {p}): {ERRORS.get(code, 'unknown error')}")


def model_args(streams: Streams, model: Model) -> tuple:
    return (
        streams.index, streams.block_base, streams.payload, model.n_frames, model.block, model.run,
        model.values, model.table_start, model.cum, model.chunks, model.itemsize, model.maxval,
    )


def run_checked(loop, streams: Streams, model: Model, n_items: int, *args) -> None:
    """``loop(model arguments, *args, errors)`` over ``n_items`` work items (a row of errors each), then
    ValueError for the first malformed stream it met."""
    errors = np.zeros((n_items, 3), dtype=np.int64)
    loop(*model_args(streams, model), *args, errors)
    raise_errors(errors)


def lanes(n_work: int) -> int:
    """Work items to split ``n_work`` independent pieces into: a few per Numba thread, so that uneven pieces
    or a busy core leave little idle."""
    return max(1, min(n_work, 4 * numba.get_num_threads()))


@jit
def scratch(block, dtype):
    """(pos, val) buffers of three streams (one alone, a lockstep pair), the three table sets and what they hold."""
    pos = np.empty((3, block), dtype=np.int64)
    val = np.empty((3, block), dtype=dtype)
    return pos, val, np.empty(3 * LUT_BYTES, dtype=np.uint8), np.full(3 * HELD, -1, dtype=np.int64)


@jit
def add_weighted(acc, k, weights, pos, val, cnt, dense):
    """acc[m] += weights[m, k] * the stream's counts, for every mask m weighing pixel k."""
    for m in range(weights.shape[0]):
        w = weights[m, k]
        if w == 0:
            continue
        row = acc[m]
        if dense:
            for j in range(cnt):
                row[j] += w * val[j]
        else:
            for j in range(cnt):
                row[pos[j]] += w * val[j]


@pjit
def mask_sums_loop(index, block_base, payload, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval, pixels, weights, part, errors):
    """Work item (b, g): scan block b of every ``n_groups``-th mask pixel from g on, into part[g]; value-mode
    pixels two at a time."""
    n_blocks = index.shape[0]
    n_groups = part.shape[0]
    for item in numba.prange(n_blocks * n_groups):
        b, g = item // n_groups, item % n_groups
        n = min(block, n_frames - b * block)
        acc = part[g, :, b * block : b * block + n]
        acc[:] = 0
        pos, val, lut, held = scratch(n, weights.dtype)
        waiting = -1  # a value-mode pixel's k, waiting for a partner
        for k in range(g, pixels.shape[0], n_groups):
            p = pixels[k]
            if run[p] == 0 and waiting < 0:
                waiting = k
                continue
            if run[p] == 0:
                q = pixels[waiting]
                c0, d0, c1, d1 = decode_pair_at(index, block_base, payload, b, q, p, n_frames, block, run, values, table_start, cum, chunks,
                                                itemsize, maxval, pos[1], val[1], pos[2], val[2], lut, held)
                if failed(errors, item, b, q, c0) or failed(errors, item, b, p, c1):
                    break
                add_weighted(acc, waiting, weights, pos[1], val[1], c0, d0)
                add_weighted(acc, k, weights, pos[2], val[2], c1, d1)
                waiting = -1
                continue
            cnt, dense = decode_at(index, block_base, payload, b, p, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval,
                                   pos[0], val[0], lut, held, 0)
            if failed(errors, item, b, p, cnt):
                break
            add_weighted(acc, k, weights, pos[0], val[0], cnt, dense)
        if waiting >= 0 and errors[item, 0] == 0:
            p = pixels[waiting]
            cnt, dense = decode_at(index, block_base, payload, b, p, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval,
                                   pos[0], val[0], lut, held, 0)
            if not failed(errors, item, b, p, cnt):
                add_weighted(acc, waiting, weights, pos[0], val[0], cnt, dense)


def mask_sums(streams: Streams, model: Model, pixels: np.ndarray, weights: np.ndarray, narrow: bool = False) -> np.ndarray:
    """``out[m, f] = sum_k weights[m, k] * count[f, pixels[k]]`` in weights.dtype (uint64 wraps; float64).

    ``narrow`` (only the result modulo 2**32 is wanted) lets the CUDA twin
    accumulate in uint32; here uint64 costs the same, so it is not used.
    """
    out, done = mask_sums_async(streams, model, pixels, weights, narrow)
    done()
    return out


def mask_sums_async(streams: Streams, model: Model, pixels: np.ndarray, weights: np.ndarray, narrow: bool = False):
    """:func:`mask_sums` as (out, done): ``done()`` raises for a malformed stream (here: already checked).

    With too few scan blocks to keep every thread busy, a block's mask pixels
    are split into groups, each summed into a partial result of its own, then
    added (integer sums wrap, so any order is exact).
    """
    pixels = np.asarray(pixels, dtype=np.int64)
    n_blocks = streams.index.shape[0]
    n_groups = max(1, min(pixels.size, -(-lanes(n_blocks * pixels.size) // max(n_blocks, 1))))
    part = np.empty((n_groups, weights.shape[0], model.n_frames), dtype=weights.dtype)
    run_checked(mask_sums_loop, streams, model, n_blocks * n_groups, pixels, np.ascontiguousarray(weights), part)
    return (part[0] if n_groups == 1 else part.sum(axis=0, dtype=part.dtype)), lambda: None


@jit
def tally(total, pos, val, cnt, dense, sel, is_max):
    """``total`` plus (or the max with) the counts of one stream at the frames its block selects (``sel``: multiplicities)."""
    if is_max:
        for j in range(cnt):
            if sel[j if dense else pos[j]] and val[j] > total:
                total = val[j]
    elif dense:
        for j in range(cnt):
            total += val[j] * sel[j]
    else:
        for j in range(cnt):
            total += val[j] * sel[pos[j]]
    return total


@jit
def reduce_one(index, block_base, payload, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval, blocks, mult, is_max, out,
               errors, t, p, pos, val, lut, held):
    """out[p]: pixel p's sum or max over the selected scan blocks (table set 0)."""
    total = np.uint64(0)
    for k in range(blocks.shape[0]):
        b = blocks[k]
        cnt, dense = decode_at(index, block_base, payload, b, p, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval,
                               pos[0], val[0], lut, held, 0)
        if failed(errors, t, b, p, cnt):
            return
        total = tally(total, pos[0], val[0], cnt, dense, mult[b * block : b * block + block], is_max)
    out[p] = total


@jit
def reduce_pair(index, block_base, payload, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval, blocks, mult, is_max, out,
                errors, t, p0, p1, pos, val, lut, held):
    """out[p0], out[p1] of two value-mode pixels, their streams decoded in lockstep."""
    t0 = np.uint64(0)
    t1 = np.uint64(0)
    for k in range(blocks.shape[0]):
        b = blocks[k]
        c0, d0, c1, d1 = decode_pair_at(index, block_base, payload, b, p0, p1, n_frames, block, run, values, table_start, cum, chunks,
                                        itemsize, maxval, pos[1], val[1], pos[2], val[2], lut, held)
        if failed(errors, t, b, p0, c0) or failed(errors, t, b, p1, c1):
            return
        sel = mult[b * block : b * block + block]
        t0 = tally(t0, pos[1], val[1], c0, d0, sel, is_max)
        t1 = tally(t1, pos[2], val[2], c1, d1, sel, is_max)
    out[p0] = t0
    out[p1] = t1


@pjit
def roi_reduce_loop(index, block_base, payload, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval, blocks, mult, is_max, out, errors):
    """Work item t: every n_items-th pixel from t on; value-mode pixels two at a time."""
    frame_len = index.shape[1]
    n_items = errors.shape[0]
    for t in numba.prange(n_items):
        pos, val, lut, held = scratch(block, np.uint64)
        waiting = -1  # a value-mode pixel waiting for a partner
        for p in range(t, frame_len, n_items):
            if run[p] != 0:
                reduce_one(index, block_base, payload, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval, blocks, mult,
                           is_max, out, errors, t, p, pos, val, lut, held)
            elif waiting < 0:
                waiting = p
            else:
                reduce_pair(index, block_base, payload, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval, blocks, mult,
                            is_max, out, errors, t, waiting, p, pos, val, lut, held)
                waiting = -1
            if errors[t, 0] < 0:
                break
        if waiting >= 0 and errors[t, 0] == 0:
            reduce_one(index, block_base, payload, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval, blocks, mult,
                       is_max, out, errors, t, waiting, pos, val, lut, held)


def roi_reduce(streams: Streams, model: Model, mult: np.ndarray, op: str) -> np.ndarray:
    """Per-pixel sum (uint64, each frame counted ``mult`` times) or max (uint64) over frames with ``mult > 0``."""
    frame_len = streams.index.shape[1]
    blocks = np.flatnonzero(np.add.reduceat(mult, np.arange(0, model.n_frames, model.block)) > 0).astype(np.int64)
    out = np.zeros(frame_len, dtype=np.uint64)
    run_checked(roi_reduce_loop, streams, model, lanes(frame_len), blocks, mult.astype(np.uint64), op == "max", out)
    return out


@pjit
def frame_loop(index, block_base, payload, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval, f, out, errors):
    """Work item t: every n_items-th pixel from t on, its stream of frame f's scan block."""
    b, i = f // block, f % block
    frame_len = index.shape[1]
    n_items = errors.shape[0]
    for t in numba.prange(n_items):
        pos, val, lut, held = scratch(block, np.uint32)
        for p in range(t, frame_len, n_items):
            cnt, dense = decode_at(index, block_base, payload, b, p, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval,
                                   pos[0], val[0], lut, held, 0, i + 1)
            if failed(errors, t, b, p, cnt):
                break
            v = np.uint32(0)
            if dense:
                v = val[0, i]
            else:
                for j in range(cnt):
                    if pos[0, j] == i:
                        v = val[0, j]
            out[p] = v


def frame(streams: Streams, model: Model, index: int) -> np.ndarray:
    """The counts of frame ``index`` (frame_len,) as uint32 (on the host, as the GPU twin's)."""
    frame_len = streams.index.shape[1]
    out = np.zeros(frame_len, dtype=np.uint32)
    run_checked(frame_loop, streams, model, lanes(frame_len), int(index), out)
    return out


@pjit
def decode_loop(index, block_base, payload, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval, first, last, lo, hi,
                pixels, pixel_stride, frame_stride, out, errors):
    """Work item t: every n_items-th pixel from t on, its streams of scan blocks first .. last - 1."""
    n_pix = pixels.shape[0]
    n_items = errors.shape[0]
    for t in numba.prange(n_items):
        pos, val, lut, held = scratch(block, np.uint32)
        for k in range(t, n_pix, n_items):
            p = pixels[k]
            for b in range(first, last):
                cnt, dense = decode_at(index, block_base, payload, b, p, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval,
                                       pos[0], val[0], lut, held, 0)
                if failed(errors, t, b, p, cnt):
                    break
                for j in range(cnt):
                    f = b * block + (j if dense else pos[0, j])
                    if f >= lo and f < hi:
                        out[k * pixel_stride + (f - lo) * frame_stride] = val[0, j]
            if errors[t, 0] < 0:
                break


def decoded_layout(frames: tuple[int, int] | None, n_frames: int, n_pix: int, pixel_major: bool):
    """(lo, hi, shape, (pixel_stride, frame_stride)) of decoding ``frames`` (default all) of ``n_pix`` pixels;
    IndexError for a range outside the acquisition. Shared by both twins' ``decode_pixels``."""
    lo, hi = frames if frames is not None else (0, n_frames)
    if not 0 <= lo <= hi <= n_frames:
        raise IndexError(f"frames [{lo}, {hi}) are not inside [0, {n_frames})")
    if pixel_major:
        return lo, hi, (n_pix, hi - lo), (hi - lo, 1)
    return lo, hi, (hi - lo, n_pix), (1, n_pix)


def decode_pixels(streams: Streams, model: Model, pixels, dtype, pixel_major: bool, frames: tuple[int, int] | None = None) -> np.ndarray:
    """The counts of the int64 ``pixels`` in ``dtype`` over ``frames`` = (lo, hi) (default: all):
    (n_pixels, hi - lo) when ``pixel_major``, else (hi - lo, n_pixels). Only the blocks holding the range
    are decoded."""
    pixels = np.ascontiguousarray(pixels, dtype=np.int64)
    lo, hi, shape, strides = decoded_layout(frames, model.n_frames, pixels.size, pixel_major)
    out = np.zeros(shape, dtype=dtype)
    if hi > lo:
        run_checked(decode_loop, streams, model, lanes(pixels.size), lo // model.block, -(-hi // model.block), lo, hi, pixels, strides[0], strides[1],
                    out.reshape(-1))
    return out


def decode_all(streams: Streams, model: Model, dtype, frames: tuple[int, int] | None = None) -> np.ndarray:
    """Every pixel's counts, (hi - lo, frame_len) in ``dtype`` over ``frames`` (default all: the dense counts back)."""
    return decode_pixels(streams, model, np.arange(streams.index.shape[1]), dtype, pixel_major=False, frames=frames)


def frames_target(frames: tuple[int, int], n_frames: int, frame_len: int, out, amplitude: bool) -> tuple[int, int]:
    """(lo, hi) of ``decode_frames`` into ``out``, checked to be a C-contiguous (hi - lo, frame_len) array (float32
    for amplitudes)."""
    lo, hi, shape, _ = decoded_layout(frames, n_frames, frame_len, False)
    if out.shape != shape or (amplitude and out.dtype != np.float32) or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {shape}{' float32' if amplitude else ''} array, got {out.shape} {out.dtype}")
    return lo, hi


def decode_frames(streams: Streams, model: Model, frames: tuple[int, int], out: np.ndarray, amplitude: bool):
    """Every pixel's counts of ``frames`` = (lo, hi) into ``out`` ((hi - lo, frame_len), zeroed here), or float32
    sqrt(counts) with ``amplitude``; ``done()`` (here a no-op: malformed streams raise at once)."""
    frame_len = streams.index.shape[1]
    lo, hi = frames_target(frames, model.n_frames, frame_len, out, amplitude)
    out.fill(0)
    if hi > lo:
        run_checked(decode_loop, streams, model, lanes(frame_len), lo // model.block, -(-hi // model.block), lo, hi, np.arange(frame_len, dtype=np.int64),
                    1, frame_len, out.reshape(-1))
    if amplitude:
        np.sqrt(out, out=out)
    return lambda: None


def fill_streams() -> int:
    """Streams decoded at once that keep every Numba thread busy."""
    return numba.get_num_threads()


@pjit
def check_loop(index, block_base, payload, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval, errors):
    """Work item t: every n_items-th pixel from t on, its streams of every scan block."""
    n_blocks, frame_len = index.shape
    n_items = errors.shape[0]
    for t in numba.prange(n_items):
        pos, val, lut, held = scratch(block, np.uint32)
        for p in range(t, frame_len, n_items):
            for b in range(n_blocks):
                cnt, _ = decode_at(index, block_base, payload, b, p, n_frames, block, run, values, table_start, cum, chunks, itemsize, maxval,
                                   pos[0], val[0], lut, held, 0)
                if failed(errors, t, b, p, cnt):
                    break
            if errors[t, 0] < 0:
                break


def check(streams: Streams, model: Model) -> None:
    """Decode every stream; ValueError at the first malformed one."""
    run_checked(check_loop, streams, model, lanes(streams.index.shape[1]))
