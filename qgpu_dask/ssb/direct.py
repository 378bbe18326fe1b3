"""Regularized direct ptychography: the object on a grid ``u`` times finer than the scan, from G by normal equations.

Coarse scan frequency j aliases to the fine frequencies J_m = j + m N
(m in {0..u-1}^2, folded into [-Nu/2, Nu/2)), q_m = J_m / (N scan_step);
only aliases with lambda |q_m| < 2 alpha carry signal, and those of j = 0
(multiples of the scan frequency) are left at 0: the unscattered beam sits
there. For a weak object
O = 1 + eps, to first order
G(k, j) = u^-2 sum_m [Gamma_plus(k, q_m) eps(J_m) + Gamma_minus(k, q_m) conj(eps(-J_m))],
Gamma_plus = conj(psi(k)) psi(k - q), Gamma_minus = psi(k) conj(psi(k + q))
(physics notes). The phase method has one unknown Phi(J_m) per alias (column
i (Gamma_plus - Gamma_minus) / u^2); the complex method two, a_m = eps(J_m)
and b_m = conj(eps(-J_m)). Per j of the half spectrum: minimise
sum_k W_k |g_k - T x|^2 + s sum_m w_m |x_m|^2 with W_k = 1 / (the pixel's mean
intensity) (Poisson noise), w_m = (1 + |q_m|^2 / q0^2)^2, q0 = alpha / lambda.
With D = diag(w), the Gram A = T^H W T is turned into D^-1/2 A D^-1/2 = V L V^H
once per optics, so any strength s is x = D^-1/2 V (V^H D^-1/2 T^H W g) / (L + s):
a diagonal evaluation. ``strength`` is s relative to the mean diagonal of
that matrix, so it does not depend on the dose or the number of pixels.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .optics import Optics, chi, chi_table
from .sideband import Spectrum, sum_kernels

METHODS = ("phase", "complex")


@dataclass
class DirectResult:
    """A direct-ptychography image on the fine grid: ``phase`` (rad, mean 0) and, for the complex method,
    ``amplitude`` (mean 1), float32 (scan_rows * u, scan_cols * u); ``prepared``: whether this call built the
    equations (False: they were kept from an earlier call)."""

    phase: np.ndarray
    amplitude: np.ndarray | None
    method: str
    upsampling: int
    strength: float
    prepared: bool = True


def check_method(method) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def check_strength(strength) -> float:
    try:
        value = float(strength)
    except (TypeError, ValueError):
        raise ValueError(f"strength must be a number >= 0, got {strength!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"strength must be a finite number >= 0, got {strength!r}")
    return value


def auto_upsampling(optics: Optics) -> int:
    """The smallest u whose fine-grid Nyquist frequency u / (2 scan_step) covers 2 alpha / lambda."""
    return max(1, math.ceil(4 * optics.aperture_k * optics.scan_step_A - 1e-9))


def upsampling_of(optics: Optics, upsampling) -> int:
    """``upsampling`` checked (an integer from 1 to 8), or the automatic one for "auto"."""
    if upsampling == "auto":
        return auto_upsampling(optics)
    if not isinstance(upsampling, (int, np.integer)) or isinstance(upsampling, bool) or not 1 <= upsampling <= 8:
        raise ValueError(f"upsampling must be 'auto' or an integer from 1 to 8, got {upsampling!r}")
    return int(upsampling)


def optics_key(optics: Optics, upsampling: int) -> str:
    """What the prepared equations depend on: every optics field and the upsampling (not the strength)."""
    text = repr((optics.energy_eV, optics.semiangle_mrad, optics.scan_step_A, optics.det_sampling_mrad, optics.rotation_deg,
                 optics.flip, sorted(optics.aberrations.items()), optics.bf_center_px, upsampling))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def aliases(scan_shape: tuple[int, int], optics: Optics, u: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each coarse frequency of the half spectrum (rows, cols // 2 + 1): its aliases' q (1/A, (.., d, 2) as
    (q_y, q_x)), fine-grid indices (.., d, 2) in [0, N u) and which carry signal (.., d), the carrying ones
    first; d is the most any frequency keeps."""
    rows, cols = scan_shape
    limit = 2 * optics.aperture_k
    jr = np.arange(rows)[:, None, None, None]
    jc = np.arange(cols // 2 + 1)[None, :, None, None]
    m = np.arange(u)
    fine_r = np.broadcast_to((jr + m[:, None] * rows) % (rows * u), (rows, cols // 2 + 1, u, u)).reshape(rows, cols // 2 + 1, u * u)
    fine_c = np.broadcast_to((jc + m[None, :] * cols) % (cols * u), (rows, cols // 2 + 1, u, u)).reshape(rows, cols // 2 + 1, u * u)
    signed_r = np.where(fine_r >= (rows * u + 1) // 2, fine_r - rows * u, fine_r)
    signed_c = np.where(fine_c >= (cols * u + 1) // 2, fine_c - cols * u, fine_c)
    q = np.stack([signed_r / (rows * optics.scan_step_A), signed_c / (cols * optics.scan_step_A)], axis=-1)
    valid = np.hypot(q[..., 0], q[..., 1]) < limit
    valid[0, 0] = False  # j = 0 holds the unscattered beam: its aliases (multiples of the scan frequency) are not seen apart from it
    order = np.argsort(~valid, axis=-1, kind="stable")
    d = max(1, int(valid.sum(axis=-1).max()))
    take = order[..., :d]
    fine = np.stack([np.take_along_axis(fine_r, take, -1), np.take_along_axis(fine_c, take, -1)], axis=-1)
    return np.take_along_axis(q, take[..., None], -2), fine, np.take_along_axis(valid, take, -1)


def equations_bytes(scan_shape: tuple[int, int], optics: Optics, u: int, method: str) -> int:
    """Device bytes ``prepare`` holds at its peak: the Gram, its scaled copy and the eigenvectors, complex128."""
    valid = aliases(scan_shape, optics, u)[2]
    columns = valid.shape[-1] * (2 if method == "complex" else 1)
    return 3 * valid.shape[0] * valid.shape[1] * columns**2 * 16


@dataclass
class Prepared:
    """One method's equations in the eigenbasis, per coarse frequency: x(s) = scale * V (c / (L + s level))."""

    method: str
    upsampling: int
    scan_shape: tuple[int, int]
    valid: Any  # (rows * half * d,) which unknowns of each kind carry signal
    here_at: Any  # flat fine-grid index of each carrying alias J
    mirror_at: Any  # and of -J
    share: Any  # (rows * u, cols * u): 1 / how many aliases reach each fine frequency (0 where none)
    scale: Any  # (rows, half, D): D^-1/2
    vectors: Any  # (rows, half, D, D)
    values: Any  # (rows, half, D)
    projected: Any  # (rows, half, D): V^H D^-1/2 T^H W g
    level: float

    @property
    def nbytes(self) -> int:
        arrays = (self.valid, self.here_at, self.mirror_at, self.share, self.scale, self.vectors, self.values, self.projected)
        return int(sum(a.nbytes for a in arrays))


def placement(scan_shape: tuple[int, int], u: int, fine: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, ...]:
    """(valid flattened, flat fine-grid index of each carrying alias J, of -J, 1 / the aliases reaching each fine
    frequency). Each fine frequency is an alias of one coarse class, so J and -J are each distinct; only the
    self-conjugate columns (j_x = 0, N/2) reach a frequency from both sides, which then gets the mean."""
    shape = (scan_shape[0] * u, scan_shape[1] * u)
    valid = valid.ravel()
    rows, cols = fine[..., 0].ravel()[valid], fine[..., 1].ravel()[valid]
    here_at = rows * shape[1] + cols
    mirror_at = ((-rows) % shape[0]) * shape[1] + (-cols) % shape[1]
    count = np.bincount(here_at, minlength=shape[0] * shape[1]) + np.bincount(mirror_at, minlength=shape[0] * shape[1])
    share = np.where(count > 0, 1.0 / np.maximum(count, 1), 0.0).reshape(shape)
    return valid, here_at, mirror_at, share


def prepare(spec: Spectrum, ky: np.ndarray, kx: np.ndarray, optics: Optics, u: int, method: str, xp=np) -> Prepared:
    """The normal equations of ``method`` at upsampling ``u``, built and diagonalised on G's device."""
    q, fine, valid = aliases(spec.scan_shape, optics, u)
    kmax = optics.aperture_k
    G = spec.G
    mean_intensity = xp.asarray(G[:, 0, 0].real, xp.float64) * spec.scale / (spec.scan_shape[0] * spec.scan_shape[1])
    weights = 1.0 / xp.maximum(mean_intensity, 1e-12)
    gram, rhs = sum_kernels(xp).normal_equations(G, ky, kx, weights, chi(kx, ky, optics), chi_table(optics),
                                                 xp.asarray(q), xp.asarray(valid), method == "complex", u, kmax**2)
    rhs = rhs * spec.scale
    prior = (1 + (q[..., 0] ** 2 + q[..., 1] ** 2) / kmax**2) ** 2
    prior = np.where(valid, prior, 1.0)
    if method == "complex":
        prior = np.concatenate([prior, prior], axis=-1)
    scale = xp.asarray(1 / np.sqrt(prior))
    matrix = scale[..., :, None] * gram * scale[..., None, :]
    values, vectors = xp.linalg.eigh(matrix)
    projected = xp.einsum("...ji,...j->...i", vectors.conj(), scale * rhs)
    diagonal = xp.real(xp.diagonal(matrix, axis1=-2, axis2=-1))
    used = xp.asarray(np.concatenate([valid, valid], axis=-1) if method == "complex" else valid)
    level = float(diagonal[used].mean()) if bool(used.any()) else 1.0
    placed = [xp.asarray(a) for a in placement(spec.scan_shape, u, fine, valid)]
    return Prepared(method, u, spec.scan_shape, *placed, scale, vectors, values, projected, level)


def solve(prep: Prepared, strength: float, xp=np) -> DirectResult:
    """The image at one ``strength`` from prepared equations: a diagonal evaluation and an inverse FFT."""
    s = strength * prep.level
    values = xp.where(prep.values + s > 0, prep.values + s, xp.inf)
    x = prep.scale * xp.einsum("...ij,...j->...i", prep.vectors, prep.projected / values)
    u = prep.upsampling
    if prep.method == "complex":  # eps(J) = a, eps(-J) = conj(b)
        d = x.shape[-1] // 2
        here, mirrored = x[..., :d], xp.conj(x[..., d:])
    else:  # Phi(-J) = conj(Phi(J))
        here, mirrored = x, xp.conj(x)
    spectrum = xp.zeros(prep.share.size, xp.complex128)
    spectrum[prep.here_at] = here.reshape(-1)[prep.valid]
    spectrum[prep.mirror_at] += mirrored.reshape(-1)[prep.valid]  # distinct indices: a plain fancy-index add is exact
    spectrum = spectrum.reshape(prep.share.shape) * prep.share
    spectrum[0, 0] = 0
    image = xp.fft.ifft2(spectrum)
    if prep.method == "phase":
        phase = image.real
        return DirectResult((phase - phase.mean()).astype(xp.float32), None, "phase", u, strength)
    phase = image.imag
    return DirectResult((phase - phase.mean()).astype(xp.float32), (1 + image.real).astype(xp.float32), "complex", u, strength)
