"""The qgpu-ans-2 codec: constants, per-pixel model choice and rANS tables (GPU-free: NumPy, the tables Numba).

The format's group index (exact per-frame sums over pixel groups) is ``formats.groups``.

Both encoders (Numba and CUDA) take their tables from here, so they write the
same bytes; the byte layout is documented in docs/compressed-format.md.

Each detector pixel's counts over consecutive scan positions are cut into
streams of ``block`` scans. A pixel is coded in one of two modes, chosen from
its value histogram over the whole acquisition:

- value mode (``run == 0``): one token per count, from the pixel's value table
  (symbols 0..V-1 are the values, symbol V escapes to ``V + excess``);
- run mode (``run = R > 0``, for mostly-zero pixels): a run token (symbol r < R:
  r zeros then a nonzero count; R: R zeros, go on; R + 1: the rest are zeros),
  then for a nonzero count a value token (symbols 0..V-1 are 1..V, symbol V
  escapes to ``V + 1 + excess``).

Escaped excesses follow as raw 16-bit chunks (two for 32-bit data, low first).
rANS: 32-bit state in [2**16, 2**32), 12-bit probabilities, 16-bit words.
"""

from __future__ import annotations

import numba
import numpy as np

FORMAT = "qgpu-ans-2"
PROB_BITS = 12
PROB_SCALE = 1 << PROB_BITS
STATE_LOW = 1 << 16

# Stream forms: the top 3 bits of a stream's index entry; the low 29 bits are
# its byte offset inside its scan block.
EMPTY, CONSTANT, SPARSE, ANS, RAW = 0, 1, 2, 3, 4
FORM_NAMES = ("empty", "constant", "sparse", "ans", "raw")
FORM_SHIFT = 29
OFFSET_MASK = (1 << FORM_SHIFT) - 1

HIST_BINS = 256  # value histogram: counts of 0..254 exactly, bin 255 counts every value >= 255
MAX_V = 61  # value alphabet: V + 1 <= 62 symbols
MAX_RUN = 64
RUN_SLOT = 64  # token histogram row: value symbols at [0, V], run symbols at [RUN_SLOT, RUN_SLOT + R + 1]
TOKEN_SLOTS = RUN_SLOT + MAX_RUN + 2
MIN_BLOCK, MAX_BLOCK = 256, 4096
STREAM_BITS = 1024  # a stream should carry about this many bits, so its fixed costs stay small
TABLE_SHARE = 0.01  # a pixel's run table may cost about this share of its coded counts


def raw_chunks(dtype) -> int:
    """16-bit chunks that carry an escaped excess of ``dtype``."""
    return 2 if np.dtype(dtype).itemsize == 4 else 1


