"""Mask builders for virtual images: disk, annulus, sector, and one from an image.

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
