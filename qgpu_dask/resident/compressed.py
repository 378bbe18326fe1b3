"""CompressedCounts: counts held as entropy-coded per-detector-pixel streams (format qgpu-ans-2).

A query decodes only the streams it needs (the mask's pixels, the ROI's scan
blocks, one frame's block) and gives the same bits as the dense layout.
Virtual images go through the series engine (``series.SeriesSums``; an
acquisition alone is a series of one), which picks the exact decomposition
that decodes the fewest pixels: direct, complement (from the frame totals),
incremental (from the last result), or groups (whole rings and sector leaves
read from the group index, ``resident.groups``, plus the residual pixels).
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Callable

import numpy as np

from ..device import module_of, to_host
from ..formats import codec
from .base import Resident, kernels_for
from .groups import GroupIndex
from .masks import MaskWeights
from .series import SeriesSums


def compressible(dtype) -> bool:
    """Whether counts of ``dtype`` can be held compressed (unsigned integer counts)."""
    return np.dtype(dtype).kind == "u"


LAYOUTS = ("dense", "compressed")  # how a resident holds its counts


def check_layout(layout: str, dtype=None, allowed: tuple[str, ...] = LAYOUTS) -> None:
    """ValueError unless ``layout`` is one of ``allowed`` and counts of ``dtype`` (when given) can be held so."""
    if layout not in allowed:
        raise ValueError(f"unknown layout {layout!r}: use one of {', '.join(allowed)}")
    if layout in ("compressed", "sparse") and dtype is not None and not compressible(dtype):
        raise ValueError(f"layout={layout!r} holds unsigned integer counts; this acquisition is {np.dtype(dtype)}")


MIN_RATIO = 1.5  # "auto" never compresses counts whose estimated ratio is below this: the saving would not pay for slower queries
RATIO_SAMPLE_FRAMES = 1024  # frames, evenly spread, whose histograms estimate a compression ratio


def estimated_ratio(flat) -> float:
    """Raw bytes over the estimated coded bytes (``codec.estimated_bytes``) of dense counts ``flat``
    (n_frames, frame_len), from at most RATIO_SAMPLE_FRAMES evenly spread frames. When the raw chunks of
    the escaped counts alone keep the ratio below MIN_RATIO, that bound is the estimate: the per-pixel
    histograms of a wide detector (a MiB per 512 pixels) would cost more than a few frames of counts."""
    xp = module_of(flat)
    step = max(1, -(-flat.shape[0] // RATIO_SAMPLE_FRAMES))
    sample = xp.ascontiguousarray(flat[::step])
    escaped = int((sample >= codec.MAX_V).sum())
    bound = sample.nbytes / max(escaped * 2 * codec.raw_chunks(flat.dtype), 1)
    if bound < MIN_RATIO:
        return bound
    hist = to_host(kernels_for(xp, "compressed").value_histogram(sample))
    return sample.nbytes / max(codec.estimated_bytes(hist, sample.shape[0], flat.dtype), 1.0)


class CompressedCounts(Resident):
    """Unsigned counts as rANS-coded streams of ``block`` scans per detector pixel, with exact queries."""

    layout = "compressed"

    def __init__(self, name: str, shape, dtype, block: int, model: dict, streams: dict, stats: dict, groups: GroupIndex,
                 checked: bool = True):
        """``model``: run, values, table_start, cum; ``streams``: index, block_base, payload, totals (device
        arrays); ``groups``: the group index of the same counts. ``checked=False`` skips checking the model
        and index: only for streams this process coded (a live acquisition's view of its coded blocks, made
        again as blocks arrive)."""
        xp = module_of(streams["payload"])
        super().__init__(name, shape, dtype, xp)
        if not compressible(self.dtype):
            raise ValueError(f"compressed residents hold unsigned integer counts, not {self.dtype}")
        self.block = int(block)
        n_blocks = -(-self.n_frames // self.block)
        if checked:
            check_model({k: to_host(v) for k, v in model.items()}, self.frame_len)
            check_index(streams["index"], streams["block_base"], n_blocks, self.frame_len, int(streams["payload"].shape[0]))
        self.kernels = kernels_for(xp, "compressed")
        self.model = self.kernels.Model(self.n_frames, self.block, *(model[k] for k in MODEL_KEYS), self.dtype)
        self.streams = self.kernels.Streams(streams["index"], streams["block_base"], streams["payload"])
        self.totals = streams["totals"]
        if self.totals.shape != (self.n_frames,) or self.totals.dtype != np.uint64:
            raise ValueError(f"compressed frame totals have shape {self.totals.shape} {self.totals.dtype}, expected ({self.n_frames},) uint64")
        if groups.n_frames != self.n_frames or groups.geometry.det_shape != self.det_shape:
            raise ValueError(f"the group index covers {groups.n_frames} frames of {groups.geometry.det_shape} pixels,"
                             f" not {self.n_frames} of {self.det_shape}")
        self.groups = groups
        self.stats = dict(stats)
        self.lock = threading.Lock()
        self.sums: SeriesSums | None = None  # made at the first virtual image

    # -- building -------------------------------------------------------------

    @classmethod
    def encode(cls, name: str, flat, shape) -> "CompressedCounts":
        """Encode dense counts ``flat`` (n_frames, frame_len) on their device; ``flat`` is left as it was."""
        xp = module_of(flat)
        if not compressible(flat.dtype):
            raise ValueError(f"layout='compressed' needs unsigned integer counts, got {flat.dtype}")
        block, device_model, hist = chosen_model(flat, every_symbol=False)
        streams = kernels_for(xp, "compressed").encode(flat, block, *(device_model[k] for k in MODEL_KEYS))
        stats = {"entropy_bytes": float(entropy_bound(hist, flat, xp).sum() / 8)}
        totals = flat.sum(axis=1, dtype=np.uint64)
        groups = GroupIndex.from_counts(flat, tuple(shape[2:]), xp)
        return cls(name, shape, flat.dtype, block, device_model,
                   {"index": streams.index, "block_base": streams.block_base, "payload": streams.payload, "totals": totals}, stats,
                   groups)

    # -- the resident interface --------------------------------------------------

    @property
    def nbytes(self) -> int:
        parts = (self.streams.index, self.streams.block_base, self.streams.payload, self.totals, *(getattr(self.model, k) for k in MODEL_KEYS))
        return int(sum(p.nbytes for p in parts)) + self.groups.nbytes

    def prepare_mask_sums(self, masks: MaskWeights) -> Callable:
        plan = self.series().plan(masks)

        def launch() -> Callable:
            finish = plan.launch()
            return lambda: finish()[0]

        def run():
            return launch()()

        run.launch = launch
        run.decoded_pixels = plan.decoded_pixels
        return run

    def series(self) -> SeriesSums:
        """This acquisition as a series of one (its plans and its last result for the incremental path)."""
        with self.lock:
            if self.sums is None:
                self.sums = SeriesSums([self])
            return self.sums

    def roi_sum(self, indices):
        return self.kernels.roi_reduce(self.streams, self.model, self.multiplicity(indices), "sum")

    def roi_max(self, indices):
        return self.kernels.roi_reduce(self.streams, self.model, self.multiplicity(indices), "max").astype(self.dtype)

    def frame_flat(self, index: int):
        return self.kernels.frame(self.streams, self.model, int(index)).astype(self.dtype)

    def frames_flat(self, lo: int, hi: int):
        return self.kernels.decode_all(self.streams, self.model, self.dtype, frames=(lo, hi))

    @property
    def feed_grain(self) -> tuple[int, int]:
        return self.block, -(-self.kernels.fill_streams() // self.frame_len)

    def feed_frames(self, lo: int, hi: int, amplitude: bool, out=None):
        if out is None:
            out = self.xp.empty((hi - lo, self.frame_len), np.float32 if amplitude else self.dtype)
        return out, self.kernels.decode_frames(self.streams, self.model, (lo, hi), out, amplitude)

    def multiplicity(self, indices) -> object:
        """How often each frame is selected (uint32 on the device), from host int64 ``indices``."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.n_frames):
            raise IndexError(f"frame index out of range [0, {self.n_frames})")
        return self.xp.asarray(np.bincount(indices, minlength=self.n_frames).astype(np.uint32))

    def stream_arrays(self) -> dict:
        """The coded streams and their index, by STREAM_KEYS (what a saved resident holds besides the model)."""
        return {"index": self.streams.index, "block_base": self.streams.block_base, "payload": self.streams.payload, "totals": self.totals}

    @property
    def data(self):
        """The counts decoded into a new 4-D device array (``raw_bytes`` of memory), for user functions."""
        return self.counts_flat().reshape(self.shape)

    def counts_flat(self):
        return self.kernels.decode_all(self.streams, self.model, self.dtype)

    def pixel_images(self, indices: np.ndarray):
        return self.kernels.decode_pixels(self.streams, self.model, indices, np.float32, pixel_major=True)

    def check(self) -> None:
        """Decode every stream once; ValueError naming the first malformed one, or if the kept frame
        totals (which answer large masks) disagree with the streams."""
        self.kernels.check(self.streams, self.model)
        xp = self.xp
        pixels = xp.arange(self.frame_len, dtype=np.int64)
        sums = self.kernels.mask_sums(self.streams, self.model, pixels, xp.ones((1, self.frame_len), dtype=np.uint64))
        if not bool((sums[0] == self.totals).all()):
            raise ValueError(f"compressed acquisition {self.name!r}: the kept frame totals do not match its streams")
        self.groups.check(self.totals, self.name)

    def forms(self) -> dict[str, int]:
        """How many streams are held in each form."""
        counts = np.bincount((to_host(self.streams.index) >> codec.FORM_SHIFT).ravel(), minlength=len(codec.FORM_NAMES))
        return {name: int(c) for name, c in zip(codec.FORM_NAMES, counts)}

    def describe(self) -> dict:
        entropy = self.stats.get("entropy_bytes")
        return {
            **super().describe(),
            "format": codec.FORMAT,
            "block": self.block,
            "index_bytes": self.groups.nbytes,
            "index_center": [c / 2 for c in self.groups.center],  # (row, col): masks centred here read whole rings
            "ratio": self.raw_bytes / max(self.nbytes, 1),
            "entropy_bytes": entropy,
            "bound_ratio": self.nbytes / entropy if entropy else None,
        }


