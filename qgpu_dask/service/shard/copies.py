"""Node-local copies of compressed acquisitions: a lost shard's acquisitions come back by reopening a copy,
not by reading and encoding their source files again.

After a compressed acquisition is loaded from a detector file, its shard saves it as held (``io.saved``) in a
folder on its node, in the background, where the folder's copies then take at most half of the space that
would be free without them; the catalog keeps the copy's path and host with the acquisition. When the shard
is lost, recovery places the acquisition on a survivor of the same host if one has room, and that shard
reopens the copy (checked, read on several threads, no encoding) and takes it over; a copy that is gone or
damaged is removed and the source is read instead. The shard that holds an acquisition removes its copy when it is released or moved, or when its
process exits. A copy's file name carries the process id of the shard holding it
(``<name>-<pid>-<hex>.qgpu``): a copy whose process is gone and that no survivor took over within
``COPY_GRACE`` seconds (a whole cluster killed) is removed by the next shard that starts on the host.

A live acquisition (``svc.create``, a Dask array put block by block) has no source file: its shard keeps a
live copy beside them (``<name>-<pid>-<hex>.live``: a header, then the raw frames appended as they arrive),
so a worker's death loses nothing a detector sent; recovery holds it again from that copy, as live as it was.
Once complete, a compressed one is saved as held and its live copy removed. A live copy that cannot grow (a
full disk) is removed, and the acquisition has no second home from then on (its catalog entry says so).

``LocalCopies`` is one shard's side of them: the copy it holds of each resident that has one, written one at
a time on a thread of its own once no load of the shard is under way, and removed with the resident.

The ``qgpu.copies`` setting on the workers: the folder (default, ``""``: ``<tempdir>/qgpu-dask-copies-<uid>``), or
False for no copies.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import shutil
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import numpy as np
from distributed import Worker

from ...config import setting
from ...device import to_host
from ...io.saved import read_saved, save_resident
from ...resident import Resident
from ..sweeping import COPY_GRACE, alive, left_behind
from .threads import on

logger = logging.getLogger(__name__)

SUFFIXES = (".qgpu", ".live")  # a saved resident; a live acquisition's frames as they arrived
LIVE_FORMAT = "qgpu-live-1"
LIVE_HEADER = 4096  # bytes of a live copy's JSON header (space-padded), the frames after it


def folder() -> Path | None:
    """Where this worker keeps copies; None when they are turned off. The copies hold the user's data, so the
    folder is theirs alone (``private``)."""
    chosen = setting("copies")
    if chosen is False:
        return None
    return Path(chosen) if chosen else Path(tempfile.gettempdir()) / f"qgpu-dask-copies-{os.getuid()}"


def private(where: Path) -> bool:
    """Whether ``where`` is a folder of this user's that no other user can enter, made so where it is new (or,
    where it is ours, made so): the copies in it hold the user's counts. A folder of another user's (made in
    /tmp before us, a trap or a mistake) is refused, with a warning: no copies are kept there."""
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = where.stat()
    if info.st_uid != os.getuid():
        logger.warning("the copies folder %s belongs to uid %d, not this user's %d: no node-local copies are kept",
                       where, info.st_uid, os.getuid())
        return False
    if info.st_mode & 0o077:
        os.chmod(where, 0o700)
    return True


def host_of(address: str) -> str:
    """The host part of a worker address ("tcp://10.0.0.5:4321" -> "10.0.0.5")."""
    return urlparse(address).hostname or address


def written(resident: Resident, address: str) -> dict | None:
    """A copy of ``resident`` saved in this worker's folder, as the catalog keeps it ({"path", "host", "bytes"});
    None where there is no room for it (``room_for``)."""
    path = room_for(resident.name, resident.nbytes, ".qgpu")
    if path is None:
        return None
    nbytes = save_resident(resident, path)
    return {"path": str(path), "host": host_of(address), "bytes": nbytes}


def room_for(name: str, nbytes: int, suffix: str) -> Path | None:
    """A new copy's path in this worker's folder, or None where copies are off or ``nbytes`` more would take the
    folder's copies over half of the space that would be free without them (copies never crowd out the
    node's other users)."""
    where = folder()
    if where is None or not private(where):
        return None
    held = sum(p.stat().st_size for kind in SUFFIXES for p in where.glob(f"*{kind}") if p.is_file())
    if 2 * (held + nbytes) > shutil.disk_usage(where).free + held:
        return None
    return where / f"{name}-{os.getpid()}-{uuid.uuid4().hex[:12]}{suffix}"


