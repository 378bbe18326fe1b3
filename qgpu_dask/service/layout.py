"""The layout a new acquisition is held in, and why: what ``representation="auto"`` decides.

"auto" holds what answers fastest within the budget: dense on CPU workers where the dense counts (and
their index) fit the shard's free budget, compressed where they would not fit and on GPUs (whose
compressed kernels keep pace with dense ones), but never compressed when the estimated ratio is below
``MIN_RATIO`` (high-entropy counts: little saved, every query slower). An explicit "dense" or
"compressed" is obeyed. The reason is kept in words in the catalog record (``acq.info()["layout_reason"]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from dask.utils import format_bytes

from ..resident.compressed import MIN_RATIO, compressible

REPRESENTATIONS = ("auto", "dense", "compressed")


@dataclass(frozen=True)
class Layout:
    """Whether a new resident is held compressed, whether a dense one keeps its index, and why (a sentence
    starting with its layout)."""

    compressed: bool
    reason: str
    index: bool = True


def check_representation(representation: str, dtype) -> None:
    """ValueError unless ``representation`` is known and counts of ``dtype`` can be held so."""
    if representation not in REPRESENTATIONS:
        raise ValueError(f"unknown representation {representation!r}: use one of {', '.join(REPRESENTATIONS)}")
    if representation == "compressed" and not compressible(dtype):
        raise ValueError(f"representation='compressed' holds unsigned integer counts; this acquisition is {np.dtype(dtype)}")


def choose(representation: str, dtype, kind: str, dense_bytes: int, free_bytes: int, ratio: Callable[[], float]) -> Layout:
    """The layout of a new resident of ``dtype`` on a ``kind`` ("cpu" or "cuda") worker whose budget has
    ``free_bytes`` free, where dense, with its index, it takes ``dense_bytes``; ``ratio()`` estimates the
    compression ratio of its counts and is called only when the choice depends on it. A dense resident that
    does not fit with its index is held without it (its queries read the counts)."""
    check_representation(representation, dtype)
    fits = dense_bytes <= free_bytes
    room = "" if fits else f"; its index does not fit the {format_bytes(free_bytes)} free, so queries read the counts"
    if representation != "auto":
        return Layout(representation == "compressed", f"{representation}: asked for" + ("" if representation == "compressed" else room), fits)
    if not compressible(dtype):
        return Layout(False, f"dense: {np.dtype(dtype)} counts are held dense (compressed holds unsigned integer counts)" + room, fits)
    if kind == "cpu" and fits:
        return Layout(False, f"dense: {format_bytes(dense_bytes)} fits the CPU worker's {format_bytes(free_bytes)} free budget; "
                             "dense answers fastest on CPU")
    estimate = ratio()
    if estimate < MIN_RATIO:
        return Layout(False, f"dense: estimated ratio {estimate:.2f} is below {MIN_RATIO}: compressing would save little and "
                             "slow every query" + room, fits)
    if kind == "cpu":
        return Layout(True, f"compressed: {format_bytes(dense_bytes)} dense would not fit the CPU worker's {format_bytes(free_bytes)} "
                            f"free budget (estimated ratio {estimate:.1f})")
    return Layout(True, f"compressed: on a GPU compressed queries keep pace with dense ones and the counts take about "
                        f"1/{estimate:.1f} of the memory (estimated ratio {estimate:.1f})")


def check_saved_representation(representation: str, layout: str) -> None:
    """ValueError unless a saved resident held ``layout`` may load as ``representation`` (it is never re-encoded)."""
    if representation not in REPRESENTATIONS:
        raise ValueError(f"unknown representation {representation!r}: use one of {', '.join(REPRESENTATIONS)}")
    if representation not in ("auto", layout):
        raise ValueError(
            f"this saved resident is held {layout} and loads as it was saved: representation='auto' or {layout!r}, not {representation!r}"
        )
