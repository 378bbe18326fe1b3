"""The pixel-group index of format qgpu-ans-2: its geometry and the packing of its per-frame sums (NumPy).

A compressed resident keeps, beside its streams, the exact sum of every frame
over each group of detector pixels: level 0 are rings around the index centre
(one pixel wide), level 1 sector leaves (bands of BAND rings cut into 8
octants). A mask made of whole groups (a centred disk or annulus, a sector of
band-aligned radii) is then answered without decoding its pixels. The rules
here are integer-exact and normative (docs/compressed-format.md, section 10).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BAND = 32  # rings per band of sector leaves (wider bands: fewer leaves, fewer index bytes)
OCTANTS = 8  # leaves per band
GROUP_BLOCK = 256  # frames per packed block of group sums
ALL_ONES = np.uint64(2**64 - 1)


def center_of(pattern: np.ndarray) -> tuple[int, int]:
    """(cy2, cx2): the centroid of the whole-scan sum ``pattern`` (det_rows, det_cols) in half pixels, exactly:
    round half up of 2 * sum(row * S) / sum(S) (cols alike), clamped to the detector; its centre when all zero."""
    pattern = np.asarray(pattern)
    if pattern.ndim != 2 or pattern.dtype.kind not in "iu":
        raise ValueError(f"the sum pattern must be a 2-D integer array, got {pattern.dtype} of shape {pattern.shape}")
    rows, cols = pattern.shape
    if pattern.dtype.kind == "i" and (pattern < 0).any():
        raise ValueError("the sum pattern has negative sums")
    by_row = [int(v) for v in pattern.sum(axis=1, dtype=np.uint64)] if rows * cols else []
    by_col = [int(v) for v in pattern.sum(axis=0, dtype=np.uint64)] if rows * cols else []
    # per-row sums fit uint64 (each is at most frame sums summed); the moments are taken in Python integers
    total = sum(by_row)
    if total == 0:
        return rows - 1, cols - 1
    moment_r = sum(r * s for r, s in enumerate(by_row))
    moment_c = sum(c * s for c, s in enumerate(by_col))
    # round half up of 2 m / t = floor((4 m + t) / (2 t))
    cy2 = (4 * moment_r + total) // (2 * total)
    cx2 = (4 * moment_c + total) // (2 * total)
    return min(max(cy2, 0), 2 * (rows - 1)), min(max(cx2, 0), 2 * (cols - 1))


def octant_of(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Octant o of (u, v) = (dx2, -dy2): angles [45 o, 45 (o + 1)) counter-clockwise from +u; (0, 0) is octant 0."""
    u, v = np.asarray(u, dtype=np.int64), np.asarray(v, dtype=np.int64)
    au, av = np.abs(u), np.abs(v)
    return np.select(
        [
            (u > 0) & (v >= 0) & (v < u),   # 0: [0, 45)
            (u > 0) & (v >= u),             # 1: [45, 90)
            (u <= 0) & (v > 0) & (au < v),  # 2: [90, 135)
            (u < 0) & (v > 0) & (au >= v),  # 3: [135, 180)
            (u < 0) & (v <= 0) & (av < au),  # 4: [180, 225)
            (u < 0) & (v < 0) & (av >= au),  # 5: [225, 270)
            (u >= 0) & (v < 0) & (u < av),  # 6: [270, 315)
            (u > 0) & (v < 0) & (u >= av),  # 7: [315, 360)
        ],
        np.arange(8),
        0,  # the centre
    ).astype(np.int32)


def ring_of(d: np.ndarray) -> np.ndarray:
    """The ring k of squared half-pixel distances ``d`` = 4 dist**2: the smallest k >= 0 with d <= 4 k**2."""
    d = np.asarray(d, dtype=np.int64)
    k = np.ceil(np.sqrt(d.astype(np.float64)) / 2).astype(np.int64)
    # the float estimate is corrected exactly, both ways
    k = np.where(4 * k * k < d, k + 1, k)
    k = np.where((k > 0) & (4 * (k - 1) * (k - 1) >= d), k - 1, k)
    return k


@dataclass(frozen=True, eq=False)
class Geometry:
    """Which rings and leaves each detector pixel belongs to, for one detector shape and index centre.

    ``ring[p]`` is pixel p's ring (group id = ring), ``leaf[p]`` its leaf's group id
    (n_rings + 8 band + octant); ``members[starts[g]:starts[g + 1]]`` are group g's pixels, ascending.
    """

    det_shape: tuple[int, int]
    cy2: int
    cx2: int
    ring: np.ndarray
    leaf: np.ndarray
    n_rings: int
    n_leaves: int
    starts: np.ndarray
    members: np.ndarray

    @property
    def n_groups(self) -> int:
        return self.n_rings + self.n_leaves

    @property
    def n_bands(self) -> int:
        return self.n_leaves // OCTANTS

    @property
    def frame_len(self) -> int:
        return self.det_shape[0] * self.det_shape[1]


