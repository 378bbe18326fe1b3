"""Service: the client API. Starts or attaches to a cluster, places acquisitions, routes queries."""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import socket
import sys
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
from dask.utils import format_bytes
from distributed import Client
from distributed.comm.addressing import parse_address, parse_host_port
from tqdm.auto import tqdm

from ..config import settings
from ..device import has_gpu, parse_bytes
from ..io.source import Source
from ..io.stream import FrameSource
from ..resident.base import check_dtype, check_shape
from ..queries.functions import Function, ShardFunction
from ..resident.compressed import check_layout
from ..resident.live import LIVE_LAYOUTS, start_bytes
from .acquisition import Acquisition, Series
from .calls import QueryFuture
from .catalog import PLUGIN_NAME, Catalog, check_backup_room
from .info import ServiceInfo
from .layout import CHOICES, check_saved
from .placement import Placer, place
from .progress import LoadProgress, compiling_on, waited
from .routing import Router
from .shard import Shard, shard_key
from .spawn import check_main_guard

PathLike = str | os.PathLike
CONNECT_WAIT = 5.0  # seconds connect waits for a scheduler's port to answer
STOP_SECONDS = 60.0  # how long a closing local cluster waits for each shard to drop what it holds
SCHEDULER_FILE_BYTES = 2**20  # far above a scheduler file's few hundred bytes of JSON
INSPECT_AHEAD = 8  # sources of a list inspected before their loads start; the next ones are inspected while those load


def check_listening(address: str, what: str) -> None:
    """ConnectionError within CONNECT_WAIT seconds unless something listens at a scheduler ``address`` (tcp or
    tls; other transports are left to Dask), rather than the Client's silent wait of its 30 s timeout."""
    scheme, location = parse_address(address)
    if scheme not in ("tcp", "tls"):
        return
    host, port = parse_host_port(location, default_port=8786)
    try:
        socket.create_connection((host, port), timeout=CONNECT_WAIT).close()
    except OSError as err:
        reason = err.strerror or f"no answer within {CONNECT_WAIT:g} s"
        raise ConnectionError(f"no scheduler at {what} ({reason}): start one (dask scheduler) or check the address") from None


def scheduler_address(scheduler_file: PathLike) -> str:
    """The address in a scheduler file; FileNotFoundError or ValueError naming the file at once (the Client
    would wait for the file to appear). A file larger than SCHEDULER_FILE_BYTES is refused by its size, unread."""
    path = Path(scheduler_file).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no scheduler file {str(path)!r}: give the file that `dask scheduler --scheduler-file` wrote")
    size = path.stat().st_size
    not_one = f"{str(path)!r} is not a scheduler file (JSON with the scheduler's \"address\""
    if size > SCHEDULER_FILE_BYTES:
        raise ValueError(f"{not_one}, not {format_bytes(size)}): give the file that `dask scheduler --scheduler-file` wrote")
    try:
        return str(json.loads(path.read_bytes())["address"])
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{not_one}): give the file that `dask scheduler --scheduler-file` wrote") from None


