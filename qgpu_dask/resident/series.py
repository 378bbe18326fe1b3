"""Series sums: the virtual images of a series of compressed residents, planned once and run as one pass.

A mask stack is answered for every acquisition of a series (a shard's part of
it, or a single acquisition: a series of one) from one exact decomposition:

- direct: the pixels where some weight is nonzero;
- complement: ``c * total + sum (w - c) * count`` with ``c`` the commonest
  weight of each mask and ``total`` the per-frame sums kept with the streams
  (a mask covering most of the detector decodes only the rest);
- incremental: the series' previous result plus the sums of the weight
  changes (a viewer dragging a disk decodes only the changed pixels);
- groups: whole rings and sector leaves of each acquisition's group index
  (exact per-frame sums, ``groups``) times coefficients, plus the residual
  pixels (a disk or annulus centred on the pattern decodes none or a few).

Integer sums are exact in wrapping arithmetic, so negative terms are fine.
The host work is one plan per stack and one upload, one launch per group of
masks, one error check and one copy back per call, whatever the number of
acquisitions (``SeriesStreams`` in the kernels modules holds the work list).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

from ..device import to_host
from .base import kernels_for
from .cpu.compressed import SeriesError
from .groups import Decomposition, decompose
from .masks import MaskWeights

MEMO_SIZE = 8  # FullWeights kept (a few recent stacks)
GEOMETRIES = 64  # decompositions a mask stack keeps: one per index centre among the residents a series spans


class FullWeights:
    """A mask stack's weights over the whole detector, and what every plan derives from them.

    Made once per stack (see :func:`expanded`) and shared by the series a
    shard answers it for.
    """

    def __init__(self, masks: MaskWeights, frame_len: int):
        self.masks = masks
        self.integer = masks.acc_dtype.kind in "iu"  # integer sums: exact in wrapping arithmetic, whatever the order
        span = masks.weights.astype(np.int64 if self.integer else np.float64)
        self.full = np.zeros((masks.n_masks, frame_len), dtype=span.dtype)
        self.full[:, masks.span_start : masks.span_start + span.shape[1]] = span
        self.direct = np.flatnonzero(span.any(axis=0)) + masks.span_start
        self.offsets = commonest(span, frame_len) if self.integer else None
        if self.offsets is None or not self.offsets.any():
            self.complement = self.direct
        else:
            self.complement = np.flatnonzero((self.full != self.offsets[:, None]).any(axis=0))
        self.changes: OrderedDict = OrderedDict()
        self.decompositions: OrderedDict = OrderedDict()

    def decomposed(self, geometry) -> Decomposition:
        """``decompose(full, geometry)``, made once per geometry (the residents of a series share theirs)."""
        key = id(geometry)
        if key not in self.decompositions or self.decompositions[key][0] is not geometry:
            self.decompositions[key] = (geometry, decompose(self.full, geometry))
            while len(self.decompositions) > GEOMETRIES:
                self.decompositions.popitem(last=False)
        return self.decompositions[key][1]

    def changes_from(self, previous: "FullWeights") -> tuple[np.ndarray, np.ndarray]:
        """(pixels whose weights changed since ``previous``, the weight changes there)."""
        key = id(previous)
        if key not in self.changes or self.changes[key][0] is not previous:
            delta = self.full - previous.full
            changed = np.flatnonzero((delta != 0).any(axis=0))
            self.changes[key] = (previous, changed, delta[:, changed])
            while len(self.changes) > 2:
                self.changes.popitem(last=False)
        return self.changes[key][1], self.changes[key][2]


MEMO: OrderedDict = OrderedDict()
MEMO_LOCK = threading.Lock()


def expanded(masks: MaskWeights, frame_len: int) -> FullWeights:
    """The FullWeights of ``masks`` (the same object for the same stack while it is recent)."""
    key = (id(masks), frame_len)
    with MEMO_LOCK:
        hit = MEMO.get(key)
        if hit is not None and hit.masks is masks:
            MEMO.move_to_end(key)
            return hit
    made = FullWeights(masks, frame_len)
    with MEMO_LOCK:
        MEMO[key] = made
        while len(MEMO) > MEMO_SIZE:
            MEMO.popitem(last=False)
    return made


def commonest(span: np.ndarray, frame_len: int) -> np.ndarray:
    """The most frequent weight of each mask over the whole detector (the pixels outside ``span`` weigh 0);
    0 when zeros are the majority, or when a mask's weights span too wide a range to count."""
    out = np.zeros(span.shape[0], dtype=np.int64)
    for m, row in enumerate(span):
        zeros = frame_len - np.count_nonzero(row)
        if 2 * zeros >= frame_len:
            continue
        lo, hi = min(int(row.min()), 0), max(int(row.max()), 0)
        if hi - lo <= 4096:
            counts = np.bincount(row - lo, minlength=hi - lo + 1)
            counts[-lo] = zeros
            out[m] = lo + int(np.argmax(counts))
    return out


def cast_wrapped(sums, acc: np.dtype):
    """A wrapped uint64 (or float64) result as the accumulator dtype: uint32 wraps, int64 reinterprets."""
    if acc == np.int64:
        return sums.view(np.int64)
    return sums.astype(acc, copy=False)


