"""Shard: the Dask actor on each worker that holds its residents and answers queries.

Every method is ``async``: Dask runs it on the worker's event loop, and the
shard hands real work to its own threads (one for queries, two for loads, each
with its own CUDA stream on a GPU), so a long load never blocks a short query
and the event loop stays free to receive the next call. Queries that read at
most a MiB (a frame, a tiny acquisition) run on the loop itself: the hop to a
thread and back would cost more than they do.
"""

from __future__ import annotations

import asyncio
import io
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
from dask.utils import format_bytes
from distributed import get_worker

from ..device import array_module, cupy_or_none, default_budget, device_info, memory_bytes, synchronize, to_host
from ..io.load import describe, inspect, read_compressed, read_dense
from ..io.registry import open_reader
from ..io.saved import describe_saved, is_saved, open_resident, save_resident
from ..io.source import Source
from ..io.stream import TcpSource
from ..phase.iterative import geometry, update
from ..resident import DenseCounts, Resident, combine_parts, feed, mask_weights
from ..resident.base import Plan, check_dtype, check_shape
from ..resident.compressed import CompressedCounts, estimated_ratio
from ..resident.live import LiveCounts, check_live_representation, start_bytes
from ..phase import direct, fit, parallax, sideband
from ..phase.direct import DirectResult
from ..phase.optics import Optics
from .layout import Layout, check_representation, check_saved_representation, choose
from .maskcache import MaskCache
from .preparedcache import PreparedCache, pixels_key


def use_own_stream() -> None:
    """Thread initializer: give this thread a non-blocking CUDA stream of its own (no-op on CPU)."""
    cp = cupy_or_none()
    if cp is not None:
        cp.cuda.Stream(non_blocking=True).use()


def held_as(dense: DenseCounts, layout: Layout) -> Resident:
    """``dense`` itself (with its index where it fits), or its compressed encoding (the dense staging copy is then dropped)."""
    if not layout.compressed:
        return dense.indexed() if layout.index else dense
    return CompressedCounts.encode(dense.name, dense.flat, dense.shape)


SIDE_STREAMS = 8
side = threading.local()


def run_together(plans: list[Plan]) -> list[np.ndarray]:
    """Answer several residents' plans at once: each starts on one of a few CUDA streams of this thread,
    so their kernels overlap (one resident's query rarely fills a GPU), then every result is collected."""
    cp = cupy_or_none()
    if cp is None or len(plans) < 2:
        return [plan() for plan in plans]
    if not hasattr(side, "streams"):
        side.streams = [cp.cuda.Stream(non_blocking=True) for _ in range(SIDE_STREAMS)]
    pending = []
    for i, plan in enumerate(plans):
        stream = side.streams[i % SIDE_STREAMS]
        with stream:
            pending.append((stream, plan.launch()))
    results = []
    for stream, finish in pending:
        stream.synchronize()
        with stream:
            results.append(finish())
    return results


def shard_key(address: str) -> str:
    """The actor key of the shard on ``address`` (the same from every client and the catalog)."""
    return f"qgpu-shard-{address}"


# Queries reading at most this many bytes run on the event loop itself: they
# take microseconds, less than handing them to the query thread and back.
INLINE_BYTES = 1 << 20


