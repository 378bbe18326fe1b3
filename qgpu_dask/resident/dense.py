"""DenseCounts: an acquisition held as it is, (n_frames, frame_len) in device memory."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from ..device import array_module, module_of
from .base import Resident, kernels_for
from .masks import MaskWeights


class DenseCounts(Resident):
    """The counts as they are; ``data`` is the 4-D device array users' functions see."""

    layout = "dense"

    def __init__(self, name: str, flat, shape):
        super().__init__(name, shape, flat.dtype, module_of(flat))
        if flat.shape != (self.n_frames, self.frame_len):
            raise ValueError(f"flat frames have shape {flat.shape}, expected {(self.n_frames, self.frame_len)}")
        self.flat = flat
        self.kernels = kernels_for(self.xp, "dense")

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
        return int(self.flat.nbytes)

    def prepare_mask_sums(self, masks: MaskWeights):
        return self.kernels.prepare_mask_sums(self.flat, masks.span_start, masks.weights)

    def roi_sum(self, indices):
        return self.kernels.roi_reduce(self.flat, indices, "sum")

    def roi_max(self, indices):
        return self.kernels.roi_reduce(self.flat, indices, "max")

    def frames_flat(self, lo: int, hi: int):
        return self.flat[lo:hi]

    def frame_flat(self, index: int):
        return self.flat[index]

    def counts_flat(self):
        return self.flat

    def pixel_images(self, indices: np.ndarray):
        return self.kernels.pixel_images(self.flat, indices)
