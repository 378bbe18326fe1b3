"""A resident as a LiberTEM ``DataSet``, so an unchanged LiberTEM UDF runs on the owner over the held counts
(``qd.run_udf``) instead of over a file.

LiberTEM asks a data set for partitions (ranges of frames) and a partition for tiles: stacks of ``depth``
frames, cut into the signal slices of the tiling scheme its negotiator chose, in the dtype the UDFs asked for,
with the navigation origin counted among the frames a ROI selects. Here a partition reads its frames from the
resident in blocks of about BLOCK_BYTES, whole codec blocks where compressed (a view of dense counts, only those frames decoded where compressed,
copied off a GPU), converts each block once into a buffer it keeps (LiberTEM lets a data set reuse a tile's
buffer), and hands out tiles as views of it. Tiles of the held counts themselves are read-only: a UDF that
writes into its tile must not change the resident.

Needs LiberTEM (``pip install qgpu-dask[libertem]``): the query module imports this one only when it runs.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from libertem.common import Shape, Slice
from libertem.io.dataset.base import DataSet, DataSetMeta, DataTile, Partition, TilingScheme

from ..device import to_host
from ..resident import Resident

BLOCK_BYTES = 4 * 2**20  # counts read from the resident at a time


class ResidentDataSet(DataSet):
    """The frames of ``resident`` as LiberTEM sees a data set: its 4-D shape, native dtype, NumPy tiles, and
    ``partitions`` ranges of frames."""

    def __init__(self, resident: Resident, partitions: int):
        super().__init__(num_partitions=max(1, min(partitions, resident.n_frames)))
        self.resident = resident
        self._image_count = self._nav_shape_product = resident.n_frames
        self._meta = DataSetMeta(shape=Shape(resident.shape, sig_dims=2), array_backends=("numpy",), raw_dtype=resident.dtype,
                                 image_count=resident.n_frames)

    def initialize(self, executor) -> "ResidentDataSet":
        return self

    @property
    def dtype(self) -> np.dtype:
        return self.resident.dtype

    @property
    def shape(self) -> Shape:
        return self._meta.shape

    @property
    def array_backends(self) -> tuple[str, ...]:
        return ("numpy",)

    def check_valid(self) -> bool:
        return True

    def supports_correction(self) -> bool:
        return False

    def get_cache_key(self) -> str:
        raise TypeError("a resident's data set is not cached")

    def get_base_shape(self, roi) -> tuple[int, ...]:
        return (1, *self.resident.det_shape)  # whole frames: a frame is never read in pieces

    def need_decode(self, read_dtype, roi, corrections) -> bool:
        """Whether tiles are copies (converted or gathered): then LiberTEM's negotiator keeps them small enough to
        stay in cache (about 1 MiB), where views of the held counts may be as large as a partition."""
        return np.dtype(read_dtype) != self.resident.dtype or roi is not None

    def get_slices(self) -> Iterator[tuple[Slice, int, int]]:
        """(slice, first frame, end) of each partition: as even as the resident's grain allows (a compressed
        resident decodes whole codec blocks, so no block is decoded by two partitions)."""
        n, unit = self.resident.n_frames, self.resident.feed_grain[0]
        units, parts = -(-n // unit), self.get_num_partitions()
        edges = sorted({min(n, unit * (units * i // parts)) for i in range(parts + 1)})
        for lo, hi in zip(edges, edges[1:]):
            yield Slice(origin=(lo, 0, 0), shape=Shape((hi - lo, *self.resident.det_shape), sig_dims=2)), lo, hi

    def get_partitions(self) -> Iterator["ResidentPartition"]:
        for part_slice, start, stop in self.get_slices():
            yield ResidentPartition(self.resident, self._meta, part_slice, start, stop)


class ResidentPartition(Partition):
    """Frames ``start`` .. ``stop`` of the resident, given as LiberTEM's tiles."""

    def __init__(self, resident: Resident, meta: DataSetMeta, partition_slice: Slice, start: int, stop: int):
        super().__init__(meta=meta, partition_slice=partition_slice, io_backend=None, decoder=None)
        self.resident, self.start, self.stop = resident, start, stop

    def set_io_backend(self, backend) -> None:
        pass

    def set_corrections(self, corrections) -> None:
        if corrections is not None and corrections.have_corrections():
            raise ValueError("corrections are not applied to a resident's counts: correct them before the load, or in the UDF")

    def get_locations(self) -> None:
        return None

    def get_tiles(self, tiling_scheme: TilingScheme, dest_dtype="float32", roi=None, array_backend=None) -> Iterator[DataTile]:
        """The tiles of this partition, in frame order, each cut into the scheme's signal slices; with a ``roi``,
        only its frames, their origins counted among the frames it selects in the whole data set."""
        dest_dtype = np.dtype(dest_dtype)
        scheme = tiling_scheme.adjust_for_partition(self)
        depth, resident = scheme.depth, self.resident
        if roi is None:
            chosen, count, first = None, self.stop - self.start, self.start
        else:
            flat = np.asarray(roi, bool).reshape(-1)
            chosen = self.start + np.flatnonzero(flat[self.start : self.stop])
            count, first = len(chosen), int(np.count_nonzero(flat[: self.start]))
        unit = resident.feed_grain[0]  # read in whole codec blocks where compressed
        block_frames = -(-max(depth, BLOCK_BYTES // (resident.frame_len * resident.dtype.itemsize)) // unit) * unit
        buffer = None
        for a in range(0, count, block_frames):
            b = min(count, a + block_frames)
            if chosen is None:
                block = to_host(resident.frames_flat(self.start + a, self.start + b))
            else:
                lo, hi = int(chosen[a]), int(chosen[b - 1]) + 1
                block = to_host(resident.frames_flat(lo, hi))[chosen[a:b] - lo]
            block = block.reshape(b - a, *resident.det_shape)
            block.flags.writeable = False  # a view of the held counts: a UDF writing into its tile must not change them
            for tile_lo in range(0, b - a, depth):
                frames = block[tile_lo : tile_lo + depth]
                if frames.dtype != dest_dtype:  # converted a tile at a time, into a buffer that stays in cache
                    if buffer is None:
                        buffer = np.empty((depth, *resident.det_shape), dest_dtype)
                    np.copyto(buffer[: len(frames)], frames, casting="unsafe")
                    frames = buffer[: len(frames)]
                for index, sig in scheme.slices:
                    tile_slice = Slice(origin=(first + a + tile_lo, *sig.origin), shape=Shape((len(frames), *sig.shape), sig_dims=2))
                    yield DataTile(frames[(slice(None), *sig.get())], tile_slice=tile_slice, scheme_idx=index)
