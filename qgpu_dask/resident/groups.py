"""The pixel-group index of a compressed resident, and the planner that answers masks with it.

``GroupIndex`` holds the packed exact per-frame sums over rings and sector
leaves (``formats.groups``) on the resident's device. ``decompose`` writes a
mask stack as whole groups times coefficients plus a few residual pixels, so a
virtual image decodes only the residual pixels' streams and reads the rest from
the index, exactly (wrapping integer arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

import numpy as np

from ..device import to_host
from ..formats import groups as fmt
from ..formats.groups import BAND, OCTANTS, Geometry
from .base import kernels_for

GROUP_COST = 32  # reading one group's sums costs about 1/32 of decoding one pixel's streams
GROUP_KEYS = ("group_base", "group_width", "group_bits")  # the index's arrays in a saved resident
MODE_BINS = 2**22  # (mask, group, weight) bins up to which the commonest weights are counted, not sorted


@lru_cache(maxsize=16)
def geometry_for(det_shape: tuple[int, int], cy2: int, cx2: int) -> Geometry:
    """The Geometry of (det_shape, centre): one object per distinct geometry, so residents share it and
    the decomposition of a mask stack is made once for all of them."""
    return fmt.geometry(det_shape, cy2, cx2)


def centered_geometry(flat, det_shape: tuple[int, int]) -> Geometry:
    """The Geometry centred on the centroid of the sum pattern of dense counts ``flat`` (n_frames, frame_len)."""
    pattern = to_host(flat.sum(axis=0, dtype=np.uint64)).reshape(det_shape)
    return geometry_for(tuple(det_shape), *fmt.center_of(pattern))


def index_piece(flat, geometry: Geometry, xp: ModuleType) -> tuple:
    """(base, width, bits, n_frames): the packed group sums of dense counts ``flat`` on their device."""
    kernels = kernels_for(xp, "groups")
    return (*kernels.group_index(flat, xp.asarray(geometry.ring), xp.asarray(geometry.leaf), geometry.n_groups), flat.shape[0])


def joined_bits(pieces: list[tuple[object, int]], xp: ModuleType):
    """One bit stream of ``pieces`` (words, bits used) laid end to end, as ``formats.groups`` packs them."""
    total = sum(n for _, n in pieces)
    out = xp.zeros(-(-total // 64), dtype=np.uint64)
    at = 0
    for words, n in pieces:
        if n:
            word, shift, size = at >> 6, at & 63, -(-n // 64)
            words = words[:size]
            if shift == 0:
                out[word : word + size] |= words
            else:
                out[word : word + size] |= words << np.uint64(shift)
                spill = min(size, out.size - word - 1)
                out[word + 1 : word + 1 + spill] |= words[:spill] >> np.uint64(64 - shift)
        at += n
    return out


def worst_bytes(det_shape: tuple[int, int], n_frames: int) -> int:
    """An upper bound on a group index's bytes (every field 64 bits wide) for ``n_frames`` frames."""
    n_rings = int(np.ceil(np.hypot(*det_shape))) + 1
    n_groups = n_rings + OCTANTS * -(-n_rings // BAND)
    return n_groups * (8 * n_frames + 17 * fmt.n_blocks_of(n_frames) + 8)


class GroupIndex:
    """Packed per-frame ring and leaf sums of one acquisition, on the device of its resident."""

    def __init__(self, geometry: Geometry, base, width, bits, n_frames: int, xp: ModuleType):
        self.geometry = geometry
        self.n_frames = int(n_frames)
        host_width = to_host(width)
        fmt.check_packed(base, host_width, bits, self.n_frames, geometry.n_groups)  # bits: only its shape is checked
        self.base, self.width, self.bits = base, width, bits
        self.start = xp.asarray(fmt.starts_of(host_width, self.n_frames))
        self.xp = xp
        self.kernels = kernels_for(xp, "groups")

    @classmethod
    def from_counts(cls, flat, det_shape: tuple[int, int], xp: ModuleType) -> "GroupIndex":
        """The index of dense counts ``flat`` (n_frames, frame_len) on their device, centred on the
        centroid of their whole-scan sum pattern."""
        geometry = centered_geometry(flat, det_shape)
        return cls(geometry, *index_piece(flat, geometry, xp), xp)

    @classmethod
    def joined(cls, geometry: Geometry, pieces: list[tuple], xp: ModuleType) -> "GroupIndex":
        """The index of consecutive frames from ``index_piece``s, all but the last of whole GROUP_BLOCKs."""
        if any(n % fmt.GROUP_BLOCK for *_, n in pieces[:-1]):
            raise ValueError(f"group index pieces must hold whole blocks of {fmt.GROUP_BLOCK} frames, but the last one")
        if len(pieces) == 1:
            return cls(geometry, *pieces[0], xp)
        sizes = [fmt.total_bits(to_host(width), n) for _, width, _, n in pieces]
        bits = joined_bits([(p[2], size) for p, size in zip(pieces, sizes)], xp)
        return cls(geometry, xp.concatenate([p[0] for p in pieces]), xp.concatenate([p[1] for p in pieces]), bits,
                   sum(p[3] for p in pieces), xp)

    @classmethod
    def from_arrays(cls, det_shape: tuple[int, int], cy2: int, cx2: int, arrays: dict, n_frames: int, xp: ModuleType) -> "GroupIndex":
        """The index saved as ``arrays`` (by GROUP_KEYS) around the centre (cy2, cx2)."""
        return cls(geometry_for(tuple(det_shape), int(cy2), int(cx2)), *(xp.asarray(arrays[k]) for k in GROUP_KEYS), n_frames, xp)

    def arrays(self) -> dict:
        """The packed arrays by GROUP_KEYS (what a saved resident holds of its index)."""
        return dict(zip(GROUP_KEYS, (self.base, self.width, self.bits)))

    @property
    def center(self) -> tuple[int, int]:
        """(cy2, cx2), the index centre in half pixels."""
        return self.geometry.cy2, self.geometry.cx2

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.base, self.width, self.bits, self.start)))

    @staticmethod
    def derived_bytes(width_shape: tuple[int, ...]) -> int:
        """Bytes of the derived starts (uint64, the shape of ``width``): held, not saved."""
        return int(np.prod(width_shape)) * 8

    def group_sums(self, groups: np.ndarray, coef: np.ndarray):
        """(n_masks, n_frames) uint64 on the device: ``sum_j coef[m, j] * sums[f, groups[j]]``, wrapping."""
        groups = np.asarray(groups, dtype=np.int64)
        coef = np.asarray(coef, dtype=np.int64)
        if coef.ndim != 2 or coef.shape[1] != groups.size:
            raise ValueError(f"group coefficients have shape {coef.shape}, expected (n_masks, {groups.size})")
        if groups.size and (groups.min() < 0 or groups.max() >= self.geometry.n_groups):
            raise ValueError(f"group ids out of range [0, {self.geometry.n_groups})")
        xp = self.xp
        return self.kernels.group_sums(self.base, self.width, self.bits, self.start, self.n_frames, xp.asarray(groups), xp.asarray(coef))

    def check(self, totals, name: str) -> None:
        """ValueError unless the rings, and the leaves, of every frame add up to its total ``totals``."""
        g = self.geometry
        for level, ids in (("ring", np.arange(g.n_rings)), ("leaf", np.arange(g.n_rings, g.n_groups))):
            sums = self.group_sums(ids, np.ones((1, ids.size), dtype=np.int64))
            if not bool((sums[0] == totals).all()):
                raise ValueError(f"compressed acquisition {name!r}: the group index's {level} sums do not match the frame totals")


