"""The electron optics of an acquisition: beam energy, probe aperture, scan step, detector geometry, aberrations.

Conventions (docs/physics.md): spatial frequencies k in 1/A, angles
alpha = lambda |k| in rad, phi = atan2(k_y, k_x); the aberration function

    chi(k) = (2 pi / lambda) sum_nm C_nm alpha^(n+1) / (n+1) cos(m (phi - phi_nm)),

C_nm in A and phi_nm in rad, as abTEM, py4DSTEM and quantem define it;
defocus = -C10, Cs = C30. Aberrations are given as {"C10": A, "C12": A,
"phi12": rad, ...}; a missing angle is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

# Physical constants (CODATA 2018), SI.
ELECTRON_MASS = 9.1093837015e-31  # kg
ELEMENTARY_CHARGE = 1.602176634e-19  # C
PLANCK = 6.62607015e-34  # J s
LIGHT_SPEED = 299792458.0  # m / s

# The aberration terms (n, m) of chi, as the physics notes list them.
TERMS = ((1, 0), (1, 2), (2, 1), (2, 3), (3, 0), (3, 2), (3, 4), (4, 1), (4, 3), (4, 5), (5, 0), (5, 2), (5, 4), (5, 6))
NAMES = {f"C{n}{m}" for n, m in TERMS} | {f"phi{n}{m}" for n, m in TERMS if m}
CALIBRATION = ("det_sampling_mrad", "rotation_deg", "flip", "bf_center_px")  # what acq.calibrate fills in
ENERGY_RANGE_EV = (1e3, 3.5e6)  # beams of electron microscopes: low-voltage SEM to the MeV instruments


def wavelength_A(energy_eV: float) -> float:
    """Relativistic electron wavelength in A for a beam of ``energy_eV`` (0.019687 A at 300 keV)."""
    e = ELEMENTARY_CHARGE * energy_eV
    momentum = math.sqrt(2 * ELECTRON_MASS * e * (1 + e / (2 * ELECTRON_MASS * LIGHT_SPEED**2)))
    return PLANCK / momentum * 1e10


def interaction_constant(energy_eV: float) -> float:
    """sigma = 2 pi m_rel e lambda / h^2 in rad / (V A): phase shift per projected potential."""
    e = ELEMENTARY_CHARGE * energy_eV
    relativistic_mass = ELECTRON_MASS + e / LIGHT_SPEED**2
    return 2 * math.pi * relativistic_mass * ELEMENTARY_CHARGE * wavelength_A(energy_eV) * 1e-10 / PLANCK**2 * 1e-10


def positive(value, what: str) -> float:
    """``value`` as a float, or ValueError naming ``what`` unless it is a finite number > 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{what} must be a finite number > 0, got {value!r}")
    return number


