"""The chunk index of an HDF5 dataset chunked one frame per chunk: byte offset, stored size and filter mask of
every frame's chunk, taken once per file.

h5py's ``chunk_iter`` calls back into Python for every chunk and builds a named tuple for each: 1.4 s of
interpreter time for the 262144 chunks of a 512 x 512 scan, holding the GIL that the decoding and coding
threads of a load need. Here ``H5Dchunk_iter`` of the very HDF5 library h5py runs on (looked up through
h5py's own extension module) is called with a compiled callback (a Numba ``cfunc``) that writes each chunk
into a table: no Python per chunk, and the GIL is let go meanwhile (h5py's lock is held, so no other HDF5
call runs beside it). Where that library cannot be reached this way, h5py's ``chunk_iter`` gives the same
table.
"""

from __future__ import annotations

import ctypes
import functools

import h5py
import numpy as np

HEAD = 12  # int64 slots before the entries: frames, chunks seen, chunks out of place, lead dims, 8 lead strides
MAX_LEAD = 8


@functools.cache
def callback():
    """The compiled ``H5D_chunk_iter_op_t``: chunk (offset, filter mask, address, size) into the table at
    ``op_data`` (HEAD slots, then address, size, mask for every frame); compiled once, cached on disk."""
    from numba import carray, cfunc, types

    signature = types.intc(types.CPointer(types.uint64), types.uint32, types.uint64, types.uint64, types.voidptr)

    @cfunc(signature, nopython=True, cache=True)
    def take(offset, filter_mask, address, size, op_data):  # pragma: no cover (runs compiled, called by HDF5)
        head = carray(op_data, (HEAD,), np.int64)
        frame = 0
        for d in range(head[3]):
            frame += np.int64(offset[d]) * head[4 + d]
        head[1] += 1
        if frame < 0 or frame >= head[0]:
            head[2] += 1
            return 0
        table = carray(op_data, (HEAD + 3 * head[0],), np.int64)
        at = HEAD + 3 * frame
        if table[at] >= 0:  # a second chunk for one frame
            head[2] += 1
        table[at] = np.int64(address)
        table[at + 1] = np.int64(size)
        table[at + 2] = np.int64(filter_mask)
        return 0

    return take


@functools.cache
def chunk_iter_c():
    """(``H5Dchunk_iter`` of the HDF5 library h5py is linked to, h5py's lock around every HDF5 call), or None:
    no such symbol (an HDF5 before 1.14, or a platform where the extension module does not lead to it), or an
    h5py without that lock where it was."""
    if h5py.version.hdf5_version_tuple < (1, 14, 0):  # 1.13's callback took a 32-bit size
        return None
    try:
        from h5py._objects import phil

        function = ctypes.CDLL(h5py.h5d.__file__).H5Dchunk_iter
    except (ImportError, OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function, phil


def chunk_table(dataset: h5py.Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(offsets, sizes, filter masks) of the chunk of every frame (the dataset's leading dimensions, C order;
    offset -1 where a frame has none) and how many chunks are out of place (a second one for a frame, or one
    whose offset is not a frame's): the dataset must be chunked one frame per chunk."""
    lead = dataset.shape[:-2]
    n = int(np.prod(lead))
    found = chunk_iter_c()
    if found is not None and len(lead) <= MAX_LEAD:
        table = np.full(HEAD + 3 * n, -1, np.int64)
        table[:4] = (n, 0, 0, len(lead))
        table[4 : 4 + len(lead)] = [int(np.prod(lead[d + 1 :])) for d in range(len(lead))]
        function, phil = found
        with phil:  # no other HDF5 call while this one runs (the GIL is let go)
            status = function(dataset.id.id, 0, callback().address, table.ctypes.data)
        if status >= 0:
            offsets, sizes, masks = table[HEAD:].reshape(n, 3).T
            held = offsets >= 0
            return offsets.copy(), np.where(held, sizes, 0), np.where(held, masks, 0).astype(np.uint32), int(table[2])
    return chunk_table_py(dataset)


def chunk_table_py(dataset: h5py.Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``chunk_table`` through h5py's ``chunk_iter`` (a Python call per chunk)."""
    lead = dataset.shape[:-2]
    n = int(np.prod(lead))
    found: list = []
    dataset.id.chunk_iter(found.append)
    corners = np.array([info.chunk_offset[:-2] for info in found], np.int64).reshape(len(found), len(lead))
    fields = np.array([(info.byte_offset, info.size, info.filter_mask) for info in found], np.int64).reshape(len(found), 3)
    inside = (corners < np.array(lead, np.int64)).all(axis=1)
    frames = np.ravel_multi_index(corners[inside].T, lead)
    offsets, sizes, masks = np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n, np.uint32)
    offsets[frames], sizes[frames], masks[frames] = fields[inside].T
    return offsets, sizes, masks, len(found) - int(np.unique(frames).size)
