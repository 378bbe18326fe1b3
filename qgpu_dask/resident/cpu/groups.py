"""CPU kernels (Numba) of the pixel-group index: the twins of ``resident.cuda.groups``.

Shared contract (same arguments, same bits):

- ``group_index(flat, ring, leaf, n_groups) -> (base, width, bits)``: the per-frame sums of dense counts
  ``flat`` (n_frames, frame_len) over every ring (``ring[p]``) and leaf (``leaf[p]``, a group id), packed
  as ``formats.groups.pack`` packs them;
- ``group_sums(base, width, bits, start, n_frames, groups, coef) -> (n_masks, n_frames) uint64``:
  ``sum_j coef[m, j] * sum of group groups[j] in frame f``, wrapping (``coef`` is int64 seen as uint64).
"""

from __future__ import annotations

import numba
import numpy as np

from ...formats.groups import GROUP_BLOCK, pack

jit = numba.njit(cache=True, nogil=True)
pjit = numba.njit(cache=True, nogil=True, parallel=True)


@pjit
def sums_loop(flat, ring, leaf, out):
    for f in numba.prange(flat.shape[0]):
        row = flat[f]
        for p in range(row.shape[0]):
            v = np.uint64(row[p])
            out[f, ring[p]] += v
            out[f, leaf[p]] += v


def group_index(flat: np.ndarray, ring: np.ndarray, leaf: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base, width, bits) of the packed per-frame ring and leaf sums of ``flat``."""
    sums = np.zeros((flat.shape[0], int(n_groups)), dtype=np.uint64)
    sums_loop(np.ascontiguousarray(flat), ring, leaf, sums)
    return pack(sums)


@jit
def field(bits, pos, w):
    """The ``w``-bit field (1..64) at bit ``pos`` of the little-endian word stream ``bits``."""
    word = pos >> 6
    shift = pos & 63
    v = bits[word] >> np.uint64(shift)
    if shift + w > 64:
        v |= bits[word + 1] << np.uint64(64 - shift)
    if w < 64:
        v &= (np.uint64(1) << np.uint64(w)) - np.uint64(1)
    return v


@pjit
def group_sums_loop(base, width, bits, start, n_frames, groups, coef, out):
    n_blocks = base.shape[0]
    for b in numba.prange(n_blocks):
        lo = b * GROUP_BLOCK
        n = min(GROUP_BLOCK, n_frames - lo)
        for j in range(groups.shape[0]):
            g = groups[j]
            w = np.int64(width[b, g])
            first = np.int64(start[b, g])
            for i in range(n):
                v = base[b, g]
                if w > 0:
                    v += field(bits, first + i * w, w)
                for m in range(coef.shape[0]):
                    out[m, lo + i] += coef[m, j] * v


def group_sums(base, width, bits, start, n_frames: int, groups: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """(n_masks, n_frames) uint64: the coefficient-weighted sums of the used ``groups``, wrapping."""
    out = np.zeros((coef.shape[0], int(n_frames)), dtype=np.uint64)
    if groups.size:
        wrapped = np.ascontiguousarray(coef.astype(np.int64).view(np.uint64))
        group_sums_loop(base, width, bits, start, int(n_frames), groups.astype(np.int64), wrapped, out)
    return out
