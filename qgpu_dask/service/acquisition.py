"""Client-side handles: an Acquisition (one resident) and a Series (several, spread over shards).

Handles hold a name and a description; every query is a direct call to the
owning shard. A series query makes one call per shard (not per acquisition)
and assembles the exact result on the client.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from dask.utils import format_bytes

from ..resident import combine_parts, finish_reduce
from ..resident.base import AcquisitionShape
from ..resident.masks import as_mask_stack
from ..phase import calibration, direct
from ..phase.optics import Optics
from ..phase.parallax import check_upsampling
from .calls import QueryFuture
from .progress import waited

if TYPE_CHECKING:
    from .service import Service


def single_mask(mask, det_shape) -> np.ndarray:
    """A (1, rows, cols) stack from one 2-D mask; ValueError for anything else."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"virtual_image takes one 2-D mask, got shape {mask.shape} (use virtual_images for several)")
    return as_mask_stack(mask, det_shape)


def sideband_ready(optics) -> None:
    """TypeError unless ``optics`` is an Optics; ValueError naming the calibration fields it lacks."""
    if not isinstance(optics, Optics):
        raise TypeError(f"ssb takes a qd.Optics (from acq.calibrate), got {type(optics).__name__}")
    optics.require_calibration("ssb")


def direct_arguments(optics, method: str, upsampling, strength) -> tuple:
    """The shard's direct_ptycho arguments after ``optics``, each checked here, before anything is sent."""
    sideband_ready(optics)
    direct.check_method(method)
    direct.upsampling_of(optics, upsampling)
    return method, upsampling, direct.check_strength(strength)


def ordered(replies: list, positions: list[list[int]]) -> list:
    """Per-acquisition parts of per-shard replies, back in series order."""
    out: list[Any] = [None] * sum(len(where) for where in positions)
    for reply, where in zip(replies, positions):
        for part, i in zip(reply, where):
            out[i] = part
    return out


def in_order(replies: list, positions: list[list[int]], each: Callable[[Any], Any] = lambda part: part) -> np.ndarray:
    """Per-acquisition parts of per-shard replies, back in series order, stacked (``each`` applied to every part)."""
    return np.stack([each(part) for part in ordered(replies, positions)])


def stacked(results: list[direct.DirectResult]) -> direct.DirectResult:
    """One DirectResult whose images stack those of a series (n, rows * u, cols * u); ``prepared`` if any was."""
    first = results[0]
    amplitude = np.stack([r.amplitude for r in results]) if first.amplitude is not None else None
    return replace(first, phase=np.stack([r.phase for r in results]), amplitude=amplitude, prepared=any(r.prepared for r in results))


def finish(future: QueryFuture, wait: bool):
    return future.result() if wait else future


def finish_long(future: QueryFuture, wait: bool, what: str, n: int = 1):
    """``finish`` for a call that may take seconds (a phase solve, a fit): waited on, it shows a bar once it
    has run ``progress.DELAY`` seconds, counting the ``n`` acquisitions done."""
    return waited(future, what, n, "acquisition") if wait else future