@dataclass(frozen=True)
class Decomposition:
    """A mask stack as ``coef[m, j]`` times group ``groups[j]`` plus ``weights[m, k]`` at pixel ``pixels[k]``."""

    groups: np.ndarray  # int64 group ids used
    coef: np.ndarray  # (n_masks, n_used) int64
    pixels: np.ndarray  # int64 residual pixels, ascending
    weights: np.ndarray  # (n_masks, n_pixels) int64

    @property
    def cost(self) -> float:
        """Work in decoded pixels: residual pixels plus used groups / GROUP_COST."""
        return self.pixels.size + self.groups.size / GROUP_COST


def commonest_per_group(n_masks: int, masks: np.ndarray, pixels: np.ndarray, values: np.ndarray, group: np.ndarray,
                        sizes: np.ndarray) -> np.ndarray:
    """(n_masks, n_groups) int64: the commonest weight of each mask over each group's pixels, from its nonzero
    weights ``values`` (mask ``masks[i]``, pixel ``pixels[i]``) and the group sizes (the other pixels weigh
    0); 0 on a tie with 0, else the lowest weight; 0 for an empty group."""
    n_groups = sizes.size
    key = masks * n_groups + group[pixels]
    nonzero = np.bincount(key, minlength=n_masks * n_groups).reshape(n_masks, n_groups)
    zeros = sizes[None, :] - nonzero
    lo, hi = min(int(values.min(initial=0)), 0), max(int(values.max(initial=0)), 0)
    span = hi - lo + 1
    out = np.zeros((n_masks, n_groups), dtype=np.int64)
    if values.size == 0:
        return out
    if n_masks * n_groups * span <= MODE_BINS:
        counts = np.bincount(key * span + (values - lo), minlength=n_masks * n_groups * span).reshape(n_masks, n_groups, span)
        counts[:, :, -lo] = zeros
        counts *= 2
        counts[:, :, -lo] += 1  # ties go to 0: no group needed
        return np.argmax(counts, axis=2).astype(np.int64) + lo
    order = np.lexsort((values, key))
    key, values = key[order], values[order]
    heads = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]) | (values[1:] != values[:-1])])
    run_key, run_value, run_length = key[heads], values[heads], np.diff(np.r_[heads, key.size])
    best = np.lexsort((-run_length, run_key))  # stable: equal lengths keep the lowest weight first
    run_key, run_value, run_length = run_key[best], run_value[best], run_length[best]
    first = np.r_[True, run_key[1:] != run_key[:-1]]
    run_key, run_value, run_length = run_key[first], run_value[first], run_length[first]
    wins = run_length > zeros.ravel()[run_key]
    out.ravel()[run_key[wins]] = run_value[wins]
    return out


