"""Calls from a client on the shards' host through their local lanes (Unix sockets), on a real cluster of worker
processes; and a lane on its own, in this process."""

from __future__ import annotations

import asyncio
import os
import socket

import dask.config
import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.service.errors import LaneGone
from qgpu_dask.service.lane import Lane, LaneServer
from qgpu_dask.service.shard import Shard
from test_other_users import PYTHON, as_nobody


def lane_of(svc, acq) -> Lane | None:
    return svc.client.sync(svc.router.lane, acq.owner)


def test_queries_through_the_lane_equal_numpy(svc, names, rng):
    data = rng.integers(0, 3000, (16, 12, 10, 9), dtype=np.uint16)
    acq = svc.put(data, name=names())
    lane = lane_of(svc, acq)
    assert lane is not None and lane.name.startswith("qgpu-lane-")
    mask = np.zeros((10, 9), bool)
    mask[2:7, 3:8] = True
    assert (acq.frame(5, 7) == data[5, 7]).all() and acq.frame(5, 7).dtype == data.dtype
    image = acq.virtual_image(mask)
    assert (image == data[:, :, mask].sum(axis=-1, dtype=np.uint64)).all()
    assert lane.idle  # the calls went through it, and its connection is kept for the next
    assert lane.idle_here  # the frames from this thread, through a blocking connection (no hop to the event loop)


def test_shard_errors_come_back_through_the_lane(svc, names, rng):
    acq = svc.put(rng.integers(0, 9, (4, 4, 6, 6), dtype=np.uint16), name=names())
    assert lane_of(svc, acq) is not None
    with pytest.raises(ZeroDivisionError):
        svc.submit(lambda a: 1 // 0, acq).result()
    with pytest.raises(KeyError, match="is not resident"):
        svc.router.call(acq.owner, Shard.ask, "frame", ["no-such-acquisition"], 0, 0).result()
    assert (acq.frame(1, 2) == acq.frame(1, 2)).all()  # the shard and the lane stay usable


class Doubled(qd.Query):
    """A user's query that reads little: twice a frame, asked from the calling thread once the shard knows it."""

    name = "doubled_frame"
    inline = True

    @staticmethod
    def reads(residents, row, col) -> int:
        return 0

    @staticmethod
    def run(ctx, residents, row, col) -> list:
        if row < 0:
            raise ValueError(f"row {row} is negative")
        return [2 * r.frame(row, col).astype(np.int64) for r in residents]


def test_a_users_inline_query_is_sent_first_then_asked_from_this_thread(svc, names, rng):
    data = rng.integers(0, 9, (4, 4, 6, 6), dtype=np.uint16)
    acq = svc.put(data, name=names())
    lane = lane_of(svc, acq)
    for row in (1, 2):  # the first call finds the shard without the type, which is sent; the second goes straight
        assert (acq.ask(Doubled, row, 3) == 2 * data[row, 3].astype(np.int64)).all()
    assert lane.idle_here
    pending = acq.ask(Doubled, -1, 0, wait=False)
    with pytest.raises(ValueError, match="row -1 is negative"):
        pending.result()  # the shard's error, where the result is asked for
    assert (acq.frame(3, 3) == data[3, 3]).all()


def test_a_broken_lane_is_asked_for_again(svc, names, rng):
    data = rng.integers(0, 9, (4, 4, 6, 6), dtype=np.uint16)
    acq = svc.put(data, name=names())
    lane = lane_of(svc, acq)

    async def broken() -> None:  # on the client's loop, where its connections live
        lane.close()
        lane.name = "qgpu-lane-0-" + "0" * 32  # a lane no shard serves: the call fails, is routed again, and a new lane found

    svc.client.sync(broken)
    assert (acq.frame(3, 1) == data[3, 1]).all()
    again = lane_of(svc, acq)
    assert again is not lane and again.name.startswith("qgpu-lane-") and again.name != lane.name


def test_a_lane_refuses_other_users_and_wrong_names():
    server = LaneServer.started({"ping": lambda: None, "twice": lambda x: 2 * x})
    assert server is not None

    async def calls():
        lane = await Lane.opened(server.name)
        assert await lane.call("twice", 21) == 42 and await lane.call("ping") is None
        with pytest.raises(ValueError, match="serves \\['ping', 'twice'\\], not 'load'"):
            await lane.call("load", "x")
        assert (await lane.call("twice", np.arange(3))).tolist() == [0, 2, 4]  # still in step after an error
        assert await Lane.opened("qgpu-lane-1-" + "f" * 32) is None  # no such lane
        assert await Lane.opened("something-else") is None
        lane.close()

    asyncio.run(calls())
    if os.getuid() == 0 and PYTHON:  # another user's process on this host is refused (its connection closed unanswered)
        probe = ("import socket; s = socket.socket(socket.AF_UNIX); s.connect('\\0' + " + repr(server.name) + "); "
                 "print(len(s.recv(64)))")
        assert as_nobody(probe) == "0"


def test_no_lane_when_turned_off(svc, names, rng):
    acq = svc.put(rng.integers(0, 9, (4, 4, 6, 6), dtype=np.uint16), name=names())
    name = svc.router.call(acq.owner, Shard.lane).result()
    assert name.startswith("qgpu-lane-")
    with dask.config.set({"qgpu.lane": False}):
        assert svc.client.sync(Lane.opened, name) is None


def test_a_lane_whose_process_is_gone_is_told_from_a_broken_connection():
    server = LaneServer.started({"ping": lambda: None})

    async def calls():
        lane = await Lane.opened(server.name)
        assert await lane.call("ping") is None and lane.idle
        server.listener.shutdown(socket.SHUT_RDWR)  # nothing listens on the socket any more, as when the shard's process is gone
        server.listener.close()
        for _, writer in lane.idle:
            writer.transport.abort()  # and its connections break
        with pytest.raises(LaneGone, match="refuses connections"):
            await lane.call("ping")  # a broken connection, then a refused one: gone
        with pytest.raises(LaneGone):
            lane.call_here("ping")

    asyncio.run(calls())