class Acquisition(AcquisitionShape):
    """One resident acquisition: metadata and exact queries answered by its owning shard."""

    def __init__(self, service: "Service", record: dict):
        self.service = service
        self.record = dict(record)
        service.owners[self.name] = record["owner"]

    @property
    def name(self) -> str:
        return self.record["name"]

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return tuple(self.record["shape"])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.record["dtype"])

    @property
    def owner(self) -> str:
        """Address of the worker whose shard holds this acquisition (the newest known: it changes when a lost shard's acquisitions are held again)."""
        return self.service.owners.get(self.name, self.record["owner"])

    @property
    def nbytes(self) -> int:
        return int(self.record["nbytes"])

    def query(self, method: str, *args, assemble: Callable[[Any], Any] = lambda r: r) -> QueryFuture:
        """Shard method ``method(name, *args)`` on this acquisition's owner."""
        future = self.service.routed([self.name], lambda owner, names: self.service.send(owner, method, names[0], *args))
        return QueryFuture(future, lambda replies, positions: assemble(replies[0]))

    def query_listed(self, method: str, *args, assemble: Callable[[Any], Any] = lambda r: r) -> QueryFuture:
        """Shard method ``method([name], *args)`` (one serving several acquisitions) on this acquisition's owner; its one result."""
        return QueryFuture(self.service.routed_method([self.name], method, *args), lambda replies, positions: assemble(replies[0][0]))

    @property
    def received(self) -> int:
        """Scan positions held so far: of a live acquisition (``svc.create``) those appended or ingested, else all."""
        return self.query("received").result()

    def append(self, frames) -> int:
        """Add ``frames`` (n, det_rows, det_cols) of this acquisition's dtype, the next n scan positions in C
        order, to a live acquisition (``svc.create``); returns the positions received. A wrong shape or dtype
        or frames past the scan raise ValueError (``LiveCounts.append``, on the owner) and add nothing."""
        return self.query("append", np.ascontiguousarray(frames)).result()

    def virtual_image(self, mask, wait: bool = True):
        """Exact virtual image (scan_rows, scan_cols) of one mask (bool, integer or float weights)."""
        stack = single_mask(mask, self.det_shape)
        future = self.service.routed([self.name], lambda owner, names: self.service.send_virtual_images(owner, names, stack))
        return finish(QueryFuture(future, lambda replies, positions: replies[0][0, 0]), wait)

    def virtual_images(self, masks, wait: bool = True):
        """(n_masks, scan_rows, scan_cols) exact virtual images, all masks in one pass over the data."""
        stack = as_mask_stack(masks, self.det_shape)
        future = self.service.routed([self.name], lambda owner, names: self.service.send_virtual_images(owner, names, stack))
        return finish(QueryFuture(future, lambda replies, positions: replies[0][0]), wait)

    def frame(self, row: int, col: int, wait: bool = True):
        """The diffraction pattern at scan position (row, col), native dtype."""
        return finish(self.query("frame", row, col), wait)

    def reduce(self, roi=None, op: str = "sum", wait: bool = True):
        """Per detector pixel over a bool scan ROI (None: all): "sum" (uint64; int64 signed), "mean" (float64), "max" (native)."""
        return finish(self.query_listed("reduce", roi, op, False, assemble=lambda part: finish_reduce(*part, op)), wait)

    def center_of_mass(self, center: tuple[float, float] | None = None) -> np.ndarray:
        """(2, scan_rows, scan_cols) float64 centre of mass (row, col) of every pattern, in detector pixels
        from ``center`` (default: the bright-field disk's centre), from exact moment images."""
        if center is None:
            center, _ = calibration.bright_field_disk(self.reduce(op="mean"))
        return calibration.center_of_mass(self.virtual_images(calibration.moment_masks(self.det_shape)), center)

    def calibrate(self, optics: Optics) -> Optics:
        """``optics`` with det_sampling_mrad (from the bright-field disk radius, unless given), bf_center_px,
        rotation_deg and flip (least CoM curl, the 180 deg twin by the iCoM-ADF sign, unless given) filled in;
        the rotation is an estimate, its standard error in ``uncertainties``: ``fit_aberrations`` refines it."""
        disk = calibration.bright_field_disk(self.reduce(op="mean"))
        masks = np.concatenate([calibration.moment_masks(self.det_shape), calibration.dark_field_ring(self.det_shape, disk)[None]])
        images = self.virtual_images(masks)
        return calibration.calibrated(optics, disk, images[:3], images[3])[0]

    def dpc(self, optics: Optics) -> np.ndarray:
        """iCoM (integrated centre of mass) phase in rad, mean 0, (scan_rows, scan_cols) float64, with calibrated ``optics``."""
        optics.require_calibration("dpc")
        return calibration.dpc(self.virtual_images(calibration.moment_masks(self.det_shape)), optics)

    def ssb(self, optics: Optics, wait: bool = True):
        """Aberration-corrected single-sideband phase (rad, mean 0, float32 (scan_rows, scan_cols)) with
        calibrated ``optics`` (``calibrate``), computed on the owner; its preparation is kept there."""
        sideband_ready(optics)
        return finish_long(self.query_listed("ssb", optics), wait, f"ssb {self.name}")

    def parallax(self, optics: Optics, upsampling: int = 2, wait: bool = True):
        """Tilt-corrected bright field with contrast correction, float32 (scan_rows * u, scan_cols * u), mean 0,
        with calibrated ``optics`` carrying the aberrations (``fit_aberrations``); computed on the owner."""
        sideband_ready(optics)
        check_upsampling(upsampling)
        return finish_long(self.query_listed("parallax", optics, upsampling), wait, f"parallax {self.name}")

    def direct_ptycho(self, optics: Optics, method: str = "phase", upsampling="auto", strength: float = 0.1, wait: bool = True):
        """Regularized direct ptychography on a grid ``upsampling`` times finer than the scan ("auto": the
        smallest whose Nyquist covers 2 alpha / lambda), with calibrated ``optics`` carrying the aberrations:
        a ``DirectResult`` with ``phase`` (and ``amplitude`` for method "complex"), float32
        (scan_rows * u, scan_cols * u). The equations are prepared on the owner once per optics and
        upsampling for each method, so another ``strength`` only re-solves."""
        return finish_long(self.query_listed("direct_ptycho", optics, *direct_arguments(optics, method, upsampling, strength)), wait,
                           f"direct_ptycho {self.name}")

    def fit_aberrations(self, optics: Optics, c10_range_A: float = 500.0) -> Optics:
        """``optics`` (calibrated) with the defocus C10 and twofold astigmatism C12, phi12 that maximise the
        coherent SSB signal (robust on crystals), searched over C10 within +/- ``c10_range_A`` of the given
        one; their standard errors in ``uncertainties``. Runs on the owner."""
        sideband_ready(optics)
        call = self.query_listed("fit_aberrations", optics, float(c10_range_A), assemble=lambda fitted: fitted["optics"])
        return finish_long(call, True, f"fit_aberrations {self.name}")

    def checksum(self) -> str:
        """SHA-256 hex digest of the counts (C order, native dtype, 4-D shape), the same for every reader
        and layout: compare it with ``hashlib.sha256(array.tobytes()).hexdigest()`` of the source."""
        return finish_long(self.query("checksum"), True, f"checksum {self.name}")

    def release(self) -> None:
        """Free this acquisition's memory on its shard and forget its name."""
        self.query("release").result()

    def save(self, path: str | os.PathLike) -> str:
        """Write this acquisition as it is held (compressed streams as they are) to ``path``; returns the absolute path.

        The owning worker writes the file, so ``path`` must be on a file system
        it sees; :meth:`Service.load` reopens it without re-encoding.
        """
        path = os.path.abspath(os.fspath(path))
        finish_long(self.query("save", path), True, f"saving {self.name}")
        return path

    def info(self) -> dict:
        """Shape, dtype, layout and why it was chosen (``layout_reason``), owner, resident bytes and where it
        came from, as the catalog has them now (a live acquisition's state included); the last record known
        once it is released."""
        entry = self.service.state()["acquisitions"].get(self.name)
        if entry is not None:
            self.record.update(entry)
        return dict(self.record)

    def __repr__(self) -> str:
        """One line from the record held here (a live one asks its owner how much has arrived)."""
        r = self.record
        rows, cols, det_rows, det_cols = self.shape
        held = f"{r.get('layout', 'held')} {format_bytes(self.nbytes)}"
        if r.get("layout") == "compressed" and self.nbytes:
            held += f" ({r.get('raw_bytes', self.n_frames * self.frame_len * self.dtype.itemsize) / self.nbytes:.1f}x)"
        text = f"Acquisition({self.name!r}, {rows}x{cols} x {det_rows}x{det_cols} {self.dtype}, {held}, on {self.owner}"
        if r.get("live"):
            try:
                text += f", live {self.received}/{self.n_frames} received"
            except Exception:  # released, or the service is gone: the repr still prints
                text += ", live"
        return text + ")"


