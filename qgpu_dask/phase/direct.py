"""Regularized direct ptychography: the object on a grid ``u`` times finer than the scan, from G by normal equations.

Coarse scan frequency j aliases to the fine frequencies J_m = j + m N
(m in {0..u-1}^2, folded into [-Nu/2, Nu/2)), q_m = J_m / (N scan_step);
only aliases with lambda |q_m| < 2 alpha carry signal. The aliases of j = 0
(multiples of the scan frequency, where a crystal scanned a whole number of
positions per cell puts half its reflections) share their equations with the
unscattered beam: its term c |psi(k)|^2, c free, is projected out of them
(``beam_system``), and the first-order model fits them worse than the others
(the mean pattern also holds the second-order, incoherent scattering), so
their prior is ``BEAM_PRIOR`` times as strong; the fine grid's Nyquist row and
column (two frequencies in one) are left at 0 there. For a weak object
O = 1 + eps, to first order
G(k, j) = u^-2 sum_m [Gamma_plus(k, q_m) eps(J_m) + Gamma_minus(k, q_m) conj(eps(-J_m))],
Gamma_plus = conj(psi(k)) psi(k - q), Gamma_minus = psi(k) conj(psi(k + q))
(physics notes). The phase method has one unknown Phi(J_m) per alias (column
i (Gamma_plus - Gamma_minus) / u^2); the complex method two, a_m = eps(J_m)
and b_m = conj(eps(-J_m)). Per j of the half spectrum: minimise
sum_k W_k |g_k - T x|^2 + s sum_m w_m |x_m|^2 with W_k = 1 / (the pixel's mean
intensity) (Poisson noise), w_m = (1 + |q_m|^2 / q0^2)^2, q0 = alpha / lambda.
With D = diag(w), the Gram A = T^H W T and b = T^H W g are kept per optics
as M = D^-1/2 A D^-1/2 and D^-1/2 b, so any strength s is one batched solve
x = D^-1/2 (M + s I)^-1 D^-1/2 b (an eigenbasis would make it a diagonal
evaluation, but on the GPU the batched eigendecomposition costs more at
preparation than the solves save: docs/physics.md). ``strength`` is s
relative to the mean diagonal of M, so it does not depend on the dose or the
number of pixels. Frequencies are grouped by how many aliases carry signal,
one system size per group.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .optics import Optics, chi, chi_table, probe_spectrum
from .parallax import check_upsampling
from .sideband import Spectrum

METHODS = ("phase", "complex")
BEAM_PRIOR = 10.0  # the prior of j = 0's aliases against the others': on abTEM SrTiO3 at 8 and 16 scan positions
# over 4 cells, 3x and 30x gave lower fine-grid correlations at some upsampling (docs/physics.md)


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

    def __repr__(self) -> str:
        """One line: the images' shapes and dtypes and the settings, no array values."""
        images = [f"{name} {'x'.join(map(str, a.shape))} {a.dtype}" for name, a in (("phase", self.phase), ("amplitude", self.amplitude))
                  if a is not None]
        made = "equations prepared by this call" if self.prepared else "kept equations"
        return f"DirectResult({', '.join(images)}, method={self.method!r}, upsampling={self.upsampling}, strength={self.strength:.4g}, {made})"


