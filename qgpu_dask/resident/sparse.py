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

import numba
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

    def on(self, frame_len: int, dtype, xp: ModuleType, first: int = 0, room: tuple | None = None) -> tuple:
        """(rows, pixels, values, row pointers of any integer dtype) of the non-zeros on ``xp``'s device, each row's pixels unique and
        rising (a pixel given twice in a frame holds the sum); ValueError naming the frame (``first`` the scan
        position of frame 0) of row pointers that do not rise from 0 to the non-zeros, a pixel past
        ``frame_len`` or a count past ``dtype``. One pass on the host makes the rows and checks the rest, into
        ``room`` where given (host int32 arrays of the non-zeros' length: an acquisition's own, no copies)."""
        dtype = np.dtype(dtype)
        if len(self.values) != len(self.indices):
            raise ValueError(f"a sparse piece has {len(self.indices)} pixel indices but {len(self.values)} counts")
        if self.indices.dtype.kind not in "iu":
            raise ValueError(f"a sparse piece has pixel indices of {self.indices.dtype}, not integers")
        rows, pixels = room or (np.empty(len(self.indices), np.int32), np.empty(len(self.indices), np.int32))
        problem, at = csr_rows(self.indptr, self.indices, frame_len, rows, pixels)
        if problem == ROW_POINTERS:
            raise ValueError(f"the sparse row pointers do not rise from 0 to the piece's {len(self.indices)} non-zeros (frame {first + at})")
        if problem == PIXEL:
            raise ValueError(f"frame {first + self.frame_of(at)} has a pixel index {int(self.indices[at])} outside its {frame_len} pixels")
        if len(self.values) and not np.can_cast(self.values.dtype, dtype):
            values = np.asarray(self.values)
            if values.dtype.kind not in "iu":
                raise ValueError(f"a sparse piece has counts of {values.dtype}, the acquisition holds {dtype}")
            bad = np.flatnonzero((values < 0) | (values > np.iinfo(dtype).max))
            if bad.size:
                raise ValueError(f"frame {first + self.frame_of(int(bad[0]))} has a count of {int(values[bad[0]])}, more than the"
                                 f" acquisition's {dtype} holds")
        rows, pixels, values = xp.asarray(rows), xp.asarray(pixels), xp.asarray(self.values)
        if problem == RISING:
            return rows, pixels, values, xp.asarray(self.indptr)
        merged = merged_repeats(rows, pixels, values, frame_len, dtype, xp)
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


RISING, REPEATED, ROW_POINTERS, PIXEL = range(4)  # what csr_rows finds