def live_started(name: str, shape: tuple, dtype, layout: str, address: str) -> dict | None:
    """A live copy of a new live acquisition (its header; frames follow by :func:`live_appended`), as the
    catalog keeps it ({"path", "host", "bytes", "live": True}); None where there is no room for all its frames."""
    raw = int(np.prod(shape)) * np.dtype(dtype).itemsize
    path = room_for(name, LIVE_HEADER + raw, ".live")
    if path is None:
        return None
    header = {"format": LIVE_FORMAT, "name": name, "shape": list(map(int, shape)), "dtype": np.dtype(dtype).str, "layout": layout}
    path.write_bytes(json.dumps(header).encode().ljust(LIVE_HEADER))
    return {"path": str(path), "host": host_of(address), "bytes": LIVE_HEADER + raw, "live": True}


def live_appended(copy: dict, frames, start: int) -> None:
    """Write ``frames`` (host or device arrays) into a live copy as scan positions ``start`` on (in place,
    so appends that finish out of order still land in scan order)."""
    data = np.ascontiguousarray(to_host(frames))
    fd = os.open(copy["path"], os.O_WRONLY)
    try:
        view, at = memoryview(data).cast("B"), LIVE_HEADER + start * (data.nbytes // max(len(data), 1))
        while view:  # pwrite may write less than asked
            done = os.pwrite(fd, view, at)
            view, at = view[done:], at + done
    finally:
        os.close(fd)


def live_frames(path: str | os.PathLike) -> tuple[dict, np.ndarray]:
    """A live copy's header and the frames it holds (mapped from the file, not read); ValueError naming the
    file where it is not one, or a frame was cut short."""
    with open(path, "rb") as f:
        head = f.read(LIVE_HEADER)
    try:
        header = json.loads(head.decode())
        assert header["format"] == LIVE_FORMAT
    except (ValueError, KeyError, AssertionError):
        raise ValueError(f"{str(path)!r} is not a live copy ({LIVE_FORMAT}): its header is damaged") from None
    shape, dtype = tuple(header["shape"]), np.dtype(header["dtype"])
    frame = shape[2] * shape[3] * dtype.itemsize
    whole = (os.path.getsize(path) - LIVE_HEADER) // frame  # a frame cut short by the crash is not taken
    frames = np.memmap(path, dtype, "r", offset=LIVE_HEADER, shape=(whole, shape[2], shape[3])) if whole else np.empty((0, *shape[2:]), dtype)
    return header, frames


def taken_over(copy: dict) -> dict:
    """``copy`` renamed as this process's (a shard that reopened a lost shard's copy holds it now)."""
    path = Path(copy["path"])
    stem = path.name.rsplit("-", 2)[0]
    mine = path.with_name(f"{stem}-{os.getpid()}-{uuid.uuid4().hex[:12]}{path.suffix}")
    os.replace(path, mine)
    return copy | {"path": str(mine)}


def holder(path: Path) -> int:
    """The process id in a copy's file name (-1 if it has none)."""
    try:
        return int(path.stem.rsplit("-", 2)[1])
    except (IndexError, ValueError):
        return -1


def sweep() -> list[str]:
    """Remove this host's copies left behind (``sweeping.left_behind``: their process gone, COPY_GRACE seconds
    after they were last written); their names."""
    where = folder()
    gone = []
    if where is None or not where.is_dir():
        return gone
    for path in (p for suffix in SUFFIXES for p in where.glob(f"*{suffix}")):
        try:
            if left_behind(path, not alive(holder(path)), COPY_GRACE):
                path.unlink()
                gone.append(path.name)
        except OSError:
            pass  # removed meanwhile
    return gone


def reachable(copy: dict | None, address: str) -> bool:
    """Whether the shard on ``address`` can reopen ``copy``: it is on that shard's host and still there."""
    return copy is not None and copy["host"] == host_of(address) and Path(copy["path"]).is_file()


def removed(copy: dict | None) -> None:
    """Remove ``copy``'s file, if it is still there."""
    if copy is not None:
        Path(copy["path"]).unlink(missing_ok=True)


class LocalCopies:
    """The node-local copy of each of one shard's residents that has one: written, held and removed as the
    resident comes and goes, and read back when a lost shard's copy is taken over."""

    def __init__(self, worker: Worker, residents: dict[str, Resident], loads: ThreadPoolExecutor):
        self.worker = worker
        self.address = worker.address
        self.residents = residents
        self.loads = loads
        self.held: dict[str, dict] = {}  # the copy of each resident that has one, by name
        self.copying = ThreadPoolExecutor(1, thread_name_prefix="qgpu-copy")
        self.loads_waiting = 0  # loads asked of this shard and not yet done
        self.loads_done = asyncio.Event()  # set while loads_waiting is 0: copies are written then
        self.loads_done.set()
        self.turn = asyncio.Lock()  # one copy written at a time, each after the loads before it
        sweep()
        atexit.register(self.remove_all)

    @contextmanager
    def held_back(self) -> Iterator[None]:
        """Copies wait while this block runs (a load under way): a copy written beside a series of loads
        took 0.18 s an acquisition from it on the H200."""
        self.loads_waiting += 1
        self.loads_done.clear()
        try:
            yield
        finally:
            self.loads_waiting -= 1
            if not self.loads_waiting:
                self.loads_done.set()

    async def keep(self, name: str, resident: Resident) -> None:
        """Save a node-local copy of ``resident`` (loaded from a detector file) and tell the catalog, in the
        background once no load is waiting; none where copies are off or the disk is too full, or it failed
        (the source file remains)."""
        copy = None
        try:
            async with self.turn:
                await self.loads_done.wait()
                if self.residents.get(name) is not resident:
                    return  # released, moved or replaced meanwhile
                copy = await on(self.copying, written, resident, self.address)
            if copy is not None:
                await self.own(name, resident, copy)
        except Exception:
            removed(copy)  # a copy only speeds a re-home up

    async def own(self, name: str, resident: Resident, copy: dict) -> None:
        """Hold ``copy`` as ``resident``'s node-local copy once the catalog has recorded it; removed instead if
        the catalog refuses it or ``name`` was released, moved or replaced meanwhile."""
        if await self.worker.scheduler.qgpu_local_copy(name=name, owner=self.address, copy=copy) and self.residents.get(name) is resident:
            earlier = self.held.get(name)
            self.held[name] = copy
            if earlier is not None and earlier["path"] != copy["path"]:
                removed(earlier)  # a live copy, once its acquisition is saved as held
        else:
            removed(copy)

    async def started_live(self, name: str, shape: tuple, dtype, layout: str) -> dict | None:
        """A new live copy for live acquisition ``name`` (``live_started``), written on the copy thread."""
        return await on(self.copying, live_started, name, shape, dtype, layout, self.address)

    def appended(self, name: str, received: int, frames, loop: asyncio.AbstractEventLoop) -> int:
        """Write frames just appended (ending at position ``received``) into ``name``'s live copy, if it has
        one; a copy that cannot take them (a full disk) is removed and the catalog told; ``received``."""
        copy = self.held.get(name)
        if copy is not None and copy.get("live"):
            try:
                live_appended(copy, frames, received - len(frames))
            except OSError as err:
                if self.held.get(name) is copy:
                    del self.held[name]
                removed(copy)
                error = f"its live copy could not take frames up to {received} ({err}): it has no second home now"
                asyncio.run_coroutine_threadsafe(self.worker.scheduler.qgpu_copy_lost(name=name, owner=self.address, error=error), loop)
        return received

    def live(self, name: str) -> bool:
        """Whether ``name``'s copy is a live copy."""
        return bool((self.held.get(name) or {}).get("live"))

    async def reopened(self, copy: dict | None) -> tuple[tuple[dict, np.ndarray] | None, tuple | None, str | None]:
        """What a lost shard's ``copy`` holds, where this shard can reach it: a live copy's header and frames,
        or a saved resident's header and arrays (read and checked), and why it could not be read (the copy
        removed then)."""
        live, saved, error = None, None, None
        if reachable(copy, self.address):
            try:
                if copy.get("live"):
                    live = await on(self.loads, live_frames, copy["path"])
                else:
                    saved = await on(self.loads, read_saved, copy["path"])
            except (OSError, ValueError) as err:
                error = f"{type(err).__name__}: {err}"
                removed(copy)
        return live, saved, error

    def discard(self, name: str) -> None:
        """Remove ``name``'s copy (released here, or moved to a shard that keeps a copy of its own)."""
        removed(self.held.pop(name, None))

    def stop(self) -> None:
        """No more copies written: a copy being written is removed as it ends (the shard stops)."""
        self.copying.shutdown(wait=False, cancel_futures=True)

    def dropped(self) -> None:
        """Every copy removed and forgotten (the shard stops)."""
        self.remove_all()
        self.held.clear()

    def remove_all(self) -> None:
        """Remove the copies this shard holds (at exit: a killed worker's stay, for a survivor to reopen)."""
        for copy in list(self.held.values()):
            removed(copy)
