"""The viewer's phase panel: SSB, direct ptychography and parallax images steered by aberration sliders.

A ``Steering`` is what the panel's controls say: the method, upsampling, strength, and the three terms a
microscopist corrects by eye (C10, C12, phi12). The optics an image is made with are the acquisition's
calibrated optics carrying the fit's aberrations and rotation (``fit_aberrations`` on the owner, or the
optics given), the sliders' terms on top (``steered``). Images are the API's own results (``acq.ssb``,
``acq.direct_ptycho``, ``acq.parallax``) for those optics; the owners keep the preparations, so a slider
step costs a sum or a solve wherever the method allows it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np

from ..phase import direct, sideband
from ..phase.optics import Optics
from ..service import Acquisition

METHODS = ("ssb", "direct-phase", "direct-complex", "parallax")
UPSAMPLINGS = ("auto", 1, 2, 3)
SLIDER_C10_A = 500.0  # the C10 slider spans the fit's value +- this; numeric entry reaches the limit
SLIDER_C12_A = 250.0  # the C12 slider spans 0 .. the fit's value + this
PARALLAX_AUTO = 2  # parallax has no "auto": the grid it takes for it
CPU_ASK_S = 5.0  # a CPU worker's expected time above which the page asks before computing
# CPU seconds of an image per (scan position x bright-field pixel x u), 2 workers of the 2-core machine, from a
# 128 x 128 scan with 1318 bright-field pixels (SSB 0.6 s; direct phase 1.1-1.3 s at u = 2, 3; complex 1.3-2.4 s)
CPU_RATE_S = {"ssb": 3e-8, "direct-phase": 2e-8, "direct-complex": 4e-8, "parallax": 1.5e-8}
OPTICS_HELP = ("the phase panel needs the microscope's optics: qd.view(acq, optics=qd.Optics(energy_eV=300e3, "
               "semiangle_mrad=20, scan_step_A=0.5)), or qgpu-dask view --optics optics.json")


@dataclasses.dataclass(frozen=True)
class Steering:
    """The phase panel's controls: method, upsampling ("auto" or 1-3; SSB is on the scan grid), the direct
    method's strength, C10 and C12 in A, phi12 in degrees, and whether the power spectrum is wanted."""

    method: str = "ssb"
    upsampling: str | int = "auto"
    strength: float = 0.1
    c10_A: float = 0.0
    c12_A: float = 0.0
    phi12_deg: float = 0.0
    spectrum: bool = False


