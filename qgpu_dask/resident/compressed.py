"""CompressedCounts: counts held as entropy-coded per-detector-pixel streams (format qgpu-ans-1).

A query decodes only the streams it needs (the mask's pixels, the ROI's scan
blocks, one frame's block) and gives the same bits as the dense layout. A mask
that differs a little from the previous one on the same acquisition is
answered incrementally: the previous result plus the sums of the weight
changes, which decodes only the changed pixels (exact, in wrapping integer
arithmetic).
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Callable

import numpy as np

from ..device import module_of, to_host
from ..formats import codec
from .base import Resident
from .masks import MaskWeights

# An incremental answer is used when the changed pixels are at most this share
# of the new masks' pixels.
INCREMENTAL_SHARE = 0.5


def kernels_for(xp: ModuleType) -> ModuleType:
    """The compressed kernel module of an array module: CUDA for CuPy, Numba for NumPy."""
    if xp is np:
        from .cpu import compressed
    else:
        from .cuda import compressed
    return compressed


def compressible(dtype) -> bool:
    """Whether counts of ``dtype`` can be held compressed (unsigned integer counts)."""
    return np.dtype(dtype).kind == "u"


class CompressedCounts(Resident):
    """Unsigned counts as rANS-coded streams of ``block`` scans per detector pixel, with exact queries."""

    layout = "compressed"

    def __init__(self, name: str, shape, dtype, block: int, model: dict, streams: dict, stats: dict):
        """``model``: run, values, table_start, cum; ``streams``: index, block_base, payload (device arrays)."""
        xp = module_of(streams["payload"])
        super().__init__(name, shape, dtype, xp)
        if not compressible(self.dtype):
            raise ValueError(f"compressed residents hold unsigned integer counts, not {self.dtype}")
        self.block = int(block)
        n_blocks = -(-self.n_frames // self.block)
        host = {k: to_host(v) for k, v in model.items()}
        check_model(host, self.frame_len)
        index, base = to_host(streams["index"]), to_host(streams["block_base"])
        check_index(index, base, n_blocks, self.frame_len, int(streams["payload"].shape[0]))
        self.kernels = kernels_for(xp)
        self.host_model = host
        self.model = self.kernels.Model(self.n_frames, self.block, *(model[k] for k in MODEL_KEYS), self.dtype)
        self.streams = self.kernels.Streams(streams["index"], streams["block_base"], streams["payload"])
        self.stats = dict(stats)
        self.lock = threading.Lock()
        self.last: tuple[np.ndarray, np.dtype, object] | None = None  # (full weights, acc dtype, wrapped result)

    # -- building -------------------------------------------------------------

    @classmethod
    def encode(cls, name: str, flat, shape) -> "CompressedCounts":
        """Encode dense counts ``flat`` (n_frames, frame_len) on their device; ``flat`` is left as it was."""
        xp = module_of(flat)
        kernels = kernels_for(xp)
        if not compressible(flat.dtype):
            raise ValueError(f"representation='compressed' needs unsigned integer counts, got {flat.dtype}")
        n_frames = flat.shape[0]
        hist = to_host(kernels.value_histogram(flat))
        run, values = codec.choose_models(hist, n_frames)
        block = codec.choose_block(hist, n_frames)
        tokens = to_host(kernels.token_histogram(flat, block, xp.asarray(run), xp.asarray(values)))
        table_start, cum = codec.build_tables(tokens, run, values)
        model = {"run": run, "values": values, "table_start": table_start, "cum": cum}
        device_model = {k: xp.asarray(v) for k, v in model.items()}
        streams = kernels.encode(flat, block, *(device_model[k] for k in MODEL_KEYS))
        stats = {"entropy_bytes": float(entropy_bound(hist, flat, xp).sum() / 8)}
        return cls(name, shape, flat.dtype, block, device_model,
                   {"index": streams.index, "block_base": streams.block_base, "payload": streams.payload}, stats)

    # -- the resident interface --------------------------------------------------

    @property
    def nbytes(self) -> int:
        parts = (self.streams.index, self.streams.block_base, self.streams.payload, *(getattr(self.model, k) for k in MODEL_KEYS))
        return int(sum(p.nbytes for p in parts))

    def prepare_mask_sums(self, masks: MaskWeights) -> Callable:
        full = np.zeros((masks.n_masks, self.frame_len), dtype=masks.weights.dtype)
        full[:, masks.span_start : masks.span_start + masks.weights.shape[1]] = masks.weights
        acc = masks.acc_dtype
        integer = acc.kind in "iu" and np.abs(full.astype(np.float64)).max() < 2**62
        with self.lock:
            last = self.last
        if integer and last is not None and last[0].shape == full.shape and last[1] == acc:
            delta = full.astype(np.int64) - last[0]
            changed = np.flatnonzero((delta != 0).any(axis=0))
            if changed.size <= INCREMENTAL_SHARE * np.count_nonzero(full.any(axis=0)):
                return self.plan_sums(full, acc, delta[:, changed], changed, base=last[2])
        pixels = np.flatnonzero(full.any(axis=0))
        return self.plan_sums(full, acc, full[:, pixels], pixels, base=None)

    def plan_sums(self, full: np.ndarray, acc: np.dtype, weights: np.ndarray, pixels: np.ndarray, base) -> Callable:
        """``run()``: sums of ``weights`` over ``pixels`` (plus ``base``, a previous wrapped result), as ``acc``."""
        integer = acc.kind in "iu"
        wrapped = np.ascontiguousarray(weights.astype(np.int64).view(np.uint64) if integer else weights.astype(np.float64))
        xp = self.xp
        device_weights, device_pixels = xp.asarray(wrapped), xp.asarray(pixels.astype(np.int64))
        remembered = full.astype(np.int64) if integer else None

        def run():
            if device_pixels.size:
                sums = self.kernels.mask_sums(self.streams, self.model, device_pixels, device_weights)
            else:
                sums = xp.zeros((full.shape[0], self.n_frames), dtype=wrapped.dtype)
            if base is not None:
                sums = sums + base
            if integer:
                with self.lock:
                    self.last = (remembered, acc, sums)
            return cast_wrapped(sums, acc)

        run.decoded_pixels = int(pixels.size)
        return run

    def roi_sum(self, indices):
        return self.kernels.roi_reduce(self.streams, self.model, self.multiplicity(indices), "sum")

    def roi_max(self, indices):
        return self.kernels.roi_reduce(self.streams, self.model, self.multiplicity(indices), "max").astype(self.dtype)

    def frame_flat(self, index: int):
        return self.kernels.frame(self.streams, self.model, int(index)).astype(self.dtype)

    def multiplicity(self, indices) -> object:
        """How often each frame is selected (uint32 on the device), from host int64 ``indices``."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.n_frames):
            raise IndexError(f"frame index out of range [0, {self.n_frames})")
        return self.xp.asarray(np.bincount(indices, minlength=self.n_frames).astype(np.uint32))

    @property
    def data(self):
        """The counts decoded into a new 4-D device array (``raw_bytes`` of memory), for user functions."""
        return self.kernels.decode_all(self.streams, self.model, self.dtype).reshape(self.shape)

    def check(self) -> None:
        """Decode every stream once; ValueError naming the first malformed one."""
        self.kernels.check(self.streams, self.model)

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
            "ratio": self.raw_bytes / max(self.nbytes, 1),
            "entropy_bytes": entropy,
            "bound_ratio": self.nbytes / entropy if entropy else None,
        }