class Series(Sequence):
    """An ordered list of acquisitions spread across shards; queries make one call per shard."""

    def __init__(self, service: "Service", acquisitions: list[Acquisition]):
        if not acquisitions:
            raise ValueError("a series needs at least one acquisition")
        self.service = service
        self.acquisitions = list(acquisitions)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Series(self.service, self.acquisitions[index])
        return self.acquisitions[index]

    def __len__(self) -> int:
        return len(self.acquisitions)

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.acquisitions]

    def same(self, what: str) -> Any:
        values = {getattr(a, what) for a in self.acquisitions}
        if len(values) != 1:
            raise ValueError(f"the acquisitions of this series differ in {what} ({sorted(map(str, values))}): query them one by one")
        return values.pop()

    def per_shard(self, send: Callable[[str, list[str]], Any], assemble: Callable[[list[Any], list[list[int]]], Any]) -> QueryFuture:
        """``send(owner, names)`` once per owning shard; ``assemble`` gets each shard's reply and positions."""
        return QueryFuture(self.service.routed(self.names, send), assemble)

    def virtual_images(self, masks, wait: bool = True):
        """(n_acquisitions, scan_rows, scan_cols) for one 2-D mask; (n_acquisitions, n_masks, ...) for a stack."""
        det_shape = self.same("det_shape")
        self.same("scan_shape")
        one = np.ndim(masks) == 2 and not isinstance(masks, (list, tuple))
        stack = as_mask_stack(masks, det_shape)

        def assemble(replies, positions):
            out = None
            for reply, where in zip(replies, positions):
                if out is None:
                    out = np.empty((len(self),) + reply.shape[1:], dtype=reply.dtype)
                out[where] = reply
            return out[:, 0] if one else out

        return finish(self.per_shard(lambda o, names: self.service.send_virtual_images(o, names, stack), assemble), wait)

    def reduce(self, roi=None, op: str = "sum", total: bool = False, wait: bool = True):
        """One pattern per acquisition (n, det_rows, det_cols); ``total=True``: the exact reduction over the whole series."""
        self.same("scan_shape")
        self.same("det_shape")
        if total:
            self.same("dtype")

        def assemble(replies, positions):
            if total:
                return finish_reduce(*combine_parts([r[0] for r in replies], op), op)
            return in_order(replies, positions, lambda part: finish_reduce(*part, op))

        return finish(QueryFuture(self.service.routed_method(self.names, "reduce", roi, op, total), assemble), wait)

    def center_of_mass(self) -> np.ndarray:
        """(n_acquisitions, 2, scan_rows, scan_cols) centre of mass of every pattern from each acquisition's
        bright-field disk centre (``Acquisition.center_of_mass``): two calls per shard."""
        means = self.reduce(op="mean")
        moments = self.virtual_images(calibration.moment_masks(self.same("det_shape")))
        return np.stack([calibration.center_of_mass(m, calibration.bright_field_disk(mean)[0]) for m, mean in zip(moments, means)])

    def calibrate(self, optics: Optics) -> list[Optics]:
        """``Acquisition.calibrate`` of each acquisition, from one mean-pattern call and one images call per shard."""
        det_shape = self.same("det_shape")
        disks = [calibration.bright_field_disk(mean) for mean in self.reduce(op="mean")]
        rings = np.stack([calibration.dark_field_ring(det_shape, disk) for disk in disks])
        images = self.virtual_images(np.concatenate([calibration.moment_masks(det_shape), rings]))
        return [calibration.calibrated(optics, disk, images[i, :3], images[i, 3 + i])[0] for i, disk in enumerate(disks)]

    def dpc(self, optics: Optics) -> np.ndarray:
        """(n_acquisitions, scan_rows, scan_cols) iCoM phases with the same calibrated ``optics``: one call per shard."""
        optics.require_calibration("dpc")
        return np.stack([calibration.dpc(m, optics) for m in self.virtual_images(calibration.moment_masks(self.same("det_shape")))])

    def fit_aberrations(self, optics: Optics, c10_range_A: float = 500.0) -> list[Optics]:
        """``Acquisition.fit_aberrations`` of each acquisition from the same calibrated ``optics``: one call per shard."""
        sideband_ready(optics)
        call = self.service.routed_method(self.names, "fit_aberrations", optics, float(c10_range_A))
        fitted = QueryFuture(call, lambda replies, positions: [fitted["optics"] for fitted in ordered(replies, positions)])
        return finish_long(fitted, True, "fit_aberrations", len(self))

    def parallax(self, optics: Optics, upsampling: int = 2, wait: bool = True):
        """(n_acquisitions, scan_rows * u, scan_cols * u) tilt-corrected bright fields: one call per shard."""
        sideband_ready(optics)
        check_upsampling(upsampling)
        return finish_long(QueryFuture(self.service.routed_method(self.names, "parallax", optics, upsampling), in_order), wait, "parallax", len(self))

    def ssb(self, optics: Optics, wait: bool = True):
        """(n_acquisitions, scan_rows, scan_cols) SSB phases with the same calibrated ``optics``: one call per shard."""
        sideband_ready(optics)
        return finish_long(QueryFuture(self.service.routed_method(self.names, "ssb", optics), in_order), wait, "ssb", len(self))

    def direct_ptycho(self, optics: Optics, method: str = "phase", upsampling="auto", strength: float = 0.1, wait: bool = True):
        """Direct ptychography of every acquisition with the same calibrated ``optics`` (see
        ``Acquisition.direct_ptycho``): one DirectResult with ``phase`` (and ``amplitude``) of shape
        (n_acquisitions, scan_rows * u, scan_cols * u); one call per shard."""
        call = self.service.routed_method(self.names, "direct_ptycho", optics, *direct_arguments(optics, method, upsampling, strength))
        return finish_long(QueryFuture(call, lambda replies, positions: stacked(ordered(replies, positions))), wait, "direct_ptycho", len(self))

    def release(self) -> None:
        """Release every acquisition of the series."""
        for acq in self.acquisitions:
            acq.release()

    def __repr__(self) -> str:
        """One line: how many, their names (the first few and the last) and on how many shards."""
        names = self.names if len(self) <= 6 else [*self.names[:4], "...", self.names[-1]]
        owners = len({a.owner for a in self.acquisitions})
        return f"Series({len(self)} acquisition{'s' * (len(self) != 1)}: {', '.join(names)} on {owners} shard{'s' * (owners != 1)})"
