"""The compute device of this process: array module (NumPy or CuPy), identity, memory.

Everything above this layer asks here whether it runs on a GPU, so a worker
without CuPy (a laptop, CI) never imports it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import queue
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator

import numpy as np

from .config import setting


@functools.cache
def cupy_or_none() -> ModuleType | None:
    """CuPy when it imports and sees a CUDA device, else None (the ``qgpu.cpu`` setting forces None)."""
    if setting("cpu"):
        return None
    try:
        import cupy
    except Exception:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:
        return None
    return cupy


def synchronize() -> None:
    """Wait for this thread's CUDA stream (no-op on CPU)."""
    cp = cupy_or_none()
    if cp is not None:
        cp.cuda.get_current_stream().synchronize()


def use_own_stream() -> None:
    """Thread initializer: give this thread a non-blocking CUDA stream of its own (no-op on CPU)."""
    cp = cupy_or_none()
    if cp is not None:
        cp.cuda.Stream(non_blocking=True).use()


@functools.cache
def turn_file() -> str | None:
    """The lock file in /dev/shm of this process's GPU (named by its uuid), None on CPU or without /dev/shm."""
    cp = cupy_or_none()
    if cp is None or not os.path.isdir("/dev/shm"):
        return None
    uuid = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id).get("uuid", b"")
    return f"/dev/shm/qgpu-gpu-{uuid.hex() if isinstance(uuid, bytes) else uuid}"


@contextlib.contextmanager
def gpu_turn():
    """This process's turn on its GPU for a long pass, among the processes that share the GPU (several shards
    on one device): their kernels would time-slice, both finishing late, at a cost of the switches; taking
    turns, one finishes in half the time and copies its result out while the other computes. A lock
    (``flock``: it goes with the process) on the GPU's file; no-op on CPU."""
    path = turn_file()
    if path is None:
        yield
        return
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Pools:
    """Where this process's device allocations come from: CuPy's default pool, which holds what residents keep
    (and queries' results), and a pool of its own for what a load passes through (decoded batches, the payload
    room, the block still filling). Kept apart, a resident's arrays are never cut out of a freed passing
    buffer, where they would keep CuPy from handing back the rest (a split block goes back only whole): a GPU
    filled by loads holds residents and a few loads' buffers, not residents among the fragments of 100 loads.
    An allocation that finds the device full first hands back the other pool's free blocks."""

    def __init__(self, cp: ModuleType):
        self.out_of_memory = cp.cuda.memory.OutOfMemoryError
        self.held = cp.get_default_memory_pool()
        self.passing = cp.cuda.MemoryPool()
        cp.cuda.set_allocator(self.malloc_held)

    def malloc_held(self, nbytes: int):
        return self.malloc(self.held, self.passing, nbytes)

    def malloc_passing(self, nbytes: int):
        return self.malloc(self.passing, self.held, nbytes)

    def malloc(self, pool, other, nbytes: int):
        try:
            return pool.malloc(nbytes)
        except self.out_of_memory:
            other.free_all_blocks()
            return pool.malloc(nbytes)

    def free(self) -> None:
        """Hand both pools' free blocks back to the device."""
        self.held.free_all_blocks()
        self.passing.free_all_blocks()

    def total_bytes(self) -> int:
        """Device memory both pools hold, used and free."""
        return int(self.held.total_bytes() + self.passing.total_bytes())


@functools.cache
def pools() -> Pools | None:
    """This process's ``Pools`` (made once, installing the held pool's allocator as CuPy's); None on CPU."""
    cp = cupy_or_none()
    return None if cp is None else Pools(cp)


def passing_memory() -> contextlib.AbstractContextManager:
    """Device arrays made in this thread inside the block come from the passing pool (a load's buffers);
    what outlives the load is made inside ``held_memory``. No-op on CPU."""
    return allocating(lambda p: p.malloc_passing)


def held_memory() -> contextlib.AbstractContextManager:
    """Device arrays made in this thread inside the block come from the held pool: what a resident keeps,
    made while a load runs in ``passing_memory``. No-op on CPU."""
    return allocating(lambda p: p.malloc_held)


