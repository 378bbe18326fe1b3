"""Replies handed over through shared memory: a shard's large arrays (NumPy, or CuPy on the device) reach a
client on the same host as files in /dev/shm that the client maps, not as bytes through Dask's TCP comm
(~0.8 GiB/s on one host).

The client makes one token per process, an empty file /dev/shm/qgpu-client-<hex> (removed at exit), and
sends its name with every ``Shard.ask``. A shard that sees that file, owned by its own user, shares the
client's /dev/shm and can write files the client may open: it writes each array of at least
``HANDOFF_BYTES`` in the reply (inside lists, tuples and dicts) to a segment /dev/shm/qgpu-reply-<hex> and
sends a ``Segment`` in its place. The client maps each segment and unlinks it at once, so its memory goes
when the array is collected and nothing is left if the client dies later. A segment no client took (its
client died or gave up mid-call) is unlinked by the sweep (``sweeping.py``) every shard runs and every new client's token
runs, once it is ``REPLY_GRACE`` seconds old; so is the token of a client killed before it could remove it.
Elsewhere (another host, a container with its own /dev/shm, a reply that would fill more than half of the
free /dev/shm, the ``qgpu.handoff`` setting False on the client) replies travel inline, as before.

Writing into fresh /dev/shm pages costs more than the copy (the kernel allots and clears each page), so a
shard keeps a few segments of its own, ``POOL_SLOTS`` files /dev/shm/qgpu-pool-<pid>-<hex> whose pages stay
allotted (and page-locked on a GPU, so a device result is copied straight in, at pinned-memory speed), and
writes a reply into one no client holds. The client maps it (once: it keeps its mapping of each slot for
the next reply there, as a fresh mapping pays a page fault per 4 KiB read), takes a shared lock on it for as
long as the array lives (the lock goes with the array, or with the client's process), and marks it taken; the
shard reuses a slot only when it can lock it exclusively and it was taken (or handed more than ``REPLY_GRACE``
seconds ago and never taken). Each hand-over has a serial number the client checks, so a reply taken that
late is HandoffLost, never another reply's bytes. A shard's slots go when its process exits (or, if it was
killed, with the sweep of any process on the host once no client holds them).

A query whose result is one large array (a series of virtual images) skips the slot: the client gives its
result array beforehand, in a segment of its own (``queries.results``), and each shard on its host writes
its rows straight into it (``Handoff.written``; ``Targets`` keeps each such segment mapped, page-locked on
a GPU, for the next result there), so a result of several shards is not copied again on the client.
"""

from __future__ import annotations

import atexit
import collections
import fcntl
import functools
import mmap
import os
import re
import time
import struct
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..config import setting
from ..device import copy_into, cupy_or_none, page_locked, to_host
from ..queries.base import Query
from ..queries.results import RESULT_NAME, RESULT_PREFIX, SEGMENT_BYTES, Target
from .errors import HandoffLost
from .sweeping import CLIENT_PREFIX, POOL_PREFIX, REPLY_GRACE, REPLY_PREFIX, SHM, sweep

POOL_SLOTS = 4  # segments a shard keeps allotted for replies
MAPPED_TARGETS = 16  # clients' result segments a shard keeps mapped (and page-locked on a GPU)
SLOT_HEADER = 4096  # bytes before a slot's data: its state (HEADER), one page so the data stays page-aligned
HEADER = struct.Struct("<BxxxxxxxQd")  # taken (0: the client has it, or never handed), serial, time handed
MIN_SLOT = 8 << 20  # a slot holds at least this many bytes of data (a power of two above what it first holds)
HANDOFF_BYTES = SEGMENT_BYTES  # arrays at least this large are handed over; smaller ones cost less inline (as results)
TOKEN = re.compile(re.escape(CLIENT_PREFIX) + "[0-9a-f]{32}")