@dataclass(frozen=True)
class Optics:
    """What a phase reconstruction needs to know of the microscope; ``acq.calibrate`` fills in the detector fields.

    ``det_sampling_mrad``: mrad per detector pixel; ``bf_center_px``: the
    bright-field disk centre (row, col) in detector pixels; ``rotation_deg``:
    the angle turning detector directions into scan directions; ``flip``:
    whether detector rows and columns are swapped against the scan's;
    ``uncertainties``: standard errors, same keys: of the rotation (``acq.calibrate``: an estimate), of it
    and the fitted aberrations (``acq.fit_aberrations``).
    """

    energy_eV: float
    semiangle_mrad: float
    scan_step_A: float
    det_sampling_mrad: float | None = None
    rotation_deg: float | None = None
    flip: bool | None = None
    aberrations: dict = field(default_factory=dict)
    bf_center_px: tuple[float, float] | None = None
    uncertainties: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("energy_eV", "semiangle_mrad", "scan_step_A"):
            object.__setattr__(self, name, positive(getattr(self, name), name))
        low, high = ENERGY_RANGE_EV
        if not low <= self.energy_eV <= high:
            raise ValueError(f"energy_eV={self.energy_eV:g} is outside the beam energies of electron microscopes ({low:g} to "
                             f"{high:g} eV): the energy is in eV, so 300 keV is energy_eV=300e3")
        if self.det_sampling_mrad is not None:
            object.__setattr__(self, "det_sampling_mrad", positive(self.det_sampling_mrad, "det_sampling_mrad"))
        if self.bf_center_px is not None:  # a list (from JSON) is the same centre
            object.__setattr__(self, "bf_center_px", tuple(float(v) for v in self.bf_center_px))
        aberrations = dict(self.aberrations or {})
        unknown = sorted(set(aberrations) - NAMES)
        if unknown:
            raise ValueError(f"unknown aberrations {unknown}: use C_nm (A) and phi_nm (rad) with nm in {[f'{n}{m}' for n, m in TERMS]}")
        for name, value in aberrations.items():
            if not math.isfinite(float(value)):
                raise ValueError(f"aberration {name} must be finite, got {value!r}")
        object.__setattr__(self, "aberrations", {k: float(v) for k, v in aberrations.items()})

    @property
    def wavelength_A(self) -> float:
        return wavelength_A(self.energy_eV)

    @property
    def aperture_k(self) -> float:
        """The probe aperture's radius in spatial frequency, alpha / lambda, in 1/A."""
        return self.semiangle_mrad * 1e-3 / self.wavelength_A

    def __repr__(self) -> str:
        """The fields that are set, floats to 4 significant digits, each fitted aberration with its standard error."""
        parts = [f"{f.name}={rounded(getattr(self, f.name))}" for f in fields(self)
                 if f.name not in ("aberrations", "uncertainties") and getattr(self, f.name) is not None]
        if self.aberrations:
            terms = [f"{k}: {rounded(v)}" + (f" +- {rounded(self.uncertainties[k], 2)}" if k in self.uncertainties else "")
                     for k, v in self.aberrations.items()]
            parts.append("aberrations={" + ", ".join(terms) + "}")
        return f"Optics({', '.join(parts)})"

    def with_(self, **changes) -> "Optics":
        """A copy with some fields changed (aberrations replaced whole)."""
        return replace(self, **changes)

    def require(self, *names: str, purpose: str) -> None:
        """ValueError naming every field of ``names`` still None (``acq.calibrate`` fills them)."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"{purpose} needs {', '.join(missing)} in the optics: run acq.calibrate(optics) first or give them")

    def require_calibration(self, purpose: str) -> None:
        """ValueError naming the detector fields ``acq.calibrate`` fills that are still None."""
        self.require(*CALIBRATION, purpose=purpose)

    def k_per_pixel(self) -> float:
        """Detector sampling in 1/A per pixel."""
        self.require("det_sampling_mrad", purpose="converting detector pixels to spatial frequency")
        return self.det_sampling_mrad * 1e-3 / self.wavelength_A


def rounded(value, digits: int = 4) -> str:
    """``value`` for a repr: floats (also inside tuples) to ``digits`` significant digits, 300000.0 as 3e5."""
    if isinstance(value, tuple):
        return "(" + ", ".join(rounded(v, digits) for v in value) + ")"
    if isinstance(value, bool) or not isinstance(value, (float, int)):
        return repr(value)
    text = f"{value:.{digits}g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


def polar(kx, ky, lam: float, xp=np):
    """(alpha in rad, phi in rad) of spatial frequencies (kx, ky) in 1/A."""
    return lam * xp.hypot(kx, ky), xp.arctan2(ky, kx)


def chi_table(optics: Optics) -> np.ndarray:
    """chi as a polynomial in k = (k_x, k_y) in 1/A: complex T (m + 1 rows, p + 1 columns, only as large as the
    nonzero terms need) with chi(k) = sum_mp Re(T[m, p] (k_x + i k_y)^m) |k|^(2p). Each term C_nm maps to
    m and p = (n + 1 - m) / 2 (always whole), with T = (2 pi / lambda) C_nm lambda^(n+1) / (n+1) exp(-i m phi_nm).
    The SSB kernels take this table."""
    lam = optics.wavelength_A
    table = np.zeros((7, 4), np.complex128)
    for n, m in TERMS:
        c = optics.aberrations.get(f"C{n}{m}", 0.0)
        if c:
            phi = optics.aberrations.get(f"phi{n}{m}", 0.0)
            table[m, (n + 1 - m) // 2] += 2 * np.pi / lam * c * lam ** (n + 1) / (n + 1) * np.exp(-1j * m * phi)
    used = np.argwhere(table != 0)
    rows, cols = (used.max(axis=0) + 1) if used.size else (1, 1)
    return table[:rows, :cols]


def monomials(table: np.ndarray) -> tuple[int, np.ndarray]:
    """chi's polar table (``chi_table``: Re(T[m, p] (k_x + i k_y)^m) |k|^(2p)) as a polynomial in k_x and k_y:
    (degree N, P) with chi = sum P[b, a] k_x^a k_y^b, P (N + 1) x (N + 1) float64, the form the SSB kernels
    evaluate (Horner in k_x within each power of k_y) and advance along rows of frequencies."""
    degree = max((m + 2 * p for m, p in np.argwhere(table != 0)), default=0)
    poly = np.zeros((degree + 1, degree + 1), np.float64)  # [b, a]: k_y^b k_x^a
    for m, p in np.argwhere(table != 0):
        for i in range(m + 1):  # (k_x + i k_y)^m = sum_i binom(m, i) k_x^(m - i) (i k_y)^i
            term = table[m, p] * math.comb(m, i) * 1j**i
            for j in range(p + 1):  # |k|^(2p) = sum_j binom(p, j) k_x^(2 (p - j)) k_y^(2 j)
                poly[i + 2 * j, m - i + 2 * (p - j)] += term.real * math.comb(p, j)
    return degree, poly


def chi(kx, ky, optics: Optics, xp=np):
    """The aberration function chi(k) in rad at spatial frequencies (kx, ky) in 1/A (NumPy or CuPy arrays, as ``xp``)."""
    kx, ky = xp.asarray(kx, xp.float64), xp.asarray(ky, xp.float64)
    z = kx + 1j * ky
    r2 = kx * kx + ky * ky
    total = xp.zeros(xp.broadcast(kx, ky).shape)
    power = 1
    for row in chi_table(optics):
        poly = 0
        for c in row[::-1]:
            poly = poly * r2 + c
        total = total + (poly * power).real
        power = power * z
    return total


def grad_chi(kx, ky, optics: Optics, xp=np):
    """(d chi / d k_x, d chi / d k_y) in rad A at (kx, ky) in 1/A: the probe shift is -grad chi / (2 pi)."""
    lam = optics.wavelength_A
    alpha, phi = polar(xp.asarray(kx, xp.float64), xp.asarray(ky, xp.float64), lam, xp)
    radial = xp.zeros(xp.broadcast(alpha, phi).shape)
    angular = xp.zeros_like(radial)
    for n, m in TERMS:
        c = optics.aberrations.get(f"C{n}{m}", 0.0)
        if c:
            turn = m * (phi - optics.aberrations.get(f"phi{n}{m}", 0.0))
            radial += c * alpha**n * xp.cos(turn)
            angular -= c * m / (n + 1) * alpha**n * xp.sin(turn)
    radial *= 2 * np.pi
    angular *= 2 * np.pi
    return xp.cos(phi) * radial - xp.sin(phi) * angular, xp.sin(phi) * radial + xp.cos(phi) * angular


def probe_spectrum(kx, ky, optics: Optics, xp=np):
    """psi(k) = A(k) exp(-i chi(k)): the hard aperture of the semiangle, with the optics' aberrations."""
    inside = optics.wavelength_A * xp.hypot(kx, ky) <= optics.semiangle_mrad * 1e-3
    return inside * xp.exp(-1j * chi(kx, ky, optics, xp))
