"""Time-series ptychography: one object per frame of a series, one probe for all, each frame updated on
the shard that holds it, from its resident's feed.

Each iteration every shard makes one pass over its frames (``update.frame_pass``), updating their objects
where they live and returning the probe's sums per frame; the client adds them in series order and
updates the probe (``update.probe_step``), so the result does not depend on how the frames are spread.
Every ``checkpoint_every`` iterations the objects and probe come back to the client (and to the file
``checkpoint``, when given); a shard lost mid-run has its acquisitions re-homed by the service, and the run
goes on from the last checkpoint. The steps on the shards are queries (``queries.ptycho``) asked of the
series handle, so each is one call per shard that follows its acquisitions after a loss.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ..resident.feed import check_count
from ..phase.optics import Optics
from ..phase.iterative import geometry, update
from ..phase.iterative.window import window
from ..queries.ptycho import PtychoEnd, PtychoObjects, PtychoPass, PtychoStart

RESTARTS = 3  # restarts from a checkpoint after lost state, before giving up


@dataclass
class Reconstruction:
    """``objects`` (n_frames, rows, cols) complex64 on the object grid (detector axes, ``pixel_A``);
    ``probe`` (det_rows, det_cols) complex64 in real space; ``errors`` (iterations, n_frames): each pass's
    sum (|Psi| - sqrt(I))^2 over sum I; ``corners``: each scan position's window corner on the object grid."""

    objects: np.ndarray
    probe: np.ndarray
    errors: np.ndarray
    pixel_A: tuple[float, float]
    corners: np.ndarray
    restarts: int = 0

    @property
    def phase(self) -> np.ndarray:
        """The objects' phases (rad), float32."""
        return np.angle(self.objects).astype(np.float32)

    def __repr__(self) -> str:
        """One line: shapes, passes, the last pass's mean error, pixel size and restarts; no array values."""
        objects = f"{self.objects.shape[0]} objects {'x'.join(map(str, self.objects.shape[1:]))} {self.objects.dtype}"
        passes = len(self.errors)
        error = f", last error {float(np.mean(self.errors[-1])):.4g}" if passes else ""
        return (f"Reconstruction({objects}, probe {'x'.join(map(str, self.probe.shape))}, {passes} iterations{error}, "
                f"pixel {self.pixel_A[0]:.4g} x {self.pixel_A[1]:.4g} A, {self.restarts} restarts)")


@dataclass
class Checkpoint:
    iteration: int
    probe: np.ndarray
    objects: list | None
    errors: list = field(default_factory=list)

    def save(self, path: Path, names: list[str]) -> None:
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, iteration=self.iteration, probe=self.probe, objects=np.stack(self.objects), errors=np.asarray(self.errors),
                 names=np.asarray(names))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path, names: list[str]) -> "Checkpoint":
        with np.load(path) as saved:
            if list(saved["names"]) != names:
                raise ValueError(f"checkpoint {path} is of the series {list(saved['names'])}, not {names}")
            return cls(int(saved["iteration"]), saved["probe"], list(saved["objects"]), [list(e) for e in saved["errors"]])


def check_step(value, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number in (0, 2], got {value!r}") from None
    if not 0 < number <= 2:
        raise ValueError(f"{what} must be a number in (0, 2], got {value!r}")
    return number


def reconstruct(
    series,
    fit: Optics,
    iterations: int = 20,
    batch: int = 512,
    object_step: float = 1.0,
    probe_step: float = 1.0,
    probe_after: int = 2,
    depth: int = 2,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 10,
    crop: int | None = None,
    bin: int = 1,
    progress: bool = True,
) -> Reconstruction:
    """Single-slice ptychography of every frame of ``series`` with calibrated ``fit`` (its aberrations give
    the starting probe): ``iterations`` passes, positions in batches of ``batch`` (the feed's blocks, made
    ``depth`` ahead), object and probe steps in (0, 2], the probe updated from pass ``probe_after`` on.
    With ``checkpoint`` (a .npz path) the run saves there every ``checkpoint_every`` iterations and resumes
    from it when it exists. ``crop`` (a square window's side in detector pixels, around the bright-field
    disk) and ``bin`` (b x b pixels summed) reduce the detector in the feed on each owner: a faster pass,
    object pixels as much larger (``pixel_A``)."""
    iterations, batch = check_count(iterations, "iterations", 1), check_count(batch, "batch", 1)
    probe_after, checkpoint_every = check_count(probe_after, "probe_after", 1), check_count(checkpoint_every, "checkpoint_every", 1)
    depth = check_count(depth, "depth", 0)
    object_step, probe_step = check_step(object_step, "object_step"), check_step(probe_step, "probe_step")
    names = list(series.names)
    scan_shape, det_shape = series.same("scan_shape"), series.same("det_shape")
    fit.require_calibration("ptychography")
    reduced = window(det_shape, fit, crop, bin)
    fit = reduced.optics_of(fit)
    geo = geometry.geometry(fit, scan_shape, reduced.det_shape)
    totals = np.array([reduced.sums(p) for p in series.reduce(op="sum")])  # per frame: sum I = sum a^2, in the window
    if not (totals > 0).all():
        raise ValueError(f"frames {np.flatnonzero(totals <= 0).tolist()} hold no counts: nothing to reconstruct")
    initial = Checkpoint(0, geometry.starting_probe(fit, geo, float(totals.mean()) / (scan_shape[0] * scan_shape[1])), None)
    path = Path(checkpoint) if checkpoint is not None else None
    saved = Checkpoint.load(path, names) if path is not None and path.exists() else initial
    series, run = series.plain(), uuid.uuid4().hex
    state, restarts = saved, 0
    probe, errors, done = state.probe, list(state.errors), state.iteration
    bar = tqdm(total=iterations, initial=done, desc="ptychography", unit="it", disable=not progress)
    objects = None
    try:
        series.ask(PtychoStart, run, fit, reduced, state.objects)
        while objects is None:
            try:
                while done < iterations:
                    passes = series.ask(PtychoPass, run, probe, reduced, batch, depth, object_step)
                    errors.append([p.error / t for p, t in zip(passes, totals)])
                    done += 1
                    if done >= probe_after:
                        probe = update.probe_step(probe, passes, probe_step)
                    bar.update(1)
                    bar.set_postfix(error=f"{np.mean(errors[-1]):.4g}")
                    if done % checkpoint_every == 0 and done < iterations:
                        state = Checkpoint(done, probe, series.ask(PtychoObjects, run), list(errors))
                        if path is not None:
                            state.save(path, names)
                objects = series.ask(PtychoObjects, run)
            except KeyError:  # a shard's state is gone (its worker was lost): again from the last checkpoint
                restarts += 1
                if restarts > RESTARTS:
                    raise
                series.ask(PtychoStart, run, fit, reduced, state.objects)
                probe, errors, done = state.probe, list(state.errors), state.iteration
                bar.n = done
                bar.refresh()
    finally:
        bar.close()
        series.ask(PtychoEnd, run)
    if path is not None:
        Checkpoint(done, probe, objects, errors).save(path, names)
    return Reconstruction(np.stack(objects), probe, np.asarray(errors, np.float64).reshape(-1, len(names)), geo.pixel_A, geo.corners, restarts)
