"""Event data held sparse (``layout="sparse"``): each frame's non-zero counts, row-compressed over the scan
(CSR, one row a frame), as an event detector sends them. An ASI Timepix3 frame of LiberTEM-live's simulator
holds one count of 512 x 512 pixels: 12 bytes where the dense frame takes 1 MiB, and a dense or coded
resident spends its time making and coding zeros.

Frames arrive in scan order (``append``: dense frames, or ``SparseFrames`` pieces); the positions not
received yet hold no count, so every query answers exactly for the frames received so far, as a live
acquisition does. Each frame's pixels are kept unique and rising (a piece whose are not is summed per pixel
first), so a frame is made by scattering its counts. The queries are array operations of NumPy or CuPy
alike: sums by prefix sums over the non-zeros (in the accumulator's own modular arithmetic, exact wherever
the sum fits it), patterns by ``ufunc.at`` adds and maxima in uint64 (atomic on a GPU).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Iterator

import numpy as np

from ..device import module_of, to_host
from .base import Resident
from .masks import MaskWeights

GROWTH = 1.5  # the non-zeros' arrays grow to this many times their size, or as much as an append needs
START = 4096  # non-zeros an empty acquisition has room for
SPARSE_KEYS = ("indptr", "frames", "pixels", "values")  # a sparse resident's arrays, as saved


@dataclass(frozen=True)
class SparseFrames:
    """``len(indptr) - 1`` consecutive frames as CSR: frame i's counts ``values[indptr[i]:indptr[i + 1]]`` at
    flat detector pixels ``indices[...]`` (NumPy arrays on the host, row pointers from 0)."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def pieces(self, most: int) -> Iterator["SparseFrames"]:
        """These frames in consecutive pieces of at most ``most`` frames."""
        for lo in range(0, len(self), most):
            hi = min(lo + most, len(self))
            a, b = self.indptr[lo], self.indptr[hi]
            yield SparseFrames(self.indptr[lo : hi + 1] - a, self.indices[a:b], self.values[a:b])

    def on(self, frame_len: int, dtype, xp: ModuleType, first: int = 0) -> tuple:
        """(rows, pixels, values, row pointers) of the non-zeros on ``xp``'s device, each row's pixels unique and
        rising (a pixel given twice in a frame holds the sum); ValueError naming the frame (``first`` the scan
        position of frame 0) of a pixel past ``frame_len`` or a count past ``dtype``."""
        dtype = np.dtype(dtype)
        if len(self.indices) and int(self.indices.max()) >= frame_len:
            at = int(np.flatnonzero(self.indices >= frame_len)[0])
            raise ValueError(f"frame {first + self.frame_of(at)} has a pixel index {int(self.indices[at])} outside its {frame_len} pixels")
        if len(self.values) and not np.can_cast(self.values.dtype, dtype):
            values = np.asarray(self.values)
            if values.dtype.kind not in "iu":
                raise ValueError(f"a sparse piece has counts of {values.dtype}, the acquisition holds {dtype}")
            bad = np.flatnonzero((values < 0) | (values > np.iinfo(dtype).max))
            if bad.size:
                raise ValueError(f"frame {first + self.frame_of(int(bad[0]))} has a count of {int(values[bad[0]])}, more than the"
                                 f" acquisition's {dtype} holds")
        rows, pixels, values = rows_of(self.indptr, xp), xp.asarray(self.indices, np.int64), xp.asarray(self.values)
        merged = unique_rising(rows, pixels, values, frame_len, dtype, xp)
        if merged[1] is pixels:
            return rows, pixels, values, xp.asarray(self.indptr, np.int64)
        return *merged, pointers_of(merged[0], len(self), xp)

    def frame_of(self, at: int) -> int:
        """The frame holding non-zero ``at``."""
        return int(np.searchsorted(self.indptr, at, side="right")) - 1

    def dense(self, det_shape: tuple[int, int], dtype, xp: ModuleType, first: int = 0):
        """The frames, (n, det_rows, det_cols) ``dtype`` on ``xp``'s device: the non-zeros go up (a few bytes
        a frame) and are scattered there (``first``: frame 0's scan position, for errors)."""
        out = xp.zeros((len(self), det_shape[0] * det_shape[1]), dtype)
        rows, pixels, values, _ = self.on(out.shape[1], dtype, xp, first)
        out[rows, pixels] = values.astype(dtype)
        return out.reshape(len(self), *det_shape)


def rows_of(indptr: np.ndarray, xp: ModuleType):
    """The row of each non-zero of host CSR row pointers ``indptr``, int64 on ``xp``'s device (made on the host:
    CuPy repeats by an int or a list only)."""
    counts = np.diff(np.asarray(indptr, np.int64))
    return xp.asarray(np.repeat(np.arange(len(counts), dtype=np.int64), counts))


def pointers_of(rows, n: int, xp: ModuleType):
    """CSR row pointers of ``n`` rows from the (sorted) row of each non-zero."""
    counts = xp.bincount(rows, minlength=n) if len(rows) else xp.zeros(n, np.int64)
    return xp.concatenate([xp.zeros(1, np.int64), xp.cumsum(counts)])


