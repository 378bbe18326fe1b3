"""A peer's in-memory object on the service: a HyperSpy signal (``qd.from_hyperspy``) or a py4DSTEM DataCube
(``qd.from_py4dstem``), with the calibration it holds carried into an ``Optics``.

The counts go as ``svc.put`` sends an array (the dtypes it holds, a copy kept on the scheduler). A lazy
(Dask) signal is computed a block of scan rows at a time into a live acquisition (``svc.create``,
``acq.append``), so it is never whole on the client; having no file and no kept copy, such an acquisition
is lost with its worker unless saved (``acq.save``).

The calibration is read where each library keeps it: HyperSpy, the axes' scale and units and the beam
energy (keV) and convergence semi-angle (mrad) in ``metadata.Acquisition_instrument.TEM`` (where
``acq.export`` writes them); py4DSTEM, the R and Q pixel sizes and units and the convergence semi-angle in
mrad (a DataCube holds no beam energy: py4DSTEM takes it per reconstruction; an .emd export of ours keeps it as
``beam_energy_keV`` in the calibration, which is read). A beam energy or semi-angle the
object lacks may be given. Without a scan step, beam energy and semi-angle the optics is None, and without
a detector calibration its ``det_sampling_mrad`` is: nothing is guessed. A calibration Optics cannot hold
(units that are no length or angle, two steps that differ) is refused, saying how to put the counts without it.
py4DSTEM's rotation and flip are not carried: their conventions are its own, ``acq.calibrate`` measures ours.
"""

from __future__ import annotations

import math
import uuid
from typing import TYPE_CHECKING, Any, Sequence

import dask.array as da
import numpy as np

from ..phase.optics import Optics, wavelength_A
from ..resident import DenseCounts
from ..resident.base import check_dtype, check_shape
from ..resident.compressed import check_layout, estimated_ratio
from .layout import CHOICES, choose
from .placement import free_bytes, place

if TYPE_CHECKING:
    from .acquisition import Acquisition
    from .service import Service

BLOCK_BYTES = 64 * 2**20  # counts of a lazy signal computed and appended at a time (whole scan rows, at least one)
LENGTH_A = {"pm": 0.01, "Å": 1.0, "A": 1.0, "nm": 10.0, "µm": 1e4, "μm": 1e4, "um": 1e4}  # scan step units -> A
ANGLE_MRAD = {"mrad": 1.0, "rad": 1e3}  # detector pixel units -> mrad
RECIPROCAL_PER_A = {"1/Å": 1.0, "1/A": 1.0, "Å^-1": 1.0, "A^-1": 1.0, "1/nm": 0.1, "nm^-1": 0.1}  # -> 1/A (alpha = lambda k)
UNCALIBRATED = {"", "<undefined>", "_None_", "px", "pixel", "pixels"}  # units saying an axis is in pixels
LENGTHS = f"a length ({', '.join(LENGTH_A)})"
ANGLES = f"an angle ({', '.join(ANGLE_MRAD)}) or a spatial frequency ({', '.join(RECIPROCAL_PER_A)})"
CLEAR_HYPERSPY = "or set its units to '' (pixels) to put the counts without that calibration"
CLEAR_PY4DSTEM = "or set them to 'pixels' (datacube.calibration.set_{space}_pixel_units('pixels')) to put the counts without it"


