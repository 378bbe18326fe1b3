"""Replies handed over through shared memory: a shard's large NumPy arrays reach a client on the same host
as files in /dev/shm that the client maps, not as bytes through Dask's TCP comm (~0.8 GiB/s on one host).

The client makes one token per process, an empty file /dev/shm/qgpu-client-<hex> (removed at exit), and
sends its name with every ``Shard.ask``. A shard that sees that file, owned by its own user, shares the
client's /dev/shm and can write files the client may open: it writes each array of at least
``HANDOFF_BYTES`` in the reply (inside lists, tuples and dicts) to a segment /dev/shm/qgpu-reply-<hex> and
sends a ``Segment`` in its place. The client maps each segment and unlinks it at once, so its memory goes
when the array is collected and nothing is left if the client dies later. A segment no client took (its
client died or gave up mid-call) is unlinked by the sweep every shard runs and every new client's token
runs, once it is ``STALE`` seconds old; so is the token of a client killed before it could remove it.
Elsewhere (another host, a container with its own /dev/shm, a reply that would fill more than half of the
free /dev/shm, ``QGPU_DASK_HANDOFF=0`` on the client) replies travel inline, as before.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import mmap
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

SHM = Path("/dev/shm")
CLIENT_PREFIX = "qgpu-client-"
REPLY_PREFIX = "qgpu-reply-"
HANDOFF_BYTES = 1 << 20  # arrays at least this large are handed over; smaller ones cost less inline
STALE = 60.0  # seconds after which a segment no client took is unlinked
TOKEN = re.compile(re.escape(CLIENT_PREFIX) + "[0-9a-f]{32}")


class HandoffLost(RuntimeError):
    """A reply's shared-memory segment was gone (or unreadable) when the client came to take it."""