def allocating(malloc) -> contextlib.AbstractContextManager:
    """CuPy's allocator for this thread inside the block: ``malloc(pools())``."""
    p = pools()
    if p is None:
        return contextlib.nullcontext()
    import cupy as cp

    return cp.cuda.using_allocator(malloc(p))


def free_cached_memory() -> None:
    """Hand the pools' free blocks back to the device, so freed memory shows as free (no-op on CPU)."""
    p = pools()
    if p is not None:
        p.free()


def pool_bytes() -> int:
    """Device memory this process's pools hold, used and free (0 on CPU)."""
    p = pools()
    return 0 if p is None else p.total_bytes()


def has_gpu() -> bool:
    """Whether this process computes on a CUDA device."""
    return cupy_or_none() is not None


def array_module() -> ModuleType:
    """The array module residents of this process live in: cupy on a GPU, else numpy."""
    cp = cupy_or_none()
    return np if cp is None else cp


def module_of(array) -> ModuleType:
    """numpy or cupy, whichever owns ``array``."""
    cp = cupy_or_none()
    if cp is not None and isinstance(array, cp.ndarray):
        return cp
    return np


PINNED_COPIES = (1 << 20, 256 << 20)  # arrays of these sizes come back through page-locked memory (several times faster)


def to_host(value):
    """NumPy copies of CuPy arrays inside ``value`` (arrays, tuples, lists, dicts); the rest as is. Arrays of
    PINNED_COPIES bytes land in page-locked memory (CuPy's pool keeps it for the next copy)."""
    cp = cupy_or_none()
    if cp is None:
        return value
    if isinstance(value, cp.ndarray):
        if PINNED_COPIES[0] <= value.nbytes <= PINNED_COPIES[1]:
            import cupyx

            out = cupyx.empty_pinned(value.shape, value.dtype)
            return cp.ascontiguousarray(value).get(out=out)
        return cp.asnumpy(value)
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    return value


def copy_into(out: np.ndarray, array) -> None:
    """``array`` (NumPy, or CuPy: copied from the device straight into ``out``) written into the host array
    ``out`` of its shape and dtype."""
    cp = cupy_or_none()
    if cp is not None and isinstance(array, cp.ndarray):
        cp.ascontiguousarray(array).get(out=out)
    else:
        np.copyto(out, array)


def uploaded(host: np.ndarray):
    """A device copy of the host array ``host``, sent on this thread's stream straight from its memory. CuPy's
    ``asarray`` first copies a NumPy array into pinned memory of its own, from a pool that keeps a block of
    every size it was asked for; a buffer already pinned goes up here at the bus's speed, with no host copy.
    ``host`` must stay as it is until the stream has passed the copy."""
    import cupy as cp

    out = cp.empty(host.shape, host.dtype)
    out.set(np.ascontiguousarray(host), stream=cp.cuda.get_current_stream())
    return out


def host_memory(nbytes: int) -> np.ndarray:
    """``nbytes`` of host memory (uint8) for data bound for this process's device: pinned, from CuPy's pool
    (the copy up is direct, and the pages are kept for the next read instead of faulted in again), where
    there is a GPU; plain memory on CPU."""
    cp = cupy_or_none()
    if cp is None or nbytes == 0:
        return np.empty(nbytes, np.uint8)
    return np.frombuffer(cp.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)


class Uploads:
    """Host bytes to device memory through a ring of ``slots`` pinned host slots of ``slot_bytes`` each, from any
    number of threads: a thread fills a slot and sends it (copied up on the ring's stream) while the others
    fill theirs; a slot is taken again once its copy is done. Made once per process (the pinning is costly)."""

    def __init__(self, slots: int, slot_bytes: int):
        import cupy as cp

        self.stream = cp.cuda.Stream(non_blocking=True)
        self.memory = [np.frombuffer(cp.cuda.alloc_pinned_memory(slot_bytes), np.uint8, slot_bytes) for _ in range(slots)]
        self.copied: list = [None] * slots  # the event of each slot's last copy
        self.free: queue.SimpleQueue = queue.SimpleQueue()
        for k in range(slots):
            self.free.put(k)

    @contextlib.contextmanager
    def slot(self, nbytes: int) -> Iterator["Slot"]:
        """A slot of ``nbytes`` (at most slot_bytes) to fill and send, free again after the ``with``."""
        k = self.free.get()
        try:
            if self.copied[k] is not None:
                self.copied[k].synchronize()
            yield Slot(self, k, self.memory[k][:nbytes])
        finally:
            self.free.put(k)

    def finish(self) -> None:
        """Wait for every copy sent."""
        self.stream.synchronize()


