"""Virtual images: per scan position, the exact sum of counts over each mask's detector pixels.

Masks are sent once: interactive use repeats masks (the same BF disk on every acquisition, a viewer
asking again). A client sends a mask stack with its digest the first time a
shard sees it and only the digest afterwards; the shard keeps the stack and,
per resident, the prepared plan (weights checked, accumulator chosen, weights
on the device). A shard that has dropped a stack answers ``MaskNotCached`` and
the client sends it again.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from ..device import cupy_or_none, gpu_turn
from ..resident import Resident, mask_weights
from ..resident.base import Plan
from ..resident.compressed import CompressedCounts
from ..resident.masks import MaskWeights, as_mask_stack
from ..resident.series import SeriesSums
from .base import Context, Kept, Query, placed, register
from .results import result_array

STACK_BYTES = 256 * 2**20
PLANS = 512
SERIES_ENGINES = 16  # series whose engines (tables, last results) a shard keeps
SENT_REMEMBERED = 4096  # (shard, mask digest) pairs a client remembers having sent
SIDE_STREAMS = 8


class MaskNotCached(KeyError):
    """The shard does not hold the mask stack of this digest (evicted, or a restarted worker)."""


def mask_digest(stack: np.ndarray) -> str:
    """A digest of a mask stack's dtype, shape and values."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{stack.dtype.str}{stack.shape}".encode())
    h.update(np.ascontiguousarray(stack).view(np.uint8).data)
    return h.hexdigest()


class MaskCache(Kept):
    """Mask stacks by digest (bounded in bytes, host memory), plans by (acquisitions, digest) (bounded in
    count; their weights are small beside the residents and are not counted against the budget) and the
    series engines of the compressed acquisitions asked together (``SeriesSums``: their streams' table and
    last result)."""

    def __init__(self, ctx: Context | None = None, stack_bytes: int = STACK_BYTES, plans: int = PLANS):
        self.stack_bytes = stack_bytes
        self.max_plans = plans
        self.stacks: OrderedDict[str, np.ndarray] = OrderedDict()
        self.plans: OrderedDict[tuple[tuple[str, ...], str], Callable] = OrderedDict()
        self.engines: OrderedDict[tuple[str, ...], SeriesSums] = OrderedDict()
        self.lock = threading.Lock()  # the event loop and the query thread both use the cache

    def stack(self, digest: str, stack: np.ndarray | None) -> np.ndarray:
        """The stack of ``digest``: stored if given (checked against the digest), else looked up."""
        if stack is not None:
            stack = np.asarray(stack)
            if mask_digest(stack) != digest:
                raise ValueError("mask stack does not match its digest")
        with self.lock:
            if stack is not None:
                self.stacks[digest] = stack
                while sum(s.nbytes for s in self.stacks.values()) > self.stack_bytes and len(self.stacks) > 1:
                    self.stacks.popitem(last=False)
            if digest not in self.stacks:
                raise MaskNotCached(digest)
            self.stacks.move_to_end(digest)
            return self.stacks[digest]

    def plan(self, names: list[str], digest: str, make: Callable[[], Callable]) -> Callable:
        """The plan of the acquisitions ``names`` (one, or a series answered together) for ``digest``, made with
        ``make()`` the first time."""
        return self.kept(self.plans, (tuple(names), digest), make, self.max_plans)

    def series(self, names: list[str], make: Callable[[], SeriesSums]) -> SeriesSums:
        """The series engine of the acquisitions ``names``, made with ``make()`` the first time."""
        return self.kept(self.engines, tuple(names), make, SERIES_ENGINES)

    def kept(self, table: OrderedDict, key, make: Callable, most: int):
        with self.lock:
            hit = table.get(key)
            if hit is not None:
                table.move_to_end(key)
                return hit
        made = make()
        with self.lock:
            table[key] = made
            while len(table) > most:
                table.popitem(last=False)
        return made

    def forget(self, name: str) -> None:
        """Drop the plans and series engines holding an acquisition (released, or its name about to be reused)."""
        with self.lock:
            for key in [k for k in self.plans if name in k[0]]:
                del self.plans[key]
            for key in [k for k in self.engines if name in k]:
                del self.engines[key]