class Service:
    """Acquisitions resident on the workers of a Dask cluster, and exact queries on them."""

    def __init__(self, client: Client, *, budget: int | str | None = None, cluster=None):
        self.client = client
        self.cluster = cluster
        self.closed = False
        self.budget = parse_bytes(budget)
        self.router = Router(client, self.check_open)
        client.sync(self.router.pool.start)
        client.register_plugin(Catalog(), name=PLUGIN_NAME)
        self.ensure_shards()

    # -- starting and stopping ----------------------------------------------

    @classmethod
    def local(cls, *, budget: int | str | None = None, **cluster_kwargs) -> "Service":
        """The embedded default cluster: one worker per GPU when CuPy sees GPUs, else CPU worker processes.

        Keyword arguments go to ``LocalCUDACluster`` / ``LocalCluster`` (e.g. ``n_workers=3``);
        ``budget`` caps each shard's resident bytes (default: most of its device's memory). Worker processes
        import the main script again: a script calls this under ``if __name__ == "__main__":`` (RuntimeError
        at once otherwise).
        """
        check_main_guard("qd.Service.local()", sys._getframe(1))
        if has_gpu():
            from dask_cuda import LocalCUDACluster

            cluster = LocalCUDACluster(**cluster_kwargs)
        else:
            from distributed import LocalCluster

            cluster_kwargs.setdefault("processes", True)
            cluster_kwargs.setdefault("threads_per_worker", 1)
            cluster = LocalCluster(**cluster_kwargs)
        try:
            client = Client(cluster, direct_to_workers=True)
            return cls(client, budget=budget, cluster=cluster)
        except BaseException:
            cluster.close()
            raise

    @classmethod
    def connect(cls, address: str | None = None, *, scheduler_file: PathLike | None = None, budget: int | str | None = None, **client_kwargs) -> "Service":
        """Attach to a running scheduler by address (``tcp://host:8786``) or ``scheduler_file``. A missing
        scheduler file is a FileNotFoundError at once, an address where nothing listens a ConnectionError
        within CONNECT_WAIT seconds."""
        if (address is None) == (scheduler_file is None):
            raise ValueError("give exactly one of address or scheduler_file")
        client_kwargs.setdefault("direct_to_workers", True)
        if scheduler_file is not None:
            found = scheduler_address(scheduler_file)
            check_listening(found, f"{found}, the address in {os.fspath(scheduler_file)!r} (a scheduler that has stopped?)")
            client = Client(scheduler_file=os.fspath(scheduler_file), **client_kwargs)
        else:
            check_listening(address, address)
            client = Client(address, **client_kwargs)
        return cls(client, budget=budget)

    def close(self) -> None:
        """Disconnect; a cluster started by :meth:`local` is shut down with its residents. Later calls raise
        RuntimeError (:meth:`check_open`); a second close does nothing."""
        if self.closed:
            return
        if self.cluster is not None and self.client.status == "running":
            self.stop_shards()
        self.closed = True
        if self.client.status == "running":
            self.client.sync(self.router.close)
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def stop_shards(self) -> None:
        """Before a cluster started by :meth:`local` shuts down: every shard drops its residents and copies, so
        each worker exits within the few seconds its nanny waits (one holding 127 acquisitions and their copies
        did not, and closing the cluster failed). A shard that cannot be reached is left to the shutdown."""
        try:
            stops = [self.router.call(w, Shard.stop) for w in self.state()["shards"]]
            for stop in stops:
                stop.result(timeout=STOP_SECONDS)
        except Exception:  # a worker already gone or stuck: the cluster's shutdown ends it either way
            pass

    def __enter__(self) -> "Service":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- shards and the catalog -------------------------------------------------

    def check_open(self) -> None:
        """RuntimeError once this service is closed (its client's event loop is gone)."""
        if self.closed or self.client.status == "closed":
            raise RuntimeError("this service is closed (svc.close(), or the end of its with block): "
                               "start another with qd.Service.local() or qd.Service.connect(...)")

    def state(self) -> dict:
        """The catalog as the scheduler holds it: shards, acquisitions, recent events, bytes of put backups."""
        self.check_open()
        return self.client.sync(self.client.scheduler.qgpu_state)

    def ensure_shards(self) -> dict:
        """Start a shard actor on every worker that has none (idempotent across clients); warn where a shard
        holds less than the budget asked for (more than its worker's memory). Returns the catalog's ``state``
        with every shard in it (one ask of the scheduler where none was missing)."""
        state = self.state()
        missing = [w for w in state["workers"] if w not in state["shards"]]
        if not missing:
            return state
        futures = {
            w: self.client.submit(Shard, shard_key(w), self.budget, actor=True, workers=[w], key=shard_key(w))
            for w in missing
        }
        for w, future in futures.items():
            future.result()
            try:
                self.client.publish_dataset(future, name=shard_key(w))
            except KeyError:
                pass  # another client published the same shard first
        starts = [self.router.call(w, Shard.start) for w in missing]
        for w, s in zip(missing, starts):
            shard = s.result()
            if self.budget is not None and shard["budget"] < self.budget:
                memory = "GPU memory" if shard["device"]["kind"] == "cuda" else "memory limit"
                warnings.warn(f"budget={format_bytes(self.budget)} is more than the {format_bytes(shard['budget'])} {memory} "
                              f"of worker {w}: its shard holds at most {format_bytes(shard['budget'])}", stacklevel=2)
        return self.state()

    # -- loading ------------------------------------------------------------------

    def load(
        self,
        path: PathLike | Sequence[PathLike],
        dataset: str | None = None,
        name: str | Sequence[str] | None = None,
        scan_shape: tuple[int, int] | None = None,
        worker: str | None = None,
        progress: bool = True,
        layout: str = "auto",
    ) -> Acquisition | Series:
        """Load a detector file (any format ``qd.inspect`` reads: HDF5, Arina masters, Merlin, DM, MRC, ...) or a saved
        resident (or a list of them: a Series) onto the shards.

        Each file is read by the worker that will hold it. ``name`` defaults to
        the file stem; 3-D stacks need ``scan_shape``; ``worker`` pins the owner.
        ``layout``: "compressed" (entropy-coded, exact), "dense", or
        "auto" (the owner decides, ``service.layout``: dense on CPU where it fits, compressed on GPUs or
        where dense would not fit, never below an estimated ratio of 1.5; ``acq.info()["layout_reason"]``
        says why). A saved resident
        (:meth:`Acquisition.save`) is reopened as it was held, without
        re-encoding: "auto" or its own layout. Nothing stays resident from a
        series load that fails part-way.
        """
        one = isinstance(path, (str, os.PathLike))
        paths = [path] if one else list(path)
        loads = self.start_loads(paths, dataset, name, scan_shape, worker, layout, one, progress=progress)
        if one:
            owner, loaded = loads.owners[0], loads.names[0]
            try:
                waited(loads.futures[0], f"loading {loaded}", loads.raw_bytes[0], "B",
                       lambda: self.router.call(owner, Shard.load_progress, [loaded]).result(), progress,
                       lambda: compiling_on(self.router, [owner]))
            except BaseException:  # Ctrl-C, or the load's own error: nothing of it stays, its name and budget are free
                self.release_loaded(loads, loads.futures)
                raise
            return Acquisition(self, loads.record(loads.futures[0]))
        return Series(self, [Acquisition(self, r) for r in self.gather(loads, progress, "loading")])

    def stream(
        self,
        paths: Sequence[PathLike],
        dataset: str | None = None,
        name: str | Sequence[str] | None = None,
        scan_shape: tuple[int, int] | None = None,
        worker: str | None = None,
        progress: bool = True,
        layout: str = "auto",
    ) -> Iterator[Acquisition]:
        """Load like :meth:`load` and yield each acquisition as soon as it is resident, while later
        files are still being read (first done, first yielded).

        If a load fails, or the iteration stops early (Ctrl-C, a break), the
        acquisitions not yet yielded are stopped or released (and the error
        raised); those already yielded stay. Where the shards fill up
        part-way (placement: ``worker`` pinned, or every shard), the acquisitions
        before the first that does not fit are loaded and yielded, and then a
        ValueError names it and the ones after it, none of which was loaded.
        """
        loads = self.start_loads(list(paths), dataset, name, scan_shape, worker, layout, False, keep_fitting=True, progress=progress)
        bar = LoadProgress(loads, progress, "streaming", self.router)
        pending = set(loads.futures)
        try:
            for future in bar.finished():
                pending.discard(future)
                if future.exception() is not None:
                    raise future.exception()
                yield Acquisition(self, loads.record(future))
        except BaseException:
            self.release_loaded(loads, pending)
            raise
        finally:
            bar.close()
        if loads.refused is not None:
            raise ValueError(loads.refused)

    def start_loads(self, paths: list, dataset, name, scan_shape, worker, layout: str, one: bool,
                    keep_fitting: bool = False, progress: bool = True) -> "Loads":
        """Check names and sources, place every file by its bytes and start each load on its owner. A file that
        fits no shard stops the list: nothing of it stays (ValueError), or, ``keep_fitting``, the loads started
        before it go on and ``Loads.refused`` names it and the files after it. ``progress``: a bar while an
        inspection takes long (it may wait for the kernels a sample's coding compiles)."""
        if not paths:
            raise ValueError("no paths given")
        names = self.names_for(paths, name, one)
        sources = [Source(os.path.abspath(os.fspath(p)), dataset, tuple(scan_shape) if scan_shape else None) for p in paths]
        state = self.ensure_shards()
        self.check_new_names(names, state)
        placer = Placer(state, pinned=worker)
        shards = [worker] if worker else sorted(state["shards"])
        loads = Loads([], names, [], [])
        try:
            for lo in range(0, len(sources), INSPECT_AHEAD):  # the next sources are inspected while these load
                part = range(lo, min(lo + INSPECT_AHEAD, len(sources)))
                metas = self.inspected([sources[i] for i in part], layout, shards, progress)
                for meta in metas:
                    if "layout" in meta:  # a saved resident
                        check_saved(layout, meta["layout"])
                    else:
                        check_layout(layout, meta["dtype"], CHOICES)
                for i, meta in zip(part, metas):
                    try:
                        owner = placer.owner(f"acquisition {names[i]!r} ({sources[i].path})", meta["load_bytes"])
                    except ValueError as err:
                        if not keep_fitting:
                            raise ValueError(f"{err}; none of the {len(names)} was loaded" if len(names) > 1 else str(err)) from None
                        rest = f"it and the {len(names) - i - 1} after it (to {names[-1]!r}) were" if i < len(names) - 1 else "it was"
                        loads.refused = f"{err}; {rest} not loaded ({i} of {len(names)} were)"
                        return loads
                    loads.futures.append(self.router.on_loop(self.router.placed(names[i], owner, meta["load_bytes"], worker is not None,
                                                                                Shard.load, sources[i], layout, self.client.id)))
                    loads.raw_bytes.append(meta["raw_bytes"])
                    loads.owners.append(owner)
        except BaseException:
            self.release_loaded(loads, loads.futures)  # nothing of the list stays
            raise
        return loads

    def inspected(self, sources: list[Source], layout: str, shards: list[str], progress: bool = True) -> list[dict]:
        """``Shard.inspect`` of ``sources`` on the first of ``shards`` that answers (a worker lost meanwhile
        passes it on to the next), with a bar once it has taken a second (``progress``)."""
        for i, shard in enumerate(shards):
            try:
                what = os.path.basename(sources[0].path) if len(sources) == 1 else f"{len(sources)} files"
                return waited(self.router.call(shard, Shard.inspect, sources, layout), f"inspecting {what}", enabled=progress,
                              compiling=lambda: compiling_on(self.router, [shard]))
            except OSError:
                if i == len(shards) - 1:
                    raise

    def release_loaded(self, loads: "Loads", futures) -> None:
        """Nothing of the loads ``futures`` (of ``loads``) stays: those under way are stopped on their owners (their
        names and budget freed there, ``Shard.cancel``), then those that finished all the same are released."""
        cancels = [self.router.call(loads.owners[i], Shard.cancel, loads.names[i], self.client.id, "its client stopped waiting")
                   for i, f in enumerate(loads.futures) if f in futures and not f.done()]
        concurrent.futures.wait([*cancels, *futures])
        for f in futures:
            if f.exception() is None:
                self.release(loads.record(f)["name"])

    def release(self, name: str) -> str:
        """Free acquisition ``name`` in whatever state it is: a load under way is stopped on its owner (its budget
        and name freed before this returns), a re-home or move is stopped, one held is freed; says what was done.
        KeyError for a name the catalog does not know."""
        self.check_open()
        return self.client.sync(self.client.scheduler.qgpu_release, name=name)

    def put(self, array: np.ndarray, name: str | None = None, worker: str | None = None, layout: str = "auto") -> Acquisition:
        """Send an in-memory 4-D array to a shard as a new acquisition (``layout`` as in :meth:`load`).

        The scheduler keeps a backup (``np.save`` bytes; 2 GiB in all) to hold it again if its worker is lost.
        An array that fits no shard's budget, or beside the backups kept, is refused before anything is sent;
        counts of either byte order are held native.
        """
        array = np.asarray(array)
        check_shape(array.shape)
        dtype = check_dtype(array.dtype)
        check_layout(layout, dtype, CHOICES)
        name = name or f"array-{uuid.uuid4().hex[:8]}"
        state = self.ensure_shards()
        self.check_new_names([name], state)
        owner = place([array.nbytes], state, pinned=worker)[0]
        check_backup_room(array.nbytes, state["backup_bytes"])
        array = np.ascontiguousarray(array, dtype)
        backup = io.BytesIO()
        np.save(backup, array, allow_pickle=False)
        self.client.sync(self.client.scheduler.qgpu_keep_backup, name=name, data=backup.getvalue())
        try:
            record = self.router.on_loop(self.router.placed(name, owner, array.nbytes, worker is not None, Shard.put, array, layout)).result()
        except BaseException:
            self.client.sync(self.client.scheduler.qgpu_forget_backup, name=name)
            raise
        return Acquisition(self, record | {"name": name})

    def create(self, name: str | list[str], scan_shape: tuple[int, int], det_shape: tuple[int, int], dtype="uint16",
               layout: str = "compressed", worker: str | None = None) -> "Acquisition | Series":
        """A new, empty live acquisition on a chosen shard (``worker`` pins it): it grows by
        ``acq.append(frames)`` (from here or from worker-side code) or ``svc.ingest(source, acq)`` (frames
        from a detector stream, straight to the owner), and answers queries at any time, exactly, for the scan
        positions received (``acq.received``). ``layout``: "compressed" (complete scan blocks coded
        as they fill, the filling one kept dense), "dense", or "sparse" (each frame's non-zero counts: event
        data, as a Timepix3 sends it). Once every position has arrived it is held as
        one loaded from a file. A live acquisition has no file to be read again from: if its worker is lost
        before it is saved, it is lost. A list of names makes a Series of such acquisitions on one shard,
        for a detector's series of scans (``svc.ingest(source, series)``)."""
        names = [name] if isinstance(name, str) else list(name)
        shape = (*map(int, scan_shape), *map(int, det_shape))
        if len(shape) != 4:
            raise ValueError(f"scan_shape and det_shape are (rows, cols) each, got {scan_shape} and {det_shape}")
        check_shape(shape)
        dtype = check_dtype(dtype)
        check_layout(layout, dtype, LIVE_LAYOUTS)
        state = self.ensure_shards()
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"live acquisitions need one name each, got {names}")
        self.check_new_names(names, state)
        nbytes = start_bytes(shape, dtype, layout)
        owner = place([nbytes * len(names)], state, pinned=worker)[0]
        made = []
        try:
            for n in names:
                record = self.router.on_loop(self.router.placed(n, owner, nbytes, worker is not None or bool(made), Shard.create, shape,
                                                                str(dtype), layout)).result()
                made.append(Acquisition(self, record | {"name": n}))
        except BaseException:
            for acq in made:
                acq.release()
            raise
        return made[0] if isinstance(name, str) else Series(self, made)

    def ingest(self, source: FrameSource, acq: "Acquisition | Series", wait: bool = True, progress: bool = True):
        """Have ``acq``'s owner read ``source``'s frames into it as they come: a detector's stream
        (``qd.MerlinSource(host)``, ``qd.DectrisSource(host)``) or a qgpu-frames-1 one (``qd.TcpSource(host,
        port)``). A Series of live acquisitions on one shard (``svc.create([...])``) takes the detector's
        consecutive acquisitions, one each, on one connection; each is held as loaded once complete. The
        frames go from the stream to the owner, not through this client. Returns the owner's {"frames",
        "received"} (received: per acquisition for a series; "stopped": why, for an ingest stopped early;
        with ``wait=False`` a future of it, while queries go on). If the stream stops inside a frame or breaks, the error is raised and the positions
        that arrived are kept. An interrupted wait (Ctrl-C) stops the owner reading the stream, once the frames
        in hand are appended: they are kept, and the acquisition stays live (``append`` or ``ingest`` fill
        the rest)."""
        single = isinstance(acq, Acquisition)
        acqs = [acq] if single else list(acq)
        names = [a.name for a in acqs]

        def send(owner: str, held: list[str], rows: list[int]):
            if len(held) < len(names):
                raise ValueError("the acquisitions of one stream must be held by one shard, these are on several: create them"
                                 " together (svc.create([...]))")
            return self.router.send(owner, Shard.ingest, held, source, self.client.id)

        future = QueryFuture(self.router.routed(names, send),
                             lambda replies, positions: replies[0] | ({"received": replies[0]["received"][0]} if single else {}))
        if not wait:
            return future
        try:
            return self.ingested(future, acqs, progress)
        except BaseException:
            if not future.done():  # Ctrl-C: the owner stops reading, keeping what arrived
                self.router.call(acqs[0].owner, Shard.cancel, names[0], self.client.id, "its client was interrupted").result()
            raise

    @staticmethod
    def ingested(future: QueryFuture, acqs: "list[Acquisition]", progress: bool) -> dict:
        """``future.result()`` of an ingest into ``acqs``, with a bar of the frames received while it runs."""
        if not progress:
            return future.result()  # nothing to show: the owner is not asked how far it is
        names = [a.name for a in acqs]
        total = sum(a.n_frames for a in acqs)
        with tqdm(total=total, desc=f"ingest {names[0]}" + (f" .. {names[-1]}" if len(names) > 1 else ""), unit="frame",
                  disable=not progress) as bar:
            filled = k = 0  # acquisitions fill in order: only the first still filling is asked
            while not future.done():
                try:
                    while k < len(acqs) and (got := acqs[k].received) == acqs[k].n_frames:
                        filled, k = filled + got, k + 1
                    bar.update(filled + (got if k < len(acqs) else 0) - bar.n)
                except (KeyError, ValueError):
                    pass
                concurrent.futures.wait([future.future], timeout=0.25)
            result = future.result()
            bar.update(int(np.sum(result["received"])) - bar.n)
        return result

    def gather(self, loads: "Loads", progress: bool, verb: str) -> list[dict]:
        """Wait for loads; if any fails, release those that succeeded and raise the first error."""
        bar = LoadProgress(loads, progress, verb, self.router)
        try:
            for _ in bar.finished():
                pass
        except BaseException:  # Ctrl-C: the loads under way are stopped, those done released
            self.release_loaded(loads, loads.futures)
            raise
        finally:
            bar.close()
        errors = [f.exception() for f in loads.futures if f.exception() is not None]
        if errors:
            self.release_loaded(loads, [f for f in loads.futures if f.exception() is None])
            raise errors[0]
        return [loads.record(f) for f in loads.futures]

    @staticmethod
    def names_for(paths: list, name, one: bool) -> list[str]:
        if name is None:
            names = [Path(os.fspath(p)).stem for p in paths]
        elif isinstance(name, str):
            names = [name] if one else [f"{name}-{i}" for i in range(len(paths))]
        else:
            names = list(name)
            if len(names) != len(paths):
                raise ValueError(f"{len(names)} names for {len(paths)} paths")
        if len(set(names)) != len(names):
            raise ValueError(f"acquisition names repeat: {names} (give name=[...])")
        return names

    @staticmethod
    def check_new_names(names: list[str], state: dict) -> None:
        taken = [n for n in names if n in state["acquisitions"]]
        if taken:
            raise ValueError(f"acquisition names already in use: {taken} (release them or choose others)")

    # -- using acquisitions ----------------------------------------------------------

    def __getitem__(self, name: str) -> Acquisition:
        acquisitions = self.state()["acquisitions"]
        if name not in acquisitions:
            raise KeyError(f"no acquisition named {name!r} (known: {sorted(acquisitions) or 'none'})")
        return Acquisition(self, acquisitions[name])

    def __contains__(self, name: str) -> bool:
        return name in self.state()["acquisitions"]

    def acquisitions(self) -> list[Acquisition]:
        """Every acquisition in the catalog, by name."""
        return [Acquisition(self, r) for _, r in sorted(self.state()["acquisitions"].items())]

    def submit(self, fn: Callable, acq: Acquisition | Series | str, *args, **kwargs) -> QueryFuture:
        """Run ``fn(resident, *args, **kwargs)`` on the owner of ``acq``; CuPy results return as NumPy. For a
        ``Series``, ``fn(part, *args, **kwargs)`` runs once on each shard holding some of it, ``part`` a
        ``ShardSeries`` (its residents in series order, ``part.positions`` their places, ``part.feed``);
        the result is [(positions, fn's result)] per shard, by first position."""
        if isinstance(acq, Acquisition):
            return acq.ask(Function, fn, args, kwargs, wait=False)
        if isinstance(acq, Series):
            return acq.ask(ShardFunction, fn, args, kwargs, wait=False)
        return self[acq].ask(Function, fn, args, kwargs, wait=False)

    def info(self) -> "ServiceInfo":
        """Shards (worker, device, resident bytes, budget, its settings), acquisitions with their owners, the
        client's ``qgpu`` settings."""
        state = self.state()
        replies = [self.router.call(w, Shard.info) for w in state["shards"]]
        shards = [r.result() for r in replies]
        return ServiceInfo(shards=shards, acquisitions=list(state["acquisitions"].values()), events=state["events"], settings=settings())

    def __repr__(self) -> str:
        """One line from the catalog: shards and their device kinds, acquisitions, bytes held of the budget."""
        if self.client.status != "running":
            return "Service(closed)"
        state = self.state()
        shards, acquisitions = state["shards"], state["acquisitions"]
        kinds = sorted({s["device"]["kind"] for s in shards.values()})
        held = sum(int(a.get("nbytes", 0)) for a in acquisitions.values())
        budget = sum(int(s["budget"]) for s in shards.values())
        return (f"Service({len(shards)} shard{'s' * (len(shards) != 1)} ({', '.join(kinds)}), {len(acquisitions)} acquisition"
                f"{'s' * (len(acquisitions) != 1)}, {format_bytes(held)} of {format_bytes(budget)} budget held)")


@dataclass
class Loads:
    """Loads in flight: one future per file (its record with the owner), with its acquisition's name, raw bytes
    and the shard it was placed on."""

    futures: list
    names: list[str]
    raw_bytes: list[int]
    owners: list[str]
    refused: str | None = None  # why the files from the first one that fits no shard on were not loaded (``stream``)

    def record(self, future) -> dict:
        """The catalog record of a finished load, with its name and owner."""
        return future.result() | {"name": self.names[self.futures.index(future)]}