@lru_cache(maxsize=16)
def planning_arrays(geometry: Geometry) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ring, leaf - n_rings, band of each pixel, group sizes) of ``geometry`` as int64: made once, not per mask."""
    ring = geometry.ring.astype(np.int64)
    return ring, geometry.leaf.astype(np.int64) - geometry.n_rings, ring // BAND, np.diff(geometry.starts)


def decompose(full: np.ndarray, geometry: Geometry) -> Decomposition:
    """The cheapest exact decomposition of integer weights ``full`` (n_masks, frame_len) over ``geometry``:
    per band, its rings, its 8 leaves or no group, whichever leaves the fewest residual pixels (union over
    masks) plus used groups / GROUP_COST; ``full == coef @ membership + residual`` exactly.

    Only the weighted pixels and the pixels of groups a level would use are looked at."""
    full = np.asarray(full)
    if full.ndim != 2 or full.shape[1] != geometry.frame_len or full.dtype.kind not in "iu":
        raise ValueError(f"weights to decompose must be integer (n_masks, {geometry.frame_len}), got {full.dtype} of shape {full.shape}")
    full = full.astype(np.int64, copy=False)
    n_masks, n_rings, n_bands = full.shape[0], geometry.n_rings, geometry.n_bands
    ring, leaf, band, sizes = planning_arrays(geometry)
    nonzero = full != 0
    where = np.flatnonzero(nonzero)  # np.take and flatnonzero: several times faster than fancy indexing here
    masks, pixels = np.divmod(where, geometry.frame_len)
    values = np.take(full, where)
    any_weight = nonzero.any(axis=0)
    weighted = np.flatnonzero(any_weight)
    levels = []  # per level: (first group id, coefficients, its groups' bands, residual pixels)
    for first, group, n in ((0, ring, n_rings), (n_rings, leaf, geometry.n_leaves)):
        coef = commonest_per_group(n_masks, masks, pixels, values, group, sizes[first : first + n])
        in_use = coef.any(axis=0)
        used = np.flatnonzero(in_use)
        looked = np.flatnonzero(any_weight | np.take(in_use, group))  # the weighted pixels and those of used groups
        residual = looked[(np.take(full, looked, axis=1) != np.take(coef, np.take(group, looked), axis=1)).any(axis=0)]
        levels.append((first, coef, group, used, residual))
    group_band = (np.arange(n_rings) // BAND, np.arange(geometry.n_leaves) // OCTANTS)

    def per_band(where: np.ndarray) -> np.ndarray:
        return np.bincount(band[where], minlength=n_bands).astype(np.int64)

    # costs in 1/GROUP_COST pixels, exact integers; ties: no group, then rings, then leaves
    costs = np.stack([GROUP_COST * per_band(weighted)] + [
        GROUP_COST * per_band(residual) + np.bincount(group_band[i][used], minlength=n_bands)
        for i, (_, _, _, used, residual) in enumerate(levels)
    ])
    choice = np.argmin(costs, axis=0)
    candidates = [weighted] + [residual for *_, residual in levels]
    pixels = np.sort(np.concatenate([c[choice[band[c]] == i] for i, c in enumerate(candidates)]))
    weights = np.take(full, pixels, axis=1)
    groups, coefs = [], []
    for i, (first, coef, group, used, _) in enumerate(levels):
        chosen = choice[band[pixels]] == i + 1
        weights[:, chosen] -= np.take(coef, np.take(group, pixels[chosen]), axis=1)
        keep = used[choice[group_band[i][used]] == i + 1]
        groups.append(first + keep)
        coefs.append(coef[:, keep])
    return Decomposition(np.concatenate(groups).astype(np.int64), np.ascontiguousarray(np.concatenate(coefs, axis=1)),
                         pixels.astype(np.int64), np.ascontiguousarray(weights))
