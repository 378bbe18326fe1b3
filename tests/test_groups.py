"""The pixel-group index: geometry facts, packing round trips, exact decompositions, queries through it, bad arrays."""

from __future__ import annotations

import time

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.formats import container
from qgpu_dask.formats import groups as fmt
from qgpu_dask.formats.groups import BAND, GROUP_BLOCK
from qgpu_dask.io.saved import open_resident, save_resident
from qgpu_dask.resident.cpu import groups as cpu_groups
from qgpu_dask.resident.groups import GroupIndex, decompose, geometry_for
from qgpu_dask.resident.live import LiveCounts
from qgpu_dask.resident.base import kernels_for
from qgpu_dask.resident.masks import mask_weights

from conftest import BACKENDS, host, module
from test_compressed import encode

SHAPES = [(17, 17), (257, 257), (130, 128)]


def membership(geometry) -> np.ndarray:
    """(n_groups, frame_len) int64 0/1 membership, from the CSR."""
    out = np.zeros((geometry.n_groups, geometry.frame_len), dtype=np.int64)
    for g in range(geometry.n_groups):
        out[g, geometry.members[geometry.starts[g] : geometry.starts[g + 1]]] = 1
    return out


def rebuilt(parts, geometry) -> np.ndarray:
    """The full weights a Decomposition stands for."""
    full = parts.coef @ membership(geometry)[parts.groups]
    full[:, parts.pixels] += parts.weights
    return full


def center(geometry) -> tuple[float, float]:
    return geometry.cy2 / 2, geometry.cx2 / 2







