"""Frames to device memory through a ring of pinned host buffers.

A reader that can decode into memory it is given (``blocks_into``) fills one
pinned buffer while the last is copied to the device asynchronously, so a
load costs the decoding alone: no page of a fresh block is faulted in and no
copy waits for the driver to stage pageable memory.
"""

from __future__ import annotations

import numpy as np

SLOTS = 3  # one being filled, one waiting to be sent, one being copied


class PinnedStaging:
    """Pinned buffers of ``frames`` frames each for copies into ``flat`` (a CuPy (n_frames, frame_len) array)."""

    def __init__(self, flat, frames: int, det_shape: tuple[int, int]):
        import cupy as cp

        self.flat = flat
        self.stream = cp.cuda.Stream(non_blocking=True)
        count = frames * flat.shape[1]
        memory = [cp.cuda.alloc_pinned_memory(count * flat.dtype.itemsize) for _ in range(SLOTS)]
        self.buffers = [np.frombuffer(m, flat.dtype, count).reshape(frames, *det_shape) for m in memory]
        self.copied: list = [None] * SLOTS  # the event of each buffer's last copy
        self.slot_of: dict[int, int] = {}
        self.next = 0

    def buffer(self, start: int, n: int) -> np.ndarray:
        """A pinned buffer for frames start .. start + n, once its last copy has finished."""
        slot = self.next
        self.next = (slot + 1) % SLOTS
        if self.copied[slot] is not None:
            self.copied[slot].synchronize()
        self.slot_of[start] = slot
        return self.buffers[slot][:n]

    def send(self, start: int, frames: np.ndarray) -> None:
        """Copy the buffer given for ``start`` (now filled) to frames start .. of the device array, asynchronously."""
        slot = self.slot_of.pop(start)
        n = len(frames)
        self.flat[start : start + n].set(frames.reshape(n, -1), stream=self.stream)
        self.copied[slot] = self.stream.record()

    def finish(self) -> None:
        """Wait for every copy."""
        self.stream.synchronize()