MODEL_KEYS = ("run", "values", "table_start", "cum")
MODEL_DTYPES = {"run": np.uint8, "values": np.uint8, "table_start": np.uint32, "cum": np.uint16}


def cast_wrapped(sums, acc: np.dtype):
    """A wrapped uint64 (or float64) result as the accumulator dtype: uint32 wraps, int64 reinterprets."""
    if acc == np.int64:
        return sums.view(np.int64)
    return sums.astype(acc, copy=False)


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


def check_index(index: np.ndarray, base: np.ndarray, n_blocks: int, frame_len: int, payload_bytes: int) -> None:
    """ValueError unless stream offsets are increasing inside their blocks and blocks tile the payload."""
    if index.shape != (n_blocks, frame_len) or index.dtype != np.uint32:
        raise ValueError(f"compressed stream index has shape {index.shape} {index.dtype}, expected ({n_blocks}, {frame_len}) uint32")
    if base.shape != (n_blocks + 1,) or base.dtype != np.uint64:
        raise ValueError(f"compressed block bases have shape {base.shape} {base.dtype}, expected ({n_blocks + 1},) uint64")
    if int(base[0]) != 0 or int(base[-1]) != payload_bytes or (np.diff(base.astype(np.int64)) < 0).any():
        raise ValueError(f"compressed block bases do not tile the payload of {payload_bytes} bytes")
    offsets = (index & codec.OFFSET_MASK).astype(np.int64)
    ends = np.concatenate([offsets[:, 1:], np.diff(base.astype(np.int64))[:, None]], axis=1)
    if (offsets[:, 0] != 0).any() or (ends < offsets).any():
        raise ValueError("compressed stream offsets are not increasing inside their scan blocks")
    if ((index >> codec.FORM_SHIFT) >= len(codec.FORM_NAMES)).any():
        raise ValueError("a compressed stream has an unknown form")


def entropy_bound(hist: np.ndarray, flat, xp: ModuleType) -> np.ndarray:
    """Order-0 entropy (bits) of each pixel's counts; pixels with counts >= 255 get their exact distribution."""
    n_frames = flat.shape[0]
    bits = codec.entropy_bits(hist, n_frames)
    for p in np.flatnonzero(hist[:, -1] > 0):
        _, counts = xp.unique(flat[:, p], return_counts=True)
        prob = to_host(counts).astype(np.float64) / n_frames
        bits[p] = -(prob * np.log2(prob)).sum() * n_frames
    return bits