class SeriesSums:
    """The virtual-image engine of one series of compressed residents (same detector and scan): their
    streams as one table, and the series' last integer result for the incremental path. It holds the
    residents' arrays: whoever keeps it drops it when one of them is released."""

    def __init__(self, residents: list):
        first = residents[0]
        for r in residents[1:]:
            if (r.frame_len, r.n_frames) != (first.frame_len, first.n_frames):
                raise ValueError(f"a series sum needs one detector and scan shape: {r.name!r} is {r.shape}, {first.name!r} {first.shape}")
        self.names = [r.name for r in residents]
        self.frame_len, self.n_frames = first.frame_len, first.n_frames
        self.xp = first.xp
        self.run_mode = to_host(first.model.run) > 0  # the first member's pixel modes order every member's pixels
        distinct = {id(r.groups.geometry): r.groups.geometry for r in residents}  # residents of one centre share one object
        self.geometries = list(distinct.values())
        place = {key: i for i, key in enumerate(distinct)}
        self.geometry_of = np.array([place[id(r.groups.geometry)] for r in residents], dtype=np.int64)
        self.table = kernels_for(self.xp, "compressed").SeriesStreams([(r.streams, r.model, r.totals, r.groups) for r in residents])
        self.lock = threading.Lock()
        self.last: tuple[FullWeights, np.dtype, object] | None = None  # (weights, acc dtype, wrapped result)

    def forget_last(self) -> None:
        """Answer the next stack afresh (not as an increment on the last one)."""
        with self.lock:
            self.last = None

    def checked(self, step: Callable):
        """``step()``; a malformed stream it meets is a ValueError naming the acquisition, and the next stack is
        answered afresh (no increment on a result that failed)."""
        try:
            return step()
        except SeriesError as err:
            self.forget_last()
            raise ValueError(f"acquisition {self.names[err.member]!r}: {err}") from None
        except ValueError:
            self.forget_last()
            raise

    def plan(self, masks: MaskWeights) -> Callable:
        """``run()``: the (n_acq, n_masks, n_frames) sums of ``masks`` on the device, as their accumulator dtype;
        ``run.launch()`` starts them on the current stream and returns ``finish()``; ``run.decoded_pixels`` is how
        many pixels' streams an acquisition decodes (the mean over the series)."""
        weights = expanded(masks, self.frame_len)
        with self.lock:
            last = self.last
        pixels, offsets = weights.direct, None
        if weights.integer and weights.complement.size < pixels.size:
            pixels, offsets = weights.complement, weights.offsets
        parts = [weights.decomposed(g) for g in self.geometries] if weights.integer else None
        grouped = None if parts is None else float(np.mean([parts[i].cost for i in self.geometry_of]))
        if grouped is not None and grouped >= pixels.size:
            parts = grouped = None
        if weights.integer and last is not None and last[1] == masks.acc_dtype and last[0].full.shape == weights.full.shape:
            changed, delta = weights.changes_from(last[0])
            if changed.size < (pixels.size if grouped is None else grouped):
                return self.planned(weights, masks.acc_dtype, [(changed, delta)], None, base=last[2])
        if parts is not None:
            return self.planned(weights, masks.acc_dtype, [(d.pixels, d.weights) for d in parts], None, base=None, parts=parts)
        chosen = weights.full[:, pixels] if offsets is None else weights.full[:, pixels] - offsets[:, None]
        return self.planned(weights, masks.acc_dtype, [(pixels, chosen)], offsets, base=None)

    def planned(self, weights: FullWeights, acc: np.dtype, lists: list[tuple[np.ndarray, np.ndarray]], offsets, base,
                parts: list[Decomposition] | None = None) -> Callable:
        """The run of sums of weights over pixels, one (pixels, weights) list for every member or one per geometry
        (``self.geometry_of``), plus ``offsets`` times the frame totals, plus ``base`` (a previous wrapped result),
        plus each member's group sums of its geometry's decomposition in ``parts``."""
        xp = self.xp
        integer = weights.integer
        narrow = acc == np.uint32
        pixel_lists, weight_lists = [], []
        for pixels, chosen in lists:
            order = np.argsort(self.run_mode[pixels], kind="stable")  # value-mode pixels side by side: their warps decode in lockstep
            pixel_lists.append(pixels[order].astype(np.int64))
            weight_lists.append(chosen[:, order])
        firsts = np.cumsum([0] + [p.size for p in pixel_lists])[:-1]
        which = self.geometry_of if len(lists) > 1 else np.zeros(len(self.names), dtype=np.int64)
        spans = np.stack([firsts[which], np.array([p.size for p in pixel_lists])[which]], axis=1).astype(np.int64)
        pixels = np.concatenate(pixel_lists)
        chosen = np.concatenate(weight_lists, axis=1)
        wrapped = np.ascontiguousarray(chosen.astype(np.int64).view(np.uint64) if integer else chosen.astype(np.float64))
        wrapped_offsets = None if offsets is None else offsets.astype(np.int64).view(np.uint64)
        group_lists = None
        if parts is not None and any(d.groups.size for d in parts):
            group_lists = [(d.groups, d.coef) for d in parts]
        shape = (len(self.names), weights.full.shape[0], self.n_frames)
        out_dtype = np.uint32 if narrow else wrapped.dtype
        decoded = float(spans[:, 1].mean())

        def launch() -> Callable:
            out = xp.zeros(shape, dtype=out_dtype) if base is None else base.astype(out_dtype, copy=True)
            done = self.checked(lambda: self.table.mask_sums_async(spans, pixels, wrapped, wrapped_offsets, out, narrow))
            if group_lists is not None:
                self.table.group_sums_into(self.geometry_of, group_lists, out)

            def finish():
                self.checked(done)
                if integer:
                    with self.lock:
                        self.last = (weights, acc, out)
                return cast_wrapped(out, acc)

            return finish

        def run():
            return launch()()

        run.launch = launch
        run.decoded_pixels = decoded
        return run