def from_hyperspy(svc: "Service", signal: Any, name: str | None = None, layout: str = "auto", *,
                  scan_shape: tuple[int, int] | None = None, worker: str | None = None, energy_eV: float | None = None,
                  semiangle_mrad: float | None = None) -> tuple["Acquisition", Optics | None]:
    """Put a HyperSpy signal (2 navigation axes: scan rows, columns; 2 signal axes: the detector's) on the
    service as a new acquisition, and the ``Optics`` its calibration makes (None where it lacks a piece).

    ``name`` defaults to the signal's title (else as ``svc.put`` names an array); ``layout`` and ``worker``
    as in ``svc.put``. A stack of frames (1 navigation axis) needs ``scan_shape``, and has no scan step.
    ``energy_eV`` and ``semiangle_mrad`` fill in what the metadata lacks (given beside it, they must agree).
    A lazy signal is computed block by block into the owner, never whole here.
    """
    if not all(hasattr(signal, a) for a in ("data", "axes_manager", "metadata")):
        raise TypeError(f"from_hyperspy takes a HyperSpy signal (hs.signals.Signal2D), got {type(signal).__name__}")
    axes = signal.axes_manager
    if axes.signal_dimension != 2:
        raise ValueError(f"the signal has {axes.signal_dimension} signal axes, a 4D-STEM signal two (the detector's rows and "
                         "columns): make the last two array axes its signal axes (signal.transpose(signal_axes=2))")
    navigation, detector = axes.navigation_axes[::-1], axes.signal_axes[::-1]  # HyperSpy lists x first: array order is y, x
    data = signal.data
    if len(navigation) == 1 and scan_shape is not None:
        rows, cols = (int(s) for s in scan_shape)
        if rows * cols != data.shape[0]:
            raise ValueError(f"scan_shape {tuple(scan_shape)} makes {rows * cols} positions, the stack has {data.shape[0]} frames")
        data, step = data.reshape(rows, cols, *data.shape[1:]), None  # a frame index is no scan step
    elif len(navigation) == 2:
        if scan_shape is not None and tuple(scan_shape) != data.shape[:2]:
            raise ValueError(f"scan_shape {tuple(scan_shape)} differs from the signal's navigation shape {data.shape[:2]}: leave it out")
        step = pair_value(described(navigation), "scan step", LENGTHS, LENGTH_A, CLEAR_HYPERSPY)
    elif len(navigation) == 1:
        raise ValueError(f"the signal is a stack of {data.shape[0]} frames: give scan_shape=(rows, cols)")
    else:
        raise ValueError(f"the signal has {len(navigation)} navigation axes, a 4D-STEM signal two (scan rows and columns), "
                         "or one (a stack of frames) with scan_shape=(rows, cols) given")
    tem = "Acquisition_instrument.TEM"
    energy = agreed("energy_eV", energy_eV, signal.metadata.get_item(f"{tem}.beam_energy"), f"metadata {tem}.beam_energy (keV)", 1e3)
    alpha = agreed("semiangle_mrad", semiangle_mrad, signal.metadata.get_item(f"{tem}.convergence_angle"),
                   f"metadata {tem}.convergence_angle (mrad)")
    det = detector_mrad(described(detector), energy, CLEAR_HYPERSPY)
    title = str(signal.metadata.get_item("General.title") or "")
    acq = put_counts(svc, data, name or title or None, worker, layout, "signal.change_dtype('uint16')")
    return acq, optics_of(step, energy, alpha, det, "the signal's calibration")


def from_py4dstem(svc: "Service", datacube: Any, name: str | None = None, layout: str = "auto", *, worker: str | None = None,
                  energy_eV: float | None = None, semiangle_mrad: float | None = None) -> tuple["Acquisition", Optics | None]:
    """Put a py4DSTEM DataCube (data[Rx, Ry, Qx, Qy]) on the service as a new acquisition, and the ``Optics`` its
    calibration makes with the beam energy ``energy_eV`` (a DataCube holds none, unless read from an export of
    ours: its calibration's ``beam_energy_keV``; None: the optics is None).

    ``name`` defaults to the DataCube's name; ``layout`` and ``worker`` as in ``svc.put``. ``semiangle_mrad``
    fills in a convergence semi-angle the calibration lacks (given beside it, they must agree).
    """
    if not all(hasattr(datacube, a) for a in ("data", "calibration", "name")):
        raise TypeError(f"from_py4dstem takes a py4DSTEM DataCube, got {type(datacube).__name__}")
    cal = datacube.calibration
    step = pair_value([(cal.get_R_pixel_size(), cal.get_R_pixel_units(), "the R pixel")], "scan step", LENGTHS, LENGTH_A,
                      CLEAR_PY4DSTEM.format(space="R"))
    alpha = agreed("semiangle_mrad", semiangle_mrad, cal.get_convergence_semiangle_mrad(), "the calibration's convergence_semiangle_mrad")
    held_keV = cal["beam_energy_keV"] if "beam_energy_keV" in cal.keys else None  # where acq.export's .emd keeps it
    energy_eV = agreed("energy_eV", energy_eV, held_keV, "the calibration's beam_energy_keV", 1e3)
    det = detector_mrad([(cal.get_Q_pixel_size(), cal.get_Q_pixel_units(), "the Q pixel")], energy_eV, CLEAR_PY4DSTEM.format(space="Q"))
    acq = put_counts(svc, datacube.data, name or datacube.name or None, worker, layout, "datacube.data = datacube.data.astype('uint16')")
    return acq, optics_of(step, energy_eV, alpha, det, "the DataCube's calibration")


def described(axes: Sequence[Any]) -> list[tuple[float, Any, str]]:
    """(scale, units, what an error calls it) of HyperSpy axes; ValueError for a calibrated axis with no one step."""
    found = []
    for a in axes:
        where = f"the signal's array axis {a.index_in_array}" + ("" if str(a.name) == "<undefined>" else f" ({a.name})")
        if not a.is_uniform and units_of(a.units) not in UNCALIBRATED:
            raise ValueError(f"{where} is not uniform, and Optics holds one step: {CLEAR_HYPERSPY.removeprefix('or ')}")
        found.append((a.scale if a.is_uniform else 1.0, a.units, where))
    return found


def units_of(units: Any) -> str:
    """An axis's units as text, '' for none (HyperSpy's Undefined, py4DSTEM's None)."""
    return "" if units is None else str(units).strip()


