"""Sparse residents (event data): appended in uneven pieces of dense frames and CSR pieces (a pixel given
twice in a frame among them), queried between appends, every answer against NumPy on the dense counts
received with ==; held sparse in a service, from appends and from LiberTEM-live's Timepix3 simulator."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.resident.sparse import SparseCounts, SparseFrames

from conftest import BACKENDS, mock_frames
from test_live import module_for

PIECES = (1, 7, 0, 30, 5, 80, 3, 200)


def events(rng, shape, dtype) -> np.ndarray:
    """Counts mostly zero, a few large (up to the dtype's largest)."""
    data = (rng.random(shape) < 0.03) * rng.integers(1, 4, shape)
    data.reshape(-1)[rng.integers(0, data.size, 20)] = np.iinfo(dtype).max
    return data.astype(dtype)


def csr(frames: np.ndarray, twice: bool) -> SparseFrames:
    """``frames`` (n, pixels) as a CSR piece; with ``twice``, every count split in two entries of its pixel."""
    rows, cols = np.nonzero(frames)
    values = frames[rows, cols]
    if twice:
        half = values // 2
        rows, cols, values = np.repeat(rows, 2), np.repeat(cols, 2), np.stack([half, values - half], 1).reshape(-1)
    return SparseFrames(np.searchsorted(rows, np.arange(len(frames) + 1)), cols, values)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32"])
def test_appends_in_uneven_pieces_answer_exactly_between_them(rng, backend, dtype):
    xp = module_for(backend)
    counts = events(rng, (19, 17, 9, 11), np.dtype(dtype))
    flat = counts.reshape(-1, 99)
    acq = SparseCounts("s", counts.shape, dtype, xp)
    masks = np.stack([rng.random((9, 11)) < 0.4, rng.integers(-3, 4, (9, 11))])
    received = 0
    for k, n in enumerate(PIECES * 2):
        n = min(n, flat.shape[0] - received)
        piece = flat[received : received + n]
        given = csr(piece, twice=k % 3 == 1) if k % 2 else (xp.asarray(piece) if k % 4 == 0 else piece).reshape(n, 9, 11)
        assert acq.append(given) == received + n
        received += n
        want = np.einsum("fp,mp->mf", flat.astype(np.int64), masks.reshape(2, -1).astype(np.int64))
        want[:, received:] = 0
        assert (acq.virtual_images(masks).reshape(2, -1) == want).all()
        chosen = np.flatnonzero(rng.random(flat.shape[0]) < 0.5)
        roi = np.zeros(flat.shape[0], bool)
        roi[chosen] = True
        chosen = chosen[chosen < received]
        assert (acq.reduce(roi.reshape(19, 17), "sum").reshape(-1) == flat[chosen].sum(axis=0, dtype=np.uint64)).all()
        if chosen.size:
            assert (acq.reduce(roi.reshape(19, 17), "max").reshape(-1) == flat[chosen].max(axis=0)).all()
    assert acq.complete and acq.finished() is acq
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
    assert (acq.frame(4, 5) == counts[4, 5]).all()
    pixels = np.array([98, 3, 3, 50])
    images = acq.pixel_images(pixels)
    assert ((images if xp is np else images.get()) == flat[:, pixels].T.astype(np.float32)).all()
    assert acq.nbytes < counts.nbytes


def test_bad_pieces_are_refused_with_nothing_added():
    acq = SparseCounts("s", (2, 3, 4, 4), "uint8", np)
    acq.append(np.zeros((2, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="frame 2 has a pixel index 16 outside its 16 pixels"):
        acq.append(SparseFrames(np.array([0, 1]), np.array([16]), np.array([1])))
    with pytest.raises(ValueError, match=r"row pointers do not rise from 0 to the piece's 3 non-zeros \(frame 3\)"):
        acq.append(SparseFrames(np.array([0, 2, 1, 3]), np.array([1, 2, 3]), np.array([1, 1, 1])))
    with pytest.raises(ValueError, match=r"row pointers do not rise from 0 to the piece's 2 non-zeros \(frame 2\)"):
        acq.append(SparseFrames(np.array([0, 1]), np.array([1, 2]), np.array([1, 1])))
    with pytest.raises(ValueError, match="2 pixel indices but 1 counts"):
        acq.append(SparseFrames(np.array([0, 2]), np.array([1, 2]), np.array([1])))
    with pytest.raises(ValueError, match="sums to 300, more than uint8"):
        acq.append(SparseFrames(np.array([0, 2]), np.array([5, 5]), np.array([200, 100])))
    with pytest.raises(ValueError, match="would pass the scan of 6 positions"):
        acq.append(np.zeros((5, 4, 4), np.uint8))
    with pytest.raises(ValueError, match=r"frames must be \(n, 4, 4\)"):
        acq.append(np.zeros((1, 4, 5), np.uint8))
    with pytest.raises(ValueError, match="frames are int16, the acquisition 's' holds uint8"):
        acq.append(np.zeros((1, 4, 4), np.int16))
    with pytest.raises(ValueError, match="frame 2 has a count of 256, more than the acquisition.s uint8 holds"):
        acq.append(SparseFrames(np.array([0, 1]), np.array([5]), np.array([256], np.uint16)))
    with pytest.raises(ValueError, match="unsigned integer counts"):
        SparseCounts("s", (2, 3, 4, 4), "float32", np)
    assert acq.received == 2 and acq.nnz == 0


def test_saved_arrays_that_do_not_fit_are_refused_by_name(rng):
    counts = events(rng, (3, 4, 5, 6), np.dtype(np.uint16))
    acq = SparseCounts("s", counts.shape, "uint16", np)
    acq.append(counts.reshape(12, 5, 6))
    good = {k: v.copy() for k, v in acq.arrays().items()}
    assert SparseCounts.held_as("t", counts.shape, "uint16", *good.values()).checksum() == acq.checksum()
    for key, change, words in [("indptr", lambda a: a.__setitem__(3, a[4] + 1), "row pointers do not rise"),
                               ("frames", lambda a: a.__setitem__(0, 11), "frames are not those"),
                               ("pixels", lambda a: a.__setitem__(0, 30), "not inside the 30 of a frame"),
                               ("values", lambda a: None, "values are uint8")]:
        bad = {k: v.copy() for k, v in good.items()}
        change(bad[key])
        if key == "values":
            bad[key] = bad[key].astype(np.uint8)
        with pytest.raises(ValueError, match=words):
            SparseCounts.held_as("t", counts.shape, "uint16", *bad.values())


def test_a_sparse_live_acquisition_in_a_service(svc, names, rng, tmp_path):
    """Created sparse, appended from the client, queried while it grows, held sparse once complete, saved and
    reopened as it is held."""
    counts = events(rng, (6, 7, 12, 10), np.dtype(np.uint16))
    acq = svc.create(names(), scan_shape=(6, 7), det_shape=(12, 10), dtype="uint16", layout="sparse")
    mask = rng.random((12, 10)) < 0.5
    acq.append(counts.reshape(42, 12, 10)[:20])
    want = (counts.astype(np.int64) * mask).sum(axis=(2, 3))
    want.reshape(-1)[20:] = 0
    assert (acq.virtual_images(mask)[0] == want).all()
    acq.append(counts.reshape(42, 12, 10)[20:])
    assert acq.info()["layout"] == "sparse" and not acq.info().get("live")
    assert acq.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
    assert (acq.reduce(None, "sum") == counts.sum(axis=(0, 1), dtype=np.uint64)).all()
    path = acq.save(tmp_path / "sparse.qgpu")
    again = svc.load(path, name=names(), progress=False)
    assert again.info()["layout"] == "sparse" and again.checksum() == hashlib.sha256(counts.tobytes()).hexdigest()
    with pytest.raises(ValueError, match="layout='sparse' holds unsigned integer counts"):
        svc.create(names(), scan_shape=(2, 2), det_shape=(4, 4), dtype="int16", layout="sparse")


def test_ingest_sparse_from_libertem_live_simulator(svc, names, tpx_sim):
    """The Timepix3 simulator's non-zeros held as they come: every frame equal to the mock's, in a few bytes a frame."""
    port = tpx_sim(4, 6)
    acq = svc.create(names(), scan_shape=(4, 6), det_shape=(512, 512), dtype="uint32", layout="sparse")
    assert svc.ingest(qd.TimepixSource("127.0.0.1", port, frames_per_read=10), acq, progress=False) == {"frames": 24, "received": 24}
    assert acq.checksum() == hashlib.sha256(mock_frames(24).tobytes()).hexdigest()
    assert acq.info()["layout"] == "sparse" and acq.info()["nbytes"] < 64 * 24 + 8 * 25 + 1
