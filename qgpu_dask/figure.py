"""One labelled overview figure of an acquisition (matplotlib, written as PNG without a screen): virtual
images, the centre-of-mass field and its integral, and a mean diffraction pattern on a log scale.

It takes plain NumPy arrays (what the service's queries return) and knows
nothing of the service; ``qd.save_png`` stays the way to write one bare image.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

WIDTH_IN, HEIGHT_IN, DPI = 13.5, 8.4, 100  # the PNG is 1350 x 840 pixels


def nice_length(span: float) -> float:
    """A round length (1, 2 or 5 times a power of ten) near a fifth of ``span``."""
    target = span / 5.0
    power = 10.0 ** np.floor(np.log10(target))
    return float(min((m * power for m in (1.0, 2.0, 5.0, 10.0)), key=lambda v: abs(v - target)))


def scale_bar(ax, scan_cols: int, scan_step_A: float | None) -> None:
    """A white bar at the lower left of a scan image: Angstrom when the scan step is known, else scan pixels."""
    from matplotlib.patches import Rectangle

    if scan_step_A:
        length_A = nice_length(scan_cols * scan_step_A)
        pixels, label = length_A / scan_step_A, f"{length_A:g} \u00c5"
    else:
        pixels = nice_length(scan_cols)
        label = f"{pixels:g} scan px"
    rows = ax.get_ylim()[0] + 0.5  # the image's row count (imshow's y axis runs downwards)
    x0, y0 = 0.05 * scan_cols - 0.5, 0.93 * rows - 0.5
    ax.add_patch(Rectangle((x0, y0), pixels, 0.02 * rows, color="white", ec="black", lw=0.5))
    ax.text(x0 + pixels / 2, y0 - 0.02 * rows, label, color="white", ha="center", va="bottom", fontsize=9,
            bbox={"facecolor": "black", "alpha": 0.4, "pad": 1, "edgecolor": "none"})


def com_colours(com: np.ndarray) -> np.ndarray:
    """(rows, cols, 3) RGB of a (2, rows, cols) vector field: hue is the direction, brightness the length
    (saturating at its 99th percentile)."""
    from matplotlib.colors import hsv_to_rgb

    dr, dc = np.nan_to_num(com[0]), np.nan_to_num(com[1])
    length = np.hypot(dr, dc)
    top = np.percentile(length, 99) or 1.0
    hsv = np.stack([(np.arctan2(dr, dc) / (2 * np.pi)) % 1.0, np.ones_like(length), np.clip(length / top, 0, 1)], axis=-1)
    return hsv_to_rgb(hsv)


def colour_wheel(ax) -> None:
    """A small key to :func:`com_colours` beside ``ax``: direction as hue, length as brightness."""
    from matplotlib.colors import hsv_to_rgb

    ax = ax.inset_axes([1.03, 0.0, 0.22, 0.22])
    r, c = np.mgrid[-1:1:64j, -1:1:64j]
    length = np.hypot(r, c)
    hsv = np.stack([(np.arctan2(r, c) / (2 * np.pi)) % 1.0, np.ones_like(r), np.clip(length, 0, 1)], axis=-1)
    rgba = np.concatenate([hsv_to_rgb(hsv), (length <= 1)[..., None].astype(float)], axis=-1)
    ax.imshow(rgba, origin="upper")
    ax.set_axis_off()


def figure(
    path: str | os.PathLike,
    images: dict[str, np.ndarray],
    com: np.ndarray,
    icom: np.ndarray,
    mean_pattern: np.ndarray,
    scan_step_A: float | None = None,
    title: str | None = None,
    mean_title: str = "mean pattern",
) -> Path:
    """Write one PNG (1350 x 840 px) with three virtual images (``images``: title -> (rows, cols) array),
    the centre-of-mass field ``com`` (2, rows, cols) as a colour wheel, its integral ``icom`` (rows, cols)
    and ``mean_pattern`` (det_rows, det_cols) on a log scale; titles, colour bars and a scale bar (in
    Angstrom when ``scan_step_A`` is known, else scan pixels). Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    if len(images) != 3:
        raise ValueError(f"figure takes three virtual images, got {len(images)} ({', '.join(images)})")
    scan_shape = next(iter(images.values())).shape
    if com.shape != (2, *scan_shape) or icom.shape != scan_shape:
        raise ValueError(f"com must be (2, {scan_shape[0]}, {scan_shape[1]}) and icom {scan_shape}, got {com.shape} and {icom.shape}")
    path = Path(path)
    fig, axes = plt.subplots(2, 3, figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    try:
        if title:
            fig.suptitle(title, fontsize=12)
        panels = list(images.items()) + [("iCoM (integrated CoM)", icom)]
        for ax, (name, image) in zip([*axes[0], axes[1, 1]], panels):
            shown = ax.imshow(image, cmap="gray", interpolation="nearest")
            fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.02, label="phase (a.u.)" if image is icom else "counts")
            ax.set_title(name)
            scale_bar(ax, scan_shape[1], scan_step_A)
            ax.set_xticks([])
            ax.set_yticks([])

        ax = axes[1, 0]
        ax.imshow(com_colours(com), interpolation="nearest")
        ax.set_title("centre of mass (hue: direction)")
        scale_bar(ax, scan_shape[1], scan_step_A)
        ax.set_xticks([])
        ax.set_yticks([])
        colour_wheel(ax)

        ax = axes[1, 2]
        positive = mean_pattern[mean_pattern > 0]
        low = float(positive.min()) if positive.size else 1.0
        shown = ax.imshow(np.where(mean_pattern > 0, mean_pattern, low), cmap="inferno", interpolation="nearest",
                          norm=LogNorm(vmin=low, vmax=max(float(mean_pattern.max()), low * 10)))
        fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.02, label="mean counts per pixel")
        ax.set_title(mean_title)
        ax.set_xlabel("detector column (px)")
        ax.set_ylabel("detector row (px)")
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)
    return path
