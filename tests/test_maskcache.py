"""Masks sent once: the shard's mask cache, plans per acquisition, and the resend when a shard lacks a mask."""

from __future__ import annotations

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.queries.virtual_images import MaskCache, MaskNotCached, mask_digest, sent


def test_cache_stores_evicts_and_checks_digests():
    cache = MaskCache(stack_bytes=3 * 256)
    stacks = [np.full((1, 16, 16), i, np.uint8) for i in range(4)]
    digests = [mask_digest(s) for s in stacks]
    assert len(set(digests)) == 4
    assert mask_digest(stacks[0].astype(np.uint16)) != digests[0]  # dtype is part of the digest
    for s, d in zip(stacks, digests):
        assert cache.stack(d, s) is not None
    with pytest.raises(MaskNotCached):
        cache.stack(digests[0], None)  # the oldest was evicted (3 stacks fit)
    assert (cache.stack(digests[3], None) == stacks[3]).all()
    with pytest.raises(ValueError, match="does not match its digest"):
        cache.stack(digests[1], stacks[2])

    made = []
    plan = cache.plan(["a"], digests[3], lambda: made.append(1) or (lambda: "image"))
    assert plan() == "image" and cache.plan(["a"], digests[3], lambda: made.append(1)) is plan and made == [1]
    series = cache.plan(["b", "a"], digests[3], lambda: made.append(3) or (lambda: "images"))
    cache.forget("a")  # every plan holding "a" goes, its series' too
    cache.plan(["a"], digests[3], lambda: made.append(2) or (lambda: "image"))
    assert cache.plan(["b", "a"], digests[3], lambda: made.append(4)) is not series
    assert made == [1, 3, 2, 4]


def test_repeated_mask_is_sent_once_and_stays_exact(svc, names, rng):
    data = rng.integers(0, 500, (4, 5, 12, 12), dtype=np.uint16)
    acq = svc.put(data, name=names())
    mask = qd.masks.disk((12, 12), (6, 6), 4)
    ref = (data.astype(np.uint32) * mask).sum(axis=(2, 3))
    assert (acq.virtual_image(mask) == ref).all()
    assert (acq.owner, mask_digest(mask[None])) in sent
    for _ in range(3):
        assert (acq.virtual_image(mask) == ref).all()


def test_shard_without_the_mask_gets_it_again(svc, names, rng):
    data = rng.integers(0, 500, (4, 5, 12, 12), dtype=np.uint16)
    acq = svc.put(data, name=names())
    mask = qd.masks.annulus((12, 12), (6, 6), 2, 5)
    sent.add((acq.owner, mask_digest(mask[None])))  # the client believes the shard has it; it has not
    assert (acq.virtual_image(mask) == (data.astype(np.uint32) * mask).sum(axis=(2, 3))).all()


def test_plans_do_not_outlive_a_released_name(svc, rng):
    mask = qd.masks.disk((12, 12), (6, 6), 3)
    first = rng.integers(0, 50, (3, 3, 12, 12), dtype=np.uint8)
    second = rng.integers(0, 60000, (2, 4, 12, 12), dtype=np.uint16)
    acq = svc.put(first, name="reused-name")
    assert (acq.virtual_image(mask) == (first.astype(np.uint32) * mask).sum(axis=(2, 3))).all()
    acq.release()
    acq = svc.put(second, name="reused-name", worker=acq.owner)
    try:
        image = acq.virtual_image(mask)
        assert image.shape == (2, 4) and (image == (second.astype(np.uint32) * mask).sum(axis=(2, 3))).all()
    finally:
        acq.release()
