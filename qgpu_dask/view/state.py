"""What a viewer shows of a series, and how each product is asked of the service (read-only: queries only).

A ``Shown`` is one consistent choice (acquisition, detector, mode, cursor, region); the products are computed
from it with the public queries, so the viewer's image is the API's own result for that detector. Nothing
here changes or releases a resident.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any

import numpy as np

from ..detector import masks
from ..phase.calibration import bright_field_disk
from ..phase.optics import Optics
from ..resident.base import out_of_range
from ..service import Acquisition, Series
from . import phase
from .phase import PhaseImage, Steering
from .protocol import GRID_SIDE, MODES, OPS

OPTICS_MODES = ("dpc", "ssb")  # modes that need Optics


@dataclasses.dataclass(frozen=True)
class Shown:
    """One consistent choice of what is shown: the products are functions of it."""

    index: int
    detector: dict
    mode: str = "detector"
    cursor: tuple[int, int] = (0, 0)
    region: tuple[tuple[int, int, int, int], str] | None = None  # ((top, left, bottom, right), op), None: the cursor's frame

    def key(self) -> tuple:
        return (self.index, repr(sorted(self.detector.items())), self.mode)


class ViewState:
    """The viewer's choice over ``series`` (an Acquisition or a Series) and the products it asks for; every
    setter checks its input (ValueError naming what is wrong) before anything changes."""

    def __init__(self, series: Series, optics: Optics | None = None, detector: dict | None = None):
        if not isinstance(series, Series) or len(series) == 0:
            raise ValueError(f"a viewer shows an Acquisition or a Series of them, got {type(series).__name__}")
        shapes = sorted({a.det_shape for a in series})
        if len(shapes) > 1:  # the slider keeps the detector, which is drawn on one pattern shape
            raise ValueError(f"a viewed series is of one detector shape; these acquisitions have {', '.join(map(str, shapes))}: "
                             f"view the acquisitions of each shape as a series of their own")
        self.series = series if not isinstance(series, Acquisition) else series.plain()
        self.optics = optics
        self.lock = threading.Lock()
        self.calibrations: dict[str, dict | None] = {}
        self.calibrated: dict[str, Optics] = {}
        self.last_image: tuple[tuple, np.ndarray] | None = None
        self.fitted: Optics | None = None  # the fit's optics (aberrations, rotation), shared by every acquisition
        self.steering = Steering(**phase.sliders_of(optics)) if optics is not None else Steering()
        self.last_phase: tuple[tuple, PhaseImage] | None = None
        self.confirmed: set[tuple] = set()  # (acquisition, method, upsampling) a user let a slow CPU preparation run for
        self.devices: dict[str, str] = {}  # owner address -> "cpu" or "cuda"
        acq = self.series[0]
        rows, cols = acq.shape[:2]
        self.shown = Shown(0, detector or self.default_detector(0), cursor=(rows // 2, cols // 2))
        if detector is not None:
            self.check_detector(detector)

    # -- what is shown ---------------------------------------------------------

    @property
    def acquisition(self) -> Acquisition:
        return self.series[self.shown.index]

    def check_detector(self, detector: dict) -> dict:
        """``detector`` as a plain dict, checked against the detector shape (it must cover some pixel)."""
        masks.from_detector(self.acquisition.det_shape, detector)
        return dict(detector)

    def set(self, **changes: Any) -> Shown:
        """Change what is shown (index, detector, mode, cursor, region), each checked; returns the new choice."""
        with self.lock:
            shown = self.shown
            if "index" in changes:
                index = changes["index"]
                if not isinstance(index, int) or not 0 <= index < len(self.series):
                    raise ValueError(f"acquisition index {index!r} is outside 0..{len(self.series) - 1}")
                shape = self.series[index].shape
                cursor = (min(shown.cursor[0], shape[0] - 1), min(shown.cursor[1], shape[1] - 1))
                shown = dataclasses.replace(shown, index=index, cursor=cursor, region=None)
            if "detector" in changes:
                shown = dataclasses.replace(shown, detector=self.check_detector(changes["detector"]))
            if "mode" in changes:
                shown = dataclasses.replace(shown, mode=self.check_mode(changes["mode"]))
            if "cursor" in changes:
                shown = dataclasses.replace(shown, cursor=self.check_cursor(changes["cursor"]), region=None)
            if "region" in changes:
                shown = dataclasses.replace(shown, region=self.check_region(*changes["region"]))
            self.shown = shown
            return shown

    def check_mode(self, mode: str) -> str:
        if mode not in MODES:
            raise ValueError(f"image mode {mode!r} is not one of {', '.join(MODES)}")
        if mode in OPTICS_MODES and self.optics is None:
            raise ValueError(f"the {mode} image needs Optics: qd.view(acq, optics=qd.Optics(...))")
        return mode

    def check_cursor(self, cursor) -> tuple[int, int]:
        rows, cols = self.acquisition.shape[:2]
        try:
            row, col = (int(v) for v in cursor)
        except (TypeError, ValueError):
            raise ValueError(f"a scan position is (row, col), got {cursor!r}") from None
        for axis, value, size in (("row", row, rows), ("col", col, cols)):
            if not 0 <= value < size:
                raise out_of_range(f"scan {axis}", value, axis, (rows, cols))
        return row, col

    def check_region(self, rect, op: str) -> tuple[tuple[int, int, int, int], str]:
        rows, cols = self.acquisition.shape[:2]
        if op not in OPS:
            raise ValueError(f"a region's reduction is one of {', '.join(OPS)}, got {op!r}")
        try:
            top, left, bottom, right = (int(v) for v in rect)
        except (TypeError, ValueError):
            raise ValueError(f"a scan region is [top, left, bottom, right], got {rect!r}") from None
        for side, value, axis in (("top", top, "row"), ("left", left, "col"), ("bottom", bottom, "row"), ("right", right, "col")):
            if value < 0:  # a negative bound would count from the scan's far edge in a slice
                raise out_of_range(f"scan region {side}", value, axis, (rows, cols))
        bottom, right = min(bottom, rows), min(right, cols)  # a region past the far edges is cut there
        if top >= bottom or left >= right:
            raise ValueError(f"the scan region {list(rect)} holds no scan position of the {rows}x{cols} scan")
        return (top, left, bottom, right), op

    # -- products ----------------------------------------------------------------

    def image(self, shown: Shown | None = None) -> np.ndarray:
        """The left image of ``shown`` (default: now): the exact virtual image of its detector, or a CoM
        component, the iCoM (DPC) or SSB phase."""
        shown = shown or self.shown
        cached = self.last_image
        if cached is not None and cached[0] == shown.key() and not self.is_live(shown.index):
            return cached[1]
        acq = self.series[shown.index]
        if shown.mode == "detector":
            image = acq.virtual_image(masks.from_detector(acq.det_shape, shown.detector))
        elif shown.mode in ("com_row", "com_col"):
            image = acq.center_of_mass()[0 if shown.mode == "com_row" else 1]
        elif shown.mode == "dpc":
            image = acq.dpc(self.optics_of(acq))
        else:
            image = acq.ssb(self.optics_of(acq))
        self.last_image = (shown.key(), image)
        return image

    def pattern(self, shown: Shown | None = None) -> np.ndarray:
        """The right pattern of ``shown``: the frame at its cursor, or its region's reduction."""
        shown = shown or self.shown
        acq = self.series[shown.index]
        if shown.region is None:
            return acq.frame(*shown.cursor)
        (top, left, bottom, right), op = shown.region
        roi = np.zeros(acq.shape[:2], dtype=bool)
        roi[top:bottom, left:right] = True
        return acq.reduce(roi, op)

    def grid(self, shown: Shown | None = None) -> np.ndarray:
        """Every acquisition's virtual image of the detector, one series query, each binned on its owner by exact
        sums to at most GRID_SIDE pixels a side: (n, rows', cols')."""
        shown = shown or self.shown
        shape = self.series.same("shape")
        factor = min(-(-max(shape[:2]) // GRID_SIDE), *shape[:2])
        return narrowed(self.series.virtual_images(masks.from_detector(shape[2:], shown.detector), bin=factor))

    # -- the phase panel ----------------------------------------------------------

    def base_optics(self, acq: Acquisition) -> Optics:
        """``acq``'s calibrated optics carrying the fit's aberrations, rotation and flip where a fit was made."""
        optics = self.optics_of(acq)
        if self.fitted is not None:
            optics = optics.with_(aberrations=dict(self.fitted.aberrations), rotation_deg=self.fitted.rotation_deg,
                                  flip=self.fitted.flip, uncertainties=dict(self.fitted.uncertainties))
        return optics

    def steer(self, controls: dict) -> Steering:
        """Change the phase panel's controls (each checked; ValueError naming what is wrong, nothing changed)."""
        with self.lock:
            self.steering = phase.checked(controls, self.steering, self.optics, tuple(self.acquisition.shape[:2]))
            return self.steering

    def steered_optics(self, index: int | None = None, steering: Steering | None = None) -> Optics:
        """The optics the sliders show for acquisition ``index`` (default: the one shown)."""
        acq = self.series[self.shown.index if index is None else index]
        return phase.steered(self.base_optics(acq), steering or self.steering)

    def phase(self, index: int | None = None, steering: Steering | None = None, optics: Optics | None = None) -> PhaseImage:
        """The phase image of acquisition ``index`` (default: shown) with ``steering`` (default: now) and its
        ``optics`` (default: ``steered_optics``); the last one is kept (a live acquisition's is made again: its
        rows keep coming)."""
        index = self.shown.index if index is None else index
        steering = steering or self.steering
        optics = optics or self.steered_optics(index, steering)
        key = (index, dataclasses.replace(steering, spectrum=False), repr(optics))
        cached = self.last_phase
        if cached is not None and cached[0] == key and not self.is_live(index):
            return cached[1]
        image = phase.image_of(self.series[index], optics, steering)
        self.last_phase = (key, image)
        return image

    def slow_on_cpu(self, index: int, steering: Steering, optics: Optics) -> float | None:
        """The seconds a CPU owner is expected to take for this image (``optics``: its steered optics) where
        that is more than ``CPU_ASK_S`` and the user has not said to go on for it (``go_on``); else None."""
        acq = self.series[index]
        if self.device_of(acq) != "cpu" or self.consent(acq, optics, steering) in self.confirmed:
            return None
        seconds = phase.cpu_seconds(acq, optics, steering)
        return seconds if seconds > phase.CPU_ASK_S else None

    def go_on(self, index: int, steering: Steering) -> None:
        """The user lets a slow CPU preparation run for this acquisition, method and upsampling."""
        self.confirmed.add(self.consent(self.series[index], self.steered_optics(index, steering), steering))

    @staticmethod
    def consent(acq: Acquisition, optics: Optics, steering: Steering) -> tuple:
        """What a user's 'go on' covers: the acquisition, the method and the upsampling."""
        return acq.name, steering.method, phase.upsampling_of(optics, steering)

    def device_of(self, acq: Acquisition) -> str:
        """"cpu" or "cuda": the kind of device ``acq``'s owner computes on."""
        owner = acq.owner
        if owner not in self.devices:
            shards = self.series.service.state()["shards"]
            self.devices.update({address: shard["device"]["kind"] for address, shard in shards.items()})
        return self.devices.get(owner, "cpu")

    def fit(self, index: int | None = None) -> Optics:
        """Fit C10, C12, phi12 and the rotation on acquisition ``index`` (default: shown) on its owner; every
        acquisition's images then carry them and the sliders start from them (reset: the same)."""
        acq = self.series[self.shown.index if index is None else index]
        fitted = acq.fit_aberrations(self.optics_of(acq))
        with self.lock:
            self.fitted = fitted
        self.reset()
        return fitted

    def start(self) -> Optics:
        """Where the sliders start and reset to: the fit's optics, or the given ones where no fit was made."""
        if self.optics is None:
            raise ValueError(phase.OPTICS_HELP)
        return self.fitted if self.fitted is not None else self.optics

    def reset(self) -> Steering:
        """The sliders back to the fit's values (or the given optics' where no fit was made)."""
        with self.lock:
            self.steering = dataclasses.replace(self.steering, **phase.sliders_of(self.start()))
            return self.steering

    def phase_grid(self, steering: Steering | None = None) -> np.ndarray:
        """Every acquisition's phase image with the same sliders, each block-averaged to at most GRID_SIDE
        pixels a side: (n, rows', cols') float32."""
        steering = steering or self.steering
        images = [self.phase(k, steering).phase for k in range(len(self.series))]
        factor = max(1, -(-max(images[0].shape) // GRID_SIDE))
        rows, cols = (side // factor for side in images[0].shape)
        stack = np.stack([im[: rows * factor, : cols * factor] for im in images])
        return stack.reshape(len(images), rows, factor, cols, factor).mean(axis=(2, 4), dtype=np.float64).astype(np.float32)

    def phase_state(self) -> dict | None:
        """What the phase panel draws its controls from: the controls now, the fit's values, the limits."""
        if self.optics is None:
            return None
        acq = self.acquisition
        limit = phase.limit_A(self.optics, tuple(acq.shape[:2]))
        start = phase.sliders_of(self.start())
        return {"steering": dataclasses.asdict(self.steering), "start": start, "fitted": self.fitted is not None,
                "limit_A": limit, "methods": list(phase.METHODS), "upsamplings": list(phase.UPSAMPLINGS),
                "c10_range": [max(-limit, start["c10_A"] - phase.SLIDER_C10_A), min(limit, start["c10_A"] + phase.SLIDER_C10_A)],
                "c12_range": [0.0, min(limit, start["c12_A"] + phase.SLIDER_C12_A)],
                "uncertainties": {k: v if math.isfinite(v) else None for k, v in (self.fitted.uncertainties if self.fitted else {}).items()}}

    # -- what the page is told -------------------------------------------------

    def state(self) -> dict:
        """The ``state`` answer: the series, the choice, calibration and optics the page draws scale bars from."""
        shown, acq = self.shown, self.acquisition
        optics = None
        if self.optics is not None:
            optics = {"scan_step_A": self.optics.scan_step_A, "det_sampling_mrad": self.optics.det_sampling_mrad}
        live = None
        if self.is_live(shown.index):
            live = {"received": acq.received, "n_frames": acq.n_frames}
        return {"type": "state", "acquisitions": self.series.names, "index": shown.index, "shape": list(acq.shape),
                "dtype": str(acq.dtype), "detector": shown.detector, "mode": shown.mode, "cursor": list(shown.cursor),
                "calibration": self.calibration(shown.index), "optics": optics, "live": live, "phase": self.phase_state(),
                "dashboard": getattr(self.series.service.client, "dashboard_link", None)}

    def is_live(self, index: int) -> bool:
        return bool(self.series[index].record.get("live"))

    def calibration(self, index: int) -> dict | None:
        """The bright-field disk of acquisition ``index`` (centre, radius in pixels) from its mean pattern, for
        snapping; None where none is found (a live one before its frames, a pattern with no disk)."""
        acq = self.series[index]
        if acq.name not in self.calibrations or self.is_live(index):
            try:
                (row, col), radius = bright_field_disk(acq.reduce(op="mean"))
                found = {"bf_center": [float(row), float(col)], "bf_radius": float(radius)}
            except ValueError:
                found = None
            self.calibrations[acq.name] = found
        return self.calibrations[acq.name]

    def default_detector(self, index: int) -> dict:
        """A bright-field disk on the calibrated disk, else a centred disk of an eighth of the pattern."""
        found = self.calibration(index)
        if found is not None:
            return {"kind": "disk", "center": found["bf_center"], "radius": found["bf_radius"]}
        rows, cols = self.series[index].det_shape
        return {"kind": "disk", "center": [(rows - 1) / 2, (cols - 1) / 2], "radius": max(1.0, min(rows, cols) / 8)}

    def optics_of(self, acq: Acquisition) -> Optics:
        """The viewer's Optics calibrated for ``acq`` (once per acquisition; a live one's as its rows come)."""
        if self.optics is None:
            raise ValueError(phase.OPTICS_HELP)
        if acq.name not in self.calibrated or acq.record.get("live"):
            self.calibrated[acq.name] = acq.calibrate(self.optics)
        return self.calibrated[acq.name]


def narrowed(sums: np.ndarray) -> np.ndarray:
    """Integer ``sums`` as 32-bit integers where every one fits (the page then needs no 64-bit decoding), else
    as they are; the values are the same."""
    if sums.dtype.kind not in "ui" or sums.dtype.itemsize <= 4 or not sums.size:
        return sums
    narrow = np.dtype(np.uint32 if sums.dtype.kind == "u" else np.int32)
    limits = np.iinfo(narrow)
    return sums.astype(narrow) if limits.min <= sums.min() and sums.max() <= limits.max else sums
