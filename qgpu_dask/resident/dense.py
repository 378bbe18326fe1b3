"""DenseCounts: an acquisition held as it is, (n_frames, frame_len) in device memory.

A resident the service holds keeps a small exact index of integer counts, built once (``indexed``): each
frame's row and column sums, the whole scan's sum and max patterns. A load from a file promises it
(``index_later``: its bytes counted at once) and the shard builds it once the load has returned, so a load
costs the read alone (on 2 CPU cores the index of 1 GiB of counts took 0.13 s, the read 0.17-0.20 s); until
then queries read the counts. Masks whose weights depend only on the
row plus only on the column (the ones mask, moments) are answered from the sums; a reduction over every
scan position is the kept pattern. Live parts and staging copies have no index and read the counts.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from ..device import array_module, module_of
from .base import Resident, kernels_for
from .masks import MaskWeights, line_weights


class DenseCounts(Resident):
    """The counts as they are; ``data`` is the 4-D device array users' functions see."""

    layout = "dense"

    def __init__(self, name: str, flat, shape):
        super().__init__(name, shape, flat.dtype, module_of(flat))
        if flat.shape != (self.n_frames, self.frame_len):
            raise ValueError(f"flat frames have shape {flat.shape}, expected {(self.n_frames, self.frame_len)}")
        self.flat = flat
        self.kernels = kernels_for(self.xp, "dense")
        self.index: tuple | None = None  # (row then column sums of each frame, sum pattern, max pattern), see ``indexed``
        self.index_to_come = False  # promised by index_later: its bytes are counted before it is built

    @staticmethod
    def index_bytes(shape, dtype) -> int:
        """Bytes of the index ``indexed`` builds for counts of ``shape`` and ``dtype`` (none for floats)."""
        dtype = np.dtype(dtype)
        if dtype.kind not in "iu":
            return 0
        n_frames, frame_len = shape[0] * shape[1], shape[2] * shape[3]
        return 8 * (n_frames * (shape[2] + shape[3]) + frame_len) + frame_len * dtype.itemsize

    @classmethod
    def held_bytes(cls, shape, dtype) -> int:
        """Device bytes a dense resident of ``shape`` and ``dtype`` holds, counts and index."""
        return shape[0] * shape[1] * shape[2] * shape[3] * np.dtype(dtype).itemsize + cls.index_bytes(shape, dtype)

    def indexed(self) -> "DenseCounts":
        """This resident with its index built from the counts as they are now (integer counts; floats have none)."""
        if self.dtype.kind in "iu":
            self.index = self.kernels.index_sums(self.flat, self.shape[3])
        self.index_to_come = False
        return self

    def index_later(self) -> "DenseCounts":
        """This resident with its index promised (integer counts): counted in ``nbytes`` now, built by ``indexed``."""
        self.index_to_come = self.dtype.kind in "iu"
        return self

    @classmethod
    def empty(cls, name: str, shape, dtype, xp: ModuleType | None = None) -> "DenseCounts":
        """Allocate device memory for ``shape``; fill it with :meth:`write`."""
        xp = xp or array_module()
        shape = tuple(int(s) for s in shape)
        flat = xp.empty((shape[0] * shape[1], shape[2] * shape[3]), dtype=np.dtype(dtype))
        return cls(name, flat, shape)

    def write(self, start_frame: int, frames: np.ndarray) -> None:
        """Copy host frames (n, det_rows, det_cols) into frames ``start_frame ..`` of the resident."""
        n = frames.shape[0]
        block = np.ascontiguousarray(frames, dtype=self.dtype).reshape(n, self.frame_len)
        if self.xp is np:
            self.flat[start_frame : start_frame + n] = block
        else:
            self.flat[start_frame : start_frame + n].set(block)

    @property
    def data(self):
        """The counts as a 4-D device array (a view, no copy)."""
        return self.flat.reshape(self.shape)

    @property
    def nbytes(self) -> int:
        promised = self.index_bytes(self.shape, self.dtype) if self.index_to_come else 0
        return int(self.flat.nbytes) + sum(int(a.nbytes) for a in self.index or ()) + promised

    def prepare_mask_sums(self, masks: MaskWeights):
        if self.index is None or masks.acc_dtype.kind not in "iu":
            return self.kernels.prepare_mask_sums(self.flat, masks.span_start, masks.weights)
        which, a, b = line_weights(masks, self.det_shape)
        rest = np.setdiff1d(np.arange(masks.n_masks), which)
        if not rest.size:
            return self.line_sums(masks.acc_dtype, a, b)
        rest_run = self.kernels.prepare_mask_sums(self.flat, masks.span_start, np.ascontiguousarray(masks.weights[rest]))
        if not which.size:
            return rest_run
        lines_run = self.line_sums(masks.acc_dtype, a, b)

        def run():
            out = self.xp.empty((masks.n_masks, self.n_frames), dtype=masks.acc_dtype)
            out[which] = lines_run()
            out[rest] = rest_run()
            return out

        return run

    def line_sums(self, acc: np.dtype, a: np.ndarray, b: np.ndarray):
        """``run()``: the sums of masks ``a[row] + b[col]`` (int64, (k, det_rows) and (k, det_cols)) from the
        index's row and column sums, (k, n_frames) in ``acc``; wrapping products, exact as the result fits."""
        lines = self.index[0]
        weights = self.xp.asarray(np.ascontiguousarray(np.concatenate([a, b], axis=1)).view(lines.dtype))

        def run():
            sums = self.kernels.line_sums(lines, weights)
            return sums.view(np.int64) if acc == np.int64 else sums.astype(acc, copy=False)

        return run

    def covers_all(self, indices) -> bool:
        """Whether host ``indices`` are every frame once, in order (what the kept patterns answer)."""
        indices = np.asarray(indices)
        return self.index is not None and indices.size == self.n_frames and int(indices[0]) == 0 and bool((np.diff(indices) == 1).all())

    def roi_sum(self, indices):
        if self.covers_all(indices):
            return self.index[1].copy()
        return self.kernels.roi_reduce(self.flat, indices, "sum")

    def roi_max(self, indices):
        if self.covers_all(indices):
            return self.index[2].copy()
        return self.kernels.roi_reduce(self.flat, indices, "max")

    def frames_flat(self, lo: int, hi: int):
        return self.flat[lo:hi]

    def frame_flat(self, index: int):
        return self.flat[index]

    def counts_flat(self):
        return self.flat

    def pixel_images(self, indices: np.ndarray):
        return self.kernels.pixel_images(self.flat, indices)
