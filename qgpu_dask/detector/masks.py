"""Mask builders for virtual images: disk, annulus, sector, rectangle, polygon, one from an image, and one
from a detector description (the viewer's).

Masks are bool arrays of the detector shape. A pixel belongs to a mask when its
centre lies inside the region (distance from ``center`` in pixels, with
``center`` given as (row, col) and allowed to be fractional).
"""

from __future__ import annotations

import numpy as np


def check_shape(shape) -> tuple[int, int]:
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"a detector shape is (rows, cols) with both >= 1, got {shape}")
    return shape


def radius_map(shape, center) -> np.ndarray:
    """Distance of each pixel centre from ``center`` (row, col)."""
    rows, cols = check_shape(shape)
    if len(center) != 2:
        raise ValueError(f"center is (row, col), got {center!r}")
    r = np.arange(rows, dtype=np.float64)[:, None] - float(center[0])
    c = np.arange(cols, dtype=np.float64)[None, :] - float(center[1])
    return np.hypot(r, c)


def disk(shape, center, radius: float) -> np.ndarray:
    """Pixels within ``radius`` of ``center``: a bright-field (BF) detector."""
    if not radius > 0:
        raise ValueError(f"disk radius must be > 0, got {radius}")
    return radius_map(shape, center) <= radius


def annulus(shape, center, inner: float, outer: float) -> np.ndarray:
    """Pixels with ``inner < distance <= outer``: annular bright- or dark-field (ABF, ADF)."""
    if not 0 <= inner < outer:
        raise ValueError(f"annulus needs 0 <= inner < outer, got inner={inner}, outer={outer}")
    r = radius_map(shape, center)
    return (r > inner) & (r <= outer)


def sector(shape, center, inner: float, outer: float, start_deg: float, stop_deg: float) -> np.ndarray:
    """Part of an annulus between two angles (degrees, counter-clockwise from +col, rows pointing down).

    Segmented detectors for differential phase contrast are sectors; the range
    may wrap through 0 (e.g. 315 to 45).
    """
    ring = annulus(shape, center, inner, outer)
    rows, cols = check_shape(shape)
    r = np.arange(rows, dtype=np.float64)[:, None] - float(center[0])
    c = np.arange(cols, dtype=np.float64)[None, :] - float(center[1])
    angle = np.degrees(np.arctan2(-r, c)) % 360.0
    start, stop = start_deg % 360.0, stop_deg % 360.0
    if stop_deg - start_deg >= 360:
        inside = np.ones_like(ring)
    elif start <= stop:
        inside = (angle >= start) & (angle < stop)
    else:
        inside = (angle >= start) | (angle < stop)
    return ring & inside


def from_image(image, threshold: float | None = None) -> np.ndarray:
    """A mask from an image: nonzero pixels, or pixels above ``threshold``."""
    image = np.asarray(image)
    if image.ndim != 2:
        raise ValueError(f"a mask image is 2-D, got shape {image.shape}")
    return image > threshold if threshold is not None else image != 0


def rectangle(shape, top: float, left: float, bottom: float, right: float) -> np.ndarray:
    """Pixels whose centres lie in rows top..bottom and columns left..right, bottom and right excluded."""
    rows, cols = check_shape(shape)
    if not (top < bottom and left < right):
        raise ValueError(f"a rectangle needs top < bottom and left < right, got {(top, left, bottom, right)}")
    r = np.arange(rows, dtype=np.float64)[:, None]
    c = np.arange(cols, dtype=np.float64)[None, :]
    return (r >= top) & (r < bottom) & (c >= left) & (c < right)


def polygon(shape, vertices) -> np.ndarray:
    """Pixels whose centres lie inside the polygon of ``vertices`` ((row, col) each, at least 3; even-odd rule)."""
    rows, cols = check_shape(shape)
    v = np.asarray(vertices, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != 2 or len(v) < 3 or not np.isfinite(v).all():
        raise ValueError(f"a polygon needs at least 3 finite (row, col) vertices, got {np.asarray(vertices).tolist()!r}")
    r = np.arange(rows, dtype=np.float64)[:, None]
    c = np.arange(cols, dtype=np.float64)[None, :]
    inside = np.zeros((rows, cols), dtype=bool)
    for (r0, c0), (r1, c1) in zip(v, np.roll(v, -1, axis=0)):
        if r0 == r1:
            continue  # a horizontal edge crosses no row's ray
        crosses = (r0 > r) != (r1 > r)
        at = c0 + (r - r0) * (c1 - c0) / (r1 - r0)
        inside ^= crosses & (c < at)
    return inside


def from_detector(shape, detector: dict) -> np.ndarray:
    """The mask of a detector description: ``{"kind": "disk", "center": [row, col], "radius"}``, an annulus
    (``inner``, ``outer``), a sector (and ``start_deg``, ``stop_deg``), a rectangle (``top``, ``left``,
    ``bottom``, ``right``) or a polygon (``vertices``). ValueError naming what is missing or wrong, and for a
    detector that covers no pixel of the pattern."""
    if not isinstance(detector, dict):
        raise ValueError(f"a detector is a dict with a kind, got {detector!r}")
    kind = detector.get("kind")
    fields = DETECTOR_FIELDS.get(kind)
    if fields is None:
        raise ValueError(f"detector kind {kind!r} is not one of {', '.join(DETECTOR_FIELDS)}")
    missing = [f for f in fields if f not in detector]
    if missing:
        raise ValueError(f"a {kind} detector needs {', '.join(fields)}; missing {', '.join(missing)}")
    try:
        mask = BUILDERS[kind](shape, *(detector[f] for f in fields))
    except (TypeError, IndexError) as err:
        raise ValueError(f"a {kind} detector's fields are numbers (center: [row, col]): {err}") from None
    if not mask.any():
        raise ValueError(f"the {kind} detector covers no pixel of the {shape[0]}x{shape[1]} pattern")
    return mask


DETECTOR_FIELDS = {
    "disk": ("center", "radius"),
    "annulus": ("center", "inner", "outer"),
    "sector": ("center", "inner", "outer", "start_deg", "stop_deg"),
    "rectangle": ("top", "left", "bottom", "right"),
    "polygon": ("vertices",),
}
BUILDERS = {"disk": disk, "annulus": annulus, "sector": sector, "rectangle": rectangle, "polygon": polygon}
