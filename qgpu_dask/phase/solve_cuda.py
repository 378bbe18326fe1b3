"""Direct ptychography's solve at one strength on the GPU (kernels/solve.cu): the twin of ``phase.direct_cpu.shifted_solve``,
which ``phase.cuda`` offers beside the other SSB kernels."""

from __future__ import annotations

import math

import cupy
import numpy as np

from .. import compile

SOLVE_THREADS = 128  # systems per block of shifted_solve, one thread each
MAX_SOLVE = 16  # the largest system the kernel factorises, a thread's (nvcc sm_90: in registers up to 10, 784 B spilled at 12, 3352 B at 16)
DEFINES = compile.defines()  # the kernel takes no constant from Python


def shifted_solve(matrix, rhs, shift: float) -> cupy.ndarray:
    """The twin of ``phase.direct_cpu.shifted_solve``: a Cholesky factorisation per thread (kernels/solve.cu) up to
    MAX_SOLVE unknowns, CuPy's batched solve beyond."""
    n, C = rhs.shape
    if C > MAX_SOLVE:
        return cupy.linalg.solve(matrix + shift * cupy.eye(C), rhs[..., None])[..., 0]
    x = cupy.empty((n, C), np.complex128)
    if n:
        compile.kernel("solve.cu", f"shifted_solve<{C}>", DEFINES)(
            (math.ceil(n / SOLVE_THREADS),), (SOLVE_THREADS,),
            (cupy.ascontiguousarray(matrix, np.complex128), cupy.ascontiguousarray(rhs, np.complex128), np.int64(n), np.float64(shift), x))
    return x