@dataclass(frozen=True)
class Segment:
    """Where an array of a reply waits in /dev/shm: the segment's file name, and the array's dtype and shape."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    serial: int = 0  # a pool slot's hand-over number (0: a one-shot segment, unlinked when taken)

    def taken(self) -> np.ndarray:
        """The array, mapped from the segment (no copy): a one-shot segment is unlinked at once; a pool slot is
        locked (shared) while the array lives."""
        if self.serial:
            return self.from_slot()
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

    def from_slot(self) -> np.ndarray:
        """The array in a shard's pool slot, which stays locked (shared) until the array is collected."""
        path = SHM / self.name
        nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            memory = slot_mapping(self.name, fd, SLOT_HEADER + nbytes)
            _, serial, _ = HEADER.unpack_from(memory, 0)
            if serial != self.serial:
                raise HandoffLost(f"reply slot {path} holds hand-over {serial}, not {self.serial}: taken more than {REPLY_GRACE:.0f} s late")
            memory[0] = 0  # taken: the shard may reuse the slot once this lock is gone
        except BaseException:
            os.close(fd)
            raise
        flat = np.frombuffer(memory, self.dtype, count=int(np.prod(self.shape)), offset=SLOT_HEADER)
        weakref.finalize(flat, os.close, fd)  # the lock goes with the last view of the array
        return flat.reshape(self.shape)


MAPPED_SLOTS = 32  # slot mappings a client keeps (a few shards' POOL_SLOTS each)
mapped_slots: dict[str, tuple[int, mmap.mmap]] = {}  # slot name -> (its file's inode, the whole slot mapped)
mapped_lock = threading.Lock()


def slot_mapping(name: str, fd: int, nbytes: int) -> mmap.mmap:
    """The whole slot file of the locked ``fd`` (``name``), at least ``nbytes``, mapped: this client's mapping of it
    from an earlier reply where it has one (its pages are mapped already: reading a reply in a slot mapped
    afresh costs a page fault per 4 KiB, 16 thousand for a 64 MiB series of images, more than the reply's
    copy), else a new one, kept for the next reply in that slot. Mappings of slots gone are let go."""
    stat = os.fstat(fd)
    with mapped_lock:
        known = mapped_slots.get(name)
        if known is not None and known[0] == stat.st_ino and len(known[1]) == stat.st_size >= nbytes:
            return known[1]
        for other in [n for n in mapped_slots if not (SHM / n).exists()]:
            del mapped_slots[other]  # its views keep their own reference while they live
        own = os.open(SHM / name, os.O_RDWR)  # a description of its own: one the mapping holds keeps its locks
        try:
            if os.fstat(own).st_ino != stat.st_ino:
                raise HandoffLost(f"reply slot {SHM / name} was replaced while it was taken")
            memory = mmap.mmap(own, stat.st_size, flags=mmap.MAP_SHARED)
        finally:
            os.close(own)
        mapped_slots[name] = (stat.st_ino, memory)
        while len(mapped_slots) > MAPPED_SLOTS:
            del mapped_slots[next(iter(mapped_slots))]
        return memory


def replaced(value: Any, kinds: tuple[type, ...], change: Callable[[Any], Any]) -> Any:
    """``value`` with ``change(x)`` for every ``x`` of exactly one of the types ``kinds`` in it, inside lists,
    tuples and dicts."""
    if type(value) in kinds:
        return change(value)
    if type(value) in (list, tuple):
        return type(value)(replaced(v, kinds, change) for v in value)
    if type(value) is dict:
        return {k: replaced(v, kinds, change) for k, v in value.items()}
    return value


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
    the ``qgpu.handoff`` setting is False or this process has no /dev/shm."""
    return made_token() if setting("handoff") else None


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

    out = replaced(reply, (Segment,), mapped)
    if lost:
        raise HandoffLost(f"a shard's reply was handed over in /dev/shm but {len(lost)} of its segments could not be taken "
                          f"(removed by something else, or taken more than {REPLY_GRACE:.0f} s late): {'; '.join(lost)}")
    return out


# -- the shard's half ---------------------------------------------------------------


class Handoff:
    """A shard's half: which clients share its /dev/shm (asked once per token), and the writing of segments."""

    def __init__(self):
        self.shared: dict[str, bool] = {}
        self.pool = Pool()
        self.targets = Targets()

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

    def written(self, query: type[Query], reply: Any, into: tuple[Target, list[int]], token: str | None) -> Any:
        """``reply`` less what ``query.written`` put into the client's result array ``into`` (its Target, and the
        series position of each resident asked), where the client of ``token`` shares this /dev/shm."""
        target, rows = into
        if token is None or not self.shares(token):
            return reply
        out = self.targets.array(target)
        if out is None:
            return reply
        at_rows = np.asarray(rows, dtype=np.int64)

        def write(places, array) -> bool:
            at = at_rows[np.asarray(places, dtype=np.int64)]
            if (array.dtype != out.dtype or tuple(array.shape) != (at.size, *out.shape[1:]) or not at.size
                    or at.min() < 0 or at.max() >= len(out)):
                return False
            if (np.diff(at) == 1).all():
                copy_into(out[at[0] : at[-1] + 1], array)
            else:
                for k, i in enumerate(at):
                    copy_into(out[i], array[k])
            return True

        return query.written(reply, write)

    def give(self, reply: Any, token: str | None) -> Any:
        """``reply`` with its arrays of at least HANDOFF_BYTES written to segments and replaced by ``Segment``s,
        where the client of ``token`` shares this /dev/shm and they fit in half of its free space; its other device
        arrays copied to the host. A device array is copied straight into its slot (page-locked: no host copy)."""
        if token is None or not self.shares(token):
            return to_host(reply)
        kinds = array_kinds()
        large: list = []
        replaced(reply, kinds, lambda a: large.append(a) if handed(a) else None)
        if not large or not fits(sum(a.nbytes for a in large)):
            return to_host(reply)
        written: list[str] = []
        try:
            return to_host(replaced(reply, kinds, lambda a: (self.pool.give(a) or written_segment(a, written)) if handed(a) else a))
        except OSError as err:
            for name in written:
                (SHM / name).unlink(missing_ok=True)
            raise RuntimeError(f"could not write a reply of {sum(a.nbytes for a in large)} bytes to {SHM} ({err}); "
                               "dask.config.set({'qgpu.handoff': False}) on the client sends replies inline") from None


