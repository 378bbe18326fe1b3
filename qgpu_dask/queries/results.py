"""The memory a client assembles series results in: files in /dev/shm that the shards on its host write
into directly, so a result of several shards' replies is not copied once more on the client.

``result_array(shape, dtype)`` is ``np.empty`` in a segment /dev/shm/qgpu-result-<pid>-<hex> this client
made and keeps mapped (``Target`` names it to a shard). Once the array, and every view of it, is
collected, its segment is kept for the next result of its size (up to ``KEPT_BYTES`` in all): a fresh
segment's pages are allotted and cleared by the kernel on first touch, which for a series of images
costs more than the copy into it, and a shard page-locks a segment once, not once per reply. A segment
that a shard may still write into late (its call failed or was sent again elsewhere) is ``spoiled``:
never handed out again. Segments go when the client exits (or, if it was killed, with the sweep of any
shard on the host: ``service.handoff``). Without a usable /dev/shm (none, or less than twice the result
free), and for a small result, the memory is a plain bytearray that no shard can reach: the parts travel.
"""

from __future__ import annotations

import atexit
import mmap
import os
import re
import threading
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHM = Path("/dev/shm")
RESULT_PREFIX = "qgpu-result-"
RESULT_NAME = re.compile(re.escape(RESULT_PREFIX) + "[0-9]+-[0-9a-f]{32}")
KEPT_BYTES = 1 << 30  # memory of collected results a client keeps for the next ones of their size
SEGMENT_BYTES = 1 << 20  # results at least this large are made in a segment; smaller ones cost less sent inline


@dataclass(frozen=True)
class Target:
    """A result array in a client's segment, as a shard finds it: the segment's file name, dtype and shape."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


class Memory:
    """One block of result memory: a mapped segment (``name``) or a bytearray (``name`` None)."""

    def __init__(self, nbytes: int):
        self.name: str | None = None
        self.buffer: mmap.mmap | bytearray = bytearray(nbytes)
        self.spoiled = False

    @classmethod
    def shared(cls, nbytes: int) -> "Memory":
        """A new segment of ``nbytes``, its pages allotted now (ENOSPC here, not SIGBUS later) and mapped."""
        memory = cls.__new__(cls)
        memory.name = f"{RESULT_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        memory.spoiled = False
        path = SHM / memory.name
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, nbytes)
            memory.buffer = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        made.add(memory.name)
        return memory

    def drop(self) -> None:
        """Let the segment go (its pages go once no process maps them)."""
        if self.name is not None:
            (SHM / self.name).unlink(missing_ok=True)
            made.discard(self.name)


kept: dict[int, list[Memory]] = {}  # nbytes -> memory of collected results, for the next ones of that size
in_use: dict[int, Memory] = {}  # id(the flat array of a live result) -> its memory
made: set[str] = set()  # this process's segments, unlinked at exit
lock = threading.Lock()
atexit.register(lambda: [(SHM / name).unlink(missing_ok=True) for name in list(made)])


def shared_room(nbytes: int) -> bool:
    """Whether /dev/shm has room for ``nbytes`` and as much again (a small /dev/shm, as in a container, is left
    for others)."""
    try:
        stats = os.statvfs(SHM)
    except OSError:
        return False
    return 2 * nbytes <= stats.f_bavail * stats.f_frsize


def result_array(shape: tuple[int, ...], dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` in result memory: a kept segment of its size where there is one, else a new
    segment (a bytearray where /dev/shm has no room, or for a result under SEGMENT_BYTES)."""
    dtype = np.dtype(dtype)
    nbytes = max(1, int(np.prod(shape)) * dtype.itemsize)
    with lock:
        free = kept.get(nbytes)
        memory = free.pop() if free else None
    if memory is None:
        memory = Memory(nbytes)
        if nbytes >= SEGMENT_BYTES and shared_room(nbytes):
            try:
                memory = Memory.shared(nbytes)
            except OSError:
                pass
    flat = np.frombuffer(memory.buffer, dtype, count=int(np.prod(shape)))
    # every view of the result refers to flat (views of a view of a buffer stop there), so its memory is free
    # for another result once flat is collected
    with lock:
        in_use[id(flat)] = memory
    weakref.finalize(flat, collected, id(flat))
    return flat.reshape(shape)


def collected(key: int) -> None:
    """A result's memory, its array gone: kept for the next result of its size, or let go."""
    with lock:
        memory = in_use.pop(key)
        size = len(memory.buffer)
        if not memory.spoiled and size + sum(len(m.buffer) for ms in kept.values() for m in ms) <= KEPT_BYTES:
            kept.setdefault(size, []).append(memory)
            return
    memory.drop()


def memory_of(out: np.ndarray) -> Memory | None:
    """The result memory under ``out`` (a result array or a view of one), None for other arrays."""
    base = out.base if isinstance(out.base, np.ndarray) else out
    with lock:
        return in_use.get(id(base))


def target_of(out: np.ndarray) -> Target | None:
    """Where a shard on this host finds the result array ``out`` (None: in no segment)."""
    memory = memory_of(out)
    if memory is None or memory.name is None or not out.flags.c_contiguous:
        return None
    return Target(memory.name, out.dtype, out.shape)


def spoil(out: np.ndarray) -> None:
    """Never hand out ``out``'s memory again: a shard may still write into it."""
    memory = memory_of(out)
    if memory is not None:
        memory.spoiled = True
