"""Client-side handles: a Series (acquisitions spread over shards) and an Acquisition (a series of one).

Handles hold names and records; every query is a registered query type (``queries``) asked of the owning
shards, one call per shard, and assembled exactly on the client. Each query is written once, here on
``Series``; an ``Acquisition`` answers the same methods with its own part of the result (``Query.single``)
and adds the calls of one acquisition (append, save, release, info).
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from dask.utils import format_bytes

from ..io.export import Calibration
from ..phase.direct import DirectResult
from ..phase.optics import Optics
from ..queries import calibration
from ..queries.base import Query, lookup
from ..queries.direct import DirectPtycho
from ..queries.fit import FitAberrations
from ..queries.parallax import Parallax
from ..queries.reductions import Checksum, Frame, Reduce
from ..queries.sideband import SSB
from ..queries.virtual_images import VirtualImages
from ..resident.base import AcquisitionShape
from .arrays import CHUNK_BYTES, as_dask
from .calls import QueryFuture
from . import progress
from .progress import compiling_on, waited
from .shard import Shard

if TYPE_CHECKING:
    from .service import Service


class Series(Sequence):
    """An ordered list of acquisitions spread across shards; queries make one call per shard."""

    def __init__(self, service: "Service", acquisitions: list["Acquisition"]):
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

    def plain(self) -> "Series":
        """This handle as a plain Series (an Acquisition's series of one): the shape composite queries work on."""
        return self

    def shaped(self, query: Query | None, result: Any) -> Any:
        """The result of ``query`` (None: a composite of queries, one part per acquisition) as this handle
        gives it: a series' whole."""
        return result

    def ask(self, query: type[Query] | str, *args, wait: bool = True, **kwargs):
        """Ask a query type (a registered ``qd.Query`` subclass, or its name) of this handle's acquisitions:
        its arguments are checked here, one call goes to each owning shard, and its ``merge`` assembles the
        replies (an Acquisition gets its own part). ``wait=False``: a QueryFuture. A call shows a progress bar once
        it has run a second (a long query's counts its acquisitions; any says when its owners are compiling)."""
        kind = lookup(query) if isinstance(query, str) else query
        asked = kind(self.plain(), *args, **kwargs)
        future = QueryFuture(self.service.router.ask(asked, self.names),
                             lambda replies, positions: self.shaped(asked, asked.merge(replies, positions)))
        if not wait:
            return future
        if not kind.long and concurrent.futures.wait([future.future], timeout=progress.DELAY).done:
            return future.result()  # a quick call: no bar
        owners = {a.owner for a in self.acquisitions}
        return waited(future, f"{kind.name} {self.names[0] if len(self) == 1 else ''}".strip(), len(self), "acquisition",
                      compiling=lambda: compiling_on(self.service.router, owners))

    # -- queries (each also an Acquisition's, for its one image) ----------------

    def virtual_images(self, masks, wait: bool = True, bin: int = 1):
        """(n_acquisitions, scan_rows, scan_cols) for one 2-D mask; (n_acquisitions, n_masks, ...) for a
        stack; exact (uint32, uint64 where a sum could exceed 2**32, int64 signed, float64 weights).
        ``bin`` > 1: thumbnails, each image summed over bin x bin squares of scan positions where it is
        made (scan_rows // bin, scan_cols // bin; 64-bit sums)."""
        return self.ask(VirtualImages, masks, None, bin, wait=wait)

    def reduce(self, roi=None, op: str = "sum", total: bool = False, wait: bool = True):
        """One pattern per acquisition (n, det_rows, det_cols) over a bool scan ROI (None: all): "sum"
        (uint64; int64 signed), "mean" (float64), "max" (native); ``total=True``: the exact reduction over
        the whole series."""
        return self.ask(Reduce, roi, op, total, wait=wait)

    def frame(self, row: int, col: int, wait: bool = True):
        """The diffraction pattern at scan position (row, col) of each acquisition, native dtype."""
        return self.ask(Frame, row, col, wait=wait)

    def checksum(self):
        """SHA-256 hex digest of the counts of each acquisition (C order, native dtype, 4-D shape), the same
        for every reader and layout: compare it with ``hashlib.sha256(array.tobytes()).hexdigest()``."""
        return self.ask(Checksum)

    def center_of_mass(self, center: tuple[float, float] | None = None) -> np.ndarray:
        """(n_acquisitions, 2, scan_rows, scan_cols) float64 centre of mass (row, col) of every pattern, in
        detector pixels from ``center`` (default: each one's bright-field disk centre), from exact moment images."""
        return self.shaped(None, calibration.center_of_mass(self.plain(), center))

    def calibrate(self, optics: Optics):
        """``optics`` with det_sampling_mrad (from the bright-field disk radius, unless given), bf_center_px,
        rotation_deg and flip (least CoM curl, the 180 deg twin by the iCoM-ADF sign, unless given) filled
        in, for each acquisition; the rotation is an estimate, its standard error in ``uncertainties``:
        ``fit_aberrations`` refines it."""
        return self.shaped(None, calibration.calibrate(self.plain(), optics))

    def dpc(self, optics: Optics) -> np.ndarray:
        """(n_acquisitions, scan_rows, scan_cols) iCoM (integrated centre of mass) phases in rad, mean 0,
        float64, with calibrated ``optics``."""
        return self.shaped(None, calibration.dpc(self.plain(), optics))

    def ssb(self, optics: Optics, wait: bool = True):
        """(n_acquisitions, scan_rows, scan_cols) aberration-corrected single-sideband phases (rad, mean 0,
        float32) with calibrated ``optics`` (``calibrate``), computed on the owners; their preparations
        are kept there, so other aberrations cost only the final sum."""
        return self.ask(SSB, optics, wait=wait)

    def parallax(self, optics: Optics, upsampling: int = 2, wait: bool = True):
        """(n_acquisitions, scan_rows * u, scan_cols * u) tilt-corrected bright fields with contrast
        correction, float32, mean 0, with calibrated ``optics`` carrying the aberrations (``fit_aberrations``)."""
        return self.ask(Parallax, optics, upsampling, wait=wait)

    def fit_aberrations(self, optics: Optics, c10_range_A: float = 500.0):
        """``optics`` (calibrated) of each acquisition with the defocus C10 and twofold astigmatism C12,
        phi12 that maximise the coherent SSB signal (robust on crystals), searched over C10 within
        +/- ``c10_range_A`` of the given one; their standard errors in ``uncertainties``."""
        return self.ask(FitAberrations, optics, c10_range_A)

    def direct_ptycho(self, optics: Optics, method: str = "phase", upsampling="auto", strength: float = 0.1,
                      wait: bool = True) -> DirectResult:
        """Regularized direct ptychography on a grid ``upsampling`` times finer than the scan ("auto": the
        smallest whose Nyquist covers 2 alpha / lambda), with calibrated ``optics`` carrying the aberrations:
        a ``DirectResult`` with ``phase`` (and ``amplitude`` for method "complex"), float32
        (n_acquisitions, scan_rows * u, scan_cols * u). The equations are prepared on the owners once per
        optics and upsampling for each method, so another ``strength`` only re-solves."""
        return self.ask(DirectPtycho, optics, method, upsampling, strength, wait=wait)

    def release(self) -> list[str]:
        """Release every acquisition of the series, in whatever state (``Service.release``); what was done to each."""
        return [acq.release() for acq in self.acquisitions]

    def __repr__(self) -> str:
        """One line: how many, their names (the first few and the last) and on how many shards."""
        names = self.names if len(self) <= 6 else [*self.names[:4], "...", self.names[-1]]
        owners = len({a.owner for a in self.acquisitions})
        return f"Series({len(self)} acquisition{'s' * (len(self) != 1)}: {', '.join(names)} on {owners} shard{'s' * (owners != 1)})"


class Acquisition(AcquisitionShape, Series):
    """One resident acquisition: a series of one, whose queries give its own image, pattern or result."""

    def __init__(self, service: "Service", record: dict):
        self.service = service
        self.record = dict(record)
        self.acquisitions = [self]
        service.router.owners[self.name] = record["owner"]

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
        return self.service.router.owners.get(self.name, self.record["owner"])

    @property
    def nbytes(self) -> int:
        return int(self.record["nbytes"])

    @property
    def positions(self) -> np.ndarray | None:
        """(n, 2) float64 (row, col) in scan pixels of each scan position of a scan that is not a raster (a
        Direct Electron movie of custom positions), held as one scan row (1, n) in the order recorded: its
        queries give (1, n) values in this order. None for a raster."""
        kept = self.record.get("positions")
        return None if kept is None else np.asarray(kept, np.float64).reshape(-1, 2)

    def plain(self) -> Series:
        return Series(self.service, [self])

    def shaped(self, query: Query | None, result: Any) -> Any:
        """An acquisition's own part of a series' result (``Query.single``; a composite's first part)."""
        return result[0] if query is None else query.single(result)

    def call(self, method: Callable, *args) -> QueryFuture:
        """Shard method ``method(name, *args)`` of one acquisition on its owner, followed when it moves."""
        future = self.service.router.routed([self.name], lambda owner, names, rows: self.service.router.send(owner, method, names[0], *args))
        return QueryFuture(future, lambda replies, positions: replies[0])

    def virtual_image(self, mask, wait: bool = True):
        """Exact virtual image (scan_rows, scan_cols) of one 2-D mask (bool, integer or float weights)."""
        if np.ndim(mask) != 2:
            raise ValueError(f"virtual_image takes one 2-D mask, got shape {np.shape(mask)} (use virtual_images for several)")
        return self.ask(VirtualImages, mask, True, wait=wait)

    def virtual_images(self, masks, wait: bool = True, bin: int = 1):
        """(n_masks, scan_rows, scan_cols) exact virtual images, all masks in one pass over the data; ``bin``
        as the series' ``virtual_images``."""
        return self.ask(VirtualImages, masks, False, bin, wait=wait)

    def reduce(self, roi=None, op: str = "sum", wait: bool = True):
        """Per detector pixel over a bool scan ROI (None: all): "sum" (uint64; int64 signed), "mean" (float64), "max" (native)."""
        return self.ask(Reduce, roi, op, False, wait=wait)

    @property
    def received(self) -> int:
        """Scan positions held so far: of a live acquisition (``svc.create``) those appended or ingested, else all."""
        return self.call(Shard.received).result()

    def append(self, frames) -> int:
        """Add ``frames`` (n, det_rows, det_cols) of this acquisition's dtype, the next n scan positions in C
        order, to a live acquisition (``svc.create``); returns the positions received. A wrong shape or dtype
        or frames past the scan raise ValueError (``LiveCounts.append``, on the owner) and add nothing."""
        return self.call(Shard.append, np.ascontiguousarray(frames)).result()

    def release(self) -> str:
        """Free this acquisition's memory on its shard and forget its name, in whatever state it is: a load or
        re-home under way is stopped (``Service.release``); what was done."""
        return self.service.release(self.name)

    def save(self, path: str | os.PathLike) -> str:
        """Write this acquisition as it is held (compressed streams as they are) to ``path``; returns the absolute path.

        The owning worker writes the file, so ``path`` must be on a file system
        it sees; :meth:`Service.load` reopens it without re-encoding.
        """
        path = os.path.abspath(os.fspath(path))
        waited(self.call(Shard.save, path), f"saving {self.name}", 1, "acquisition")
        return path

    def export(self, path: str | os.PathLike, optics: Optics | None = None) -> str:
        """Write this acquisition for other programs, in the layout the suffix of ``path`` names; returns the
        absolute path. The owning worker writes it, block by block.

        - ``.hspy`` (``.h5``, ``.hdf5``): HyperSpy's HDF5 layout, one bitshuffle-LZ4 chunk a frame, which
          HyperSpy, RosettaSciIO, LiberTEM (``ds_path="Experiments/<name>/data"``) and h5py read;
        - ``.zspy``: HyperSpy's Zarr layout (a directory store, Zarr format 3, one blosc LZ4 chunk a frame),
          which HyperSpy, RosettaSciIO, ``zarr.open`` and :meth:`Service.load` read;
        - ``.emd``: EMD 1.0 as py4DSTEM writes a DataCube with its calibration, which ``py4DSTEM.read``,
          emdfile and LiberTEM (``ds_path="<name>_root/<name>/data"``) read.

        With ``optics``, the scan step (nm), the detector pixel (mrad, once calibrated), the beam energy and the
        convergence angle go where each layout keeps them; without, every axis is in pixels.
        """
        path = os.path.abspath(os.fspath(path))
        calibration = None if optics is None else Calibration(optics.scan_step_A / 10, optics.det_sampling_mrad, optics.energy_eV / 1e3,
                                                                 optics.semiangle_mrad)
        waited(self.call(Shard.export, path, calibration), f"exporting {self.name}", 1, "acquisition")
        return path

    def to_dask(self, chunk_bytes: int = CHUNK_BYTES):
        """This acquisition as a Dask array (scan rows, scan cols, det rows, det cols) of chunks of whole scan
        rows (about ``chunk_bytes`` of counts), each asked of the owner's shard when computed (by the service's
        client, the default Dask scheduler once the service is made): ``hs.signals.Signal2D(acq.to_dask()).as_lazy()``
        and plain Dask work on it without a copy of the file. Made again after the acquisition moves."""
        return as_dask(self.name, self.owner, self.shape, self.dtype, chunk_bytes)

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
