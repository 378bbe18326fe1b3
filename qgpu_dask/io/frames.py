"""Block iteration over any sliceable 3-D or 4-D array (h5py dataset, memmap, Zarr array)."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from .source import frames_per_block


def native_order(dtype) -> np.dtype:
    """``dtype`` in this machine's byte order: readers hand residents native counts whatever the file holds."""
    return np.dtype(dtype).newbyteorder("=")


def array_blocks(array, shape: tuple[int, int, int, int], block_bytes: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first frame, frames (n, det_rows, det_cols)) blocks of whole scan rows where they fit, in native byte order."""
    n_frames = shape[0] * shape[1]
    step = frames_per_block(shape, array.dtype, block_bytes)
    cols = shape[1]
    for start in range(0, n_frames, step):
        stop = min(start + step, n_frames)
        if array.ndim == 3:
            block = array[start:stop]
        elif start % cols == 0 and stop % cols == 0:
            block = array[start // cols : stop // cols].reshape(-1, shape[2], shape[3])
        else:
            block = np.stack([array[i // cols, i % cols] for i in range(start, stop)])
        yield start, np.asarray(block, dtype=native_order(block.dtype))
