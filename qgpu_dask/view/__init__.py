"""The viewer: a notebook widget (``qd.view``) and the same page served for a running service (``qgpu-dask view``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .widget import Viewer


def view(series, optics=None, detector: dict | None = None) -> "Viewer":
    """A viewer widget of an Acquisition or a Series (a live one fills in as frames arrive): the virtual image of
    a detector drawn on the pattern, the pattern at the scan cursor or of a drawn region, an acquisition slider
    for a series. ``optics`` (``qd.Optics``) adds CoM, iCoM and SSB images, scale bars, and the phase panel:
    SSB, direct ptychography and parallax steered by C10, C12 and phi12 sliders (``v.optics``, ``v.phase``,
    ``v.save_phase``). Needs anywidget
    (installed with the package) and a notebook front end (JupyterLab, Notebook 7, VS Code)."""
    from .widget import Viewer

    return Viewer(series, optics, detector)