side = threading.local()


def series_plan(series: SeriesSums, weights: MaskWeights, scan_shape: tuple[int, int]) -> Plan:
    """A series' plan as a shard runs it: (n_acq, n_masks, rows, cols) on the host."""
    return Plan(series.plan(weights), (len(series.names), weights.n_masks, *scan_shape))


def run_together(plans: list[Plan], then: Callable[[Any], Any] = lambda result: result) -> list:
    """Answer several residents' plans at once, in this process's turn on its GPU (``gpu_turn``): each starts
    on one of a few CUDA streams of this thread, so their kernels overlap (one resident's query rarely fills
    a GPU), then every result is collected where it was made (the device: the reply copies it to the host),
    ``then`` applied to it on its stream in the same turn (a binning)."""
    cp = cupy_or_none()
    if cp is None:
        return [then(plan.launch()()) for plan in plans]
    with gpu_turn():
        if len(plans) < 2:
            results = [then(plan.launch()()) for plan in plans]
            cp.cuda.get_current_stream().synchronize()  # all of it done in this turn (finish waits for its error word only)
            return results
        if not hasattr(side, "streams"):
            side.streams = [cp.cuda.Stream(non_blocking=True) for _ in range(SIDE_STREAMS)]
        pending = []
        for i, plan in enumerate(plans):
            stream = side.streams[i % SIDE_STREAMS]
            with stream:
                pending.append((stream, plan.launch()))
        results = []
        for stream, finish in pending:
            stream.synchronize()
            with stream:
                results.append(then(finish()))
            stream.synchronize()  # what finish and then launched (a cast, a binning) is done before the reply copies it from another stream
        return results


sent: set[tuple[str, str]] = set()  # (shard address, digest) of the stacks this client has sent


def bin_sums(images, factor: int):
    """(..., rows, cols) images summed over ``factor`` x ``factor`` squares of scan positions, on the device
    they are on, in the 64-bit type of their kind (exact for integer sums); the edge rows and columns that
    do not fill a square are left out. Rows of a square first (whole image rows), then its columns."""
    if factor == 1:
        return images
    *lead, rows, cols = images.shape
    out_rows, out_cols = rows // factor, cols // factor
    kept = images[..., : out_rows * factor, : out_cols * factor]
    wide = wide_dtype(images.dtype)
    sums = kept.reshape(*lead, out_rows, factor, out_cols * factor).sum(axis=-2, dtype=wide)
    return sums.reshape(*lead, out_rows, out_cols, factor).sum(axis=-1, dtype=wide)


def wide_dtype(dtype) -> np.dtype:
    """The 64-bit dtype of ``dtype``'s kind: what binned sums are held in."""
    kind = np.dtype(dtype).kind
    return np.dtype(np.uint64 if kind == "u" else np.int64 if kind == "i" else np.float64)


