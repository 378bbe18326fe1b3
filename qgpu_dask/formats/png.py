"""8-bit grayscale PNG previews of 2-D arrays (virtual images, diffraction patterns)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image


def to_uint8(
    image: np.ndarray, log: bool = False, percentile: tuple[float, float] = (0.5, 99.5)
) -> np.ndarray:
    """Contrast-stretch a 2-D real array to uint8 between two percentiles of its finite values.

    Values at or below the low percentile map to 0, at or above the high one
    to 255. log=True applies log1p to the values clipped at 0 first, which
    shows the faint dark-field of a diffraction pattern next to its bright
    disk. Non-finite pixels come out black. If the percentiles coincide the
    full finite range is used; a constant image comes out black when it is 0
    (or log=True maps it to 0) and mid-gray otherwise, with no division by zero.
    """
    arr = np.asarray(image)
    if arr.ndim != 2:
        raise ValueError(f"image must be 2-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"image is empty, shape {arr.shape}")
    if arr.dtype.kind not in "buif":
        raise ValueError(f"image must have a real dtype, got {arr.dtype}")
    lo_q, hi_q = (float(q) for q in percentile)
    if not (0.0 <= lo_q < hi_q <= 100.0):
        raise ValueError(f"percentile must be (low, high) with 0 <= low < high <= 100, got {percentile!r}")

    values = arr.astype(np.float64)
    if log:
        with np.errstate(invalid="ignore"):
            values = np.log1p(np.maximum(values, 0.0))
    finite = np.isfinite(values)
    if not finite.any():
        raise ValueError("image has no finite values (all NaN or infinite)")
    sample = values[finite]
    lo, hi = np.percentile(sample, [lo_q, hi_q])
    if not hi > lo:
        lo, hi = sample.min(), sample.max()
    if not hi > lo:
        level = 0 if lo == 0 else 128
        return np.where(finite, level, 0).astype(np.uint8)
    scaled = (values - lo) * (255.0 / (hi - lo))
    scaled = np.where(finite, scaled, 0.0)
    return np.rint(np.clip(scaled, 0.0, 255.0)).astype(np.uint8)


def save_png(
    image: np.ndarray,
    path: str | os.PathLike[str],
    log: bool = False,
    percentile: tuple[float, float] = (0.5, 99.5),
) -> Path:
    """Write a 2-D array as an 8-bit grayscale PNG stretched as `to_uint8` does; return the path.

    Row 0 of the array is the top row of the picture. The parent folder is
    created if missing.
    """
    pixels = to_uint8(image, log=log, percentile=percentile)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.ascontiguousarray(pixels)).save(out, format="PNG")
    return out
