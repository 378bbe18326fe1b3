"""CUDA kernels of the pixel-group index (kernels/groups.cu through CuPy): the twins of ``resident.cpu.groups``.

Same functions, arguments and bits (see its docstring), plus ``series_group_sums``, which adds the group
sums of every member of a series in one launch.
"""

from __future__ import annotations

import cupy
import numpy as np

from ... import compile
from ...formats.groups import GROUP_BLOCK, n_blocks_of, starts_of, total_bits, widths_of

__all__ = ["group_index", "group_sums", "series_group_sums", "GDESC_FIELDS"]

THREADS = 256
GDESC_FIELDS = ("base", "width", "bits", "start", "n_groups")  # a member's row in series_group_sums' table
GDESC_WORDS = len(GDESC_FIELDS)
DEFINES = compile.defines(GROUP_BLOCK=GROUP_BLOCK, GDESC_WORDS=GDESC_WORDS)
CTYPES = {np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short", np.dtype(np.uint32): "unsigned int"}
WTYPES = {np.dtype(np.uint32): "unsigned int", np.dtype(np.uint64): "unsigned long long"}


def kernel(name_expr: str) -> cupy.RawKernel:
    return compile.kernel("groups.cu", name_expr, DEFINES)


def group_index(flat: cupy.ndarray, ring: cupy.ndarray, leaf: cupy.ndarray, n_groups: int) -> tuple:
    """(base, width, bits) on the device: the per-frame ring and leaf sums of ``flat`` packed as
    ``formats.groups.pack`` packs them."""
    if flat.dtype not in CTYPES or flat.ndim != 2 or not flat.flags.c_contiguous:
        raise ValueError(f"group sums take C-contiguous (n_frames, frame_len) uint8/16/32 counts, got {flat.dtype} {flat.shape}")
    n_frames, frame_len = flat.shape
    n_groups = int(n_groups)
    if n_groups >= 2**16 - 1:
        raise ValueError(f"group sums take fewer than {2**16 - 1} groups (16-bit ids), got {n_groups}")
    sums = cupy.empty((n_frames, n_groups), dtype=np.uint64)
    if n_frames:
        ids = cupy.asarray(ring, dtype=np.uint32) | cupy.asarray(leaf, dtype=np.uint32) << np.uint32(16)  # ring, leaf: 16 bits each
        kernel(f"group_totals<{CTYPES[flat.dtype]}>")(
            (n_frames,), (THREADS,), (flat, np.int64(n_frames), np.int32(frame_len), ids, np.int32(n_groups), sums),
            shared_mem=8 * n_groups,
        )
    n_blocks = n_blocks_of(n_frames)
    whole = (n_frames // GROUP_BLOCK) * GROUP_BLOCK
    base = cupy.empty((n_blocks, n_groups), dtype=np.uint64)
    top = cupy.empty_like(base)
    if whole:
        blocks = sums[:whole].reshape(-1, GROUP_BLOCK, n_groups)
        base[: whole // GROUP_BLOCK], top[: whole // GROUP_BLOCK] = blocks.min(axis=1), blocks.max(axis=1)
    if whole < n_frames:
        base[-1], top[-1] = sums[whole:].min(axis=0), sums[whole:].max(axis=0)
    width = widths_of(cupy.asnumpy(top - base))
    bits = cupy.zeros(-(-total_bits(width, n_frames) // 64), dtype=np.uint64)
    if bits.size:
        kernel("pack_fields")(
            (-(-(n_frames * n_groups) // THREADS),), (THREADS,),
            (sums, np.int64(n_frames), np.int32(n_groups), base, cupy.asarray(width), cupy.asarray(starts_of(width, n_frames)), bits),
        )
    return base, cupy.asarray(width), bits


def table(members: list[tuple]) -> cupy.ndarray:
    """The series_group_sums table of ``members``: (base, width, bits, start) device arrays of each member's index."""
    rows = [[base.data.ptr, width.data.ptr, bits.data.ptr, start.data.ptr, width.shape[1]] for base, width, bits, start in members]
    return cupy.asarray(np.array(rows, dtype=np.uint64).reshape(len(members), len(GDESC_FIELDS)))


def series_group_sums(gdesc: cupy.ndarray, n_frames: int, spans: np.ndarray, groups: np.ndarray, coef: np.ndarray, out: cupy.ndarray) -> None:
    """Add to ``out`` (n_acq, n_masks, n_frames; uint32 or uint64, wrapping) each member's ``coef``-weighted sums of
    ``groups`` over its span (first, count) of the host lists (coef: (n_masks, list_len) int64), on the current stream."""
    n_masks, list_len = coef.shape
    if not list_len or out.dtype not in WTYPES:
        return
    kernel(f"series_group_sums<{WTYPES[out.dtype]}>")(
        (-(-int(n_frames) // THREADS), out.shape[0]), (THREADS,),
        (gdesc, np.int64(n_frames), cupy.asarray(np.ascontiguousarray(spans, dtype=np.int64)), cupy.asarray(groups.astype(np.int64)),
         cupy.asarray(np.ascontiguousarray(coef.astype(np.int64).view(np.uint64))), np.int64(list_len), np.int32(n_masks), out),
    )


def group_sums(base, width, bits, start, n_frames: int, groups, coef) -> cupy.ndarray:
    """(n_masks, n_frames) uint64 on the device: ``sum_j coef[m, j] * sums[f, groups[j]]``, wrapping."""
    groups, coef = cupy.asnumpy(groups).astype(np.int64), cupy.asnumpy(coef).astype(np.int64)
    out = cupy.zeros((1, coef.shape[0], int(n_frames)), dtype=np.uint64)
    series_group_sums(table([(base, width, bits, start)]), n_frames, np.array([[0, groups.size]]), groups, coef, out)
    return out[0]