class SparseCounts(Resident):
    """An acquisition of unsigned counts held as its non-zeros, growing by ``append`` in scan order."""

    layout = "sparse"

    def __init__(self, name: str, shape, dtype, xp: ModuleType):
        super().__init__(name, shape, dtype, xp)
        if self.dtype.kind != "u":
            raise ValueError(f"layout='sparse' holds unsigned integer counts; this acquisition is {self.dtype}")
        self.lock = threading.RLock()
        self.received = 0
        self.nnz = 0
        self.indptr = xp.zeros(self.n_frames + 1, np.int64)  # every frame past the received ones empty
        self.frames = xp.zeros(START, np.int32)  # the frame of each non-zero
        self.pixels = xp.zeros(START, np.int32)
        self.values = xp.zeros(START, self.dtype)
        self.room: Callable[[int], None] = lambda nbytes: None  # raises if nbytes more do not fit (the shard's budget)

    @classmethod
    def held_as(cls, name: str, shape, dtype, indptr, frames, pixels, values) -> "SparseCounts":
        """A complete one holding the arrays ``arrays()`` gave (a saved one's, on one device); ValueError naming
        what does not fit: row pointers that do not rise from 0 to the non-zeros, frames that are not theirs,
        pixels outside a frame or not rising within it, values of another dtype."""
        out = cls(name, shape, dtype, module_of(indptr))
        xp, n = out.xp, len(pixels)
        kinds = {"indptr": (indptr, np.int64, out.n_frames + 1), "frames": (frames, np.int32, n), "pixels": (pixels, np.int32, n),
                 "values": (values, out.dtype, n)}
        for key, (array, dtype_, size) in kinds.items():
            if array.dtype != dtype_ or array.shape != (size,):
                raise ValueError(f"the sparse {key} are {array.dtype} {array.shape}, expected {np.dtype(dtype_)} ({size},)")
        if int(indptr[0]) != 0 or int(indptr[-1]) != n or bool((indptr[1:] < indptr[:-1]).any()):
            raise ValueError(f"the sparse row pointers do not rise from 0 to the {n} non-zeros")
        if n and not bool((frames == rows_of(to_host(indptr), xp)).all()):
            raise ValueError("the sparse non-zeros' frames are not those their row pointers give")
        key = frames.astype(np.int64) * out.frame_len + pixels
        if n and (int(pixels.min()) < 0 or int(pixels.max()) >= out.frame_len or bool((key[1:] <= key[:-1]).any())):
            raise ValueError(f"the sparse pixels are not inside the {out.frame_len} of a frame, each frame's unique and rising")
        out.indptr, out.frames, out.pixels, out.values = indptr, frames, pixels, values
        out.nnz, out.received = n, out.n_frames
        return out

    def arrays(self) -> dict:
        """The arrays ``held_as`` takes, by name, cut to the non-zeros received."""
        return dict(zip(SPARSE_KEYS, self.held()))

    @staticmethod
    def start_bytes(shape, dtype) -> int:
        """Device bytes an empty one takes: the row pointers and room for START non-zeros."""
        return 8 * (shape[0] * shape[1] + 1) + START * (8 + np.dtype(dtype).itemsize)

    @property
    def complete(self) -> bool:
        return self.received == self.n_frames

    @property
    def nbytes(self) -> int:
        return int(self.indptr.nbytes + self.frames.nbytes + self.pixels.nbytes + self.values.nbytes)

    # -- growing ---------------------------------------------------------------

    def append(self, frames) -> int:
        """Add the next scan positions: dense frames (n, det_rows, det_cols) of any device, or ``SparseFrames``;
        returns the positions received. ValueError, with nothing added, for a wrong shape or frames past the scan."""
        xp = self.xp
        if isinstance(frames, SparseFrames):
            n = len(frames)
            rows, pixels, values, indptr = frames.on(self.frame_len, self.dtype, xp, self.received)
        else:
            frames = self.checked_frames(frames)
            n = int(frames.shape[0])
            flat = xp.asarray(frames).reshape(n, self.frame_len)
            rows, pixels = xp.nonzero(flat)
            values = flat[rows, pixels]
            indptr = pointers_of(rows, n, xp)
        with self.lock:
            self.check_to_come(self.received, n)
            k = int(len(pixels))
            self.make_room(k)
            at, first = self.nnz, self.received
            self.frames[at : at + k] = rows + first
            self.pixels[at : at + k] = pixels
            self.values[at : at + k] = values.astype(self.dtype)
            self.indptr[first + 1 : first + n + 1] = at + indptr[1:]
            self.indptr[first + n + 1 :] = at + k
            self.nnz += k
            self.received += n
            return self.settled(self.received)  # in place before the lock lets a query see them

    def make_room(self, k: int) -> None:
        """Grow the non-zeros' arrays, before anything is written, to hold ``k`` more (the budget asked first)."""
        size = self.pixels.size
        if self.nnz + k <= size:
            return
        size = max(int(GROWTH * size), self.nnz + k)
        self.room((size - self.pixels.size) * (8 + self.dtype.itemsize))
        for key in ("frames", "pixels", "values"):
            old = getattr(self, key)
            grown = self.xp.zeros(size, old.dtype)
            grown[: self.nnz] = old[: self.nnz]
            setattr(self, key, grown)

    def finished(self) -> "SparseCounts":
        """This acquisition, complete, its arrays cut to the non-zeros held."""
        with self.lock:
            if not self.complete:
                raise ValueError(f"live acquisition {self.name!r} has {self.received} of {self.n_frames} positions")
            for key in ("frames", "pixels", "values"):
                setattr(self, key, getattr(self, key)[: self.nnz].copy())
            return self

    def held(self) -> tuple:
        """(row pointers, frames, pixels, values) of the non-zeros received so far, which later appends leave as
        they are (the row pointers copied)."""
        with self.lock:
            n = self.nnz
            return self.indptr.copy(), self.frames[:n], self.pixels[:n], self.values[:n]

    # -- the resident interface ------------------------------------------------

    def prepare_mask_sums(self, masks: MaskWeights) -> Callable:
        xp, acc = self.xp, masks.acc_dtype
        weights = xp.asarray(masks.weights)
        start, span = masks.span_start, weights.shape[1]

        def run():
            indptr, _, pixels, values = self.held()
            col = pixels.astype(np.int64) - start
            inside = (col >= 0) & (col < span)
            terms = weights[:, xp.where(inside, col, 0)] * (values.astype(acc) * inside.astype(acc))
            prefix = xp.zeros((weights.shape[0], terms.shape[1] + 1), acc)
            prefix[:, 1:] = xp.cumsum(terms, axis=1, dtype=acc)
            out = prefix[:, indptr[1:]] - prefix[:, indptr[:-1]]  # modular: exact where each frame's sum fits acc
            return self.settled(out)

        return run

    def selected_terms(self, indices):
        """(pixels, values) of the non-zeros of the frames host int64 ``indices`` selects."""
        _, frames, pixels, values = self.held()
        chosen = self.xp.zeros(self.n_frames, bool)
        chosen[self.xp.asarray(indices)] = True
        keep = chosen[frames]
        return pixels[keep].astype(np.int64), values[keep].astype(np.uint64)

    def roi_sum(self, indices):
        pixels, values = self.selected_terms(indices)
        out = self.xp.zeros(self.frame_len, np.uint64)
        self.xp.add.at(out, pixels, values)  # CuPy's is atomic: uint64 out
        return self.settled(out)

    def roi_max(self, indices):
        pixels, values = self.selected_terms(indices)
        out = self.xp.zeros(self.frame_len, np.uint64)
        self.xp.maximum.at(out, pixels, values)
        return self.settled(out.astype(self.dtype))

    def counts_flat(self):
        return self.frames_flat(0, self.n_frames)

    def frames_flat(self, lo: int, hi: int):
        indptr, frames, pixels, values = self.held()
        a, b = (int(v) for v in to_host(indptr[[lo, hi]]))
        out = self.xp.zeros((hi - lo, self.frame_len), self.dtype)
        out[frames[a:b] - lo, pixels[a:b]] = values[a:b]
        return self.settled(out)

    def frame_flat(self, index: int):
        return self.frames_flat(index, index + 1)[0]

    def pixel_images(self, indices: np.ndarray):
        xp = self.xp
        wanted, inverse = np.unique(np.asarray(indices, np.int64), return_inverse=True)
        _, frames, pixels, values = self.held()
        row = xp.full(self.frame_len, -1, np.int64)
        row[xp.asarray(wanted)] = xp.arange(len(wanted))
        at = row[pixels]
        keep = at >= 0
        out = xp.zeros((len(wanted), self.n_frames), np.float32)
        out[at[keep], frames[keep]] = values[keep].astype(np.float32)
        return self.settled(xp.ascontiguousarray(out[xp.asarray(inverse)]))


def unique_rising(rows, pixels, values, frame_len: int, dtype: np.dtype, xp: ModuleType) -> tuple:
    """(rows, pixels, values) with each row's pixels unique and rising: as given where they are, else ordered
    and summed per pixel (ValueError where a sum does not fit ``dtype``)."""
    if len(pixels) < 2:
        return rows, pixels, values
    key = rows * frame_len + pixels
    if bool((key[1:] > key[:-1]).all()):
        return rows, pixels, values
    order = xp.argsort(key)
    key, values = key[order], values[order].astype(np.uint64)
    starts = xp.flatnonzero(xp.concatenate([xp.ones(1, bool), key[1:] != key[:-1]]))
    prefix = xp.concatenate([xp.zeros(1, np.uint64), xp.cumsum(values)])
    sums = prefix[xp.concatenate([starts[1:], xp.asarray([len(key)])])] - prefix[starts]
    if int(sums.max()) > np.iinfo(dtype).max:
        raise ValueError(f"a pixel given more than once in a frame sums to {int(sums.max())}, more than {dtype} holds")
    key = key[starts]
    return key // frame_len, key % frame_len, sums