@dataclasses.dataclass(frozen=True)
class PhaseImage:
    """A phase image as the panel shows it: ``phase`` (float32 rad, mean 0), ``amplitude`` for direct
    complex (else None), on a grid ``upsampling`` times finer than the scan of pixel ``pixel_A``, the
    ``optics`` it was made with, of acquisition ``name``."""

    phase: np.ndarray
    amplitude: np.ndarray | None
    upsampling: int
    pixel_A: float
    optics: Optics
    steering: Steering
    name: str

    def __array__(self, dtype=None, copy=None):
        return self.phase if dtype is None else self.phase.astype(dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.phase.shape

    def metadata(self) -> dict:
        """What a saved image carries: the acquisition, method, upsampling, strength, pixel size and optics."""
        s = self.steering
        return {"acquisition": self.name, "method": s.method, "upsampling": self.upsampling,
                "strength": s.strength if s.method.startswith("direct") else None, "pixel_A": self.pixel_A,
                "units": "rad", "optics": dataclasses.asdict(self.optics)}  # qd.Optics' keyword arguments


def sliders_of(optics: Optics) -> dict:
    """The three steered terms of ``optics``: C10 and C12 in A, phi12 in degrees (in -90..90: C12 repeats
    every 180 degrees)."""
    ab = optics.aberrations
    return {"c10_A": ab.get("C10", 0.0), "c12_A": ab.get("C12", 0.0), "phi12_deg": wrapped_deg(math.degrees(ab.get("phi12", 0.0)))}


def wrapped_deg(angle: float) -> float:
    """``angle`` in degrees folded into (-90, 90]: a twofold term's angle repeats every 180 degrees."""
    folded = (angle + 90.0) % 180.0 - 90.0
    return 90.0 if folded == -90.0 else folded


def limit_A(optics: Optics, scan_shape: tuple[int, int]) -> float:
    """The largest |C10| or C12 the sliders take: the geometric probe radius |C| alpha then reaches half
    the scanned field, beyond which the image is of the probe, not the specimen."""
    field_A = min(scan_shape) * optics.scan_step_A
    return field_A / 2 / (optics.semiangle_mrad * 1e-3)


def number(value, what: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} is a number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{what} is a finite number, got {value!r}")
    return out


def checked(ask: dict, base: Steering, optics: Optics | None, scan_shape: tuple[int, int]) -> Steering:
    """``base`` with the controls ``ask`` gives (method, upsampling, strength, c10_A, c12_A, phi12_deg,
    spectrum), each checked: ValueError naming the control and what it takes."""
    if optics is None:
        raise ValueError(OPTICS_HELP)
    changes = {}
    if "method" in ask:
        if ask["method"] not in METHODS:
            raise ValueError(f"phase method {ask['method']!r} is not one of {', '.join(METHODS)}")
        changes["method"] = ask["method"]
    if "upsampling" in ask:
        if ask["upsampling"] not in UPSAMPLINGS or isinstance(ask["upsampling"], bool):
            raise ValueError(f"upsampling {ask['upsampling']!r} is not one of {', '.join(map(str, UPSAMPLINGS))}")
        changes["upsampling"] = ask["upsampling"]
    if "strength" in ask:
        strength = number(ask["strength"], "strength")
        if strength <= 0:
            raise ValueError(f"strength is > 0 (the regularization of direct ptychography), got {strength:g}")
        changes["strength"] = strength
    limit = limit_A(optics, scan_shape)
    for key, what, low in (("c10_A", "C10", -limit), ("c12_A", "C12", 0.0)):
        if key in ask:
            value = number(ask[key], f"{what} (A)")
            if not low <= value <= limit:
                raise ValueError(f"{what} = {value:g} A is outside {low:g} .. {limit:g} A: beyond it the probe "
                                 f"(radius |{what}| x {optics.semiangle_mrad:g} mrad) is wider than half the scanned field")
            changes[key] = value
    if "phi12_deg" in ask:
        changes["phi12_deg"] = wrapped_deg(number(ask["phi12_deg"], "phi12 (degrees)"))
    if "spectrum" in ask:
        changes["spectrum"] = bool(ask["spectrum"])
    return dataclasses.replace(base, **changes)


def steered(optics: Optics, steering: Steering) -> Optics:
    """``optics`` with the sliders' C10, C12 and phi12 in place of its own."""
    aberrations = {**optics.aberrations, "C10": steering.c10_A, "C12": steering.c12_A,
                   "phi12": math.radians(steering.phi12_deg)}
    return optics.with_(aberrations=aberrations)


def upsampling_of(optics: Optics, steering: Steering) -> int:
    """The grid factor the image will have (SSB: the scan's; "auto": direct's own choice, parallax's 2)."""
    if steering.method == "ssb":
        return 1
    if steering.method == "parallax" and steering.upsampling == "auto":
        return PARALLAX_AUTO
    return direct.upsampling_of(optics, steering.upsampling)


def cpu_seconds(acq: Acquisition, optics: Optics, steering: Steering) -> float:
    """About how long a CPU worker takes to make ``steering``'s image of ``acq`` (2-core rates)."""
    rows, cols = acq.shape[:2]
    pixels = len(sideband.bright_field_pixels(optics, acq.det_shape)[0])
    return CPU_RATE_S[steering.method] * rows * cols * pixels * upsampling_of(optics, steering)


def image_of(acq: Acquisition, optics: Optics, steering: Steering) -> PhaseImage:
    """``acq``'s phase image with ``optics`` (already steered), computed on its owner."""
    amplitude = None
    if steering.method == "ssb":
        phase = acq.ssb(optics)
    elif steering.method == "parallax":
        phase = acq.parallax(optics, upsampling_of(optics, steering))
    else:
        result = acq.direct_ptycho(optics, steering.method.split("-")[1], steering.upsampling, steering.strength)
        phase, amplitude = result.phase, result.amplitude
    phase = np.asarray(phase, np.float32)
    u = phase.shape[0] // acq.shape[0]
    return PhaseImage(phase, None if amplitude is None else np.asarray(amplitude, np.float32), u, optics.scan_step_A / u,
                      optics, steering, acq.name)


def power_spectrum(image: np.ndarray) -> np.ndarray:
    """log10 of the power spectrum of ``image`` less its mean, zero frequency at the centre (float32): the
    diffractogram whose Thon rings show defocus and astigmatism."""
    values = np.asarray(image, np.float32)
    rows, cols = values.shape
    half = np.fft.rfft2(values)  # float32 in, complex64 out
    half = half.real * half.real + half.imag * half.imag
    half[0, 0] = 0.0  # the mean, left out
    positive = half > 0
    half = np.log10(np.maximum(half, half[positive].min() if positive.any() else 1.0))
    power = np.empty((rows, cols), np.float32)  # the other half by symmetry: P(-q) = P(q) for a real image
    power[:, : half.shape[1]] = half
    power[:, half.shape[1] :] = half[(-np.arange(rows)) % rows][:, cols - np.arange(half.shape[1], cols)]
    return np.fft.fftshift(power)


SAVED = (".png", ".npy", ".tif", ".tiff")


def save(image: PhaseImage, path: str | os.PathLike) -> Path:
    """Write ``image``: .png a labelled figure for looking (colour bar in rad, scale bar in A, the optics in
    its title); .npy the float32 phase with ``<name>.json`` beside it; .tif/.tiff float32 with the metadata
    as JSON in its description. The metadata: acquisition, method, upsampling, strength, pixel size, optics."""
    path = Path(path)
    if path.suffix.lower() not in SAVED:
        raise ValueError(f"a phase image is saved as {', '.join(SAVED)}, not {path.suffix or 'a name without suffix'}: "
                         f"give the path one of these suffixes")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = image.metadata()
    suffix = path.suffix.lower()
    if suffix == ".npy":
        np.save(path, image.phase)
        path.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    elif suffix in (".tif", ".tiff"):
        from PIL import Image

        Image.fromarray(np.ascontiguousarray(image.phase, np.float32), mode="F").save(path, format="TIFF", tiffinfo={270: json.dumps(meta)})
    else:
        figure(image, path)
    return path


def figure(image: PhaseImage, path: Path) -> None:
    """The labelled PNG of :func:`save`: the phase (and amplitude) with colour bars and a scale bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..figure import scale_bar

    panels = [("phase (rad)", image.phase)] + ([("amplitude", image.amplitude)] if image.amplitude is not None else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5.0), dpi=100, layout="constrained", squeeze=False)
    try:
        s, ab = image.steering, sliders_of(image.optics)
        fig.suptitle(f"{image.name}: {s.method}, C10 {ab['c10_A']:.1f} \u00c5, C12 {ab['c12_A']:.1f} \u00c5, "
                     f"phi12 {ab['phi12_deg']:.1f}\u00b0", fontsize=11)
        for ax, (label, values) in zip(axes[0], panels):
            shown = ax.imshow(values, cmap="gray", interpolation="nearest")
            fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.02, label=label)
            scale_bar(ax, values.shape[1], image.pixel_A)
            ax.set_xticks([])
            ax.set_yticks([])
        fig.savefig(path)
    finally:
        plt.close(fig)
