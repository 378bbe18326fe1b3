"""CUDA kernels run on the host (tests/cuda_on_host.h: a std::thread per CUDA thread, barriers for the block's and
the warp's synchronisation) against their CPU twins, as the GPU tests compare them: their indexing, tiling and
synchronisation checked where no GPU is (float arithmetic is the host's, not the device's fast intrinsics).

The sources are compiled with the host's C++ compiler (C++20, for std::barrier); the launches are the ones the
CUDA modules make (``fused_launches``), their constants the same -D options (``DEFINES``)."""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import compiling_module
from qgpu_dask.phase import cpu as phase_cpu
from qgpu_dask.phase.iterative import cpu
from qgpu_dask.phase.iterative.geometry import Geometry
from qgpu_dask.phase.iterative.update import batch_of

ROOT = Path(__file__).resolve().parents[1]
COMPILER = shutil.which("g++")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="needs a C++20 compiler (g++)")
SHARED = re.compile(r"extern __shared__ (\w+) (\w+)\[\];")


def host_source(file: str) -> str:
    """kernels/``file`` with its dynamic shared memory pointed at the host's buffer."""
    return SHARED.sub(r"\1* \2 = reinterpret_cast<\1*>(host_shared);", (ROOT / "kernels" / file).read_text())


def library(file: str, defines: tuple[str, ...], entry: str, tmp: Path) -> ctypes.CDLL:
    """``entry`` (extern "C" functions launching the kernels) compiled with kernels/``file`` into a library."""
    (tmp / file).write_text(host_source(file))
    (tmp / "entry.cpp").write_text(f'#include "{ROOT / "tests" / "cuda_on_host.h"}"\n#include "{file}"\n{entry}')
    subprocess.run([COMPILER, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", *defines, str(tmp / "entry.cpp"), "-o", str(tmp / "entry.so")],
                   check=True, cwd=tmp)
    return ctypes.CDLL(str(tmp / "entry.so"))


def pointer(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("window", [(24, 20), (45, 64)], ids=["6x4,5x4", "9x5,8x8"])
def test_fused_ptycho_kernels_against_their_twin(window, tmp_path):
    """rows_forward, columns and rows_inverse as updated_waves launches them: partial tiles of columns, a last
    block of fewer rows, a last group of fewer positions, repeated windows."""
    cuda = compiling_module("qgpu_dask.phase.iterative.cuda")
    R, C = window
    rng = np.random.default_rng(5)
    corners = rng.integers(0, 40, (20, 2))
    corners[5] = corners[4]
    geo = Geometry(corners, (40 + R, 40 + C), window, (1.0, 1.0), (5, 7))
    cplx = lambda *shape: (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(np.complex64)
    obj, probe = cplx(*geo.object_shape), cplx(*window)
    batch = batch_of(geo, 3, 10)
    measured = rng.poisson(3.0, (batch.n, R, C)).astype(np.uint16)
    numerator, denominator = np.zeros(window, np.complex64), np.zeros(window, np.float32)
    updated, error = cpu.updated_waves(obj, probe, measured, corners, batch, geo.center, 0.25, numerator, denominator)

    forward, columns, inverse = cuda.fused_launches(R, C, batch.n, "unsigned short")
    dim = lambda grid: "Dim{" + ", ".join(map(str, grid)) + "}"
    entry = f"""
extern "C" void fused(const float2* obj, i64 cols, const float2* probe, int R, int C, const i64* corners, i64 first, i64 n,
                      const unsigned short* measured, int cr, int cs, float scale, const float2* roots_r, const float2* roots_c,
                      float2* wave, double* partial, float2* top, float* bottom) {{
    launch({dim(forward.grid)}, {forward.threads}, [&] {{ {forward.name}(obj, cols, probe, R, C, corners, first, n, roots_c, wave); }});
    launch({dim(columns.grid)}, {columns.threads}, [&] {{ {columns.name}(wave, measured, R, C, cr, cs, scale, roots_r, partial); }});
    launch({dim(inverse.grid)}, {inverse.threads}, [&] {{
        {inverse.name}(wave, obj, cols, probe, R, C, corners, first, n, {cuda.FUSED_GROUP}, roots_c, top, bottom); }});
}}"""
    fused = library("ptycho.cu", cuda.DEFINES, entry, tmp_path).fused
    roots = lambda m: np.exp(-2j * np.pi * np.arange(m) / m).astype(np.complex64)  # as cuda.roots makes them
    wave = np.zeros((batch.n, R, C), np.complex64)
    partial = np.zeros(math.prod(columns.grid))
    top = np.zeros((inverse.grid[1], R, C), np.complex64)
    bottom = np.zeros((inverse.grid[1], R, C), np.float32)
    arrays = [np.ascontiguousarray(a) for a in (obj, probe, corners.astype(np.int64), measured, roots(R), roots(C))]
    fused(pointer(arrays[0]), ctypes.c_int64(obj.shape[1]), pointer(arrays[1]), R, C, pointer(arrays[2]), ctypes.c_int64(batch.first),
          ctypes.c_int64(batch.n), pointer(arrays[3]), geo.center[0] % R, geo.center[1] % C, ctypes.c_float(0.25), pointer(arrays[4]),
          pointer(arrays[5]), pointer(wave), pointer(partial), pointer(top), pointer(bottom))

    close = lambda got, want: np.abs(got - want).max() <= 1e-5 * np.abs(want).max()  # the GPU test's tolerances
    assert close(wave, updated) and abs(partial.sum() - error) <= 1e-5 * error
    assert close(top.sum(axis=0), numerator) and close(bottom.sum(axis=0), denominator)


@pytest.mark.parametrize("C", [1, 6, 16])
def test_shifted_solve_kernel_against_its_twin(C, tmp_path):
    """A thread per system, Cholesky in registers: against the Numba twin, on singular matrices too."""
    solve = compiling_module("qgpu_dask.phase.solve_cuda")
    rng = np.random.default_rng(C)
    n = solve.SOLVE_THREADS + 7  # two blocks, the second partly empty
    A = rng.normal(size=(n, max(1, C - 2), C)) + 1j * rng.normal(size=(n, max(1, C - 2), C))
    matrix = np.ascontiguousarray(np.einsum("nki,nkj->nij", A.conj(), A))
    rhs = np.ascontiguousarray(rng.normal(size=(n, C)) + 1j * rng.normal(size=(n, C)))
    entry = f"""
extern "C" void solve(const double2* matrix, const double2* rhs, i64 n, double shift, double2* x) {{
    launch(Dim{{{math.ceil(n / solve.SOLVE_THREADS)}}}, {solve.SOLVE_THREADS}, [&] {{ shifted_solve<{C}>(matrix, rhs, n, shift, x); }});
}}"""
    x = np.zeros((n, C), np.complex128)
    library("solve.cu", solve.DEFINES, entry, tmp_path).solve(pointer(matrix), pointer(rhs), ctypes.c_int64(n), ctypes.c_double(0.05), pointer(x))
    want = phase_cpu.shifted_solve(matrix, rhs, 0.05)
    assert np.abs(x - want).max() <= 1e-9 * np.abs(want).max()