@numba.njit(cache=True, nogil=True)
def csr_rows(indptr, indices, frame_len, rows, pixels):
    """(what, at) of host CSR arrays, each non-zero's row and pixel written to ``rows`` and ``pixels`` in one
    pass: ``what`` RISING where every row's pixels are unique and rising, REPEATED where a row's are not,
    ROW_POINTERS where the row pointers do not rise from 0 to the non-zeros (``at``: the row), PIXEL where a
    pixel lies outside ``frame_len`` (``at``: the non-zero); rows and pixels are complete only for the first
    two."""
    n, nnz = len(indptr) - 1, len(indices)
    if n < 0 or indptr[0] != 0 or indptr[n] != nnz:
        return ROW_POINTERS, 0
    what = RISING
    for r in range(n):
        a, b = indptr[r], indptr[r + 1]
        if b < a or b > nnz:
            return ROW_POINTERS, r
        last = -1
        for j in range(a, b):
            p = indices[j]
            if p < 0 or p >= frame_len:
                return PIXEL, np.int64(j)
            rows[j] = r
            pixels[j] = p
            if p <= last:
                what = REPEATED
            last = p
    return what, 0


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
        self.indptr = xp.zeros(self.n_frames + 1, np.int64)  # up to the received frames (held() ends the rest)
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
        rows = np.repeat(np.arange(out.n_frames, dtype=np.int32), np.diff(to_host(indptr)))
        if n and not bool((frames == xp.asarray(rows)).all()):
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
            with self.lock:
                n, k = len(frames), len(frames.indices)
                self.check_to_come(self.received, n)
                self.make_room(k, n)
                at = self.nnz
                room = (self.frames[at : at + k], self.pixels[at : at + k]) if xp is np else None  # written in place
                return self.put(*frames.on(self.frame_len, self.dtype, xp, self.received, room), n)
        frames = self.checked_frames(frames)
        n = int(frames.shape[0])
        flat = xp.asarray(frames).reshape(n, self.frame_len)
        rows, pixels = xp.nonzero(flat)
        with self.lock:
            self.check_to_come(self.received, n)
            self.make_room(len(pixels), n)
            return self.put(rows, pixels, flat[rows, pixels], pointers_of(rows, n, xp), n)

    def put(self, rows, pixels, values, indptr, n: int) -> int:
        """Write the next ``n`` frames' non-zeros (rows from 0; they may already lie in place) behind the others."""
        at, first, k = self.nnz, self.received, len(pixels)
        for key, given in (("frames", rows), ("pixels", pixels), ("values", values)):
            held = getattr(self, key)
            if given.base is not held:
                held[at : at + k] = given
        self.frames[at : at + k] += first
        ends = self.indptr[first + 1 : first + n + 1]
        ends[...] = indptr[1:]  # in place: a piece's row pointers may be narrower
        ends += at
        self.nnz += k
        self.received += n
        return self.settled(self.received)  # in place before the lock lets a query see them

    def make_room(self, k: int, n: int) -> None:
        """Grow the non-zeros' arrays, before anything is written, to hold ``k`` more of ``n`` frames (the budget
        asked first): to GROWTH times their size, or what the scan holds at the dose so far and 1/16 more if
        that is more (a scan grows them a few times, not a few times per piece)."""
        size = self.pixels.size
        if self.nnz + k <= size:
            return
        least = max(int(GROWTH * size), self.nnz + k)
        expected = -(-(self.nnz + k) * self.n_frames // (self.received + n))
        wanted = max(least, expected + expected // 16)
        per = 8 + self.dtype.itemsize
        try:
            self.room((wanted - size) * per)
        except ValueError:  # the dose so far may be above the scan's: the least will do
            if wanted == least:
                raise
            self.room((least - size) * per)
            wanted = least
        for key in ("frames", "pixels", "values"):
            old = getattr(self, key)
            grown = self.xp.zeros(wanted, old.dtype)
            grown[: self.nnz] = old[: self.nnz]
            setattr(self, key, grown)

    def finished(self) -> "SparseCounts":
        """This acquisition, complete, its arrays cut to the non-zeros held where they have more than 1/16
        room to spare (less is kept: the copy would cost more)."""
        with self.lock:
            if not self.complete:
                raise ValueError(f"live acquisition {self.name!r} has {self.received} of {self.n_frames} positions")
            if self.pixels.size - self.nnz <= self.pixels.size // 16:
                return self
            for key in ("frames", "pixels", "values"):
                setattr(self, key, getattr(self, key)[: self.nnz].copy())
            return self

    def held(self) -> tuple:
        """(row pointers, frames, pixels, values) of the non-zeros received so far, which later appends leave as
        they are (the row pointers copied, every frame past the received ones empty)."""
        with self.lock:
            n, indptr = self.nnz, self.indptr.copy()
            indptr[self.received + 1 :] = n
            return indptr, self.frames[:n], self.pixels[:n], self.values[:n]

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


def merged_repeats(rows, pixels, values, frame_len: int, dtype: np.dtype, xp: ModuleType) -> tuple:
    """(rows, pixels, values) with each row's pixels unique and rising: ordered and summed per pixel
    (ValueError where a sum does not fit ``dtype``)."""
    key = rows.astype(np.int64) * frame_len + pixels
    order = xp.argsort(key)
    key, values = key[order], values[order].astype(np.uint64)
    starts = xp.flatnonzero(xp.concatenate([xp.ones(1, bool), key[1:] != key[:-1]]))
    prefix = xp.concatenate([xp.zeros(1, np.uint64), xp.cumsum(values)])
    sums = prefix[xp.concatenate([starts[1:], xp.asarray([len(key)])])] - prefix[starts]
    if int(sums.max()) > np.iinfo(dtype).max:
        raise ValueError(f"a pixel given more than once in a frame sums to {int(sums.max())}, more than {dtype} holds")
    key = key[starts]
    return key // frame_len, key % frame_len, sums
