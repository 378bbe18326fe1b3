"""The viewer as a notebook widget (anywidget): the page's JavaScript module, answered by a Session.

The widget syncs no data as traits: every image and pattern goes as a custom message with binary buffers
(the protocol's answers), so only small products reach the browser.
"""

from __future__ import annotations

from pathlib import Path

import anywidget
import numpy as np

from ..phase.optics import Optics
from ..service import Series
from . import phase
from .phase import PhaseImage
from .session import Session
from .state import ViewState


class Viewer(anywidget.AnyWidget):
    """An interactive view of an acquisition or a series: virtual image left, diffraction pattern right."""

    _esm = Path(__file__).with_name("viewer.js")

    def __init__(self, series: Series, optics: Optics | None = None, detector: dict | None = None):
        super().__init__()
        self.view = ViewState(series, optics, detector)
        self.session = Session(self.view, lambda header, buffers: self.send(header, buffers))
        self.on_msg(lambda widget, content, buffers: self.session.handle(content))

    @property
    def detector(self) -> dict:
        """The current virtual detector (kind, centre, radii, angles, corners or vertices); settable."""
        return dict(self.view.shown.detector)

    @detector.setter
    def detector(self, detector: dict) -> None:
        self.session.push(self.view.set(detector=detector))

    @property
    def index(self) -> int:
        """The acquisition of the series shown now; settable."""
        return self.view.shown.index

    @index.setter
    def index(self, index: int) -> None:
        self.session.push(self.view.set(index=index))

    @property
    def image(self) -> np.ndarray:
        """The image shown now: the exact virtual image of the detector (or the CoM, iCoM, SSB image of the mode)."""
        return self.view.image()

    @property
    def pattern(self) -> np.ndarray:
        """The pattern shown now: the frame at the scan cursor, or the reduction over the drawn scan region."""
        return self.view.pattern()

    @property
    def optics(self) -> Optics:
        """The optics the phase panel's sliders show now for the acquisition shown: its calibration, the fit's
        aberrations and rotation, the sliders' C10, C12 and phi12 (usable in ``acq.ssb``, ``acq.direct_ptycho``,
        ``qd.ptycho.reconstruct``)."""
        return self.view.steered_optics()

    @property
    def phase(self) -> PhaseImage:
        """The phase panel's image now (float32 rad ``phase``, ``amplitude`` for direct complex, ``pixel_A``,
        ``optics``); ``np.asarray(v.phase)`` is the phase."""
        return self.view.phase()

    def save_phase(self, path) -> Path:
        """Write the phase panel's image: .png a labelled figure, .npy (with ``<name>.json``) or .tif with the
        optics and method in its metadata."""
        return phase.save(self.view.phase(), path)

    def close(self) -> None:
        self.session.close()
        super().close()

