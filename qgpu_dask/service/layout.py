"""The layout a new acquisition is held in, and why: what ``layout="auto"`` decides.

"auto" holds what answers fastest within the budget: dense on CPU workers where the dense counts (and
their index) fit the shard's free budget, compressed where they would not fit and on GPUs (whose
compressed kernels keep pace with dense ones), but never compressed when the estimated ratio is below
``MIN_RATIO`` (high-entropy counts: little saved, every query slower). An explicit "dense" or
"compressed" is obeyed. The reason is kept in words in the catalog record (``acq.info()["layout_reason"]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import numpy as np
from dask.utils import format_bytes

from ..resident import DenseCounts, Resident
from ..resident.live import Coding
from ..resident.compressed import LAYOUTS, MIN_RATIO, CompressedCounts, check_layout, compressible, estimated_ratio

CHOICES = ("auto", *LAYOUTS)  # what a load may ask for: a layout, or "auto"


@dataclass(frozen=True)
class Choice:
    """Whether a new resident is held compressed, whether a dense one keeps its index, and why (a sentence
    starting with its layout)."""

    compressed: bool
    reason: str
    index: bool = True


@dataclass(frozen=True)
class Plan:
    """How a new resident is made: ``reserve`` bytes admitted for its load, the ``expected`` bytes it will hold
    (what placement counts), and either the ``coding`` it is coded with as it is read (compressed) or, read
    dense first, the ``choice`` made on its dense counts."""

    reserve: int
    expected: int
    coding: Coding | None
    choice: Callable[[DenseCounts | None], Choice]


def planned(asked: str, shape, dtype, kind: str, free_bytes: int, sample: Callable[[], np.ndarray | None] = lambda: None,
            xp: ModuleType = np) -> Plan:
    """The plan of a new resident on a ``kind`` worker with ``free_bytes`` free. Where it may be held
    compressed, ``sample()`` gives frames spread over its scan (None where the source cannot): "auto" decides
    on them, and a compressed one is coded as read, admitted by the bytes its sample's coding makes it expect
    (on ``xp``'s device; the batches on their way are working memory, as a query's scratch is); else it is
    read dense first and "auto" decides on its counts, estimating the ratio only where it matters."""
    check_layout(asked, dtype, CHOICES)
    dense_bytes = DenseCounts.held_bytes(shape, dtype)
    raw = int(np.prod(shape)) * np.dtype(dtype).itemsize
    reserve = dense_bytes if asked != "compressed" and dense_bytes <= free_bytes else raw
    may_code = compressible(dtype) and (asked == "compressed" or (asked == "auto" and not (kind == "cpu" and dense_bytes <= free_bytes)))
    frames = sample() if may_code else None
    if frames is None:
        return Plan(reserve, reserve, None,
                    lambda dense: choose(asked, dtype, kind, dense_bytes, free_bytes, lambda: estimated_ratio(dense.flat)))
    flat = xp.asarray(frames).reshape(len(frames), -1)
    chosen = choose(asked, dtype, kind, dense_bytes, free_bytes, lambda: estimated_ratio(flat))
    if not chosen.compressed:
        return Plan(reserve, reserve, None, lambda dense: chosen)
    coding = Coding.chosen(flat, tuple(shape[2:]), xp)
    return Plan(coding.reserved_bytes(shape, dtype), coding.expected_bytes(shape), coding, lambda dense: chosen)


def held_as(dense: DenseCounts, choice: Choice) -> Resident:
    """``dense`` itself (its index promised where it fits: the shard builds it once the load has returned), or its
    compressed encoding (the dense staging copy is then dropped)."""
    if not choice.compressed:
        return dense.index_later() if choice.index else dense
    return CompressedCounts.encode(dense.name, dense.flat, dense.shape)


def choose(asked: str, dtype, kind: str, dense_bytes: int, free_bytes: int, ratio: Callable[[], float]) -> Choice:
    """The layout of a new resident of ``dtype`` on a ``kind`` ("cpu" or "cuda") worker whose budget has
    ``free_bytes`` free, where dense, with its index, it takes ``dense_bytes``; ``ratio()`` estimates the
    compression ratio of its counts and is called only when the choice depends on it. A dense resident that
    does not fit with its index is held without it (its queries read the counts)."""
    check_layout(asked, dtype, CHOICES)
    fits = dense_bytes <= free_bytes
    room = "" if fits else f"; its index does not fit the {format_bytes(free_bytes)} free, so queries read the counts"
    if asked != "auto":
        return Choice(asked == "compressed", f"{asked}: asked for" + ("" if asked == "compressed" else room), fits)
    if not compressible(dtype):
        return Choice(False, f"dense: {np.dtype(dtype)} counts are held dense (compressed holds unsigned integer counts)" + room, fits)
    if kind == "cpu" and fits:
        return Choice(False, f"dense: {format_bytes(dense_bytes)} fits the CPU worker's {format_bytes(free_bytes)} free budget; "
                             "dense answers fastest on CPU")
    estimate = ratio()
    if estimate < MIN_RATIO:
        return Choice(False, f"dense: estimated ratio {estimate:.2f} is below {MIN_RATIO}: compressing would save little and "
                             "slow every query" + room, fits)
    if kind == "cpu":
        return Choice(True, f"compressed: {format_bytes(dense_bytes)} dense would not fit the CPU worker's {format_bytes(free_bytes)} "
                            f"free budget (estimated ratio {estimate:.1f})")
    return Choice(True, f"compressed: on a GPU compressed queries keep pace with dense ones and the counts take about "
                        f"1/{estimate:.1f} of the memory (estimated ratio {estimate:.1f})")


def check_saved(asked: str, layout: str) -> None:
    """ValueError unless a saved resident held ``layout`` may load when ``asked`` for (it is never re-encoded)."""
    check_layout(asked, allowed=CHOICES)
    if asked not in ("auto", layout):
        raise ValueError(f"this saved resident is held {layout} and loads as it was saved: layout='auto' or {layout!r}, not {asked!r}")
