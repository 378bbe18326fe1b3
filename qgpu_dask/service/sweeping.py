"""What processes leave on a host, and the one rule by which it is removed (``left_behind``): files in /dev/shm
(a client's token and result segments, a shard's reply segments and pool slots; ``handoff.py``,
``queries/results.py``) and node-local copies (``shard/copies.py``). Each is named by the process that owns it
where it has one; it is removed once that owner is gone and it was last written more than the grace of its
kind ago: REPLY_GRACE for a reply no client has taken (its client is not named), COPY_GRACE for a copy that
recovery may still reopen, none for the rest."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from ..queries.results import RESULT_PREFIX, SHM

CLIENT_PREFIX = "qgpu-client-"
REPLY_PREFIX = "qgpu-reply-"
POOL_PREFIX = "qgpu-pool-"
REPLY_GRACE = 60.0  # seconds a reply segment (or a slot's hand-over) waits for its client before it is taken for left
COPY_GRACE = 3600.0  # seconds a node-local copy whose process is gone is kept for recovery to reopen


def sweep(grace: float = REPLY_GRACE) -> list[str]:
    """Unlink what processes left in /dev/shm (``left_behind``): result segments and pool slots of processes that
    are gone (and slots no client holds), reply segments no client took within ``grace`` seconds (their client
    is not named: the grace alone), tokens of clients killed before they could remove them; their names."""
    gone = []
    try:
        entries = list(os.scandir(SHM))
    except OSError:
        return gone
    for entry in entries:
        name = entry.name
        try:
            if name.startswith((RESULT_PREFIX, POOL_PREFIX)):  # named by their process
                prefix = RESULT_PREFIX if name.startswith(RESULT_PREFIX) else POOL_PREFIX
                left = left_behind(entry.path, not alive(pid_in(name, prefix)) and (prefix == RESULT_PREFIX or unlocked(entry.path)), 0.0)
            elif name.startswith(REPLY_PREFIX):
                left = left_behind(entry.path, True, grace)
            elif name.startswith(CLIENT_PREFIX):
                left = left_behind(entry.path, unlocked(entry.path), grace)
            else:
                continue
            if left:
                os.unlink(entry.path)
                gone.append(name)
        except OSError:
            pass  # taken or removed meanwhile, or another user's
    return gone


def left_behind(path: str | Path, owner_gone: bool, grace: float) -> bool:
    """The one rule by which a file a process left (in /dev/shm, or a node-local copy) is removed: its owner is
    gone and it was last written more than ``grace`` seconds ago (REPLY_GRACE for a reply, COPY_GRACE for a copy
    that recovery may still reopen)."""
    return owner_gone and (grace <= 0 or os.stat(path).st_mtime < time.time() - grace)


def pid_in(name: str, prefix: str) -> int:
    """The process id in the name of a pool slot or a client's result segment (<prefix><pid>-<hex>)."""
    try:
        return int(name[len(prefix) :].split("-", 1)[0])
    except ValueError:
        return -1


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def unlocked(path: str) -> bool:
    """Whether no process holds the lock of the token file at ``path`` (its client is gone)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
