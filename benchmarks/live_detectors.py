"""Ingest from real detectors' streams against LiberTEM-live's own receivers on the same stream (issue 26's measure).

A DECTRIS detector: LiberTEM-live's DECTRIS simulator (``libertem-live-dectris-sim``) replays a recorded
stream-v1 series of ``--scan`` x ``--scan`` frames of ``--dectris-det`` x ``--dectris-det`` uint16 counts
(bitshuffle-LZ4, Poisson ``--dose``), once per arm through its REST API. Measured as for the Merlin below:
a bare pyzmq reader of every part (the simulator's send rate), ``libertem_dectris.DectrisConnection``
decoding every frame into one NumPy array, and ``svc.ingest(qd.DectrisSource(...))`` (compressed, alone and
with a viewer; dense).

A Merlin: LiberTEM-live's simulator (``libertem-live-mib-sim --cached mem``, a process of its own) replays a
.mib of ``--scan`` x ``--scan`` frames of ``--det`` x ``--det`` U16 counts (Poisson, ``--dose`` per pixel)
on its data port, as fast as it goes, an acquisition a connection. Measured in the same run, each the
median of ``--runs`` after one unmeasured pass (the simulator fills its cache, receivers compile): a bare
reader of the messages (the simulator's own send rate), ``libertem_qd_mpx.QdConnection`` decoding every
frame into one NumPy array (LiberTEM-live's receiver), and ``svc.ingest(qd.MerlinSource(...))`` into a
compressed live acquisition on a one-worker cluster, alone and with a viewer asking a moving-disk virtual
image as fast as it can, and into a dense one (the receiver and the appends without the coding).

An ASI Timepix3 server: LiberTEM-live's simulator (``libertem-live-asi-tpx-sim --mock-nav-shape``) sends its
mock scan of ``--tpx-scan`` x ``--tpx-scan`` sparse frames (512 x 512 uint32, one non-zero pixel each) again
and again on a connection. Measured: a bare reader of one scan's bytes, ``libertem_asi_tpx3.ASITpx3Connection``
handing on the scan's CSR arrays (LiberTEM-live keeps them sparse: it makes no dense frame), and
``svc.ingest(qd.TimepixSource(...))`` into a sparse live acquisition (the non-zeros held as they come; alone
and with a viewer). Not dense: a frame is 1 MiB, a 256 x 256 scan 64 GiB, to hold a count or two.

    python benchmarks/live_detectors.py            # on the GPU machine
    python benchmarks/live_detectors.py --small    # seconds, on the CPU too: what CI runs
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

import qgpu_dask as qd
from qgpu_dask.formats import merlin
from qgpu_dask.samples import write_dectris_series, write_merlin

import record
from live_gpu import median_run, watched


def simulator(hdr: Path) -> tuple[int, subprocess.Popen]:
    """LiberTEM-live's Merlin simulator replaying ``hdr`` from memory, once its data port listens: (port, process)."""
    ports = []
    for _ in range(3):
        with socket.create_server(("127.0.0.1", 0)) as probe:
            ports.append(probe.getsockname()[1])
    program = Path(sys.executable).with_name("libertem-live-mib-sim")
    process = subprocess.Popen([str(program), str(hdr), "--host", "127.0.0.1", "--cached", "mem", "--data-port", str(ports[0]),
                                "--control-port", str(ports[1]), "--trigger-port", str(ports[2])],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        if f"{ports[0]})" in line and "listening" in line:
            return ports[0], process
    raise RuntimeError(f"libertem-live-mib-sim {hdr} did not start")


def bare(port: int, n_frames: int) -> float:
    """Frames per second of one acquisition read off the port and dropped (the simulator's send rate)."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        t0 = time.perf_counter()
        stream = conn.makefile("rb")
        stream.read(merlin.mpx_length(stream.read(merlin.MPX_BYTES), "sim"))
        prefix = stream.read(merlin.MPX_BYTES)
        size = merlin.MPX_BYTES + merlin.mpx_length(prefix, "sim")
        stream.read(size - merlin.MPX_BYTES)
        left = (n_frames - 1) * size
        sink = bytearray(1 << 22)
        while left:
            got = stream.readinto(memoryview(sink)[: min(left, len(sink))])
            left -= got
        return n_frames / (time.perf_counter() - t0)


def libertem_live(port: int, n_frames: int, det: int) -> float:
    """Frames per second of one acquisition received and decoded into NumPy by LiberTEM-live's receiver."""
    import libertem_qd_mpx

    out = np.empty((n_frames, det, det), np.uint16)
    with tempfile.TemporaryDirectory() as shm:
        conn = libertem_qd_mpx.QdConnection(data_host="127.0.0.1", data_port=port, frame_stack_size=16,
                                            shm_handle_path=str(Path(shm) / "qd-shm"), bytes_per_frame=det * det * 2)
        seconds = received(conn, libertem_qd_mpx.CamClient, lambda cam: decoded_stacks(conn, cam, out, 64, "LiberTEM-live's receiver"),
                           "LiberTEM-live's receiver")
    return n_frames / seconds


def received(conn, client, consume, receiver: str, start=lambda: None) -> float:
    """Seconds for one acquisition through a LiberTEM-live connection: started passive, its shared-memory client
    made, ``start()`` called (a DECTRIS detector armed), its first header awaited, ``consume(cam)`` run; closed after."""
    try:
        t0 = time.perf_counter()
        conn.start_passive()
        cam = client(conn.get_socket_path())
        start()
        if conn.wait_for_arm(timeout=60.0) is None:
            raise RuntimeError(f"{receiver} saw no acquisition in 60 s")
        consume(cam)
        return time.perf_counter() - t0
    finally:
        conn.close()


def decoded_stacks(conn, cam, out: np.ndarray, max_size: int, receiver: str) -> None:
    """Every frame stack a LiberTEM-live connection hands on, decoded into ``out`` in turn (its shared-memory slot
    freed after); RuntimeError unless they fill ``out``."""
    at = 0
    while (stack := conn.get_next_stack(max_size=max_size)) is not None:
        n = len(stack)
        cam.decode_range_into_buffer(stack, out[at : at + n], 0, n)
        cam.done(stack)
        at += n
    if at != len(out):
        raise RuntimeError(f"{receiver} got {at} of {len(out)} frames")


def dectris_simulator(dump: Path) -> tuple[int, int, subprocess.Popen]:
    """LiberTEM-live's DECTRIS simulator replaying ``dump``, once it listens: (zmq port, REST port, process)."""
    program = Path(sys.executable).with_name("libertem-live-dectris-sim")
    process = subprocess.Popen([str(program), str(dump), "--port", "0", "--zmqport", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    zmq_port = rest_port = None
    for line in process.stdout:
        zmq_port = zmq_port or re.search(r"listening on tcp://127\.0\.0\.1:(\d+)", line)
        rest_port = rest_port or re.search(r"API server listening on \('127\.0\.0\.1', (\d+)\)", line)
        if zmq_port and rest_port:
            return int(zmq_port.group(1)), int(rest_port.group(1)), process
    raise RuntimeError(f"libertem-live-dectris-sim {dump} did not start")


def arm(rest_port: int) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{rest_port}/detector/api/1.8.0/command/arm", method="PUT", data=b"{}",
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).read()


def dectris_bare(ports: tuple[int, int], n_frames: int) -> float:
    """Frames per second of one series' parts pulled and dropped (the simulator's send rate)."""
    import zmq

    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.connect(f"tcp://127.0.0.1:{ports[0]}")
    try:
        t0 = time.perf_counter()
        arm(ports[1])
        while b"dseries_end" not in pull.recv()[:64]:
            pass
        return n_frames / (time.perf_counter() - t0)
    finally:
        pull.close()


def dectris_libertem_live(ports: tuple[int, int], n_frames: int, det: int) -> float:
    """Frames per second of one series received and decoded into NumPy by LiberTEM-live's receiver."""
    import libertem_dectris

    out = np.empty((n_frames, det, det), np.uint16)
    with tempfile.TemporaryDirectory() as shm:
        conn = libertem_dectris.DectrisConnection(uri=f"tcp://127.0.0.1:{ports[0]}", frame_stack_size=32,
                                                  handle_path=str(Path(shm) / "shm"), num_slots=2000, bytes_per_frame=det * det * 2)
        seconds = received(conn, libertem_dectris.CamClient, lambda cam: decoded_stacks(conn, cam, out, 32, "LiberTEM-live's DECTRIS receiver"),
                           "LiberTEM-live's DECTRIS receiver", lambda: arm(ports[1]))
    return n_frames / seconds


def tpx_simulator(scan: int) -> tuple[int, subprocess.Popen]:
    """LiberTEM-live's Timepix3 simulator sending its mock scan, once it listens: (port, process); its log goes to
    /dev/null (it logs each scan sent)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    program = Path(sys.executable).with_name("libertem-live-asi-tpx-sim")
    process = subprocess.Popen([str(program), "--mock-nav-shape", str(scan), str(scan), "--port", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()  # the simulator then waits for the next
            return port, process
        except OSError:
            time.sleep(0.2)
    process.terminate()
    raise RuntimeError("libertem-live-asi-tpx-sim did not start")


def tpx_bare(port: int, n_frames: int) -> float:
    """Frames per second of one mock scan's bytes read off the port and dropped (the simulator's send rate)."""
    left = 5 * 32 + 4 * (n_frames + 1) + 8 * (n_frames - 1)  # its headers, and one chunk: row pointers, indices, values (u32)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        t0 = time.perf_counter()
        sink = bytearray(1 << 22)
        while left:
            got = conn.recv_into(memoryview(sink)[: min(left, len(sink))])
            if not got:
                raise RuntimeError("the Timepix3 simulator closed inside a scan")
            left -= got
        return n_frames / (time.perf_counter() - t0)


def tpx_libertem_live(port: int, n_frames: int) -> float:
    """Frames per second of one scan received by LiberTEM-live's receiver, its CSR arrays copied out."""
    import libertem_asi_tpx3

    def copied(cam) -> None:
        got = 0
        while got < n_frames and (stack := conn.get_next_stack(max_size=1 << 30)) is not None:
            for layout, indptr, indices, values in cam.get_chunks(handle=stack):
                parts = (np.frombuffer(indptr, layout.get_indptr_dtype()).copy(), np.frombuffer(indices, layout.get_indices_dtype()).copy(),
                         np.frombuffer(values, layout.get_value_dtype()).copy())
                got += len(parts[0]) - 1
                del indptr, indices, values
            cam.done(stack)
        cam.close()
        if got != n_frames:
            raise RuntimeError(f"LiberTEM-live's Timepix3 receiver got {got} of {n_frames} frames")

    chunk_bytes = 4 * (n_frames + 1) + 8 * n_frames  # the mock sends a scan as one chunk
    with tempfile.TemporaryDirectory() as shm:
        conn = libertem_asi_tpx3.ASITpx3Connection(uri=f"127.0.0.1:{port}", chunks_per_stack=1, handle_path=str(Path(shm) / "shm"),
                                                   num_slots=16, bytes_per_chunk=chunk_bytes + 4096, huge=False)
        seconds = received(conn, libertem_asi_tpx3.CamClient, copied, "LiberTEM-live's Timepix3 receiver")
    return n_frames / seconds


def ingest(svc, source, start, scan: tuple[int, int], det: int, viewer: bool, layout: str = "compressed", dtype: str = "uint16") -> dict:
    """One acquisition ingested from ``source`` into a live acquisition of ``layout`` (``start()`` called once the
    ingest is asked: a DECTRIS detector is armed), with or without a viewer loop; rates."""
    acq = svc.create(f"detector-{time.monotonic_ns()}", scan, (det, det), dtype, layout=layout)
    t0 = time.perf_counter()
    future = svc.ingest(source, acq, wait=False, progress=False)
    start()
    views = watched(future, acq, det) if viewer else 0
    result = future.result()
    seconds = time.perf_counter() - t0
    out = {"frames_per_s": result["received"] / seconds, "views_per_s": views / seconds if viewer else None,
           "ratio": acq.info()["raw_bytes"] / acq.info()["nbytes"]}
    acq.release()
    return out


def compared(svc, runs: int, source, start, scan: tuple[int, int], det: int, bare_rate, theirs_rate, dtype: str = "uint16",
             layout: str = "compressed", dense: bool = True) -> dict:
    """One detector's figures (``source`` and ``start`` as ``ingest`` takes them), ingested into ``layout`` alone
    and with a viewer, and dense where ``dense``: each measure once unmeasured, then the median of ``runs``."""
    bare_rate(), theirs_rate(), ingest(svc, source, start, scan, det, False, layout, dtype)
    sent = statistics.median(bare_rate() for _ in range(runs))
    theirs = statistics.median(theirs_rate() for _ in range(runs))
    alone = median_run(runs, lambda: ingest(svc, source, start, scan, det, False, layout, dtype))
    viewed = median_run(runs, lambda: ingest(svc, source, start, scan, det, True, layout, dtype))
    out = {"simulator_frames_per_s": sent, "libertem_live_frames_per_s": theirs, "layout": layout,
           "alone": alone | {"over_libertem_live": alone["frames_per_s"] / theirs, "over_simulator": alone["frames_per_s"] / sent},
           "with_viewer": viewed | {"over_libertem_live": viewed["frames_per_s"] / theirs}}
    if dense:
        made = median_run(runs, lambda: ingest(svc, source, start, scan, det, False, "dense", dtype))
        out["dense"] = made | {"over_libertem_live": made["frames_per_s"] / theirs}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=64)
    ap.add_argument("--det", type=int, default=256)
    ap.add_argument("--dose", type=float, default=0.3)
    ap.add_argument("--runs", type=int, default=3, help="runs of each measurement; the median is kept")
    ap.add_argument("--dectris-det", type=int, default=192)
    ap.add_argument("--tpx-scan", type=int, default=256, help="the Timepix3 mock's scan side (its frames are 512 x 512 uint32)")
    args = record.parse(ap, small={"scan": 16, "det": 64, "dectris_det": 64, "runs": 1, "tpx_scan": 8})
    scan, n_frames = (args.scan, args.scan), args.scan * args.scan
    rng = np.random.default_rng(5)
    results: dict = {"frames": n_frames, "det": args.det, "dectris_det": args.dectris_det, "dose": args.dose, "runs": args.runs,
                     "tpx_frames": args.tpx_scan**2}
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp, qd.Service.local(n_workers=1) as svc:
        counts = rng.poisson(args.dose, (n_frames, args.det, args.det)).astype(">u2")
        port, process = simulator(write_merlin(Path(tmp), "bench", counts.view(np.uint8).reshape(n_frames, -1), (args.det, args.det), scan))
        try:
            results["merlin"] = compared(svc, args.runs, qd.MerlinSource("127.0.0.1", port), lambda: None, scan, args.det,
                                         lambda: bare(port, n_frames),
                                         lambda: libertem_live(port, n_frames, args.det))
        finally:
            process.terminate()
            process.wait()
        counts = rng.poisson(args.dose, (n_frames, args.dectris_det, args.dectris_det)).astype(np.uint16)
        zmq_port, rest_port, process = dectris_simulator(write_dectris_series(Path(tmp) / "series.dump", counts))
        ports = (zmq_port, rest_port)
        try:
            results["dectris"] = compared(svc, args.runs, qd.DectrisSource("127.0.0.1", zmq_port), lambda: arm(rest_port), scan,
                                          args.dectris_det, lambda: dectris_bare(ports, n_frames),
                                          lambda: dectris_libertem_live(ports, n_frames, args.dectris_det))
        finally:
            process.terminate()
            process.wait()
        tpx = args.tpx_scan
        port, process = tpx_simulator(tpx)
        try:
            results["timepix"] = compared(svc, args.runs, qd.TimepixSource("127.0.0.1", port), lambda: None, (tpx, tpx), 512,
                                          lambda: tpx_bare(port, tpx * tpx), lambda: tpx_libertem_live(port, tpx * tpx), "uint32", "sparse",
                                          dense=False)
        finally:
            process.terminate()
            process.wait()
    record.publish(f"live_detectors_{'cuda' if qd.device.has_gpu() else 'cpu'}", results)


if __name__ == "__main__":
    main()