def array_kinds() -> tuple[type, ...]:
    """The array types a reply may hold: NumPy's, and CuPy's on a GPU."""
    cp = cupy_or_none()
    return (np.ndarray,) if cp is None else (np.ndarray, cp.ndarray)


def handed(array) -> bool:
    """Whether ``array`` (host or device) goes through a segment: at least HANDOFF_BYTES of plain values (no
    Python objects)."""
    return array.nbytes >= HANDOFF_BYTES and not array.dtype.hasobject


def fits(nbytes: int) -> bool:
    """Whether ``nbytes`` of segments take at most half of the free space of /dev/shm (a small /dev/shm, as in a
    container, is left for others: the reply travels inline)."""
    try:
        stats = os.statvfs(SHM)
    except OSError:
        return False
    return nbytes <= stats.f_bavail * stats.f_frsize // 2


def written_segment(array, written: list[str]) -> Segment:
    """``array``'s bytes (host or device) in a new segment (its name appended to ``written``); its ``Segment``."""
    name = REPLY_PREFIX + uuid.uuid4().hex
    fd = os.open(SHM / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    written.append(name)
    try:
        data = memoryview(np.ascontiguousarray(to_host(array)).reshape(-1).view(np.uint8))
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
    finally:
        os.close(fd)
    return Segment(name, array.dtype, array.shape)


class Slot:
    """One segment of a shard's pool: its file (kept open: the shard's exclusive lock is taken on it), mapping
    and data capacity."""

    def __init__(self, capacity: int):
        self.name = f"{POOL_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        self.capacity = capacity
        self.fd = os.open(SHM / self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(self.fd, 0, SLOT_HEADER + capacity)  # every page allotted now (ENOSPC here, not SIGBUS later)
            self.memory = mmap.mmap(self.fd, SLOT_HEADER + capacity, flags=mmap.MAP_SHARED)
            self.unlock_pages = page_locked(np.frombuffer(self.memory, np.uint8))  # device results are copied straight in
        except BaseException:
            os.close(self.fd)
            (SHM / self.name).unlink(missing_ok=True)
            raise
        self.serial = 0

    def free(self) -> bool:
        """Whether no client holds the slot and its last reply was taken (or never will be): then it stays locked
        (exclusive) until ``fill`` lets it go."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        waiting, _, handed_at = HEADER.unpack_from(self.memory, 0)
        if waiting and time.time() - handed_at < REPLY_GRACE:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            return False
        return True

    def gone(self) -> bool:
        """Whether the slot's file was unlinked (by hand, or a sweep that took this process for dead)."""
        return os.fstat(self.fd).st_nlink == 0

    def fill(self, array) -> Segment:
        """``array``'s bytes (host or device) in the slot (locked by ``free``), handed over under a new serial; the
        lock is let go."""
        try:
            view = np.frombuffer(self.memory, array.dtype, count=array.size, offset=SLOT_HEADER).reshape(array.shape)
            copy_into(view, array)
            self.serial += 1
            HEADER.pack_into(self.memory, 0, 1, self.serial, time.time())
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        return Segment(self.name, array.dtype, array.shape, self.serial)

    def close(self) -> None:
        self.unlock_pages()
        self.memory.close()
        os.close(self.fd)
        (SHM / self.name).unlink(missing_ok=True)


class Pool:
    """A shard's reply slots: at most POOL_SLOTS, made as replies need them and kept while the process lives."""

    def __init__(self):
        self.slots: list[Slot] = []
        self.lock = threading.Lock()  # the event loop and the query threads both reply
        atexit.register(self.close)

    def give(self, array) -> Segment | None:
        """``array`` (host or device) written to a free slot that holds it (a new one while there are fewer than POOL_SLOTS, or one
        too small replaced); None when every slot is in use."""
        nbytes = array.nbytes
        with self.lock:
            for slot in [s for s in self.slots if s.gone()]:  # its file was removed: no client could open it
                slot.close()
                self.slots.remove(slot)
            for slot in self.slots:
                if slot.capacity >= nbytes and slot.free():
                    return slot.fill(array)
            if len(self.slots) >= POOL_SLOTS:
                small = next((s for s in self.slots if s.capacity < nbytes and s.free()), None)
                if small is None:
                    return None
                small.close()
                self.slots.remove(small)
            try:
                slot = Slot(max(MIN_SLOT, 1 << (nbytes - 1).bit_length()))
            except OSError:
                return None  # no room in /dev/shm for another slot: a one-shot segment, or inline
            if not slot.free():
                raise HandoffLost(f"a new reply slot {slot.name} could not be locked")
            self.slots.append(slot)
            return slot.fill(array)

    def close(self) -> None:
        with self.lock:
            for slot in self.slots:
                slot.close()
            self.slots.clear()


class Targets:
    """The clients' result segments this shard writes into (``queries.results``), each mapped, and page-locked on
    a GPU, the first time (20 ms for 64 MiB: a client reuses its segments), at most MAPPED_TARGETS of them."""

    def __init__(self):
        self.mapped: collections.OrderedDict[str, tuple[int, mmap.mmap, Callable[[], None]]] = collections.OrderedDict()
        self.lock = threading.Lock()  # the query threads write replies
        atexit.register(self.close)

    def array(self, target: Target) -> np.ndarray | None:
        """The client's result array of ``target``, mapped here; None where its segment is gone or too small."""
        if not RESULT_NAME.fullmatch(target.name):
            raise ValueError(f"result segment {target.name!r} is not one a client makes ({RESULT_PREFIX}<pid>-<32 hex digits>)")
        path = SHM / target.name
        with self.lock:
            try:
                stat = os.stat(path)
                known = self.mapped.get(target.name)
                if known is None or known[0] != stat.st_ino:
                    if known is not None:
                        self.let_go(target.name)
                    fd = os.open(path, os.O_RDWR)
                    try:
                        memory = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED)
                    finally:
                        os.close(fd)
                    known = (stat.st_ino, memory, page_locked(np.frombuffer(memory, np.uint8)))
                    self.mapped[target.name] = known
                    for name in [n for n in self.mapped if n != target.name and not (SHM / n).exists()] + list(self.mapped)[:-MAPPED_TARGETS]:
                        self.let_go(name)  # its client let it go (or died): so does this shard
                self.mapped.move_to_end(target.name)
            except (OSError, ValueError):
                return None  # gone meanwhile, or empty: the reply carries the arrays
        memory = known[1]
        if target.nbytes > len(memory):
            return None
        return np.frombuffer(memory, target.dtype, count=int(np.prod(target.shape))).reshape(target.shape)

    def let_go(self, name: str) -> None:
        """Unmap segment ``name`` here (its pages go once no view of them lives and no process maps them)."""
        entry = self.mapped.pop(name, None)
        if entry is not None:
            entry[2]()

    def close(self) -> None:
        with self.lock:
            for name in list(self.mapped):
                self.let_go(name)
