"""The viewer's phase panel in a real browser (headless chromium): slider event to pixels drawn (issue 58).

An ``--simulated`` x ``--simulated`` scan of a simulated crystal (300 kV, 31.5 mrad, 0.4 A step, the
direct benchmark's: about 9000 bright-field pixels on a 192 x 192 detector, u = 3 automatic) repeated and cut to
``--scan``, loaded dense on one worker (a GPU, or two CPU workers), is viewed through the web server in
chromium with its calibrated optics. Each step moves one slider (C10 by ``--c10-step`` A, or the strength)
and waits until the phase image of that step is painted: ms from the slider's ask to its pixels, per
method (SSB; direct, phase; direct, complex; the strength of direct phase). Baselines from the same run:
the same calls from Python (``acq.ssb``, ``acq.direct_ptycho``) at the same C10 steps, and the same steps asked
over the page's WebSocket from Python (ask to answer read: everything but the drawing), each beside the page's.
Where the machine has no chromium (the GPU machine's image has none) the page's figures are left out and the
socket's stand for the viewer's server half.

    python benchmarks/view_phase_gpu.py                 # on the GPU machine: 512 x 512 x 192 x 192, u = 3
    DASK_QGPU__CPU=True python benchmarks/view_phase_gpu.py # 2 CPU workers: 128 x 128 x 128 x 128
    python benchmarks/view_phase_gpu.py --small         # seconds: what CI runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import qgpu_dask as qd
from qgpu_dask.phase import simulate
from qgpu_dask.phase.optics import wavelength_A
from qgpu_dask.view.protocol import unframe
from qgpu_dask.view.server import ViewServer

import record
from ssb_gpu import write_tiled
from view_gpu import browser

STEP = """
const [controls, done] = arguments;
const v = window.qgpuViewers[0];
const timed0 = v.phaseTimings.length, errors0 = v.errors.length, start = performance.now();
v.setPhase(controls);
const seq = v.asked.phase;
function look() {  // the step's phase image painted: its timing entry (taken in the frame after it was drawn)
  const entry = v.phaseTimings.slice(timed0).find(x => x.seq === seq);
  if (entry) done({ms: entry.drawn - start, server_ms: entry.received - entry.asked});
  else if (v.errors.length > errors0) done({error: v.errors[v.errors.length - 1]});
  else setTimeout(look, 1);
}
look();
"""
METHODS = ("ssb", "direct-phase", "direct-complex")


def api_ms(acq, optics, method: str, c10s: list[float], u: int) -> list[float]:
    """ms of each call from Python at the C10 steps (each a new C10: the owner's preparations as the page meets them),
    after an untimed first call (the method's kernels compiled, as the socket's first ask is untimed)."""
    times = []
    for c10 in [c10s[0] - 1.0, *c10s]:
        at = optics.with_(aberrations={**optics.aberrations, "C10": c10})
        start = time.perf_counter()
        if method == "ssb":
            acq.ssb(at)
        else:
            acq.direct_ptycho(at, method.split("-")[1], u)
        times.append((time.perf_counter() - start) * 1e3)
    return times[1:]


def page_steps(page, steps: list[dict]) -> list[float]:
    """ms from each slider ask to its image painted; RuntimeError naming an error the page showed."""
    times = []
    for controls in steps:
        out = page.execute_async_script(STEP, controls)
        if "error" in out:
            raise RuntimeError(f"the page showed an error for {controls}: {out['error']}")
        times.append(out["ms"])
    return times


def socket_steps(url: str, steps: list[dict]) -> list[float]:
    """ms from each slider ask sent over the page's WebSocket to its phase image read and unframed (the page's
    protocol without the page); RuntimeError naming an error the server answered."""
    import tornado.websocket

    async def run() -> list[float]:
        socket = await tornado.websocket.websocket_connect(url, max_message_size=1 << 30)  # a complex u = 3 image is 19 MB
        try:
            times = []
            for seq, controls in enumerate(steps, start=1):
                start = time.perf_counter()
                await socket.write_message(json.dumps({"type": "phase", "seq": seq, **controls}))
                while True:
                    data = await asyncio.wait_for(socket.read_message(), 300)
                    if data is None:
                        raise RuntimeError("the viewer closed its socket")
                    header, _ = unframe(data)
                    if header.get("seq") == seq and header["type"] in ("phase", "error"):
                        break
                if header["type"] == "error":
                    raise RuntimeError(f"the viewer answered an error for {controls}: {header['message']}")
                times.append((time.perf_counter() - start) * 1e3)
            return times
        finally:
            socket.close()

    return asyncio.run(run())


def slider_steps(method: str, args, c10s: list[float]) -> tuple[list[dict], list[dict]]:
    """The method's first ask (its kernels, a CPU worker's consent; not timed) and the timed slider steps."""
    if method == "strength":
        return [{"method": "direct-phase"}], [{"strength": s} for s in np.geomspace(0.02, 0.5, args.steps).tolist()]
    return [{"method": method, "upsampling": args.upsampling, "c10_A": -30.0, "go_on": True}], [{"c10_A": c} for c in c10s]


def summary(times: list[float]) -> dict:
    return {"p50_ms": statistics.median(times), "p95_ms": float(np.percentile(times, 95)), "max_ms": max(times), "steps": len(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu = qd.device.has_gpu()
    parser.add_argument("--scan", type=int, default=512 if gpu else 128)
    parser.add_argument("--det", type=int, default=192 if gpu else 128)
    parser.add_argument("--simulated", type=int, default=84 if gpu else 32, help="simulated scan side (repeated to --scan)")
    parser.add_argument("--upsampling", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="slider steps timed per method")
    parser.add_argument("--c10-step", type=float, default=2.0, help="A a C10 slider step moves")
    args = record.parse(parser, {"scan": 16, "det": 32, "simulated": 16, "upsampling": 2, "steps": 3})
    backend = "cuda" if gpu else "cpu"
    step_A, semiangle, over = 0.4, 31.5, 6
    det = (args.det, args.det)
    truth = qd.Optics(300e3, semiangle, step_A, aberrations={"C10": -30.0, "C12": 5.0, "phi12": 0.3})
    simulated = (args.simulated, args.simulated)
    potential = simulate.atoms_potential((simulated[0] * over, simulated[1] * over), step_A / over, 3.9)
    counts = simulate.acquisition(truth, simulated, det, potential, over, dose=1e5, seed=1)
    sampling = wavelength_A(300e3) * 1e3 / (simulated[0] * step_A)
    optics = truth.with_(det_sampling_mrad=sampling, rotation_deg=0.0, flip=False, bf_center_px=(det[0] // 2, det[1] // 2))
    c10s = [-30.0 + args.c10_step * (k + 1) for k in range(args.steps)]
    page = browser()
    if page is None:
        print("no chromium and chromedriver (apt-get install chromium chromium-driver): the page's figures are left out",
              file=sys.stderr)
    viewer, socket, errors = {}, {}, []
    try:
        with tempfile.TemporaryDirectory() as tmp, (qd.Service.local(n_workers=1, dashboard_address=":0") if gpu
                                                   else qd.Service.local(n_workers=2, dashboard_address=":0")) as svc:
            acq = svc.load(write_tiled(Path(tmp) / "phase.h5", counts, (args.scan, args.scan)), dataset="/data", name="phase",
                           layout="dense", progress=False)
            acq.ssb(optics)  # the kernels compiled and G made before anything is timed, page and API alike
            api = {m: summary(api_ms(acq, optics, m, [c - 0.5 for c in c10s], args.upsampling)) for m in METHODS}
            with ViewServer(svc, optics=optics) as server:
                url = server.address("acq/phase/ws", scheme="ws")
                for method in (*METHODS, "strength"):
                    first, steps = slider_steps(method, args, [c + 0.25 for c in c10s])
                    socket[method] = summary(socket_steps(url, first + steps)[1:])
                if page is not None:
                    page.get(server.address("acq/phase/"))
                    deadline = time.monotonic() + 300
                    while not page.execute_script("const v = (window.qgpuViewers || [])[0]; return v && v.drawn.image > 0;"):
                        if time.monotonic() > deadline:
                            raise RuntimeError("the page drew no image in 300 s")
                        time.sleep(0.05)
                    for method in (*METHODS, "strength"):
                        first, steps = slider_steps(method, args, c10s)
                        page_steps(page, first)
                        viewer[method] = summary(page_steps(page, steps))
                    errors = page.execute_script("return window.qgpuViewers[0].errors;")
            acq.release()
    finally:
        if page is not None:
            page.quit()
    shown = viewer or socket  # the page's figures where a browser drew them, else the server's half
    results = {"scan": args.scan, "det": args.det, "upsampling": args.upsampling, "backend": backend, "c10_step_A": args.c10_step,
               "api": api, "socket": socket, "errors": errors,
               **({"viewer": viewer, "over_api": {m: viewer[m]["p50_ms"] / api[m]["p50_ms"] for m in METHODS}} if viewer else {}),
               "targets": ({"ssb_p50_ms": 20.0, "direct-phase_p50_ms": 45.0, "direct-complex_p50_ms": 65.0, "strength_p50_ms": 10.0}
                           if gpu else {"ssb_p50_ms": 150.0, "direct-phase_p50_ms": 400.0, "direct-complex_p50_ms": None, "strength_p50_ms": None})}
    results["meets_targets"] = {key: shown[key.removesuffix("_p50_ms")]["p50_ms"] <= limit
                                for key, limit in results["targets"].items() if limit is not None}
    path = record.write(f"view_phase_{backend}", results)
    lines = [f"{args.scan}x{args.scan}x{args.det}x{args.det}, u = {args.upsampling} ({backend}): slider to "
             f"{'pixels' if viewer else 'image read over the socket (no browser)'} p50 / p95 / max ms, beside the socket's and the API's p50"]
    lines += [f"{name}: {v['p50_ms']:.1f} / {v['p95_ms']:.1f} / {v['max_ms']:.1f} (socket {socket[name]['p50_ms']:.1f}"
              + (f", API {api[name]['p50_ms']:.1f})" if name in api else ")") for name, v in shown.items()]
    lines.append(f"targets met: {results['meets_targets']}")
    return record.reported(path, lines, {"no errors on the page": not errors})


if __name__ == "__main__":
    sys.exit(main())
