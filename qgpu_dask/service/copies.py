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
``STALE`` seconds (a whole cluster killed) is removed by the next shard that starts on the host.

``QGPU_DASK_COPIES`` on the workers: the folder (default ``<tempdir>/qgpu-dask-copies-<uid>``), or ``0``
for no copies.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

from ..io.saved import save_resident
from ..resident import Resident
from .handoff import alive

FOLDER_ENV = "QGPU_DASK_COPIES"
STALE = 3600.0  # seconds after which a copy no live process holds is removed


def folder() -> Path | None:
    """Where this worker keeps copies; None when they are turned off."""
    chosen = os.environ.get(FOLDER_ENV)
    if chosen == "0":
        return None
    return Path(chosen) if chosen else Path(tempfile.gettempdir()) / f"qgpu-dask-copies-{os.getuid()}"


def host_of(address: str) -> str:
    """The host part of a worker address ("tcp://10.0.0.5:4321" -> "10.0.0.5")."""
    return urlparse(address).hostname or address


def written(resident: Resident, address: str) -> dict | None:
    """A copy of ``resident`` saved in this worker's folder, as the catalog keeps it ({"path", "host", "bytes"});
    None where copies are off or the folder's copies would then take more than half of the space that would be
    free without them (copies never crowd out the node's other users)."""
    where = folder()
    if where is None:
        return None
    where.mkdir(parents=True, exist_ok=True)
    held = sum(p.stat().st_size for p in where.glob("*.qgpu") if p.is_file())
    if 2 * (held + resident.nbytes) > shutil.disk_usage(where).free + held:
        return None
    path = where / f"{resident.name}-{os.getpid()}-{uuid.uuid4().hex[:12]}.qgpu"
    nbytes = save_resident(resident, path)
    return {"path": str(path), "host": host_of(address), "bytes": nbytes}


def taken_over(copy: dict) -> dict:
    """``copy`` renamed as this process's (a shard that reopened a lost shard's copy holds it now)."""
    path = Path(copy["path"])
    stem = path.name.rsplit("-", 2)[0]
    mine = path.with_name(f"{stem}-{os.getpid()}-{uuid.uuid4().hex[:12]}.qgpu")
    os.replace(path, mine)
    return copy | {"path": str(mine)}


def holder(path: Path) -> int:
    """The process id in a copy's file name (-1 if it has none)."""
    try:
        return int(path.stem.rsplit("-", 2)[1])
    except (IndexError, ValueError):
        return -1


def sweep() -> list[str]:
    """Remove this host's copies whose holding process is gone and that are older than STALE seconds; their names."""
    where = folder()
    gone = []
    if where is None or not where.is_dir():
        return gone
    before = time.time() - STALE
    for path in where.glob("*.qgpu"):
        try:
            if not alive(holder(path)) and path.stat().st_mtime < before:
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
