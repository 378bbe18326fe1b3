"""Interrupting a load, a series load or an ingest: Ctrl-C (SIGINT to a client in a process of its own), a
client that dies, and a release of a name still loading. Another client sees the name and the owner's budget
freed within FREED_WITHIN seconds, and the same name loads again; an interrupted ingest keeps its frames."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest


from test_live import acquisition_file, counts, free_port, simulator  # noqa: F401 (fixtures)

FREED_WITHIN = 2.0  # seconds from the interrupt until the name and the budget are free


@pytest.fixture(scope="module")
def slow_files(tmp_path_factory, svc):
    """Two files whose compressed loads take seconds each on two CPU cores (128 MiB of counts each: at 32 MiB a
    fast core finished the load before the Ctrl-C reached it). A GPU loads them in milliseconds, before a Ctrl-C
    or a poll can meet the load: there the tests skip (the stop is the shard's, the same code on either backend)."""
    if svc.backend == "gpu":
        pytest.skip("a GPU loads a test-size file before a Ctrl-C can reach the load")
    folder = tmp_path_factory.mktemp("slow")
    rng = np.random.default_rng(56)
    paths = []
    for i in range(2):
        paths.append(folder / f"slow{i}.npy")
        np.save(paths[-1], rng.poisson(0.3, (128, 128, 64, 64)).astype(np.uint16))
    return paths


def client(scheduler_file, body: str) -> subprocess.Popen:
    """A client process running ``body`` (``svc`` connected), which prints "interrupted" and the error's type
    name when a KeyboardInterrupt or another error ends it, then stays connected until its stdin closes."""
    script = textwrap.dedent("""
        import signal
        import sys
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a Ctrl-C raises, though a shell that started us ignores it
        import qgpu_dask as qd
        svc = qd.Service.connect(scheduler_file=sys.argv[1])
        print("connected", flush=True)
        try:
        {body}
        except BaseException as err:
            print("interrupted", type(err).__name__, flush=True)
        sys.stdin.read()
        svc.close()
    """).format(body=textwrap.indent(textwrap.dedent(body), "    "))
    process = subprocess.Popen([sys.executable, "-c", script, str(scheduler_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    assert process.stdout.readline().strip() == "connected"
    return process


def shard_bytes(svc, worker: str) -> tuple[int, int]:
    """(resident bytes, reserved bytes) of the shard on ``worker``."""
    info = next(s for s in svc.info()["shards"] if s["worker"] == worker)
    return info["resident_bytes"], info["reserved_bytes"]


def wait_until(condition, seconds: float, what: str) -> float:
    """Seconds until ``condition()`` held (polled); fails the test after ``seconds``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < seconds, f"{what} not within {seconds} s"
        time.sleep(0.05)
    return time.monotonic() - start


def loading(svc, names: list[str]) -> bool:
    entries = svc.state()["acquisitions"]
    return all(entries.get(n, {}).get("state") == "loading" for n in names)


def freed(svc, names: list[str], worker: str, before: tuple[int, int]) -> bool:
    return not any(n in svc for n in names) and shard_bytes(svc, worker) == before


@pytest.mark.parametrize("series", [False, True], ids=["load", "series"])
def test_ctrl_c_cancels_a_load_and_frees_its_name_and_budget(svc, names, scheduler_file, slow_files, series):
    worker = sorted(svc.state()["shards"])[0]
    wanted = [names("slow") for _ in slow_files] if series else [names("slow")]
    paths = [str(p) for p in slow_files[: len(wanted)]]
    before = shard_bytes(svc, worker)
    process = client(scheduler_file, f"svc.load({paths if series else paths[0]!r}, name={wanted if series else wanted[0]!r}, "
                                      f"worker={worker!r}, layout='compressed', progress=False)")
    try:
        wait_until(lambda: loading(svc, wanted), 60, "the loads under way")
        time.sleep(0.3)  # reading and coding
        process.send_signal(signal.SIGINT)
        took = wait_until(lambda: freed(svc, wanted, worker, before), FREED_WITHIN, "names and budget free")
        assert process.stdout.readline().split() == ["interrupted", "KeyboardInterrupt"]  # it is still connected
        print(f"freed {took:.2f} s after Ctrl-C")
        assert [e for e in svc.state()["events"] if e.get("name") in wanted and e["event"] == "load-failed"]
    finally:
        process.communicate("", timeout=60)
    acq = svc.load(paths[0], name=wanted[0], worker=worker, layout="dense", progress=False)  # the name loads again
    assert acq.info()["state"] == "ready"
    acq.release()
    assert shard_bytes(svc, worker) == before


def test_a_client_that_dies_mid_load_frees_its_name_and_budget(svc, names, scheduler_file, slow_files):
    worker = sorted(svc.state()["shards"])[0]
    wanted = names("orphan")
    before = shard_bytes(svc, worker)
    process = client(scheduler_file, f"svc.load({str(slow_files[0])!r}, name={wanted!r}, worker={worker!r}, layout='compressed', progress=False)")
    wait_until(lambda: loading(svc, [wanted]), 60, "the load under way")
    process.kill()
    process.communicate(timeout=60)
    wait_until(lambda: freed(svc, [wanted], worker, before), FREED_WITHIN, "name and budget free after the client died")


def test_release_of_a_loading_name_stops_the_load(svc, names, scheduler_file, slow_files):
    worker = sorted(svc.state()["shards"])[0]
    wanted = names("released")
    before = shard_bytes(svc, worker)
    process = client(scheduler_file, f"svc.load({str(slow_files[0])!r}, name={wanted!r}, worker={worker!r}, layout='compressed', progress=False)")
    try:
        wait_until(lambda: loading(svc, [wanted]), 60, "the load under way")
        start = time.monotonic()
        said = svc[wanted].release()
        assert time.monotonic() - start < FREED_WITHIN
        assert f"released {wanted!r} (loading): its load on {worker} stopped" == said
        assert freed(svc, [wanted], worker, before)
        assert process.stdout.readline().split() == ["interrupted", "Cancelled"]  # the loading client is told
    finally:
        process.communicate("", timeout=60)
    with pytest.raises(KeyError, match=re.escape(f"no acquisition named {wanted!r}")):
        svc.release(wanted)


def test_ctrl_c_stops_an_ingest_and_keeps_what_arrived(svc, names, scheduler_file, counts, acquisition_file):  # noqa: F811
    flat = counts.reshape(-1, *counts.shape[2:])
    acq = svc.create(names("ingest"), counts.shape[:2], counts.shape[2:], "uint16", layout="dense")
    port = free_port()
    source = simulator(acquisition_file, port, "--dataset", "data", "--rate", "500")  # 3 s for the whole scan
    process = client(scheduler_file, f"svc.ingest(qd.TcpSource('127.0.0.1', {port}, frames_per_read=16), svc[{acq.name!r}], progress=False)")
    try:
        wait_until(lambda: acq.received >= 64, 30, "frames arriving")
        process.send_signal(signal.SIGINT)
        assert process.stdout.readline().split() == ["interrupted", "KeyboardInterrupt"]  # once the owner stopped reading
        kept = acq.received
        time.sleep(0.3)
        assert acq.received == kept < len(flat)  # it stopped reading, and kept what arrived
        assert (acq.frame(*divmod(kept - 1, counts.shape[1])) == flat[kept - 1]).all()
        assert acq.append(flat[kept : kept + 5]) == kept + 5  # live, and no longer ingesting
    finally:
        process.communicate("", timeout=60)
        source.kill()
        source.wait(30)