def geometry(det_shape: tuple[int, int], cy2: int, cx2: int) -> Geometry:
    """The Geometry of a detector of ``det_shape`` around the half-pixel centre (cy2, cx2)."""
    rows, cols = (int(s) for s in det_shape)
    if rows < 1 or cols < 1:
        raise ValueError(f"a detector shape is (rows, cols) with both >= 1, got {det_shape}")
    cy2, cx2 = int(cy2), int(cx2)
    if not (0 <= cy2 <= 2 * (rows - 1) and 0 <= cx2 <= 2 * (cols - 1)):
        raise ValueError(f"the index centre (cy2, cx2) = ({cy2}, {cx2}) half pixels lies outside the {rows} x {cols} detector")
    dy2 = (2 * np.arange(rows, dtype=np.int64) - cy2)[:, None]
    dx2 = (2 * np.arange(cols, dtype=np.int64) - cx2)[None, :]
    ring = ring_of(dy2 * dy2 + dx2 * dx2).ravel()
    n_rings = int(ring.max()) + 1
    n_bands = -(-n_rings // BAND)
    octant = octant_of(np.broadcast_to(dx2, (rows, cols)), np.broadcast_to(-dy2, (rows, cols))).ravel()
    leaf = n_rings + OCTANTS * (ring // BAND) + octant
    n_groups = n_rings + OCTANTS * n_bands
    group = np.concatenate([ring, leaf])
    pixel = np.concatenate([np.arange(rows * cols, dtype=np.int64)] * 2)
    order = np.argsort(group, kind="stable")
    starts = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(group, minlength=n_groups), out=starts[1:])
    return Geometry((rows, cols), cy2, cx2, ring.astype(np.int32), leaf.astype(np.int32), n_rings, OCTANTS * n_bands,
                    starts, pixel[order])


# ---------------------------------------------------------------- packing


def n_blocks_of(n_frames: int) -> int:
    return -(-int(n_frames) // GROUP_BLOCK)


def block_lengths(n_frames: int) -> np.ndarray:
    """Frames in each packed block: GROUP_BLOCK, the last one shorter."""
    n_blocks = n_blocks_of(n_frames)
    lengths = np.full(n_blocks, GROUP_BLOCK, dtype=np.int64)
    if n_blocks:
        lengths[-1] = n_frames - GROUP_BLOCK * (n_blocks - 1)
    return lengths


def starts_of(width: np.ndarray, n_frames: int) -> np.ndarray:
    """(n_blocks, n_groups) uint64 first bit of each (block, group)'s fields: the exclusive prefix sum of
    frames-in-block x width, block-major then group order."""
    sizes = (block_lengths(n_frames)[:, None] * width.astype(np.int64)).ravel()
    start = np.zeros(sizes.size, dtype=np.int64)
    np.cumsum(sizes[:-1], out=start[1:])
    return start.reshape(width.shape).astype(np.uint64)


def total_bits(width: np.ndarray, n_frames: int) -> int:
    return int((block_lengths(n_frames)[:, None] * width.astype(np.int64)).sum())


def widths_of(spread: np.ndarray) -> np.ndarray:
    """uint8 bits needed for each uint64 ``spread`` (0 for 0, 64 for >= 2**63)."""
    rest = np.asarray(spread, dtype=np.uint64)
    width = np.zeros(rest.shape, dtype=np.uint8)
    for shift in (32, 16, 8, 4, 2, 1):  # a binary search for the top bit, every value at once
        high = (rest >> np.uint64(shift)) != 0
        width += high.astype(np.uint8) * np.uint8(shift)
        rest = np.where(high, rest >> np.uint64(shift), rest)
    return width + (rest != 0)


def pack(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base, width, bits) of per-frame group sums ``sums`` (n_frames, n_groups) uint64 (the reference packer)."""
    sums = np.asarray(sums)
    if sums.ndim != 2 or sums.dtype != np.uint64:
        raise ValueError(f"group sums must be (n_frames, n_groups) uint64, got {sums.dtype} of shape {sums.shape}")
    n_frames, n_groups = sums.shape
    lengths = block_lengths(n_frames)
    base = np.zeros((lengths.size, n_groups), dtype=np.uint64)
    width = np.zeros((lengths.size, n_groups), dtype=np.uint8)
    fields, field_widths = [], []
    for b, n in enumerate(lengths):
        block = sums[b * GROUP_BLOCK : b * GROUP_BLOCK + n]
        base[b] = block.min(axis=0)
        width[b] = widths_of(block.max(axis=0) - base[b])
        fields.append((block - base[b]).T.ravel())  # group-major, frame order
        field_widths.append(np.repeat(width[b], n))
    n_words = -(-total_bits(width, n_frames) // 64)
    bits = np.zeros(n_words, dtype=np.uint64)
    if n_words:
        value = np.concatenate(fields)
        w = np.concatenate(field_widths).astype(np.int64)
        pos = np.zeros(w.size, dtype=np.int64)
        np.cumsum(w[:-1], out=pos[1:])
        keep = w > 0
        value, w, pos = value[keep], w[keep], pos[keep]
        word, shift = pos >> 6, (pos & 63).astype(np.uint64)
        low = value << shift
        # fields never share bits, so OR-reducing the contributions of each word writes them all
        heads = np.flatnonzero(np.r_[True, word[1:] != word[:-1]])
        bits[word[heads]] |= np.bitwise_or.reduceat(low, heads)
        spill = (pos & 63) + w > 64
        if spill.any():
            high = value[spill] >> (np.uint64(64) - shift[spill])
            words = word[spill] + 1
            heads = np.flatnonzero(np.r_[True, words[1:] != words[:-1]])
            bits[words[heads]] |= np.bitwise_or.reduceat(high, heads)
    return base, width, bits


def check_packed(base: np.ndarray, width: np.ndarray, bits: np.ndarray, n_frames: int, n_groups: int) -> None:
    """ValueError naming the array unless base, width and bits are a packing of (n_frames, n_groups) sums."""
    shape = (n_blocks_of(n_frames), int(n_groups))
    for name, array, dtype in (("base", base, np.uint64), ("width", width, np.uint8)):
        if array.shape != shape or array.dtype != dtype:
            raise ValueError(f"group index {name!r} has shape {array.shape} {array.dtype}, expected {shape} {np.dtype(dtype)}")
    if bits.ndim != 1 or bits.dtype != np.uint64:
        raise ValueError(f"group index 'bits' has shape {bits.shape} {bits.dtype}, expected 1-D uint64")
    if (width > 64).any():
        raise ValueError(f"group index 'width' has a width of {int(width.max())} bits, above 64")
    need = -(-total_bits(width, n_frames) // 64)
    if bits.size != need:
        raise ValueError(f"group index 'bits' has {bits.size} words, but its widths need {need}"
                         f" ({'too short' if bits.size < need else 'too long'} for the widths)")


def unpack(base: np.ndarray, width: np.ndarray, bits: np.ndarray, n_frames: int) -> np.ndarray:
    """(n_frames, n_groups) uint64 group sums from their packing (the reference decoder)."""
    check_packed(base, width, bits, n_frames, width.shape[1] if width.ndim == 2 else -1)
    lengths = block_lengths(n_frames)
    n_groups = width.shape[1]
    start = starts_of(width, n_frames).astype(np.int64)
    sums = np.zeros((n_frames, n_groups), dtype=np.uint64)
    for b, n in enumerate(lengths):
        w = width[b].astype(np.int64)[:, None]
        pos = start[b][:, None] + np.arange(n, dtype=np.int64)[None, :] * w  # (n_groups, n)
        sums[b * GROUP_BLOCK : b * GROUP_BLOCK + n] = (base[b][:, None] + read_fields(bits, pos, w)).T
    return sums


def read_fields(bits: np.ndarray, pos: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The ``w``-bit fields (0..64) at bit positions ``pos`` of the little-endian word stream ``bits``."""
    pos, w = np.broadcast_arrays(pos, w)
    if bits.size == 0:
        return np.zeros(pos.shape, dtype=np.uint64)
    word = np.minimum(pos >> 6, bits.size - 1)
    shift = (pos & 63).astype(np.uint64)
    value = bits[word] >> shift
    spill = (pos & 63) + w > 64
    nxt = bits[np.minimum(word + 1, bits.size - 1)] << (np.uint64(64) - shift).clip(max=63)
    value = np.where(spill, value | nxt, value)
    mask = np.where(w >= 64, ALL_ONES, (np.uint64(1) << w.astype(np.uint64).clip(max=63)) - np.uint64(1))
    return np.where(w > 0, value & mask, np.uint64(0))