@register
class VirtualImages(Query):
    """(n_acquisitions, n_masks, scan_rows, scan_cols) exact virtual images, every mask in one pass over
    each resident; ``one``: one 2-D mask, the masks axis dropped (default: when ``masks`` is one 2-D
    array); ``bin`` > 1: each image summed over bin x bin squares of scan positions on its owner (a
    thumbnail that crosses to the client bin**2 times smaller; 64-bit sums, ``bin_sums``)."""

    name = "virtual_images"
    inline = True
    keeps = {"masks": MaskCache}

    def __init__(self, series, masks, one: bool | None = None, bin: int = 1):
        self.stack = as_mask_stack(masks, series.same("det_shape"))
        rows, cols = series.same("scan_shape")
        if isinstance(bin, bool) or not isinstance(bin, (int, np.integer)) or not 1 <= bin <= min(rows, cols):
            raise ValueError(f"bin must be a whole number of scan positions from 1 to {min(rows, cols)} "
                             f"(the scan is {rows} x {cols}), got {bin!r}")
        self.bin = int(bin)
        self.images_shape = (len(self.stack), rows // self.bin, cols // self.bin)
        self.one = (np.ndim(masks) == 2 and not isinstance(masks, (list, tuple))) if one is None else one
        self.digest = mask_digest(self.stack)
        acc = mask_weights(self.stack, self.stack.shape[1:], series[0].dtype).acc_dtype  # as the owner of the first chooses it
        self.acc = acc if self.bin == 1 else wide_dtype(acc)
        self.out: np.ndarray | None = None

    def destination(self, n: int) -> np.ndarray:
        """The (n, n_masks, rows, cols) result, in the sums' dtype the owner of the first acquisition chooses."""
        self.out = result_array((n, *self.images_shape), self.acc)
        return self.out

    async def send(self, call, owner: str, names: list[str]) -> np.ndarray:
        """The digest alone where this shard has been sent the stack (the stack again if it has dropped it)."""
        key = (owner, self.digest)
        if key in sent:
            try:
                return await call(owner, names, self.digest, None, self.bin)
            except MaskNotCached:
                pass
        result = await call(owner, names, self.digest, self.stack, self.bin)
        if len(sent) > SENT_REMEMBERED:
            sent.clear()
        sent.add(key)
        return result

    @staticmethod
    def run(ctx: Context, residents: list[Resident], digest: str, masks: np.ndarray | None = None, bin: int = 1) -> dict:
        """{"acc": the sums' dtype, "parts": [(places among ``residents``, images (k, n_masks, rows, cols))]}: the
        compressed residents of each count dtype answered together by the series engine (one plan and one
        launch for all of them), the others each by their own kept plan; binned where they were made."""
        cache: MaskCache = ctx.kept["masks"]
        stack = cache.stack(digest, masks)
        weights: dict[tuple, Any] = {}

        def prepared(r: Resident) -> Any:
            key = (r.det_shape, r.dtype)
            if key not in weights:
                weights[key] = mask_weights(stack, r.det_shape, r.dtype)
            return weights[key]

        together: dict[np.dtype, list[int]] = {}
        alone = []
        for i, r in enumerate(residents):
            if isinstance(r, CompressedCounts):
                together.setdefault(r.dtype, []).append(i)
            else:
                alone.append(i)
        places, plans = [], []
        for places_of in together.values():
            members = [residents[i] for i in places_of]
            series = cache.series([r.name for r in members], lambda members=members: SeriesSums(members))
            plan = cache.plan(series.names, digest, lambda series=series, r=members[0]: series_plan(series, prepared(r), r.scan_shape))
            places.append(places_of)
            plans.append(plan)
        for i in alone:
            r = residents[i]
            places.append([i])
            plans.append(cache.plan([r.name], digest, lambda r=r: r.plan_virtual_images(prepared(r))))
        images = run_together(plans, lambda im: bin_sums(im if im.ndim == 4 else im[None], bin))
        acc = prepared(residents[0]).acc_dtype
        return {"acc": (acc if bin == 1 else wide_dtype(acc)).str, "parts": list(zip(places, images))}

    @staticmethod
    def written(reply: dict, write) -> dict:
        """The reply less the images written into the client's result."""
        return {"acc": reply["acc"], "parts": [(places, None if write(places, images) else images) for places, images in reply["parts"]]}

    def merge(self, replies: list[dict], positions: list[list[int]]) -> np.ndarray:
        """The images in series order, in the first reply's sums' dtype: the client's result array with the
        parts the owners did not write into it placed there; one shard's reply holding the whole series in
        order, in that dtype, is the result as it came (no copy)."""
        parts = [(np.asarray(where)[places], images) for reply, where in zip(replies, positions) for places, images in reply["parts"]]
        left = [(where, images) for where, images in parts if images is not None]
        acc = np.dtype(replies[0]["acc"])
        n = sum(map(len, positions))
        if len(parts) == len(left) == 1 and (parts[0][0] == np.arange(n)).all() and parts[0][1].dtype == acc:
            out = parts[0][1]
        else:
            out = self.out
            if out is None or (len(left) == len(parts) and (out.dtype != acc or len(out) != n)):  # none written there
                out = result_array((n, *self.images_shape), acc)
            placed(out, [(i, images[k]) for where, images in left for k, i in enumerate(where)])
        return out[:, 0] if self.one else out
