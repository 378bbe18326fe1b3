"""Large replies from shards on this host handed over through /dev/shm, on a real cluster of worker processes."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

import dask.config
import numpy as np
import pytest

import qgpu_dask as qd
from conftest import cupy_available
from qgpu_dask.service.handoff import HANDOFF_BYTES, POOL_SLOTS, Handoff, Segment, fits, mapped_slots, take, token
from qgpu_dask.service.sweeping import POOL_PREFIX, REPLY_GRACE, REPLY_PREFIX, SHM, pid_in, sweep
from qgpu_dask.queries import results
from qgpu_dask.service.errors import HandoffLost
from qgpu_dask.queries.results import RESULT_PREFIX, SEGMENT_BYTES, Target, memory_of, result_array, spoil, target_of
from qgpu_dask.queries.virtual_images import mask_digest
from qgpu_dask.service.shard import Shard


def segments() -> set[str]:
    """Reply segments in /dev/shm now. Tests check that calls leave none new (``<=``: a sweep may remove old
    ones that an interrupted run left meanwhile)."""
    return {n for n in os.listdir(SHM) if n.startswith(REPLY_PREFIX)}


def big_reply(resident, n: int) -> dict:
    """Arrays at (``n`` int64 is HANDOFF_BYTES), below and above HANDOFF_BYTES, nested, beside things that are no arrays."""
    return {"big": np.arange(n, dtype=np.int64).reshape(-1, 8), "pair": (np.arange(n - 1, dtype=np.int64), np.full(3 * n, 7, np.uint32)),
            "label": resident.name, "objects": np.array([None] * n, dtype=object)}


def raw(svc, name: str, handoff: str | None):
    """A Shard.ask of ``big_reply`` as it comes from the shard, before the client takes its segments."""
    owner = svc[name].owner
    return svc.router.call(owner, Shard.ask, "function", [name], big_reply, (HANDOFF_BYTES // 8,), {}, handoff=handoff).result()


def test_series_virtual_images_handed_over_equal_inline(svc, names, rng):
    det = (8, 8)
    data = [rng.integers(0, 3000, (128, 128) + det, dtype=np.uint16) for _ in range(6)]
    series = qd.Series(svc, [svc.put(d, name=names()) for d in data])
    stack = np.stack([qd.masks.disk(det, (4, 4), r) for r in range(1, 9)])
    before = segments()
    handed = series.virtual_images(stack)  # one reply per shard of >= 2 acquisitions x 8 x 128 x 128
    assert handed.nbytes // len(svc.state()["shards"]) >= HANDOFF_BYTES
    inline = np.stack([np.stack([svc[n].virtual_image(m) for m in stack]) for n in series.names])  # 64 KiB replies
    reference = np.stack([np.einsum("xyij,mij->mxy", d.astype(np.uint64), stack.astype(np.uint64)) for d in data])
    assert handed.dtype == inline.dtype and (handed == inline).all() and (handed == reference).all()
    assert handed.flags.writeable
    handed[0, 0, 0, 0] += 1  # the caller's own memory
    assert segments() <= before


def test_each_shard_writes_its_images_straight_into_the_clients_result(svc, names, rng):
    det = (8, 8)
    data = [rng.integers(0, 3000, (128, 128) + det, dtype=np.uint16) for _ in range(7)]
    series = qd.Series(svc, [svc.put(d, name=names()) for d in data])
    assert len({a.owner for a in series}) > 1
    stack = np.stack([qd.masks.disk(det, (4, 4), r) for r in (1.5, 3, 5)])
    reference = np.stack([np.einsum("xyij,mij->mxy", d.astype(np.uint64), stack.astype(np.uint64)) for d in data]).astype(np.uint32)
    got = series.virtual_images(stack)
    assert got.dtype == np.uint32 and (got == reference).all() and got.flags.writeable
    assert got.nbytes >= SEGMENT_BYTES and memory_of(got).name.startswith(RESULT_PREFIX) and target_of(got).shape == got.shape
    small = series[:2].virtual_images(stack[0])  # under SEGMENT_BYTES: in plain memory, the images sent inline
    assert memory_of(small).name is None and target_of(small) is None and (small == reference[:2, 0]).all()

    # what a shard sends back: the rows it wrote, not the images
    out = result_array(reference.shape, np.uint32)
    out[:] = 7
    mine = [i for i, a in enumerate(series) if a.owner == series[2].owner]
    ask = lambda into, handoff=token(): svc.router.call(series[2].owner, Shard.ask, "virtual_images", [series.names[i] for i in mine],  # noqa: E731
                                                      mask_digest(stack), stack, handoff=handoff, into=into).result()
    reply = ask((target_of(out), mine))
    assert [images for _, images in reply["parts"]] == [None] * len(reply["parts"])
    assert (out[mine] == reference[mine]).all() and (np.delete(out, mine, axis=0) == 7).all()  # its rows, and only those
    elsewhere = ask((target_of(out), mine), handoff=None)  # a client the shard cannot reach: the images travel
    assert all(images is not None for _, images in elsewhere["parts"])
    gone = Target(f"{RESULT_PREFIX}{os.getpid()}-{'0' * 32}", np.dtype(np.uint32), out.shape)
    assert all(images is not None for _, images in ask((gone, mine))["parts"])  # a segment gone: the images travel
    wrong = Target(target_of(out).name, np.dtype(np.uint64), out.shape)
    assert all(images is not None for _, images in ask((wrong, mine))["parts"])  # another dtype: not written
    with pytest.raises(ValueError, match="not one a client makes"):
        ask((Target("../etc/passwd", np.dtype(np.uint32), out.shape), mine))
    assert (series.virtual_images(stack) == reference).all()  # the service still answers


def test_result_memory_is_reused_once_collected_unless_spoiled():
    first = result_array((3, 1 << 17), np.uint64)
    name = memory_of(first).name
    view = first[1]
    del first
    gc.collect()
    other = result_array((3, 1 << 17), np.uint64)
    other_name = memory_of(other).name
    assert other_name != name  # a view of the first still lives
    del view, other
    gc.collect()
    again = result_array((3, 1 << 17), np.uint64)
    assert memory_of(again).name in {name, other_name}  # the memory of a collected result
    names_kept = {m.name for ms in results.kept.values() for m in ms if m.name is not None}
    spoil(again)
    spoiled = memory_of(again).name
    del again
    gc.collect()
    assert not (SHM / spoiled).exists() and spoiled not in {m.name for ms in results.kept.values() for m in ms}
    assert all((SHM / n).exists() for n in names_kept)


def test_nested_reply_and_what_travelled(svc, names, rng):
    acq = svc.put(rng.integers(0, 9, (4, 4, 8, 8), dtype=np.uint16), name=names())
    n = HANDOFF_BYTES // 8
    before = segments()
    reply = raw(svc, acq.name, token())[0]
    assert isinstance(reply["big"], Segment) and isinstance(reply["pair"][1], Segment)  # at and above HANDOFF_BYTES
    assert isinstance(reply["pair"][0], np.ndarray) and isinstance(reply["objects"], np.ndarray)  # 8 bytes short, or objects
    assert {reply["big"].name, reply["pair"][1].name} <= pool_slots()  # written into the shard's kept slots
    taken = take(reply)
    assert segments() <= before
    expected = big_reply(acq, n)
    assert (taken["big"] == expected["big"]).all() and taken["big"].shape == expected["big"].shape
    assert (taken["pair"][1] == expected["pair"][1]).all() and taken["pair"][1].dtype == np.uint32
    assert (taken["pair"][0] == expected["pair"][0]).all() and (taken["objects"] == expected["objects"]).all()
    assert type(taken["pair"]) is tuple and taken["label"] == acq.name
    public = svc.submit(big_reply, acq, n).result()
    assert (public["big"] == expected["big"]).all() and (public["pair"][1] == expected["pair"][1]).all()
    assert segments() <= before


def test_client_on_another_host_gets_replies_inline(svc, names, rng):
    acq = svc.put(rng.integers(0, 9, (4, 4, 8, 8), dtype=np.uint16), name=names())
    before = segments()
    elsewhere = raw(svc, acq.name, "qgpu-client-" + "0" * 32)[0]  # a token this host has no file of
    assert isinstance(elsewhere["big"], np.ndarray) and (elsewhere["big"] == big_reply(acq, HANDOFF_BYTES // 8)["big"]).all()
    assert isinstance(raw(svc, acq.name, None)[0]["big"], np.ndarray)
    with dask.config.set({"qgpu.handoff": False}):
        assert token() is None
        assert (svc.submit(big_reply, acq, HANDOFF_BYTES // 8).result()["big"] == elsewhere["big"]).all()
    assert segments() <= before
    with pytest.raises(ValueError, match="handoff token '../etc/passwd'"):
        raw(svc, acq.name, "../etc/passwd")


def test_vanished_segment_is_a_clear_error_and_service_stays_usable(svc, names, rng):
    acq = svc.put(rng.integers(0, 9, (4, 4, 8, 8), dtype=np.uint16), name=names())
    before = segments()
    reply = raw(svc, acq.name, token())
    os.unlink(SHM / reply[0]["big"].name)
    with pytest.raises(HandoffLost, match=reply[0]["big"].name):
        take(reply)
    assert segments() <= before  # the segment still there was taken all the same
    for _ in range(2 * POOL_SLOTS):  # the shard drops the slot whose file went, and answers from the others
        assert (svc.submit(big_reply, acq, HANDOFF_BYTES // 8).result()["big"] == big_reply(acq, HANDOFF_BYTES // 8)["big"]).all()


def test_segments_no_client_took_are_swept(svc, names, rng):
    acq = svc.put(rng.integers(0, 9, (4, 4, 8, 8), dtype=np.uint16), name=names())
    held = [svc.submit(counted, acq, HANDOFF_BYTES // 4, k).result() for k in range(POOL_SLOTS)]  # every slot held: one-shot segments
    before = segments()
    reply = raw(svc, acq.name, token())[0]  # never taken: as if the client had died mid-call
    left = {reply["big"].name, reply["pair"][1].name}
    assert segments() - before == left
    assert not set(sweep()) & left  # fresh: its client may still come for it
    old = time.time() - REPLY_GRACE - 1
    for name in left:
        os.utime(SHM / name, (old, old))
    assert set(sweep()) >= left
    assert segments() <= before
    assert all((a == counted(None, HANDOFF_BYTES // 4, k)).all() for k, a in enumerate(held))
    running = svc.client.run(lambda dask_worker: dask_worker.periodic_callbacks["qgpu-handoff-sweep"].is_running())
    assert all(running.values()) and len(running) == len(svc.state()["shards"])


def test_token_file_removed_at_exit_or_swept_once_its_client_was_killed():
    made = "from qgpu_dask.service.handoff import token; from qgpu_dask.service.sweeping import SHM; t = token(); print(t, (SHM / t).is_file(), flush=True)"
    out = subprocess.run([sys.executable, "-c", made], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "True" and not (SHM / out[0]).exists()
    killed = subprocess.Popen([sys.executable, "-c", made + "; import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    left = SHM / killed.stdout.readline().split()[0]
    killed.kill()  # no exit handlers run
    killed.wait()
    mine = SHM / token()
    old = time.time() - REPLY_GRACE - 1
    for path in (left, mine):
        os.utime(path, (old, old))
    gone = sweep()
    assert left.name in gone and not left.exists()
    assert mine.name not in gone and mine.exists()  # locked by this live process


def test_result_segments_go_at_exit_or_with_a_sweep_once_their_client_was_killed():
    made = ("from qgpu_dask.queries.results import result_array, memory_of; a = result_array((4, 1 << 18), 'u4'); "
            "print(memory_of(a).name, flush=True)")
    left = subprocess.run([sys.executable, "-c", made], capture_output=True, text=True, check=True).stdout.split()[0]
    assert left.startswith(RESULT_PREFIX) and not (SHM / left).exists()
    killed = subprocess.Popen([sys.executable, "-c", made + "; import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    left = SHM / killed.stdout.readline().split()[0]
    killed.kill()
    killed.wait()
    live = result_array((4, 1 << 18), np.uint32)
    sweep()  # another process's sweep may take it first: every client's start makes one (other tests' too)
    assert not left.exists()
    assert (SHM / memory_of(live).name).exists()  # this live client's stays


def test_room_rule():
    free = os.statvfs(SHM).f_bavail * os.statvfs(SHM).f_frsize
    assert fits(HANDOFF_BYTES) and not fits(free)  # a reply that would fill the free /dev/shm travels inline


def pool_slots() -> set[str]:
    return {n for n in os.listdir(SHM) if n.startswith(POOL_PREFIX)}


def test_pool_slots_are_reused_only_once_taken_and_let_go(svc, names, rng):
    """A shard writes large replies into slots it keeps; a slot whose array a client still holds is not
    written again (other replies go to other slots, then to one-shot segments), and is reused once let go."""
    acq = svc.put(rng.integers(0, 9, (4, 4, 8, 8), dtype=np.uint16), name=names())
    n = HANDOFF_BYTES // 4
    held = [svc.submit(counted, acq, n, k).result() for k in range(POOL_SLOTS + 2)]  # more held than slots
    for k, array in enumerate(held):
        assert (array == counted(None, n, k)).all()  # none overwritten by a later reply
    pid = owner_pid(svc, acq)
    mine = {s for s in pool_slots() if pid_in(s, POOL_PREFIX) == pid}
    assert len(mine) == POOL_SLOTS  # no more slots than that: the last two replies went as one-shot segments
    del held, array
    gc.collect()
    again = [svc.submit(counted, acq, n, 100 + k).result() for k in range(3)]
    assert all((a == counted(None, n, 100 + k)).all() for k, a in enumerate(again))
    assert {s for s in pool_slots() if pid_in(s, POOL_PREFIX) == pid} == mine  # the same slots, reused


def test_a_slot_taken_too_late_is_lost_not_another_reply(svc, names, rng):
    acq = svc.put(rng.integers(0, 9, (4, 4, 8, 8), dtype=np.uint16), name=names())
    reply = raw(svc, acq.name, token())[0]
    segment = reply["big"]
    assert isinstance(segment, Segment) and segment.serial
    stale = Segment(segment.name, segment.dtype, segment.shape, segment.serial + 1)
    with pytest.raises(HandoffLost, match="hand-over"):
        take({"x": stale})
    assert (take(reply)["big"] == big_reply(acq, HANDOFF_BYTES // 8)["big"]).all()


def test_a_client_maps_a_slot_once_and_reads_each_reply_in_it(svc, names, rng):
    acq = svc.put(rng.integers(0, 9, (4, 4, 8, 8), dtype=np.uint16), name=names())
    owner, n = acq.owner, HANDOFF_BYTES // 4
    seen: dict[str, object] = {}
    for k in range(3 * POOL_SLOTS):
        reply = svc.router.call(owner, Shard.ask, "function", [acq.name], counted, (n, k), {}, handoff=token()).result()[0]
        segment = reply
        assert isinstance(segment, Segment) and segment.serial
        got = take(reply)
        assert (got == np.arange(n, dtype=np.uint32) + np.uint32(k)).all()  # this reply's bytes, not an earlier one's
        memory = mapped_slots[segment.name][1]
        assert seen.setdefault(segment.name, memory) is memory  # the slot's mapping of the first reply in it
        del got
        gc.collect()
    assert len(seen) < 3 * POOL_SLOTS  # slots were used again


def counted(resident, n: int, k: int) -> np.ndarray:
    return np.arange(n, dtype=np.uint32) + np.uint32(k)


def owner_pid(svc, acq) -> int:
    return svc.client.run(os.getpid, workers=[acq.owner])[acq.owner]


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
def test_device_arrays_of_a_reply_go_straight_into_slots():
    import cupy

    handoff = Handoff()
    try:
        n = HANDOFF_BYTES // 4
        big = cupy.arange(3 * n, dtype=cupy.uint32).reshape(3, n)
        reply = {"big": big, "strided": big[:, ::2], "small": cupy.arange(5, dtype=cupy.int64), "host": np.arange(n, dtype=np.uint32)}
        given = handoff.give(reply, token())
        assert all(type(given[k]) is Segment for k in ("big", "strided", "host")) and given["big"].serial
        assert type(given["small"]) is np.ndarray and given["small"].tolist() == [0, 1, 2, 3, 4]  # small: on the host, inline
        taken = take(given)
        assert (taken["big"] == big.get()).all() and (taken["strided"] == big[:, ::2].get()).all() and (taken["host"] == reply["host"]).all()
        inline = handoff.give(reply, None)  # no client to hand to: every device array comes to the host
        assert all(type(v) is np.ndarray for v in inline.values()) and (inline["big"] == big.get()).all()
    finally:
        handoff.pool.close()
