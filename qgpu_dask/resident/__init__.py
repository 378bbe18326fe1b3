"""Residents: acquisitions held in (GPU) memory in a query-ready layout, with exact reductions."""

from .base import Resident, combine_parts, finish_reduce, roi_indices
from .dense import DenseCounts
from .masks import MaskWeights, mask_weights

__all__ = ["DenseCounts", "MaskWeights", "Resident", "combine_parts", "finish_reduce", "mask_weights", "roi_indices"]
