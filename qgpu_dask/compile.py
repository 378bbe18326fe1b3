"""CUDA sources of kernels/ compiled at run time (CuPy RawModule, NVRTC), one template instantiation at a time.

Constants a kernel shares with Python are written once, in Python, and reach the source as ``-D`` options
(``defines``); the source ``#error``s on a missing one. tests/test_kernel_constants.py holds the two sides to it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import cupy


def kernel_dir() -> Path:
    """Folder holding the .cu sources: ``qgpu_dask/kernels`` when installed, the repo's ``kernels/`` in a checkout."""
    here = Path(__file__).resolve()
    for candidate in (here.parent / "kernels", here.parents[1] / "kernels"):
        if (candidate / "dense.cu").is_file():
            return candidate
    raise FileNotFoundError(f"kernels/dense.cu not found near {here}")


def defines(**constants: int | str) -> tuple[str, ...]:
    """``-DNAME=value`` options handing Python's constants to a kernel source: an int as its decimal digits,
    a str as written (``f"{STATE_LOW}u"`` for an unsigned literal)."""
    for name, value in constants.items():
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise TypeError(f"kernel constant {name} must be an int or a str, got {type(value).__name__}")
    return tuple(f"-D{name}={value}" for name, value in constants.items())


INCLUDE = re.compile(r'^#include "(\w+\.cuh)"$', re.MULTILINE)


def inlined(text: str, folder: Path) -> str:
    """A kernel source with its ``#include "name.cuh"`` lines (headers of ``folder``) replaced by the headers'
    text, so a compiled source is one string: CuPy's cache keys on it, and a changed header compiles again."""
    return INCLUDE.sub(lambda m: inlined((folder / m.group(1)).read_text(), folder), text)


@dataclass(frozen=True)
class Launch:
    """One kernel launch: its name expression, grid, threads per block and dynamic shared memory (bytes)."""

    name: str
    grid: tuple[int, ...]
    threads: int
    shared_bytes: int


@functools.cache
def source(file: str) -> str:
    return inlined((kernel_dir() / file).read_text(), kernel_dir())


@functools.cache
def limits(device_id: int) -> tuple[int, int, int]:
    """(multiprocessors, shared memory a block may opt into, shared memory per multiprocessor)."""
    rt = cupy.cuda.runtime
    sms = rt.deviceGetAttribute(getattr(rt, "cudaDevAttrMultiProcessorCount", 16), device_id)
    optin = rt.deviceGetAttribute(getattr(rt, "cudaDevAttrMaxSharedMemoryPerBlockOptin", 97), device_id)
    per_sm = rt.deviceGetAttribute(getattr(rt, "cudaDevAttrMaxSharedMemoryPerMultiprocessor", 81), device_id)
    return int(sms), int(optin), int(per_sm)


@functools.cache
def compiled(file: str, name_expr: str, options: tuple[str, ...], device_id: int) -> cupy.RawKernel:
    """One kernel of ``file``, compiled once per (expression, options, device), allowed all the shared memory
    a block may opt into."""
    module = cupy.RawModule(code=source(file), options=("-std=c++17", *options), name_expressions=[name_expr])
    kern = module.get_function(name_expr)
    optin = limits(device_id)[1]
    if optin > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = optin - kern.shared_size_bytes
    return kern


def kernel(file: str, name_expr: str, options: tuple[str, ...] = ()) -> cupy.RawKernel:
    """The compiled kernel ``name_expr`` of ``file`` for the current device."""
    return compiled(file, name_expr, options, cupy.cuda.Device().id)


def run(file: str, options: tuple[str, ...], launch: Launch, args: tuple) -> None:
    """``launch`` of a kernel of ``file`` compiled with ``options``, on the current stream."""
    kernel(file, launch.name, options)(launch.grid, (launch.threads,), args, shared_mem=launch.shared_bytes)
