"""What a shard compiles as it starts, in a thread of its own, so that its first calls do not wait for the
compiler: the kernels a load, a compressed frame, the aberration fit and direct ptychography run, each run
once on a tiny acquisition. With Numba's cache filled (``jit.py``) this only loads them, in about a second; a
call that needs one still being compiled waits for it, and its progress bar says so (``Shard.compiling``)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType

import numpy as np

from .. import jit
from ..config import setting
from ..device import use_own_stream
from ..io.load import warm_up as warm_up_loads
from ..phase import simulate
from ..phase.optics import Optics
from ..queries.base import REGISTRY, Context
from ..queries.direct import DirectPtycho
from ..queries.fit import FitAberrations
from ..queries.reductions import Frame
from ..resident.dense import DenseCounts

logger = logging.getLogger(__name__)
stopped = threading.Event()  # set once this process's shard has stopped (``abandon``)
OPTICS = Optics(300e3, 20.0, 1.0, aberrations={"C10": -30.0}, det_sampling_mrad=2.0, bf_center_px=(12.0, 12.0), rotation_deg=0.0, flip=False)
SCAN, DET = (8, 8), (24, 24)


def tiny_phase_acquisition(xp: ModuleType) -> DenseCounts:
    """A simulated 8 x 8 x 24 x 24 uint16 acquisition of atomic columns seen with ``OPTICS``, held dense."""
    potential = simulate.atoms_potential((SCAN[0] * 2, SCAN[1] * 2), OPTICS.scan_step_A / 2, 3.9)
    counts = simulate.acquisition(OPTICS, SCAN, DET, potential, 2, dose=1e4, seed=0).astype(np.uint16)
    return DenseCounts("warm-up", xp.asarray(counts.reshape(SCAN[0] * SCAN[1], -1)), counts.shape)


def warm_up(xp: ModuleType) -> None:
    """Run, once each on tiny acquisitions on ``xp``'s device, a load's coding and decoding, a compressed
    frame, the aberration fit and direct ptychography: compiled, or loaded from the caches, from then on.
    Its own query context, so nothing it keeps meets a real query's. The workers of a machine take turns
    (``jit.one_at_a_time``): on a first start one compiles while the rest wait, then load from the cache."""
    with jit.one_at_a_time():
        run_once(xp)


def run_once(xp: ModuleType) -> None:
    """The warm-up's calls, once each (see :func:`warm_up`)."""
    ctx = Context("warm-up", "cpu" if xp is np else "cuda", 1 << 30, lambda what_needs, nbytes: None)
    for query in REGISTRY.values():
        ctx.keep(query)
    coded = warm_up_loads(xp)
    Frame.run(ctx, [coded], 0, 0)
    dense = tiny_phase_acquisition(xp)
    with np.errstate(all="ignore"):  # a fit of 64 positions is poor: its uncertainties may be inf
        fitted = FitAberrations.run(ctx, [dense], OPTICS, 1.0)[0]["optics"]
    DirectPtycho.run(ctx, [dense], fitted, "phase", "auto", 0.1)


def started(xp: ModuleType) -> Future:
    """:func:`warm_up` under way in a thread of its own (its own CUDA stream on a GPU); its future, done
    when it is (a failure is logged: the kernels then compile on first use). The ``qgpu.warm-up`` setting False
    on the workers skips it (a done future): kernels compile, or load from the cache, on first use."""
    if not setting("warm-up"):
        skipped: Future = Future()
        skipped.set_result(None)
        return skipped
    pool = ThreadPoolExecutor(1, thread_name_prefix="qgpu-warm-up", initializer=use_own_stream)
    future = pool.submit(warm_up, xp)
    future.add_done_callback(reported)
    pool.shutdown(wait=False)
    return future


def abandon() -> None:
    """Say that this process's shard has stopped (``Shard.stop``: its cluster is closing): a warm-up still under
    way then meets pools that refuse new work as the process exits, which is no failure of the kernels."""
    stopped.set()


def reported(done: Future) -> None:
    """Log a warm-up that failed, unless its shard stopped meanwhile (``abandon``)."""
    error = done.exception()
    if error is not None and not stopped.is_set():
        logger.warning("warming up the kernels failed: %r", error)