def check_method(method) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def check_strength(strength) -> float:
    try:
        value = float(strength)
    except (TypeError, ValueError):
        raise ValueError(f"strength must be a number > 0, got {strength!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"strength must be a finite number > 0 (without regularization frequencies the data do not "
                         f"determine are undetermined), got {strength!r}")
    return value


def auto_upsampling(optics: Optics) -> int:
    """The smallest u whose fine-grid Nyquist frequency u / (2 scan_step) covers 2 alpha / lambda."""
    return max(1, math.ceil(4 * optics.aperture_k * optics.scan_step_A - 1e-9))


def upsampling_of(optics: Optics, upsampling) -> int:
    """``upsampling`` checked (an integer from 1 to 8), or the automatic one for "auto"."""
    if upsampling == "auto":
        return auto_upsampling(optics)
    check_upsampling(upsampling, also="'auto' or ")
    return int(upsampling)


def optics_key(optics: Optics, upsampling: int) -> str:
    """What the prepared equations depend on: every optics field and the upsampling (not the strength)."""
    text = repr((optics.energy_eV, optics.semiangle_mrad, optics.scan_step_A, optics.det_sampling_mrad, optics.rotation_deg,
                 optics.flip, sorted(optics.aberrations.items()), optics.bf_center_px, upsampling))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@dataclass
class AliasGroup:
    """The coarse frequencies of the half spectrum with ``count`` carrying aliases: their flat indices
    ``freq`` (n,) into the (rows, cols // 2 + 1) half spectrum, the aliases' q (n, count, 2) as (q_y, q_x) in 1/A,
    and the flat fine-grid indices of each alias J (``here_at``) and of -J (``mirror_at``), (n * count,)."""

    count: int
    freq: Any
    q: Any
    here_at: Any
    mirror_at: Any


@dataclass
class Aliases:
    """Every coarse frequency's carrying aliases, grouped by their number; ``share`` (rows * u, cols * u) is
    1 / how many aliases reach each fine frequency (0 where none). Each fine frequency is an alias of one
    coarse class, so J and -J are each distinct; only the self-conjugate columns (j_x = 0, N/2) reach a
    frequency from both sides, which then gets the mean."""

    scan_shape: tuple[int, int]
    upsampling: int
    groups: list[AliasGroup]
    beam: AliasGroup | None  # j = 0's carrying aliases (one frequency), solved beside the unscattered beam
    share: Any
    q_step: tuple[float, float]

    @property
    def all_groups(self) -> list[AliasGroup]:
        """The groups, then the beam's: the order of the prepared systems."""
        return self.groups + ([self.beam] if self.beam is not None else [])

    @property
    def nbytes(self) -> int:
        return int(self.share.nbytes + sum(g.freq.nbytes + g.q.nbytes + g.here_at.nbytes + g.mirror_at.nbytes for g in self.all_groups))


def aliases_key(scan_shape: tuple[int, int], optics: Optics, u: int) -> str:
    """What ``aliases`` depends on: the scan, the upsampling and the band (scan step, aperture, wavelength);
    not the aberrations, so a change of them keeps the aliases."""
    return repr((tuple(scan_shape), u, optics.scan_step_A, optics.aperture_k))


def aliases(scan_shape: tuple[int, int], optics: Optics, u: int, xp=np) -> Aliases:
    """The aliases of every coarse frequency that carry signal (lambda |q| < 2 alpha), on ``xp``'s device."""
    rows, cols = scan_shape
    fine_shape = (rows * u, cols * u)
    m = xp.arange(u)
    fine_r = (xp.arange(rows)[:, None, None, None] + m[:, None] * rows) % fine_shape[0]
    fine_c = (xp.arange(cols // 2 + 1)[None, :, None, None] + m[None, :] * cols) % fine_shape[1]
    fine_r, fine_c = (a.reshape(rows * (cols // 2 + 1), u * u) for a in xp.broadcast_arrays(fine_r, fine_c))
    qy = xp.where(fine_r >= (fine_shape[0] + 1) // 2, fine_r - fine_shape[0], fine_r) / (rows * optics.scan_step_A)
    qx = xp.where(fine_c >= (fine_shape[1] + 1) // 2, fine_c - fine_shape[1], fine_c) / (cols * optics.scan_step_A)
    valid = qy**2 + qx**2 < (2 * optics.aperture_k) ** 2
    nyquist = (2 * fine_r[0] == fine_shape[0]) | (2 * fine_c[0] == fine_shape[1])
    beside_beam = valid[0] & ~nyquist & ((fine_r[0] != 0) | (fine_c[0] != 0))  # j = 0: its aliases less q = 0, the beam
    valid[0] = False
    count = valid.sum(axis=1)
    groups = []
    for d in (c for c in xp.unique(count).tolist() if c > 0):
        freq = xp.nonzero(count == d)[0]
        at = xp.nonzero(valid[freq])[1].reshape(-1, d)  # row by row: each frequency's carrying aliases in order

        def take(a, freq=freq, at=at):
            return xp.take_along_axis(a[freq], at, axis=1)

        r, c = take(fine_r), take(fine_c)
        groups.append(AliasGroup(d, freq, xp.stack([take(qy), take(qx)], axis=-1), (r * fine_shape[1] + c).ravel(),
                                 ((-r % fine_shape[0]) * fine_shape[1] + (-c % fine_shape[1])).ravel()))
    beam = None
    if bool(beside_beam.any()):
        at = xp.nonzero(beside_beam)[0]
        r, c = fine_r[0, at], fine_c[0, at]
        beam = AliasGroup(int(at.size), xp.zeros(1, xp.int64), xp.stack([qy[0, at], qx[0, at]], axis=-1)[None], r * fine_shape[1] + c,
                          (-r % fine_shape[0]) * fine_shape[1] + (-c % fine_shape[1]))
    reaching = [a for g in groups + ([beam] if beam else []) for a in (g.here_at, g.mirror_at)]
    reached = xp.bincount(xp.concatenate(reaching) if reaching else xp.zeros(0, xp.int64), minlength=fine_shape[0] * fine_shape[1])
    inverse = xp.concatenate([xp.zeros(1), 1.0 / xp.arange(1, int(reached.max()) + 1)])  # 1 / n, and 0 where none reaches
    return Aliases((rows, cols), u, groups, beam, inverse[reached].reshape(fine_shape),
                   (1 / (rows * optics.scan_step_A), 1 / (cols * optics.scan_step_A)))


def equations_bytes(found: Aliases, method: str) -> int:
    """Device bytes ``prepare`` and ``solve`` hold at their peak: the Gram, its scaled copy and a solve's
    copy, complex128."""
    per = 2 if method == "complex" else 1
    return 3 * 16 * sum(int(g.freq.size) * (per * g.count) ** 2 for g in found.all_groups)


@dataclass
class System:
    """The scaled equations of one alias group: x(s) = scale * (matrix + s I)^-1 rhs, per frequency."""

    matrix: Any  # (n, C, C) D^-1/2 T^H W T D^-1/2
    rhs: Any  # (n, C) D^-1/2 T^H W g
    scale: Any  # (n, C) D^-1/2

    @property
    def nbytes(self) -> int:
        return int(self.matrix.nbytes + self.rhs.nbytes + self.scale.nbytes)


@dataclass
class Prepared:
    """One method's equations at one optics and upsampling, and where their unknowns go on the fine grid."""

    method: str
    found: Aliases
    systems: list[System]
    here_at: Any  # every group's here_at, in group order
    mirror_at: Any
    level: float

    @property
    def nbytes(self) -> int:
        return int(sum(s.nbytes for s in self.systems) + self.here_at.nbytes + self.mirror_at.nbytes + self.found.nbytes)


def equation_kernels(xp):
    """The normal equations and their shifted solve for ``xp``'s arrays: ``phase.direct_cpu`` or ``phase.cuda``."""
    if xp is np:
        from . import direct_cpu

        return direct_cpu
    from . import cuda

    return cuda


def pixel_weights(spec: Spectrum, xp=np):
    """W_k = 1 / each bright-field pixel's mean intensity (normalised counts): Poisson noise, float64."""
    mean_intensity = xp.asarray(spec.G[:, 0, 0].real, xp.float64) * spec.scale / (spec.scan_shape[0] * spec.scan_shape[1])
    return 1.0 / xp.maximum(mean_intensity, 1e-12)


def beam_system(spec: Spectrum, ky: np.ndarray, kx: np.ndarray, weights, optics: Optics, found: Aliases, method: str, xp=np) -> System:
    """The equations of j = 0's aliases (``found.beam``), from explicit columns on G's device: g = G(k, 0) holds
    the unscattered beam c |psi(k)|^2 beside them, c free, so the weighted projection onto |psi|^2 is taken out
    of g and of every column (the least squares over c done first); scaled for a prior BEAM_PRIOR times the
    others'."""
    beam, u2 = found.beam, found.upsampling**2
    ky, kx = xp.asarray(ky, xp.float64)[:, None], xp.asarray(kx, xp.float64)[:, None]
    qy, qx = beam.q[0, :, 0][None, :], beam.q[0, :, 1][None, :]
    count = qx.shape[1]  # psi at k, k - q and k + q in one evaluation (each of chi's terms is an array operation)
    psi = probe_spectrum(xp.concatenate([kx, kx - qx, kx + qx], axis=1), xp.concatenate([ky, ky - qy, ky + qy], axis=1), optics, xp)
    here = psi[:, :1]
    plus = xp.conj(here) * psi[:, 1 : 1 + count] / u2
    minus = here * xp.conj(psi[:, 1 + count :]) / u2
    T = xp.concatenate([plus, minus], axis=1) if method == "complex" else 1j * (plus - minus)
    g = xp.asarray(spec.G[:, 0, 0], xp.complex128) * spec.scale
    a = xp.abs(here[:, 0]) ** 2
    wa = weights * a
    beam_norm = float(wa @ a)
    T = T - a[:, None] * (wa @ T)[None, :] / beam_norm
    g = g - a * (wa @ g) / beam_norm
    TW = T.conj().T * weights
    return scaled((TW @ T)[None], (TW @ g)[None], beam.q, optics.aperture_k, method, xp, BEAM_PRIOR)


def scaled(gram, rhs, q, kmax: float, method: str, xp=np, prior: float = 1.0) -> System:
    """A group's Gram (n, C, C) and right side (n, C) at its aliases' q (n, count, 2) as the System solved for
    the prior ``prior`` x (1 + |q|^2 / kmax^2)^2: scaled by D^-1/2 on both sides (both columns of an alias,
    for the complex method)."""
    scale = 1 / (1 + (q[..., 0] ** 2 + q[..., 1] ** 2) / kmax**2) / math.sqrt(prior)
    scale = xp.concatenate([scale, scale], axis=1) if method == "complex" else scale
    return System(scale[:, :, None] * gram * scale[:, None, :], scale * rhs, scale)


def prepare(spec: Spectrum, ky: np.ndarray, kx: np.ndarray, optics: Optics, found: Aliases, method: str, xp=np) -> Prepared:
    """The normal equations of ``method`` for the aliases ``found``, built and scaled on G's device."""
    kmax = optics.aperture_k
    weights = pixel_weights(spec, xp)
    chi_k, table, kernels = chi(kx, ky, optics), chi_table(optics), equation_kernels(xp)
    systems = []
    equations = kernels.normal_equations(spec.G, ky, kx, weights, chi_k, table, found, method == "complex", kmax**2)
    for g, (gram, rhs) in zip(found.groups, equations):
        systems.append(scaled(gram, rhs * spec.scale, g.q, kmax, method, xp))
    diagonal = sum(float(xp.real(xp.diagonal(s.matrix, axis1=1, axis2=2)).sum()) for s in systems)
    unknowns = sum(s.scale.size for s in systems)
    if found.beam is not None:  # after the level: the strength means what it meant without it
        systems.append(beam_system(spec, ky, kx, weights, optics, found, method, xp))
    groups = found.all_groups
    here_at = xp.concatenate([g.here_at for g in groups]) if groups else xp.zeros(0, xp.int64)
    mirror_at = xp.concatenate([g.mirror_at for g in groups]) if groups else xp.zeros(0, xp.int64)
    return Prepared(method, found, systems, here_at, mirror_at, diagonal / unknowns if unknowns else 1.0)


def unknowns(prep: Prepared, strength: float, xp=np) -> list:
    """Each group's unknowns (n, C) at ``strength``: the batched solve of (M + s I) y = D^-1/2 b, x = D^-1/2 y."""
    s = strength * prep.level
    kernels = equation_kernels(xp)
    return [sys.scale * kernels.shifted_solve(sys.matrix, sys.rhs, s) for sys in prep.systems]


def solve(prep: Prepared, strength: float, xp=np) -> DirectResult:
    """The image at one ``strength`` from prepared equations: batched solves and an inverse FFT."""
    x = unknowns(prep, strength, xp)
    if prep.method == "complex":  # eps(J) = a, eps(-J) = conj(b)
        here = [v[:, : v.shape[1] // 2].ravel() for v in x]
        mirrored = [xp.conj(v[:, v.shape[1] // 2 :]).ravel() for v in x]
    else:  # Phi(-J) = conj(Phi(J))
        here = [v.ravel() for v in x]
        mirrored = [xp.conj(v).ravel() for v in x]
    share = prep.found.share
    spectrum = xp.zeros(share.size, xp.complex128)
    if x:
        spectrum[prep.here_at] = xp.concatenate(here)
        spectrum[prep.mirror_at] += xp.concatenate(mirrored)  # distinct indices: a plain fancy-index add is exact
    spectrum = spectrum.reshape(share.shape) * share
    spectrum[0, 0] = 0
    image = xp.fft.ifft2(spectrum)
    u = prep.found.upsampling
    if prep.method == "phase":
        phase = image.real
        return DirectResult((phase - phase.mean()).astype(xp.float32), None, "phase", u, strength)
    phase = image.imag
    return DirectResult((phase - phase.mean()).astype(xp.float32), (1 + image.real).astype(xp.float32), "complex", u, strength)