def choose_models(hist: np.ndarray, n_frames: int, bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(run, V) per pixel from value histograms (frame_len, HIST_BINS) and their ``entropy_bits``.

    Run mode when more than half of a pixel's counts are zero, with R about
    twice the mean run of zeros, but no larger than keeps the run table (2 (R + 3)
    bytes) within TABLE_SHARE of the pixel's expected coded size: runs are nearly
    geometric, so a smaller R costs the streams little and a short acquisition
    saves its tables. V is the smallest alphabet whose escapes are rarer than 1
    in 2**12 (at most MAX_V). Only the values up to one past the largest count held are looked at: past it no
    count is left, so the first alphabet with rare escapes lies within them.
    """
    held = np.flatnonzero(hist.any(axis=0))
    cols = min(MAX_V + 2, int(held[-1]) + 3 if held.size else 3)
    affordable = TABLE_SHARE * bits / 16 - 3
    zeros = np.asarray(hist[:, 0], dtype=np.int64)
    nonzero = n_frames - zeros
    run_mode = zeros * 2 > n_frames
    mean_run = zeros / np.maximum(nonzero, 1)
    cap = np.clip(2 ** np.floor(np.log2(np.maximum(affordable, 1))), 4, MAX_RUN)
    wanted = 2 ** np.ceil(np.log2(np.maximum(2 * mean_run, 1)))
    run = np.where(run_mode, np.clip(wanted, 4, cap), 0).astype(np.uint8)
    return run, alphabets(hist, n_frames, run_mode, cols)


@numba.njit(cache=True, nogil=True)
def alphabets(hist: np.ndarray, n_frames: int, run_mode: np.ndarray, cols: int) -> np.ndarray:
    """``choose_models``' V of each pixel, from the counts >= v of its histogram for v below ``cols``: the first
    V >= 1 whose escapes (counts >= V; in run mode, nonzero counts >= V + 1) are rarer than 1 in PROB_SCALE
    among its tokens, else MAX_V."""
    out = np.empty(hist.shape[0], np.uint8)
    tail = np.empty(cols, np.int64)  # tail[v]: counts >= v
    for p in range(hist.shape[0]):
        tail[0], held = n_frames, 0
        for v in range(1, cols):
            held += np.int64(hist[p, v - 1])
            tail[v] = n_frames - held
        base = 1 if run_mode[p] else 0
        population = n_frames - np.int64(hist[p, 0]) if run_mode[p] else n_frames
        first = MAX_V
        for v in range(1, cols):
            if tail[min(v + base, cols - 1)] * PROB_SCALE <= population:
                first = v
                break
        out[p] = min(max(first, 1), MAX_V)
    return out


def choose_block(bits: np.ndarray, n_frames: int) -> int:
    """Scan positions per stream: a power of two giving about STREAM_BITS bits per stream, from the pixels'
    ``entropy_bits``."""
    bits = bits.sum() / max(1, bits.shape[0] * n_frames)
    want = STREAM_BITS / max(bits, 1e-3)
    block = int(2 ** np.ceil(np.log2(want)))
    return int(np.clip(block, MIN_BLOCK, MAX_BLOCK))


def entropy_bits(hist: np.ndarray, n_frames: int) -> np.ndarray:
    """Order-0 entropy (bits) of each pixel's whole stream, from its value histogram (frame_len,)."""
    hist = np.asarray(hist)
    used = np.flatnonzero(hist.any(axis=0))
    p = hist[:, : int(used[-1]) + 1 if used.size else 0].astype(np.float64) / max(n_frames, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log2(p), 0.0).sum(axis=1)
    return h * n_frames


def estimated_bytes(hist: np.ndarray, n_frames: int, dtype) -> float:
    """Coded bytes the counts of value histograms (frame_len, HIST_BINS) of ``n_frames`` frames would take,
    roughly: the order-0 entropy of each pixel's tokens (counts below MAX_V, one escape symbol for the
    rest) plus the raw 16-bit chunks every escaped count carries. Cheap: for choosing a layout, not sizing."""
    hist = np.asarray(hist, dtype=np.float64)
    tokens = np.concatenate([hist[:, :MAX_V], hist[:, MAX_V:].sum(axis=1, keepdims=True)], axis=1)
    escapes = tokens[:, -1].sum()
    return float(entropy_bits(tokens, n_frames).sum() + escapes * 16 * raw_chunks(dtype)) / 8


@numba.njit(cache=True, nogil=True)
def quantized(counts: np.ndarray, freq: np.ndarray) -> None:
    """``freq``: the frequencies of one row of symbol ``counts`` (int64) summing to PROB_SCALE, >= 1 for every
    symbol that occurs, 0 for the others.

    Proportional rounding, then the difference taken from or given to the most
    frequent symbol (the first of equals: it changes that symbol's cost least);
    a row with no counts gets all of PROB_SCALE on symbol 0 (a table never used).
    """
    total = counts.sum()
    safe = max(total, 1)
    for j in range(counts.size):
        freq[j] = max(1, (counts[j] * PROB_SCALE + safe // 2) // safe) if counts[j] > 0 else 0
    if total == 0:
        freq[0] = PROB_SCALE
    diff = PROB_SCALE - freq.sum()
    while diff != 0:
        top = 0
        if diff < 0:  # taken from the largest that keeps at least 1
            for j in range(counts.size):
                if freq[j] > 1 and (freq[top] <= 1 or freq[j] > freq[top]):
                    top = j
            step = max(diff, 1 - freq[top])
        else:
            for j in range(counts.size):
                if freq[j] > freq[top]:
                    top = j
            step = diff
        freq[top] += step
        diff -= step


@numba.njit(cache=True, nogil=True)
def tables_of(tokens: np.ndarray, run: np.ndarray, values: np.ndarray, every_symbol: bool) -> tuple[np.ndarray, np.ndarray]:
    """``build_tables``' work, one pixel at a time: each of its tables quantised over the widest table of its kind."""
    n = tokens.shape[0]
    nv, nr = int(values.max()) + 1 if n else 1, int(run.max()) + 2 if n else 2
    start = np.zeros(n, np.uint32)
    total = 0
    for p in range(n):
        start[p] = total
        total += int(values[p]) + 2 + (int(run[p]) + 3 if run[p] > 0 else 0)
    cum = np.zeros(total, np.uint16)
    row_v, row_r, freq = np.zeros(nv, np.int64), np.zeros(nr, np.int64), np.zeros(max(nv, nr), np.int64)
    for p in range(n):
        v, r, at = int(values[p]), int(run[p]), int(start[p])
        for j in range(nv):
            row_v[j] = np.int64(tokens[p, j]) + (1 if every_symbol and j <= v else 0)
        quantized(row_v, freq[:nv])
        acc = 0
        for j in range(v + 1):
            acc += freq[j]
            cum[at + 1 + j] = acc
        if r > 0:
            at += v + 2
            for j in range(nr):
                row_r[j] = np.int64(tokens[p, RUN_SLOT + j]) + (1 if every_symbol and j <= r + 1 else 0)
            quantized(row_r, freq[:nr])
            acc = 0
            for j in range(r + 2):
                acc += freq[j]
                cum[at + 1 + j] = acc
    return start, cum


def build_tables(tokens: np.ndarray, run: np.ndarray, values: np.ndarray, every_symbol: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(table_start (frame_len,) uint32, cum uint16) from token histograms (frame_len, TOKEN_SLOTS, or as many
    as reach the widest run table).

    A pixel's tables sit at ``cum[table_start[p]:]``: the value table's V + 2
    cumulative frequencies, then (run mode) the run table's R + 3. Symbols a
    pixel's model does not have were never counted, so each table quantises
    over the widest of its kind alike. With ``every_symbol``, every symbol a
    pixel's model has gets one more count first, so the tables give each a
    nonzero frequency: a model chosen from the first frames of a live
    acquisition can then code any later count (a symbol of frequency 0 cannot
    be coded).
    """
    return tables_of(np.asarray(tokens), np.asarray(run, np.int64), np.asarray(values, np.int64), bool(every_symbol))


def check_tables(run: np.ndarray, values: np.ndarray, table_start: np.ndarray, cum: np.ndarray) -> None:
    """ValueError unless every pixel's tables lie inside ``cum`` and are valid cumulative frequencies."""
    run = np.asarray(run, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    start = np.asarray(table_start, dtype=np.int64)
    if (run > MAX_RUN).any():
        raise ValueError("compressed tables: a run limit is out of range")
    if (values < 1).any() or (values > MAX_V).any():
        raise ValueError("compressed tables: a value alphabet size is out of range")
    ends = start + values + 2 + np.where(run > 0, run + 3, 0)
    if (start < 0).any() or (ends > cum.size).any():
        raise ValueError("compressed tables: a pixel's table lies outside the table array")
    cum = cum.astype(np.int64)
    for s, n in ((start, values + 2), (start + values + 2, np.where(run > 0, run + 3, 0))):
        has = n > 0
        if (cum[s[has]] != 0).any() or (cum[(s + n - 1)[has]] != PROB_SCALE).any():
            raise ValueError("compressed tables: a table does not run from 0 to 2**12")
    if cum.size > 1:
        steps = np.diff(cum)
        # decreasing steps may only occur between tables
        starts = np.zeros(cum.size, dtype=bool)
        starts[start] = True
        starts[(start + values + 2)[run > 0]] = True
        if (steps[~starts[1:]] < 0).any():
            raise ValueError("compressed tables: cumulative frequencies decrease")


def stream_raw_bytes(n: int, itemsize: int) -> int:
    """Bytes of a raw stream of ``n`` counts: the counts, padded to an even length."""
    return n * itemsize + (n * itemsize) % 2


def stream_bound(n: int, itemsize: int) -> int:
    """The most bytes one stream of ``n`` counts takes in the form the encoder chooses: raw, or a 4-byte constant."""
    return max(4, stream_raw_bytes(n, itemsize))


def payload_in(out, total: int):
    """The first ``total`` bytes of ``out`` (1-D uint8), for a payload written in place; ValueError if they do not fit."""
    if out.ndim != 1 or out.dtype != np.uint8 or out.size < total:
        raise ValueError(f"a payload of {total} bytes does not fit in {out.dtype} {out.shape}")
    return out[:total]


def pack_index(forms: np.ndarray, offsets: np.ndarray, bound: int | None = None) -> np.ndarray:
    """Index entries (uint32) from stream forms and byte offsets inside their scan block; ``bound``, where
    given, is known to be at least every offset (then a bound within range spares a pass over them)."""
    if offsets.size and (bound is None or bound > OFFSET_MASK) and int(offsets.max()) > OFFSET_MASK:
        raise ValueError("a scan block of compressed streams exceeds 512 MiB: use a smaller block")
    return (forms.astype(np.uint32) << FORM_SHIFT) | offsets.astype(np.uint32)