@dataclass(frozen=True)
class Segment:
    """Where an array of a reply waits in /dev/shm: the segment's file name, and the array's dtype and shape."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    def taken(self) -> np.ndarray:
        """The array, mapped from the segment (no copy), whose name is unlinked at once."""
        path = SHM / self.name
        fd = os.open(path, os.O_RDWR)
        try:
            os.unlink(path)
            nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
            size = os.fstat(fd).st_size
            if size != nbytes:
                raise HandoffLost(f"reply segment {path} holds {size} bytes, not the {nbytes} of its {self.dtype} array {self.shape}")
            memory = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        return np.frombuffer(memory, self.dtype).reshape(self.shape)


def replaced(value: Any, kind: type, change: Callable[[Any], Any]) -> Any:
    """``value`` with ``change(x)`` for every ``x`` of exactly type ``kind`` in it, inside lists, tuples and dicts."""
    if type(value) is kind:
        return change(value)
    if type(value) in (list, tuple):
        return type(value)(replaced(v, kind, change) for v in value)
    if type(value) is dict:
        return {k: replaced(v, kind, change) for k, v in value.items()}
    return value


def sweep(stale: float = STALE) -> list[str]:
    """Unlink what was left in /dev/shm more than ``stale`` seconds ago: reply segments no client took, and
    tokens of clients that died without removing them (killed: no process holds their lock); their names."""
    gone = []
    before = time.time() - stale
    try:
        entries = list(os.scandir(SHM))
    except OSError:
        return gone
    for entry in entries:
        if entry.name.startswith((REPLY_PREFIX, CLIENT_PREFIX)):
            try:
                if entry.stat().st_mtime < before and (entry.name.startswith(REPLY_PREFIX) or unlocked(entry.path)):
                    os.unlink(entry.path)
                    gone.append(entry.name)
            except OSError:
                pass  # taken or removed meanwhile, or another user's
    return gone


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


# -- the client's half -----------------------------------------------------------


@functools.cache
def made_token() -> str | None:
    """This process's token file in /dev/shm, made once, locked while the process lives (the lock goes with it,
    however it ends) and removed at exit; None where it cannot be made."""
    name = CLIENT_PREFIX + uuid.uuid4().hex
    try:
        fd = os.open(SHM / name, os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)  # the descriptor stays open: a sweep leaves a locked token alone
    except OSError:
        return None
    atexit.register(lambda: (SHM / name).unlink(missing_ok=True))
    sweep()
    return name


def token() -> str | None:
    """The token a client sends with each call that may return a large reply; None (inline replies) when
    ``QGPU_DASK_HANDOFF=0`` or this process has no /dev/shm."""
    if os.environ.get("QGPU_DASK_HANDOFF") == "0":
        return None
    return made_token()


def take(reply: Any) -> Any:
    """``reply`` with every ``Segment`` in it replaced by its array; HandoffLost naming the segments that were
    gone (the others are still taken, so none is left behind)."""
    lost = []

    def mapped(segment: Segment) -> np.ndarray | None:
        try:
            return segment.taken()
        except (OSError, HandoffLost) as err:
            lost.append(f"{segment.name}: {err}")
            return None

    out = replaced(reply, Segment, mapped)
    if lost:
        raise HandoffLost(f"a shard's reply was handed over in /dev/shm but {len(lost)} of its segments could not be taken "
                          f"(removed by something else, or taken more than {STALE:.0f} s late): {'; '.join(lost)}")
    return out


# -- the shard's half ---------------------------------------------------------------


class Handoff:
    """A shard's half: which clients share its /dev/shm (asked once per token), and the writing of segments."""

    def __init__(self):
        self.shared: dict[str, bool] = {}

    def shares(self, token: str) -> bool:
        """Whether the client of ``token`` shares this process's /dev/shm: its token file is there, made by this
        process's user (who can then open the segments written here)."""
        if token not in self.shared:
            if not TOKEN.fullmatch(token):
                raise ValueError(f"handoff token {token!r} is not one a client makes ({CLIENT_PREFIX} and 32 hex digits)")
            try:
                self.shared[token] = (SHM / token).stat().st_uid == os.getuid()
            except OSError:
                self.shared[token] = False
        return self.shared[token]

    def give(self, reply: Any, token: str | None) -> Any:
        """``reply`` with its arrays of at least HANDOFF_BYTES written to segments and replaced by ``Segment``s,
        where the client of ``token`` shares this /dev/shm and they fit in half of its free space; else ``reply``."""
        if token is None or not self.shares(token):
            return reply
        large: list[np.ndarray] = []
        replaced(reply, np.ndarray, lambda a: large.append(a) if handed(a) else None)
        if not large or not fits(sum(a.nbytes for a in large)):
            return reply
        written: list[str] = []
        try:
            return replaced(reply, np.ndarray, lambda a: written_segment(a, written) if handed(a) else a)
        except OSError as err:
            for name in written:
                (SHM / name).unlink(missing_ok=True)
            raise RuntimeError(f"could not write a reply of {sum(a.nbytes for a in large)} bytes to {SHM} ({err}); "
                               "QGPU_DASK_HANDOFF=0 on the client sends replies inline") from None


def handed(array: np.ndarray) -> bool:
    """Whether ``array`` goes through a segment: at least HANDOFF_BYTES of plain values (no Python objects)."""
    return array.nbytes >= HANDOFF_BYTES and not array.dtype.hasobject


def fits(nbytes: int) -> bool:
    """Whether ``nbytes`` of segments take at most half of the free space of /dev/shm (a small /dev/shm, as in a
    container, is left for others: the reply travels inline)."""
    try:
        stats = os.statvfs(SHM)
    except OSError:
        return False
    return nbytes <= stats.f_bavail * stats.f_frsize // 2


def written_segment(array: np.ndarray, written: list[str]) -> Segment:
    """``array``'s bytes in a new segment (its name appended to ``written``); its ``Segment``."""
    name = REPLY_PREFIX + uuid.uuid4().hex
    fd = os.open(SHM / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    written.append(name)
    try:
        data = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
    finally:
        os.close(fd)
    return Segment(name, array.dtype, array.shape)