def pair_value(axes: Sequence[tuple[float, Any, str]], what: str, kind: str, table: dict[str, float], clear: str) -> float | None:
    """The one value of ``what`` the (scale, units, description) ``axes`` give in ``table``'s unit, or None where
    none is calibrated; ValueError where one is in other units or they differ."""
    units = [units_of(u) for _, u, _ in axes]
    if all(u in UNCALIBRATED for u in units):
        return None
    values = []
    for (scale, _, where), unit in zip(axes, units):
        if unit not in table:
            raise ValueError(f"{where} is in {unit or 'pixels'!r}, not {kind}: convert it, {clear}")
        values.append(float(scale) * table[unit])
    if any(not math.isclose(v, values[0], rel_tol=1e-9) for v in values):
        raise ValueError(f"the {what} differs between {' and '.join(w for _, _, w in axes)} ({', '.join(f'{s:g} {u}' for (s, _, _), u in zip(axes, units))}),"
                         f" and Optics holds one: resample to one step, {clear}")
    return values[0]


def detector_mrad(axes: Sequence[tuple[float, Any, str]], energy_eV: float | None, clear: str) -> float | None:
    """mrad per detector pixel from axes in an angle, or in spatial frequency with the beam's wavelength (alpha =
    lambda k; None without an energy); None where they are in pixels."""
    if any(units_of(u) in RECIPROCAL_PER_A for _, u, _ in axes):
        k = pair_value(axes, "detector sampling", ANGLES, RECIPROCAL_PER_A, clear)
        return None if energy_eV is None else k * wavelength_A(energy_eV) * 1e3
    return pair_value(axes, "detector sampling", ANGLES, ANGLE_MRAD, clear)


def agreed(what: str, given: float | None, held: Any, where: str, scale: float = 1.0) -> float | None:
    """The value of ``what``: the object's (``held`` times ``scale``, from ``where``) or the one ``given``; ValueError
    where both are and differ."""
    if given is None:
        return None if held is None else float(held) * scale
    if held is not None and not math.isclose(float(held) * scale, float(given), rel_tol=1e-9):
        raise ValueError(f"{what}={given:g} was given, but {where} says {float(held):g}: leave it out, or correct the object's")
    return float(given)


def optics_of(step_A: float | None, energy_eV: float | None, semiangle_mrad: float | None, det_mrad: float | None,
              source: str) -> Optics | None:
    """The Optics of a calibration, None unless it has a scan step, beam energy and semi-angle."""
    if None in (step_A, energy_eV, semiangle_mrad):
        return None
    try:
        return Optics(energy_eV, semiangle_mrad, step_A, det_sampling_mrad=det_mrad)
    except ValueError as err:
        raise ValueError(f"{source} makes no Optics: {err}") from None


def put_counts(svc: "Service", data: Any, name: str | None, worker: str | None, layout: str, convert: str) -> "Acquisition":
    """``data`` on the service: a NumPy-like array by ``svc.put``, a Dask array block by block (``put_lazy``)."""
    try:
        check_dtype(data.dtype)
    except ValueError as err:
        raise ValueError(f"{err}: convert the counts first ({convert})") from None
    if isinstance(data, da.Array):
        return put_lazy(svc, data, name, worker, layout)
    return svc.put(np.asarray(data), name=name, worker=worker, layout=layout)


def put_lazy(svc: "Service", data: da.Array, name: str | None, worker: str | None, layout: str) -> "Acquisition":
    """A Dask array as a live acquisition filled BLOCK_BYTES of scan rows at a time, placed as ``svc.put`` would
    place it; layout "auto" decided as a put's on its owner (``choose``), a ratio estimated on the first block.
    Nothing stays of it when a block fails."""
    shape, dtype = check_shape(data.shape), check_dtype(data.dtype)
    check_layout(layout, dtype, CHOICES)
    name = name or f"array-{uuid.uuid4().hex[:8]}"
    state = svc.ensure_shards()
    svc.check_new_names([name], state)
    owner = place([int(np.prod(shape)) * dtype.itemsize], state, pinned=worker)[0]
    rows, cols, det_rows, det_cols = shape
    per = max(1, BLOCK_BYTES // (cols * det_rows * det_cols * dtype.itemsize))
    first = np.asarray(data[:per].compute(), dtype).reshape(-1, det_rows, det_cols)
    if layout == "auto":
        chosen = choose(layout, dtype, state["shards"][owner]["device"]["kind"], DenseCounts.held_bytes(shape, dtype),
                        free_bytes(state)[owner], lambda: estimated_ratio(first.reshape(len(first), -1)))
        layout = "compressed" if chosen.compressed else "dense"
    acq = svc.create(name, (rows, cols), (det_rows, det_cols), dtype, layout=layout, worker=owner)
    try:
        acq.append(first)
        for lo in range(per, rows, per):
            acq.append(np.asarray(data[lo:lo + per].compute(), dtype).reshape(-1, det_rows, det_cols))
    except BaseException:
        acq.release()
        raise
    return svc[name]
