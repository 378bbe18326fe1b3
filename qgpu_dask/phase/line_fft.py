"""The kernels' FFTs of lines in shared memory (kernels/fft.cuh, which ptycho.cu includes): the Line type
of an n-point FFT, its shared memory and its twiddle table."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cupy
import numpy as np

RADICES = (8, 4, 2, 3, 5)  # kernels/fft.cuh butterfly; a DFT takes as many 8s, then 4s, as it can
MAX_DFT = 32  # the most points of a thread's DFT in registers (a line of N = P Q points takes P- and Q-point ones)


@dataclass(frozen=True)
class Line:
    """The kernels' two-step FFT of an n-point line, n = P Q (kernels/fft.cuh Line): P-point DFTs, then
    Q-point ones, each in a thread's registers."""

    P: int
    Q: int

    @property
    def name(self) -> str:
        return f"Line<{dft(self.P)}, {dft(self.Q)}>"

    @property
    def scratch_points(self) -> int:
        """Shared-memory points of one line's scratch between the two steps (kernels/fft.cuh scratch_line: P rows
        of an odd pitch, then up to Q modulo 16)."""
        return congruent(self.P * (self.Q | 1), self.Q)

    @property
    def pitch(self) -> int:
        """Shared-memory points of one line (kernels/fft.cuh Line::pitch)."""
        return congruent(self.P * self.Q, self.Q if self.Q % 16 else 2)

    def shared_points(self, lines: int) -> int:
        """Shared-memory points of ``lines`` lines and their FFT's scratch."""
        return lines * (self.pitch + self.scratch_points)


def dft(n: int) -> str:
    """The kernels' Dft<n, radices...> (RADICES, largest first); n has no prime factor above 5."""
    radices, rest = [], n
    for r in RADICES:
        while rest % r == 0:
            radices.append(r)
            rest //= r
    return f"Dft<{', '.join(map(str, [n, *radices]))}>"


def line(n: int, longest: int) -> Line | None:
    """The kernels' Line of an n-point FFT (P >= Q, as near each other as they come, both at most MAX_DFT), or None
    when n has a prime factor above 5 or exceeds ``longest`` (the caller's shared memory): cuFFT's then."""
    rest = n
    for r in (2, 3, 5):
        while rest % r == 0:
            rest //= r
    if rest != 1 or n > longest:
        return None
    P = min(p for p in range(1, n + 1) if n % p == 0 and p * p >= n)
    return Line(P, n // P) if P <= MAX_DFT else None


@functools.cache
def roots(n: int, device: int) -> cupy.ndarray:
    """exp(-2 pi i m / n) for m < n, complex64 of float64 values: the N-point twiddles of a Line's two steps, one
    table per ``device`` (the cache's key: an array lives on the GPU that made it)."""
    return cupy.asarray(np.exp(-2j * np.pi * np.arange(n) / n).astype(np.complex64))


def padded(n: int) -> int:
    """Shared-memory points of an n-point row in far_field_pair's padded layout (kernels/fft.cuh padded)."""
    return n + (n >> 4) + 1


def congruent(n: int, m: int) -> int:
    """The least count >= n that is m modulo 16 (kernels/fft.cuh congruent)."""
    return n + (m - n) % 16