class Slot:
    """One filled host slot of ``Uploads``, ``host``, and its copy up."""

    def __init__(self, uploads: Uploads, k: int, host: np.ndarray):
        self.uploads, self.k, self.host = uploads, k, host

    def send(self, target, at: int) -> None:
        """Copy ``host`` to bytes ``at`` .. of the device array ``target`` (uint8), asynchronously."""
        import cupy as cp

        up = self.uploads
        cp.cuda.runtime.memcpyAsync(target.data.ptr + at, self.host.ctypes.data, self.host.nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                    up.stream.ptr)
        up.copied[self.k] = up.stream.record()


def page_locked(memory: np.ndarray):
    """Page-lock the host memory under the contiguous array ``memory`` (a long-lived buffer that device results
    are copied into, at the speed of pinned memory); the function that lets it go again. No-op on CPU."""
    cp = cupy_or_none()
    if cp is None:
        return lambda: None
    pointer = memory.ctypes.data
    cp.cuda.runtime.hostRegister(pointer, memory.nbytes, 0)

    def unlock() -> None:
        try:
            cp.cuda.runtime.hostUnregister(pointer)
        except cp.cuda.runtime.CUDARuntimeError:
            pass  # the CUDA context went first (the process is exiting): the pages go with it

    return unlock


@dataclass(frozen=True)
class DeviceInfo:
    """What a shard reports about the device it computes on."""

    kind: str  # "cuda" or "cpu"
    name: str
    uuid: str
    total_bytes: int
    free_bytes: int


def device_info() -> DeviceInfo:
    """Identity and memory of this process's device (GPU 0 as CUDA_VISIBLE_DEVICES maps it, or the host)."""
    cp = cupy_or_none()
    if cp is not None:
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
        free, total = cp.cuda.runtime.memGetInfo()
        uuid = props.get("uuid", b"")
        uuid = uuid.hex() if isinstance(uuid, bytes) else str(uuid)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return DeviceInfo("cuda", name, uuid, int(total), int(free))
    import psutil

    vm = psutil.virtual_memory()
    return DeviceInfo("cpu", "host", os.uname().nodename, int(vm.total), int(vm.available))


def parse_bytes(value: int | str | None) -> int | None:
    """Bytes from an int or a string such as '2 GiB' (None stays None)."""
    if value is None or isinstance(value, int):
        return value
    from dask.utils import parse_bytes as dask_parse

    return int(dask_parse(value))


def memory_bytes(worker_memory_limit: int | None) -> int:
    """The memory a shard's residents live in: its GPU's, else the worker's memory limit (or the host's RAM)."""
    info = device_info()
    if info.kind == "cuda":
        return info.total_bytes
    return worker_memory_limit or info.total_bytes


def default_budget(worker_memory_limit: int | None) -> int:
    """Bytes of residents a shard may hold when the user sets no budget.

    GPU: 85% of the device's free memory at shard start (the rest for query
    scratch and CUDA context). CPU: half the worker's memory limit, so Dask's
    own memory manager (which pauses a worker at 80%) keeps room for results.
    The ``qgpu.budget`` setting (bytes or '4 GiB') overrides both.
    """
    chosen = setting("budget")
    if chosen is not None:
        return parse_bytes(chosen)
    info = device_info()
    if info.kind == "cuda":
        return int(info.free_bytes * 0.85)
    return int(memory_bytes(worker_memory_limit) * 0.5)