class Shard:
    """The residents of one worker (one GPU), their memory budget, and the queries on them."""

    def __init__(self, key: str, budget: int | None = None):
        self.worker = get_worker()
        self.address = self.worker.address
        self.key = key
        self.residents: dict[str, Resident] = {}
        self.reserved = 0
        self.device = device_info()
        self.requested = int(budget) if budget else None
        limit = self.worker.memory_manager.memory_limit
        self.budget = min(self.requested, memory_bytes(limit)) if self.requested else default_budget(limit)  # the client warns of a cut
        self.masks = MaskCache()
        self.prepared = PreparedCache(self.budget // 2)
        self.reconstructions: dict[str, dict[str, tuple[geometry.Geometry, Any]]] = {}  # run -> name -> (geometry, object)
        self.queries = ThreadPoolExecutor(1, thread_name_prefix="qgpu-query", initializer=use_own_stream)
        self.loads = ThreadPoolExecutor(2, thread_name_prefix="qgpu-load", initializer=use_own_stream)
        self.ingests = ThreadPoolExecutor(8, thread_name_prefix="qgpu-ingest", initializer=use_own_stream)
        self.ingesting: dict[str, str] = {}  # live acquisition -> the stream feeding it
        self.reading: dict[str, int] = {}  # acquisition being loaded -> bytes of counts read so far

    # -- bookkeeping -------------------------------------------------------

    async def start(self) -> dict:
        """Announce this shard to the catalog (idempotent); returns :meth:`info`."""
        await self.worker.scheduler.qgpu_register_shard(
            address=self.address, key=self.key, device=asdict(self.device), budget=self.budget, requested=self.requested
        )
        return await self.info()

    async def ping(self) -> None:
        """Nothing: the cheapest round trip, for measuring call overhead."""

    async def info(self) -> dict:
        """Device, budget, bytes held and the residents of this shard."""
        used = sum(r.nbytes for r in self.residents.values())
        return {
            "worker": self.address,
            "device": asdict(device_info()),
            "budget": self.budget,
            "resident_bytes": used,
            "reserved_bytes": self.reserved,
            "ssb_cache_bytes": self.prepared.nbytes,
            "ptycho_bytes": self.ptycho_bytes(),
            "acquisitions": {n: r.describe() for n, r in self.residents.items()},
        }

    def resident(self, name: str) -> Resident:
        try:
            return self.residents[name]
        except KeyError:
            raise KeyError(f"acquisition {name!r} is not resident on {self.address} (released, or never loaded)") from None

    def check_room(self, what_needs: str, nbytes: int) -> None:
        """ValueError ("<what_needs> <bytes>, but ...") before anything is allocated if ``nbytes`` more do not
        fit in the budget beside the residents, loads under way and reconstructions (kept phase preparations
        make room first)."""
        used = self.held_bytes()
        short = nbytes - (self.budget - used - self.prepared.nbytes)
        if short > 0:
            self.prepared.release(short)
        free = self.budget - used - self.prepared.nbytes
        if nbytes > free:
            raise ValueError(f"{what_needs} {format_bytes(nbytes)}, but the shard on {self.address} has "
                             f"{format_bytes(max(free, 0))} free of its {format_bytes(self.budget)} budget")

    def held_bytes(self) -> int:
        """Bytes of the budget held by residents, loads under way and reconstructions."""
        return sum(r.nbytes for r in self.residents.values()) + self.reserved + self.ptycho_bytes()

    def free_bytes(self) -> int:
        """Bytes of the budget not held (kept phase preparations make room when asked, so they count as free)."""
        return max(self.budget - self.held_bytes(), 0)

    def choose_layout(self, representation: str, shape, dtype) -> tuple[int, Callable[[DenseCounts], Layout]]:
        """(bytes to reserve, the layout for the dense counts once they are read) of a new resident: "auto"
        decides on this worker's kind and free budget now, estimating the ratio only where it matters."""
        check_representation(representation, dtype)
        dense_bytes, free = DenseCounts.held_bytes(shape, dtype), self.free_bytes()
        raw = int(np.prod(shape)) * np.dtype(dtype).itemsize
        reserve = dense_bytes if representation != "compressed" and dense_bytes <= free else raw

        def layout(dense: DenseCounts | None) -> Layout:
            """``dense``: the counts as read, or None where they are coded as read (an explicit "compressed")."""
            return choose(representation, dtype, self.device.kind, dense_bytes, free, lambda: estimated_ratio(dense.flat))

        return reserve, layout

    def admit(self, name: str, nbytes: int) -> None:
        """Reserve ``nbytes`` for a new resident, or refuse before anything is allocated."""
        if name in self.residents:
            raise ValueError(f"an acquisition named {name!r} is already resident on {self.address}")
        self.check_room(f"acquisition {name!r} needs", nbytes)
        if self.device.kind == "cuda":
            device_free = device_info().free_bytes
            if nbytes > 0.95 * device_free:
                raise ValueError(
                    f"acquisition {name!r} needs {format_bytes(nbytes)}, but the GPU of {self.address} has only "
                    f"{format_bytes(device_free)} free (shared with other processes?)"
                )
        self.reserved += nbytes

    async def run_in(self, pool: ThreadPoolExecutor, fn: Callable, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def query(self, nbytes: int, fn: Callable, *args) -> Any:
        """Run a query: inline when it reads at most INLINE_BYTES (a thread hop would cost more), else on the query thread."""
        if nbytes <= INLINE_BYTES:
            return fn(*args)
        return await self.run_in(self.queries, fn, *args)

    # -- loading -----------------------------------------------------------

    async def inspect(self, sources: list[Source]) -> list[dict]:
        """Shape, dtype and bytes of each source as this worker sees the files."""
        return await self.run_in(self.loads, lambda: [inspect(s) for s in sources])

    async def load(self, name: str, source: Source, representation: str = "auto") -> dict:
        """Read ``source`` into a new resident named ``name`` (the file is opened once; a saved resident is reopened as saved)."""
        if await self.run_in(self.loads, is_saved, source):
            return await self.load_saved(name, source, representation)
        reader = await self.run_in(self.loads, open_reader, source)
        try:
            meta = describe(reader)
            reserve, layout = self.choose_layout(representation, meta["shape"], meta["dtype"])
            frame_bytes = meta["raw_bytes"] // (meta["shape"][0] * meta["shape"][1])

            def seen(frames: int) -> None:
                self.reading[name] = frames * frame_bytes

            def read() -> tuple[Resident, str]:
                try:
                    if representation == "compressed" and array_module() is np:  # coded as read: host memory never holds the dense counts
                        chosen = layout(None)
                        resident = read_compressed(name, reader, progress=seen)
                    else:
                        dense = read_dense(name, reader, progress=seen)
                        chosen = layout(dense)
                        resident = held_as(dense, chosen)
                except ValueError as err:
                    if source.path in str(err):
                        raise
                    raise ValueError(f"{source.path!r}: {err}") from err
                synchronize()
                return resident, chosen.reason

            return await self.add(name, reserve, read, source.describe(), representation)
        finally:
            self.reading.pop(name, None)
            reader.close()

    async def load_progress(self, name: str) -> int:
        """Bytes of counts read so far by the load of ``name`` under way here (0 if none is)."""
        return self.reading.get(name, 0)

    async def load_saved(self, name: str, source: Source, representation: str) -> dict:
        """Reopen the resident saved at ``source.path`` as it was held, admitted by its resident bytes."""
        meta = await self.run_in(self.loads, describe_saved, source)
        check_saved_representation(representation, meta["layout"])

        def reopen() -> tuple[Resident, str]:
            resident = open_resident(name, Path(source.path).expanduser())
            synchronize()
            if resident.nbytes != meta["load_bytes"]:
                raise ValueError(f"{source.path!r} changed while it was loaded (its arrays no longer match the header read first)")
            return resident, f"{meta['layout']}: reopened as it was saved"

        return await self.add(name, meta["load_bytes"], reopen, source.describe(), representation)

    async def save(self, name: str, path: str) -> dict:
        """Write resident ``name`` as it is held to ``path`` (on this worker's file system)."""
        nbytes = await self.run_in(self.loads, save_resident, self.resident(name), path)
        return {"path": path, "bytes": nbytes}

    async def put(self, name: str, array: np.ndarray, representation: str = "auto") -> dict:
        """Hold an array sent by a client as a new resident named ``name``."""
        array = np.asarray(array)
        shape = check_shape(array.shape)
        dtype = check_dtype(array.dtype)
        reserve, layout = self.choose_layout(representation, shape, dtype)

        def place() -> tuple[Resident, str]:
            dense = DenseCounts.empty(name, shape, dtype)
            dense.write(0, array.reshape(-1, shape[2], shape[3]))
            chosen = layout(dense)
            resident = held_as(dense, chosen)
            synchronize()
            return resident, chosen.reason

        return await self.add(name, reserve, place, None, representation)

    async def add(self, name: str, nbytes: int, build: Callable[[], tuple[Resident, str]], source: dict | None, representation: str) -> dict:
        """Admit ``nbytes``, claim the name in the catalog, build the resident (and the reason for its layout),
        check that it fits if it came out larger than admitted, commit; undo everything on failure."""
        self.admit(name, nbytes)
        try:
            await self.worker.scheduler.qgpu_claim(name=name, owner=self.address, nbytes=nbytes)
        except BaseException:
            self.reserved -= nbytes
            raise
        try:
            resident, reason = await self.run_in(self.loads, build)
            if resident.nbytes > nbytes:
                self.check_room(f"acquisition {name!r} ({reason}) needs", resident.nbytes - nbytes)
            self.forget(name)
            self.residents[name] = resident
            record = {**resident.describe(), "source": source, "representation": representation, "layout_reason": reason}
            await self.worker.scheduler.qgpu_commit(name=name, owner=self.address, record=record)
            return record
        except BaseException:
            self.residents.pop(name, None)
            await self.worker.scheduler.qgpu_drop(name=name, owner=self.address)
            self.free_device_memory()
            raise
        finally:
            self.reserved -= nbytes

    # -- live acquisitions ------------------------------------------------------

    async def create(self, name: str, shape: tuple, dtype: str, representation: str) -> dict:
        """Hold a new, empty live acquisition ``name`` that grows by ``append`` and ``ingest``."""
        shape, dtype = check_shape(shape), check_dtype(dtype)
        check_live_representation(representation, dtype)

        def build() -> tuple[Resident, str]:
            resident = LiveCounts(name, shape, dtype, representation, array_module())
            resident.room = lambda nbytes: self.check_room(f"live acquisition {name!r} needs", nbytes)
            synchronize()
            return resident, f"{representation}: asked for"

        return await self.add(name, start_bytes(shape, dtype, representation), build, None, representation)

    def live(self, name: str) -> LiveCounts:
        resident = self.resident(name)
        if not isinstance(resident, LiveCounts):
            raise ValueError(f"acquisition {name!r} is not live: it was loaded, or all its {resident.n_frames} scan positions have arrived")
        return resident

    async def append(self, name: str, frames: np.ndarray) -> int:
        """Add the next scan positions' frames to live acquisition ``name``; the positions received."""
        resident = self.live(name)
        if name in self.ingesting:
            raise ValueError(f"acquisition {name!r} is ingesting from {self.ingesting[name]}: appends would interleave with its frames")
        received = await self.run_in(self.loads, resident.append, frames)
        await self.settle(name)
        return received

    async def received(self, name: str) -> int:
        """Scan positions held so far (all of them for an acquisition that is not live)."""
        resident = self.resident(name)
        return resident.received if isinstance(resident, LiveCounts) else resident.n_frames

    async def ingest(self, name: str, source: TcpSource) -> dict:
        """Read ``source``'s frames into live acquisition ``name`` here, as they come (one stream at a time);
        when the stream ends early or breaks, what arrived is kept (and the error raised). Releasing the
        acquisition drops the stream."""
        resident = self.live(name)
        if name in self.ingesting:
            raise ValueError(f"acquisition {name!r} is already ingesting from {self.ingesting[name]}: one stream at a time keeps its frames in order")
        self.ingesting[name] = source.describe()

        def pull() -> int:
            frames = 0
            for block in source.frames(resident.det_shape, resident.dtype, resident.xp):
                if self.residents.get(name) is not resident:
                    raise ValueError(f"acquisition {name!r} was released while {source.describe()} streamed into it: the stream was dropped")
                resident.append(block)
                frames += len(block)
            return frames

        try:
            frames = await self.run_in(self.ingests, pull)
        finally:
            del self.ingesting[name]
            await self.settle(name)
        return {"frames": frames, "received": resident.received}

    async def settle(self, name: str) -> None:
        """A live acquisition whose every position has arrived becomes the plain resident it now is (and
        the catalog's record says so): saved, fed and reconstructed as one loaded from a file."""
        resident = self.residents.get(name)
        if isinstance(resident, LiveCounts) and resident.complete:
            index = resident.layout == "dense" and DenseCounts.index_bytes(resident.shape, resident.dtype) <= self.free_bytes()
            done = await self.run_in(self.loads, resident.finished, index)
            if self.residents.get(name) is resident:
                self.residents[name] = done
                self.forget(name)
                reason = f"{resident.layout}: asked for" + ("" if index or resident.layout != "dense" else
                                                           "; its index did not fit the budget, so every query reads the counts")
                await self.worker.scheduler.qgpu_commit(name=name, owner=self.address,
                                                        record={**done.describe(), "source": None, "live": False, "layout_reason": reason})

    async def restore(self, name: str, how: dict) -> dict:
        """Hold ``name`` again after its shard was lost, or take it over from another shard (the catalog
        names this shard its target): from its source file or saved resident, else from the bytes the
        catalog kept of a put array. ``how``: source (or None), layout, copy (or None)."""
        if how["source"] is not None:
            described = dict(how["source"])
            if described["scan_shape"] is not None:
                described["scan_shape"] = tuple(described["scan_shape"])
            return await self.load(name, Source(**described), how["layout"])
        if how["copy"] is not None:
            array = np.load(io.BytesIO(how["copy"]), allow_pickle=False)
            return await self.put(name, array, how["layout"])
        raise ValueError(f"acquisition {name!r} has no source file and no copy to be held again from")

    def forget(self, name: str) -> None:
        """Drop the mask plans and phase preparations kept for ``name`` (released, moved, or its name reused)."""
        self.masks.forget(name)
        self.prepared.forget(name)

    async def discard(self, name: str) -> None:
        """Free ``name`` here without touching the catalog: it has moved to another shard."""
        if self.residents.pop(name, None) is not None:
            self.forget(name)
            await self.run_in(self.queries, self.free_device_memory)

    async def release(self, name: str) -> None:
        """Drop ``name`` from this shard and the catalog, returning its device memory."""
        self.resident(name)
        del self.residents[name]
        self.forget(name)
        await self.worker.scheduler.qgpu_drop(name=name, owner=self.address)
        await self.run_in(self.queries, self.free_device_memory)

    def free_device_memory(self) -> None:
        """Hand CuPy's cached blocks back to the device, so freed residents show as free memory."""
        cp = cupy_or_none()
        if cp is not None:
            cp.get_default_memory_pool().free_all_blocks()

    # -- queries -----------------------------------------------------------

    async def virtual_images(self, names: list[str], digest: str, masks: np.ndarray | None = None) -> np.ndarray:
        """(len(names), n_masks, scan_rows, scan_cols) exact virtual images of these residents.

        ``masks`` comes with its ``digest`` the first time; later calls send the
        digest alone (MaskNotCached if this shard no longer holds the stack).
        """
        residents = [self.resident(n) for n in names]
        stack = self.masks.stack(digest, masks)

        def compute() -> np.ndarray:
            weights: dict[tuple, Any] = {}

            def make(r: Resident) -> Callable:
                key = (r.det_shape, r.dtype)
                if key not in weights:
                    weights[key] = mask_weights(stack, r.det_shape, r.dtype)
                return r.plan_virtual_images(weights[key])

            return np.stack(run_together([self.masks.plan(r.name, digest, lambda r=r: make(r)) for r in residents]))

        return await self.query(sum(r.raw_bytes for r in residents), compute)

    async def reduce(self, names: list[str], roi, op: str, total: bool) -> list[tuple[np.ndarray, int]]:
        """Exact partials (pattern, frame count) per resident, or one combined partial with ``total``."""
        residents = [self.resident(n) for n in names]

        def compute() -> list[tuple[np.ndarray, int]]:
            parts = [r.reduce_parts(roi, op) for r in residents]
            return [combine_parts(parts, op)] if total else parts

        return await self.query(sum(r.raw_bytes for r in residents), compute)

    async def frame(self, name: str, row: int, col: int) -> np.ndarray:
        """One diffraction pattern, native dtype."""
        resident = self.resident(name)
        return await self.query(resident.frame_len * resident.dtype.itemsize, resident.frame, row, col)

    async def ssb(self, names: list[str], optics: Optics) -> list[np.ndarray]:
        """Aberration-corrected SSB phase (float32 (scan_rows, scan_cols), rad) of each resident; G of the
        bright-field pixels is kept, so other aberrations on the same calibration cost only the final sum."""
        residents = [self.resident(n) for n in names]

        def compute() -> list[np.ndarray]:
            images = [to_host(sideband.phase(*self.spectrum(r, optics), optics, r.xp)) for r in residents]
            synchronize()
            return images

        return await self.run_in(self.queries, compute)

    def spectrum(self, resident: Resident, optics: Optics) -> tuple[sideband.Spectrum, np.ndarray, np.ndarray]:
        """(G, k_y, k_x) of a resident's bright-field pixels under ``optics``' calibration, G from the cache."""
        indices, ky, kx = sideband.bright_field_pixels(optics, resident.det_shape)
        spec, _ = self.prepared.get(resident.name, "G:" + pixels_key(indices), lambda: sideband.spectrum(resident, indices))
        return spec, ky, kx

    async def parallax(self, names: list[str], optics: Optics, upsampling: int) -> list[np.ndarray]:
        """Contrast-corrected tilt-corrected bright field of each resident (``phase.parallax``), float32."""
        residents = [self.resident(n) for n in names]

        def compute() -> list[np.ndarray]:
            images = []
            for r in residents:
                indices, ky, kx = sideband.bright_field_pixels(optics, r.det_shape)
                images.append(to_host(parallax.parallax(r.pixel_images(indices), r.scan_shape, ky, kx, optics, upsampling, r.xp)))
            synchronize()
            return images

        return await self.run_in(self.queries, compute)

    async def fit_aberrations(self, names: list[str], optics: Optics, c10_range_A: float) -> list[dict]:
        """Rotation, defocus and twofold astigmatism of each resident by the coherent SSB signal (``phase.fit``)."""
        residents = [self.resident(n) for n in names]

        def compute() -> list[dict]:
            fits = []
            for r in residents:

                def k_at(rotation_deg: float, det_shape=r.det_shape) -> tuple[np.ndarray, np.ndarray]:
                    return sideband.bright_field_pixels(optics.with_(rotation_deg=rotation_deg), det_shape)[1:]

                fits.append(fit.fit(self.spectrum(r, optics)[0], k_at, optics, c10_range_A, r.xp))
            return fits

        return await self.run_in(self.queries, compute)

    async def direct_ptycho(self, names: list[str], optics: Optics, method: str, upsampling, strength: float) -> list[DirectResult]:
        """Regularized direct ptychography of each resident (``phase.direct``). Its equations are kept per
        acquisition, optics and upsampling, for each method: a strength change only re-solves; another
        optics or upsampling drops both methods' equations."""
        residents = [self.resident(n) for n in names]
        u = direct.upsampling_of(optics, upsampling)
        key = "direct:" + direct.optics_key(optics, u)

        def prepare(r: Resident) -> direct.Prepared:
            """The equations of ``r``, refused before any work if the cache could not hold them."""
            found = direct.aliases(r.scan_shape, optics, u, r.xp)
            need = direct.equations_bytes(found, method)
            if need > self.prepared.limit:
                raise ValueError(f"direct ptychography of {r.name!r} at upsampling {u} ({method}) needs {format_bytes(need)} for its "
                                 f"equations, more than the {format_bytes(self.prepared.limit)} this shard keeps for phase preparations: "
                                 "use a smaller upsampling")
            return direct.prepare(*self.spectrum(r, optics), optics, found, method, r.xp)

        def compute() -> list[DirectResult]:
            results = []
            for r in residents:
                self.prepared.retain(r.name, "direct:", key)
                prep, made = self.prepared.get(r.name, f"{key}:{method}", lambda r=r: prepare(r))
                result = direct.solve(prep, strength, r.xp)
                results.append(replace(result, phase=to_host(result.phase), amplitude=to_host(result.amplitude), prepared=made))
            synchronize()
            return results

        return await self.run_in(self.queries, compute)

    async def checksum(self, name: str) -> str:
        """SHA-256 of the counts of ``name`` (see Resident.checksum), on the load thread: it reads everything."""
        resident = self.resident(name)
        return await self.run_in(self.loads, resident.checksum)

    # -- iterative ptychography (``qgpu_dask.ptycho``) ---------------------

    async def ptycho_start(self, names: list[str], run: str, optics: Optics, objects: list | None) -> None:
        """Keep an object per resident for reconstruction ``run``: ones, or the given NumPy ``objects``."""
        residents = [self.resident(n) for n in names]
        geos = [geometry.geometry(optics, r.scan_shape, r.det_shape) for r in residents]
        held = sum(obj.nbytes for n, (_, obj) in self.reconstructions.get(run, {}).items() if n not in names)
        need = sum(8 * g.object_shape[0] * g.object_shape[1] for g in geos) + held  # complex64 objects, replacing any of these names
        self.check_room(f"the objects of reconstruction {run[:8]} need", need - self.ptycho_bytes(run))

        def start():
            state = {}
            for i, (r, geo) in enumerate(zip(residents, geos)):
                if objects is None:
                    obj = r.xp.ones(geo.object_shape, np.complex64)
                else:
                    if objects[i].shape != geo.object_shape:
                        raise ValueError(f"the object given for {r.name!r} has shape {objects[i].shape}, the scan needs {geo.object_shape}")
                    obj = r.xp.asarray(objects[i], dtype=np.complex64)
                state[r.name] = (geo, obj)
            self.reconstructions.setdefault(run, {}).update(state)

        await self.run_in(self.queries, start)

    def ptycho_bytes(self, run: str | None = None) -> int:
        """Device bytes of the objects of reconstruction ``run`` (default: of every run) held here."""
        runs = [self.reconstructions.get(run, {})] if run is not None else list(self.reconstructions.values())
        return sum(obj.nbytes for state in runs for _, obj in state.values())

    def reconstruction(self, run: str, name: str) -> tuple[geometry.Geometry, Any]:
        try:
            return self.reconstructions[run][name]
        except KeyError:
            raise KeyError(f"no state of reconstruction {run!r} for {name!r} on {self.address} (a lost worker, or never started)") from None

    async def ptycho_pass(self, names: list[str], run: str, probe: np.ndarray, batch: int, depth: int, step: float) -> list[update.Pass]:
        """One pass over each resident's scan positions, its object updated in place with ``probe``; the
        probe's sums of each (``phase.iterative.update``)."""
        residents = [self.resident(n) for n in names]
        states = [self.reconstruction(run, n) for n in names]

        def one_pass():
            passes = []
            for r, (geo, obj) in zip(residents, states):
                blocks = r.feed(batch, amplitude=False, depth=depth)  # counts: the projection takes their roots
                passes.append(update.frame_pass(obj, r.xp.asarray(probe), blocks, geo, step, r.xp))
            return passes

        return await self.run_in(self.queries, one_pass)

    async def ptycho_objects(self, names: list[str], run: str) -> list[np.ndarray]:
        """The objects of ``run`` for ``names``, as NumPy."""
        states = [self.reconstruction(run, n) for n in names]
        return await self.run_in(self.queries, lambda: [to_host(obj) for _, obj in states])

    async def ptycho_end(self, names: list[str], run: str) -> None:
        """Drop the state of reconstruction ``run`` for ``names`` (idempotent)."""
        state = self.reconstructions.get(run, {})
        for name in names:
            state.pop(name, None)
        if not state:
            self.reconstructions.pop(run, None)

    async def run(self, name: str, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """``fn(resident, *args, **kwargs)`` next to the data; CuPy results come back as NumPy."""
        resident = self.resident(name)
        result = await self.run_in(self.queries, lambda: to_host(fn(resident, *args, **kwargs)))
        await self.settle(name)  # worker-side code may have appended the last frames
        return result

    async def run_series(self, names: list[str], positions: list[int], fn: Callable, args: tuple, kwargs: dict) -> list:
        """``fn(ShardSeries of names, *args, **kwargs)`` next to this shard's part of a series, as a one-item
        list (a routed reply per shard); CuPy results come back as NumPy."""
        part = feed.ShardSeries([self.resident(n) for n in names], positions)
        result = await self.run_in(self.queries, lambda: to_host(fn(part, *args, **kwargs)))
        for name in names:  # worker-side code may have appended the last frames of live ones
            await self.settle(name)
        return [result]