MODEL_KEYS = ("run", "values", "table_start", "cum")
STREAM_KEYS = ("index", "block_base", "payload", "totals")
MODEL_DTYPES = {"run": np.uint8, "values": np.uint8, "table_start": np.uint32, "cum": np.uint16}


def chosen_model(flat, every_symbol: bool) -> tuple[int, dict, np.ndarray]:
    """(block, model on the device, value histograms up to one past the largest count) chosen for counts ``flat`` (n_frames, frame_len):
    ``codec``'s choice from the histograms; with ``every_symbol`` every symbol of each pixel's alphabets is
    codable (``codec.build_tables``), as a live acquisition needs of the model its first frames give."""
    xp = module_of(flat)
    kernels = kernels_for(xp, "compressed")
    hist = kernels.value_histogram(flat)
    held = xp.flatnonzero(hist.any(axis=0))
    hist = to_host(hist[:, : min(codec.HIST_BINS, int(held[-1]) + 2 if held.size else 2)])  # past the largest count: zeros, not sent
    bits = codec.entropy_bits(hist, flat.shape[0])
    run, values = codec.choose_models(hist, flat.shape[0], bits)
    block = codec.choose_block(bits, flat.shape[0])
    tokens = kernels.token_histogram(flat, block, xp.asarray(run), xp.asarray(values))
    tokens = to_host(tokens[:, : codec.RUN_SLOT + int(run.max(initial=0)) + 2])  # the slots no model reaches are not sent
    table_start, cum = codec.build_tables(tokens, run, values, every_symbol)
    model = {"run": run, "values": values, "table_start": table_start, "cum": cum}
    return block, {k: xp.asarray(v) for k, v in model.items()}, hist