def reference(counts: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Exact virtual images (n_masks, n_frames) of integer masks, in Python integers reduced mod 2**64."""
    flat = counts.reshape(counts.shape[0] * counts.shape[1], -1).astype(object)
    return (masks.reshape(masks.shape[0], -1).astype(object) @ flat.T)


# ---------------------------------------------------------------- geometry


def test_center_is_the_exact_half_pixel_centroid():
    pattern = np.zeros((9, 12), np.uint64)
    pattern[2, 3] = 1
    pattern[3, 4] = 1  # centroid (2.5, 3.5): exactly half pixels
    assert fmt.center_of(pattern) == (5, 7)
    pattern[3, 4] = 3  # (2.75, 3.75) -> 5.5, 7.5 half pixels: rounded half up
    assert fmt.center_of(pattern) == (6, 8)
    assert fmt.center_of(np.zeros((9, 12), np.uint64)) == (8, 11)  # the detector centre
    big = np.zeros((4, 4), np.uint64)
    big[3, 3] = 2**62  # Python integers: no overflow
    big[0, 0] = 2**62
    assert fmt.center_of(big) == (3, 3)
    with pytest.raises(ValueError, match="2-D integer"):
        fmt.center_of(np.zeros((2, 2), np.float32))


@pytest.mark.parametrize("det", SHAPES + [(192, 192)])
def test_every_pixel_is_in_one_ring_and_one_leaf(det, rng):
    cy2, cx2 = int(rng.integers(0, 2 * det[0] - 1)), int(rng.integers(0, 2 * det[1] - 1))
    g = fmt.geometry(det, cy2, cx2)
    counts = np.bincount(g.members, minlength=g.frame_len)
    assert (counts == 2).all()
    assert (g.members[: g.starts[g.n_rings]] < g.frame_len).all()
    for p in rng.integers(0, g.frame_len, 50):
        ring, leaf = int(g.ring[p]), int(g.leaf[p])
        assert p in g.members[g.starts[ring] : g.starts[ring + 1]] and p in g.members[g.starts[leaf] : g.starts[leaf + 1]]
    assert g.n_groups == g.n_rings + 8 * -(-g.n_rings // BAND)
    r, c = np.divmod(np.arange(g.frame_len), det[1])
    d = (2 * r - cy2) ** 2 + (2 * c - cx2) ** 2
    k = g.ring.astype(np.int64)
    assert (d <= 4 * k * k).all() and ((k == 0) | (d > 4 * (k - 1) ** 2)).all()  # the smallest such k
    assert (g.leaf == g.n_rings + 8 * (k // BAND) + (g.leaf - g.n_rings) % 8).all()


def test_octants_follow_the_sector_angles():
    det = (64, 64)
    g = fmt.geometry(det, 63, 63)
    leaf = g.leaf - g.n_rings
    octant, band = leaf % 8, leaf // 8
    for o in range(8):
        for j in range(g.n_bands):
            inner = BAND * j - 1 if j else 0
            want = qd.masks.sector(det, center(g), inner, BAND * j + BAND - 1, 45 * o, 45 * (o + 1)).ravel()
            got = (octant == o) & (band == j)
            assert (got == want).all(), (o, j)
    # on-axis and diagonal boundaries with exact integers: (u, v) = (dx2, -dy2)
    u = np.array([1, 1, 0, -1, -1, -1, 0, 1, 0, 2, -3])
    v = np.array([0, 1, 1, 1, 0, -1, -1, -1, 0, 1, -3])
    assert fmt.octant_of(u, v).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 5]


@pytest.mark.parametrize("det", SHAPES + [(192, 192)])
def test_centred_disks_and_annuli_are_whole_rings(det):
    g = fmt.geometry(det, det[0] - 1, det[1] - 2)  # a half-pixel centre on one axis
    for radius in (1, 3, 8, 20):
        disk = qd.masks.disk(det, center(g), radius).ravel()
        assert (disk == (g.ring <= radius)).all()
    annulus = qd.masks.annulus(det, center(g), 2, 7).ravel()
    assert (annulus == ((g.ring > 2) & (g.ring <= 7))).all()
    masks = np.stack([qd.masks.disk(det, center(g), 5), qd.masks.annulus(det, center(g), 2, 7)]).reshape(2, -1)
    parts = decompose(masks.astype(np.int64), g)
    assert parts.pixels.size == 0 and (parts.groups < g.n_rings).all()
    assert (rebuilt(parts, g) == masks).all()


def test_band_aligned_sectors_are_whole_leaves():
    det = (192, 192)
    g = fmt.geometry(det, 191, 191)
    for start, stop in ((0, 90), (90, 180), (45, 90), (270, 360)):
        sector = qd.masks.sector(det, center(g), BAND - 1, 3 * BAND - 1, start, stop).reshape(1, -1).astype(np.int64)
        parts = decompose(sector, g)
        assert parts.pixels.size == 0 and (parts.groups >= g.n_rings).all(), (start, stop)
        assert parts.groups.size == 2 * (stop - start) // 45
        assert (rebuilt(parts, g) == sector).all()


# ---------------------------------------------------------------- packing


@pytest.mark.parametrize("n_frames", [1, 255, 256, 257, 3 * GROUP_BLOCK + 17])
def test_pack_round_trip_with_widths_0_and_64(n_frames, rng):
    sums = rng.integers(0, 2**40, (n_frames, 6), dtype=np.uint64)
    sums[:, 0] = 12345  # width 0
    sums[:, 1] = rng.integers(0, 2**64 - 1, n_frames, dtype=np.uint64, endpoint=True)
    sums[::GROUP_BLOCK, 1] = 0  # width 64 in every block of two frames or more
    sums[GROUP_BLOCK - 1 :: GROUP_BLOCK, 1] = sums[-1, 1] = 2**64 - 1
    sums[:, 2] = 2**64 - 1  # width 0 at the top
    sums[:, 3] = rng.integers(0, 2, n_frames)  # width 0 or 1
    base, width, bits = fmt.pack(sums)
    assert base.shape == width.shape == (-(-n_frames // GROUP_BLOCK), 6)
    lengths = np.minimum(GROUP_BLOCK, n_frames - GROUP_BLOCK * np.arange(width.shape[0]))
    assert (width[:, 0] == 0).all() and (width[:, 2] == 0).all() and (width[lengths > 1, 1] == 64).all()
    assert bits.size == -(-fmt.total_bits(width, n_frames) // 64)
    assert (fmt.unpack(base, width, bits, n_frames) == sums).all()
    start = fmt.starts_of(width, n_frames)
    sizes = np.minimum(GROUP_BLOCK, n_frames - GROUP_BLOCK * np.arange(width.shape[0]))[:, None] * width.astype(np.int64)
    assert start[0, 0] == 0 and (np.diff(np.r_[start.ravel().astype(np.int64), sizes.sum()]) == sizes.ravel()).all()
    # the kernels' decoder of the same fields, for every group at once with coefficients 1
    got = cpu_groups.group_sums(base, width, bits, start, n_frames, np.arange(6), np.eye(6, dtype=np.int64))
    assert (got == sums.T).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_index_kernel_matches_numpy(rng, backend):
    xp = module(backend)
    kernels = kernels_for(xp, "groups")
    det = (130, 128)
    counts = rng.poisson(0.7, (3 * GROUP_BLOCK + 5, det[0] * det[1])).astype(np.uint16)
    g = fmt.geometry(det, *fmt.center_of(counts.sum(axis=0, dtype=np.uint64).reshape(det)))
    sums = (counts.astype(np.uint64) @ membership(g).T.astype(np.uint64))
    packed = kernels.group_index(xp.asarray(counts), xp.asarray(g.ring), xp.asarray(g.leaf), g.n_groups)
    for got, want in zip(packed, fmt.pack(sums)):
        assert got.dtype == want.dtype and (host(got) == want).all()
    base, width, bits = packed
    start = xp.asarray(fmt.starts_of(host(width), counts.shape[0]))
    coef = rng.integers(-5, 6, (2, g.n_groups))
    got = host(kernels.group_sums(base, width, bits, start, counts.shape[0], np.arange(g.n_groups), coef))
    assert (got == (coef.astype(np.uint64) @ sums.T)).all()


def test_group_sums_wrap_with_negative_coefficients(rng):
    sums = rng.integers(0, 2**63, (300, 4), dtype=np.uint64)
    base, width, bits = fmt.pack(sums)
    coef = np.array([[-1, 2, 0, -(2**62)], [3, -5, 7, 1]], dtype=np.int64)
    got = cpu_groups.group_sums(base, width, bits, fmt.starts_of(width, 300), 300, np.arange(4), coef)
    want = (coef.astype(object) @ sums.T.astype(object)) % 2**64
    assert (got.astype(object) == want).all()


# ---------------------------------------------------------------- the planner


@pytest.mark.parametrize("det", SHAPES)
def test_decompose_is_exact_for_random_integer_masks(det, rng):
    g = fmt.geometry(det, det[0] - 1, det[1] - 1)
    masks = rng.integers(-4, 5, (3, det[0] * det[1]))
    masks[:, rng.random(det[0] * det[1]) < 0.5] = 0
    masks[0, g.ring < 6] = 7  # a uniform disk: rings
    masks[1, (g.ring >= BAND) & (g.ring < 2 * BAND)] = -2  # a uniform band: rings or leaves
    wide = rng.integers(-(2**40), 2**40, (1, det[0] * det[1]))  # too wide a range to count: sorted
    wide[0, g.ring > 3] = 2**40 + 1
    for full in (masks, wide, masks[:1] * 0 + 1, np.zeros((2, det[0] * det[1]), np.int64)):
        parts = decompose(full, g)
        assert parts.coef.dtype == parts.weights.dtype == np.int64
        assert (rebuilt(parts, g) == full).all()
        assert (parts.coef != 0).any(axis=0).all()  # no group used with only zero coefficients
        assert np.unique(parts.pixels).size == parts.pixels.size
    assert decompose(masks[:1] * 0 + 1, g).pixels.size == 0


def test_decompose_is_fast():
    g = geometry_for((192, 192), 191, 191)
    c = center(g)
    masks = np.stack([qd.masks.disk((192, 192), c, 24), qd.masks.disk((192, 192), (c[0] + 1, c[1]), 24),
                      qd.masks.annulus((192, 192), c, 45, 90), qd.masks.disk((192, 192), (c[0] + 0.3, c[1]), 30)])
    full = masks.reshape(4, -1).astype(np.int64)
    best = min(timed(lambda: decompose(full, g)) for _ in range(5))
    assert best < 0.05  # a few ms unloaded; the bound leaves room for a busy machine


def timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


# ---------------------------------------------------------------- queries through the index


@pytest.mark.parametrize("backend", BACKENDS)
def test_virtual_images_through_the_index(rng, backend):
    counts = rng.poisson(0.4, (23, 29, 40, 37)).astype(np.uint16)  # 667 scans: a short last block
    counts[:, :, 18:23, 16:21] += rng.poisson(6.0, (23, 29, 5, 5)).astype(np.uint16)
    resident = encode(counts, module(backend))
    g = resident.groups.geometry
    c = center(g)
    det = counts.shape[2:]
    masks = [
        qd.masks.disk(det, c, 9),  # rings only
        qd.masks.annulus(det, c, 4, 15).astype(np.int64) * 3 - qd.masks.disk(det, c, 2),  # negative weights
        qd.masks.disk(det, (c[0] + 0.3, c[1]), 9),  # rings and a few residual pixels
        qd.masks.sector(det, c, 0, 15, 0, 90) | qd.masks.disk(det, c, 0.5),  # leaves of band 0
        rng.random(det) < 0.3,  # no group helps much
    ]
    for mask in masks:
        resident.series().forget_last()  # no previous answer: the plan must pick a stateless path
        weights = mask_weights(mask, det, counts.dtype)
        run = resident.prepare_mask_sums(weights)
        full = np.asarray(mask, dtype=np.int64).reshape(1, -1)
        assert run.decoded_pixels <= decompose(full, g).cost  # the cheapest of the four paths
        got = host(run())
        assert (got.astype(object) == reference(counts, full.reshape(1, *det))).all()
        assert (resident.virtual_images(mask).reshape(1, -1) == got).all()
    resident.series().forget_last()
    run = resident.prepare_mask_sums(mask_weights(masks[0], det, counts.dtype))
    assert run.decoded_pixels == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_saturated_and_32_bit_counts(rng, backend):
    top = np.iinfo(np.uint32).max
    counts = rng.integers(0, 4, (9, 31, 17, 17)).astype(np.uint32)  # 279 scans: two packed blocks
    counts[:, :, 8, 8] = top  # a saturated centre
    counts[::2, :, 7:10, 7:10] = top - rng.integers(0, 3, (5, 31, 3, 3)).astype(np.uint32)
    resident = encode(counts, module(backend))
    resident.check()
    flat = counts.reshape(279, -1).astype(np.uint64)
    sums = flat @ membership(resident.groups.geometry).T.astype(np.uint64)
    assert sums.max() > 2**32
    ids = np.arange(resident.groups.geometry.n_groups)
    assert (host(resident.groups.group_sums(ids, np.eye(ids.size, dtype=np.int64))) == sums.T).all()
    c = center(resident.groups.geometry)
    for mask in (qd.masks.disk((17, 17), c, 3), qd.masks.annulus((17, 17), c, 1, 6).astype(np.int64) * -2):
        resident.series().forget_last()
        got = resident.virtual_images(mask).reshape(1, -1)
        want = reference(counts, np.asarray(mask, dtype=np.int64)[None])
        assert (got.astype(object) == want).all()


def test_live_acquisitions_join_their_index(rng):
    counts = rng.poisson(0.5, (21, 40, 19, 23)).astype(np.uint16)  # 840 scans
    live = LiveCounts("live", counts.shape, counts.dtype, "compressed", np)
    frames = counts.reshape(-1, 19, 23)
    for lo in range(0, 840, 300):
        live.append(frames[lo : lo + 300])
    done = live.finished()
    g = done.groups.geometry
    ids = np.arange(g.n_groups)
    eye = np.eye(ids.size, dtype=np.int64)
    want = counts.reshape(840, -1).astype(np.uint64) @ membership(g).T.astype(np.uint64)
    assert (done.groups.group_sums(ids, eye) == want.T).all()
    mask = qd.masks.disk((19, 23), center(g), 6)
    assert (done.virtual_images(mask) == live.virtual_images(mask)).all()
    assert (done.virtual_images(mask).reshape(1, -1) == reference(counts, mask[None].astype(np.int64)).astype(np.uint64)).all()


# ---------------------------------------------------------------- bad index arrays


def test_malformed_index_arrays_are_named(rng, tmp_path):
    counts = rng.poisson(0.5, (10, 30, 12, 12)).astype(np.uint16)  # 300 scans: two packed blocks
    resident = encode(counts)
    index = resident.groups
    base, width, bits = (np.asarray(a) for a in (index.base, index.width, index.bits))
    g, n = index.geometry, index.n_frames
    cases = {
        "'base' has shape": (base.astype(np.int64), width, bits),
        "'width' has shape": (base, width[:1], bits),
        "'bits' has shape": (base, width, bits.astype(np.uint32)),
        "'width' has a width of 65 bits": (base, np.where(np.arange(width.size).reshape(width.shape) == 3, 65, width).astype(np.uint8), bits),
        "'bits' has .* words.*too short": (base, width, bits[:-1]),
        "'bits' has .* words.*too long": (base, width, np.r_[bits, np.uint64(0)]),
    }
    for message, arrays in cases.items():
        with pytest.raises(ValueError, match=message):
            GroupIndex(g, *arrays, n, np)
    path = tmp_path / "r.qgpu"
    save_resident(resident, path)
    meta, saved = container.read(path)
    meta.pop("arrays")
    container.write(path, meta, saved | {"group_bits": saved["group_bits"][:-1]})
    with pytest.raises(ValueError, match=r"r\.qgpu.*'bits' has .* words"):
        open_resident("t", path)
    container.write(path, meta | {"group_center": [99, 0]}, saved)
    with pytest.raises(ValueError, match=r"r\.qgpu.*centre .* outside the 12 x 12 detector"):
        open_resident("t", path)
    wrong = dict(saved)
    wrong["group_base"] = saved["group_base"].copy()
    wrong["group_base"][0, 0] += np.uint64(1)
    container.write(path, meta, wrong)
    with pytest.raises(ValueError, match="group index's ring sums do not match the frame totals"):
        open_resident("t", path).check()
