"""What handles and results print as in a notebook: one short line each, no array values."""

from __future__ import annotations

import re

import numpy as np
from dask.utils import format_bytes

import qgpu_dask as qd
from qgpu_dask.ptycho.reconstruct import Reconstruction


def test_acquisition_series_and_service(svc, names, rng):
    counts = rng.poisson(0.5, (6, 8, 16, 16)).astype(np.uint16)
    comp = svc.put(counts, name=names(), layout="compressed")
    dense = svc.put(counts, name=names(), layout="dense")
    text = repr(comp)
    assert text.startswith(f"Acquisition({comp.name!r}, 6x8 x 16x16 uint16, compressed ") and text.endswith(f"x), on {comp.owner})")
    ratio = float(re.search(r"\(([\d.]+)x\)", text).group(1))
    assert abs(ratio - counts.nbytes / comp.nbytes) < 0.05
    assert repr(dense) == f"Acquisition({dense.name!r}, 6x8 x 16x16 uint16, dense {format_bytes(dense.nbytes)}, on {dense.owner})"

    series = qd.Series(svc, [comp, dense])
    owners = len({comp.owner, dense.owner})
    assert repr(series) == f"Series(2 acquisitions: {comp.name}, {dense.name} on {owners} shard{'s' * (owners > 1)})"
    long = qd.Series(svc, [comp] * 8)
    assert repr(long) == f"Series(8 acquisitions: {', '.join([comp.name] * 4)}, ..., {comp.name} on 1 shard)"

    text = repr(svc)
    state = svc.state()
    kind = "cpu" if svc.backend == "cpu" else "cuda"
    assert text.startswith(f"Service({len(state['shards'])} shards ({kind}), {len(state['acquisitions'])} acquisitions, ")
    assert text.endswith(" budget held)") and "array(" not in text


def test_live_acquisition_says_what_has_arrived(svc, names):
    live = svc.create(names(), (4, 4), (8, 8), "uint16", layout="dense")
    live.append(np.ones((6, 8, 8), np.uint16))
    assert repr(live).endswith(f"on {live.owner}, live 6/16 received)")
    live.release()
    assert repr(live).endswith(", live)")  # released: still prints


def test_optics_rounded():
    optics = qd.Optics(300e3, 20.0, 0.5123456, det_sampling_mrad=1.23456789, rotation_deg=-0.5062345, flip=False,
                       aberrations={"C10": -151.23456, "C12": 12.9345}, bf_center_px=(31.51234, 32.0),
                       uncertainties={"C10": 3.14159})
    assert repr(optics) == ("Optics(energy_eV=3e5, semiangle_mrad=20, scan_step_A=0.5123, det_sampling_mrad=1.235, "
                            "rotation_deg=-0.5062, flip=False, bf_center_px=(31.51, 32), aberrations={C10: -151.2 +- 3.1, C12: 12.93})")
    assert repr(qd.Optics(200e3, 25.0, 1.0)) == "Optics(energy_eV=2e5, semiangle_mrad=25, scan_step_A=1)"


def test_results_without_array_dumps():
    phase = np.zeros((128, 96), np.float32)
    result = qd.DirectResult(phase, None, "phase", 2, 0.1, prepared=False)
    assert repr(result) == "DirectResult(phase 128x96 float32, method='phase', upsampling=2, strength=0.1, kept equations)"
    both = qd.DirectResult(np.zeros((3, 8, 8), np.float32), np.ones((3, 8, 8), np.float32), "complex", 1, 0.05)
    assert repr(both) == ("DirectResult(phase 3x8x8 float32, amplitude 3x8x8 float32, method='complex', upsampling=1, "
                          "strength=0.05, equations prepared by this call)")
    rec = Reconstruction(np.ones((2, 40, 40), np.complex64), np.ones((16, 16), np.complex64), np.array([[0.5, 0.3], [0.2, 0.1]]),
                         (0.25, 0.25), np.zeros((2, 2), np.int64))
    assert repr(rec) == "Reconstruction(2 objects 40x40 complex64, probe 16x16, 2 iterations, last error 0.15, pixel 0.25 x 0.25 A, 0 restarts)"
