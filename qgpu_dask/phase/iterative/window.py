"""The part of the detector a reconstruction reads: a square crop around the bright-field disk and a binning,
applied to each block of the feed on the owner (a smaller far field is a faster pass; its object pixels are
as much larger).

A crop of side c keeps detector pixels [r0, r0 + c) x [c0, c0 + c), the window centred on the bright-field
centre rounded to a pixel; a binning b sums b x b pixels (exact: counts stay counts, as uint32). The optics
the reconstruction then works with are the detector's so reduced: b times the sampling, the bright-field
centre in the reduced pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..optics import Optics


@dataclass(frozen=True)
class Window:
    """Rows [top, top + rows) and columns [left, left + cols) of the detector, summed in bin x bin pixels."""

    top: int
    left: int
    rows: int
    cols: int
    bin: int

    @property
    def det_shape(self) -> tuple[int, int]:
        """The reduced detector's shape."""
        return self.rows // self.bin, self.cols // self.bin

    def optics_of(self, optics: Optics) -> Optics:
        """``optics`` for the reduced detector: its sampling b times coarser, the bright-field centre moved by
        the crop and scaled by the binning (a binned pixel's centre is that of its b x b originals)."""
        if self.bin == 1 and self.top == 0 and self.left == 0:
            return optics
        b, (row, col) = self.bin, optics.bf_center_px
        return optics.with_(det_sampling_mrad=optics.det_sampling_mrad * b,
                            bf_center_px=((row - self.top - (b - 1) / 2) / b, (col - self.left - (b - 1) / 2) / b))

    def reduce(self, block, xp=np):
        """A feed block (n, det_rows, det_cols) of counts cropped and binned (uint32 sums where binned)."""
        if self.bin == 1 and block.shape[1:] == (self.rows, self.cols):
            return block
        part = block[:, self.top : self.top + self.rows, self.left : self.left + self.cols]
        if self.bin == 1:
            return xp.ascontiguousarray(part)
        n, (r, c), b = part.shape[0], self.det_shape, self.bin
        return part.reshape(n, r, b, c, b).sum(axis=(2, 4), dtype=np.uint32)

    def sums(self, pattern: np.ndarray) -> float:
        """The counts of a (det_rows, det_cols) pattern inside the window."""
        return float(pattern[self.top : self.top + self.rows, self.left : self.left + self.cols].sum(dtype=np.float64))


def window(det_shape: tuple[int, int], optics: Optics, crop: int | None, bin: int) -> Window:
    """The crop (side in detector pixels, None for the whole detector) and binning (1: none) checked against
    the detector and the calibrated bright-field centre; ValueError naming what does not fit."""
    if not isinstance(bin, (int, np.integer)) or isinstance(bin, bool) or bin < 1:
        raise ValueError(f"bin must be an integer >= 1 (2 sums 2 x 2 pixels), got {bin!r}")
    rows, cols = det_shape
    if crop is None:
        top, left, rows_kept, cols_kept = 0, 0, rows, cols
    else:
        if not isinstance(crop, (int, np.integer)) or isinstance(crop, bool) or crop < 2:
            raise ValueError(f"crop must be a window side in detector pixels >= 2 (or None for the whole detector), got {crop!r}")
        if crop > min(rows, cols):
            raise ValueError(f"crop {crop} is wider than the {rows} x {cols} detector")
        center = (int(round(optics.bf_center_px[0])), int(round(optics.bf_center_px[1])))
        top, left = center[0] - crop // 2, center[1] - crop // 2
        if top < 0 or left < 0 or top + crop > rows or left + crop > cols:
            raise ValueError(f"a crop of {crop} around the bright-field centre {center} passes the {rows} x {cols} detector's "
                             f"edge: choose at most {2 * min(center[0], center[1], rows - center[0], cols - center[1])}")
        rows_kept = cols_kept = int(crop)
    if rows_kept % bin or cols_kept % bin:
        raise ValueError(f"bin {bin} does not divide the {rows_kept} x {cols_kept} detector {'crop' if crop else ''}".rstrip()
                         + ": choose a bin that divides it (or a crop that bin divides)")
    return Window(int(top), int(left), int(rows_kept), int(cols_kept), int(bin))