def check_model(model: dict, frame_len: int) -> None:
    """ValueError unless the per-pixel model arrays have the right dtypes, sizes and valid tables."""
    for key in MODEL_KEYS:
        if key not in model:
            raise ValueError(f"compressed model lacks {key!r}")
        if model[key].dtype != MODEL_DTYPES[key]:
            raise ValueError(f"compressed model {key!r} has dtype {model[key].dtype}, expected {np.dtype(MODEL_DTYPES[key])}")
    for key in ("run", "values", "table_start"):
        if model[key].shape != (frame_len,):
            raise ValueError(f"compressed model {key!r} has shape {model[key].shape}, expected ({frame_len},)")
    codec.check_tables(model["run"], model["values"], model["table_start"], model["cum"])


def check_index(index, base, n_blocks: int, frame_len: int, payload_bytes: int) -> None:
    """ValueError unless stream offsets are increasing inside their blocks and blocks tile the payload; checked
    on the arrays' device (a full acquisition's index is 19 MB)."""
    xp = module_of(index)
    if index.shape != (n_blocks, frame_len) or index.dtype != np.uint32:
        raise ValueError(f"compressed stream index has shape {index.shape} {index.dtype}, expected ({n_blocks}, {frame_len}) uint32")
    if base.shape != (n_blocks + 1,) or base.dtype != np.uint64:
        raise ValueError(f"compressed block bases have shape {base.shape} {base.dtype}, expected ({n_blocks + 1},) uint64")
    sizes = xp.diff(base.astype(np.int64))
    if int(base[0]) != 0 or int(base[-1]) != payload_bytes or bool((sizes < 0).any()):
        raise ValueError(f"compressed block bases do not tile the payload of {payload_bytes} bytes")
    offsets = (index & np.uint32(codec.OFFSET_MASK)).astype(np.int64)
    ends = xp.concatenate([offsets[:, 1:], sizes[:, None]], axis=1)
    if bool((offsets[:, 0] != 0).any()) or bool((ends < offsets).any()):
        raise ValueError("compressed stream offsets are not increasing inside their scan blocks")
    if bool(((index >> np.uint32(codec.FORM_SHIFT)) >= len(codec.FORM_NAMES)).any()):
        raise ValueError("a compressed stream has an unknown form")


def entropy_bound(hist: np.ndarray, flat, xp: ModuleType) -> np.ndarray:
    """Order-0 entropy (bits) of each pixel's counts; pixels with counts >= 255 get their exact distribution (the
    histograms' last column is the >= 255 bin, or one past the largest count, all zero)."""
    n_frames = flat.shape[0]
    bits = codec.entropy_bits(hist, n_frames)
    for p in np.flatnonzero(hist[:, -1] > 0):
        _, counts = xp.unique(flat[:, p], return_counts=True)
        prob = to_host(counts).astype(np.float64) / n_frames
        bits[p] = -(prob * np.log2(prob)).sum() * n_frames
    return bits

