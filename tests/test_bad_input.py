"""Bad input: a clear error naming what is wrong, no partial result, and the shard stays usable."""

from __future__ import annotations

import errno
import re
import subprocess

import h5py
import numpy as np
import pytest

import qgpu_dask as qd
from qgpu_dask.service.shard import Shard

DET = (8, 10)


@pytest.fixture
def acq(svc, names, rng):
    data = rng.integers(0, 100, (4, 5) + DET, dtype=np.uint16)
    acq = svc.put(data, name=names())
    acq.data = data
    return acq


def still_usable(acq):
    mask = qd.masks.disk(DET, (4, 5), 3)
    assert (acq.virtual_image(mask) == (acq.data.astype(np.uint32) * mask).sum(axis=(2, 3))).all()


@pytest.mark.parametrize(
    "mask, match",
    [
        (np.ones((8, 11), bool), r"mask has shape \(8, 11\), but the detector is \(8, 10\)"),
        (np.zeros(DET, bool), "mask 0 is all zero"),
        (np.ones((2, 3, 8, 10), bool), "takes one 2-D mask, got shape"),
        (np.full(DET, np.nan), "NaN or infinite"),
        (np.full(DET, "x"), "not bool, integer or float"),
    ],
)
def test_bad_masks(acq, mask, match):
    with pytest.raises(ValueError, match=match):
        acq.virtual_image(mask)
    still_usable(acq)


def test_bad_mask_in_a_stack(acq):
    good = np.ones(DET, bool)
    with pytest.raises(ValueError, match="mask 1 has shape"):
        acq.virtual_images([good, np.ones((3, 3), bool)])
    with pytest.raises(ValueError, match="mask 1 is all zero"):
        acq.virtual_images([good, np.zeros(DET, bool)])
    still_usable(acq)


def test_weights_too_large(acq):
    with pytest.raises(ValueError, match="too large"):
        acq.virtual_image(np.full(DET, 2**62, np.int64))
    still_usable(acq)


@pytest.mark.parametrize(
    "roi, op, error, match",
    [
        (np.ones((4, 6), bool), "sum", ValueError, r"roi has shape \(4, 6\), but the scan is \(4, 5\)"),
        (np.zeros((4, 5), bool), "mean", ValueError, "selects no scan position: mean"),
        (np.zeros((4, 5), bool), "max", ValueError, "selects no scan position: max"),
        (np.ones((4, 5), np.uint8), "sum", ValueError, "roi must be a bool array"),
        (None, "median", ValueError, "unknown reduce op 'median'"),
    ],
)
def test_bad_reductions(acq, roi, op, error, match):
    with pytest.raises(error, match=match):
        acq.reduce(roi, op)
    still_usable(acq)


@pytest.mark.parametrize("row, col", [(4, 0), (0, 5), (-5, 0), (0, -6), (1.5, 0), (True, 0)])
def test_frame_out_of_range(acq, row, col):
    with pytest.raises(IndexError):
        acq.frame(row, col)
    still_usable(acq)


@pytest.mark.parametrize("row, col, says", [(-1, 0, "scan row -1 is out of range: rows are 0 to 3"),
                                            (0, -16, "scan col -16 is out of range: cols are 0 to 4"),
                                            (4, 0, "scan row 4 is out of range: rows are 0 to 3")])
def test_negative_scan_indices_are_out_of_range(svc, acq, row, col, says):
    """A negative scan index is refused like any other outside the scan (frame(-1, 0) gave the last row's
    frame), for an acquisition and for a series."""
    with pytest.raises(IndexError, match=re.escape(says + " (a scan of 4 x 5)")):
        acq.frame(row, col)
    with pytest.raises(IndexError, match=re.escape(says)):
        qd.Series(svc, [acq, acq]).frame(row, col)
    still_usable(acq)


def test_unknown_and_released(svc, acq, names, rng):
    with pytest.raises(KeyError, match="no acquisition named 'nope'"):
        svc["nope"]
    other = svc.put(rng.integers(0, 5, (2, 2) + DET, dtype=np.uint8), name=names())
    other.release()
    with pytest.raises(qd.errors.NotResident, match="not resident") as refused:  # a KeyError too, as users catch it
        other.virtual_image(np.ones(DET, bool))
    assert isinstance(refused.value, KeyError) and str(refused.value).startswith("acquisition ")  # no quotes around it
    with pytest.raises(KeyError, match="no acquisition named"):
        other.release()
    with pytest.raises(KeyError):
        svc[other.name]
    still_usable(acq)


def test_bad_files(svc, acq, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.h5"):
        svc.load(tmp_path / "missing.h5", dataset="/data")
    with h5py.File(tmp_path / "flat.h5", "w") as f:
        f["data"] = np.zeros((10, 10), np.uint16)
        f["stack"] = np.zeros((6, 4, 4), np.uint16)
        f["cplx"] = np.zeros((2, 2, 4, 4), np.complex64)
    with pytest.raises(ValueError, match="2-D"):
        svc.load(tmp_path / "flat.h5", dataset="/data")
    with pytest.raises(KeyError, match="no dataset '/other'"):
        svc.load(tmp_path / "flat.h5", dataset="/other")
    with pytest.raises(ValueError, match="give scan_shape"):
        svc.load(tmp_path / "flat.h5", dataset="/stack")
    with pytest.raises(ValueError, match=r"scan_shape \(4, 4\) has 16 positions"):
        svc.load(tmp_path / "flat.h5", dataset="/stack", scan_shape=(4, 4))
    with pytest.raises(ValueError, match="complex64 is not supported"):
        svc.load(tmp_path / "flat.h5", dataset="/cplx")
    (tmp_path / "junk.h5").write_bytes(b"not an hdf5 file at all")
    with pytest.raises(ValueError, match="not an HDF5 file"):
        svc.load(tmp_path / "junk.h5")
    assert not [a for a in svc.state()["acquisitions"] if a in ("flat", "junk", "missing")]
    still_usable(acq)


def test_a_cut_short_hdf5_file_is_named(svc, acq, tmp_path, rng):
    """A truncated HDF5 file (copied in part) is refused naming it and what is wrong, alone and in a series
    (HDF5's "Unable to synchronously open file (truncated file: eof = ...)" named no file)."""
    whole = qd.samples.write_hdf5(tmp_path / "whole.h5", rng.integers(0, 9, (4, 4, 8, 8), dtype=np.uint16))
    cut = tmp_path / "cut.h5"
    cut.write_bytes(whole.read_bytes()[:1500])
    says = re.escape(f"{str(cut)!r} is cut short: 1500 bytes of the {whole.stat().st_size} its HDF5 header gives")
    with pytest.raises(ValueError, match=says):
        qd.inspect(cut)
    with pytest.raises(ValueError, match=says):
        svc.load(cut, progress=False)
    with pytest.raises(ValueError, match=says):
        svc.load([whole, cut], name=["whole", "cut"], progress=False)
    assert "whole" not in svc and "cut" not in svc
    still_usable(acq)


def test_a_failed_save_names_the_users_path(acq, tmp_path):
    """Saving or exporting where the file cannot be written names the path given, not the hidden temporary file
    written first (a folder that is a file; a folder with no room left, where a tmpfs can be mounted)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file")
    with pytest.raises(NotADirectoryError) as caught:
        acq.save(blocker / "scan.qgpu")
    message = str(caught.value)
    assert caught.value.filename == str(blocker / "scan.qgpu") and str(blocker / "scan.qgpu") in message and ".tmp" not in message, message
    with pytest.raises(ValueError) as caught:  # an export's failure is its ValueError
        acq.export(blocker / "scan.hspy")
    message = str(caught.value)
    assert str(blocker / "scan.hspy") in message and "Not a directory" in message and ".partial" not in message, message
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True).returncode != 0:
        pytest.skip("no tmpfs can be mounted here for a full folder")
    try:
        with open(full / "filler", "wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(bytes(4096))
        with pytest.raises(OSError) as caught:
            acq.save(full / "scan.qgpu")
        message = str(caught.value)
        assert caught.value.errno == errno.ENOSPC and str(full / "scan.qgpu") in message and ".tmp" not in message, message
        assert sorted(p.name for p in full.iterdir()) == ["filler"]
    finally:
        subprocess.run(["umount", str(full)], check=True)
    still_usable(acq)


def test_an_os_error_on_the_owner_is_the_calls_error_not_a_lost_connection(svc, acq, tmp_path):
    """A shard's code failing on a file (saving into a folder that is not there), or with any other OSError,
    raises that error within seconds: the router asks a live owner again once, never on and on."""
    import time

    started = time.monotonic()
    with pytest.raises(FileNotFoundError):
        acq.save(tmp_path / "no-such-folder" / "scan.qgpu")
    assert time.monotonic() - started < 5

    class Unreachable(qd.Query):
        name = "unreachable_test"

        @staticmethod
        def run(ctx, residents):
            raise ConnectionResetError("the query's own connection to somewhere else failed")

    started = time.monotonic()
    with pytest.raises(ConnectionResetError, match="the query's own connection"):
        acq.ask(qd.register(Unreachable))
    assert time.monotonic() - started < 10
    still_usable(acq)


def test_failed_series_leaves_nothing(svc, acq, tmp_path, rng):
    good = tmp_path / "good.h5"
    with h5py.File(good, "w") as f:
        f["data"] = rng.integers(0, 9, (2, 2, 4, 4), dtype=np.uint16)
    with pytest.raises(FileNotFoundError):
        svc.load([good, tmp_path / "absent.h5"], dataset="/data", name=["g1", "g2"], progress=False)
    assert "g1" not in svc and "g2" not in svc
    still_usable(acq)


def test_a_series_failing_after_its_first_loads_started_leaves_nothing(svc, acq, tmp_path, rng):
    """The sources past the first INSPECT_AHEAD are inspected while those load: a bad one there still leaves
    nothing of the list, and a list that long loads whole, in order."""
    from qgpu_dask.service.service import INSPECT_AHEAD

    data = rng.integers(0, 9, (2, 2, 4, 4), dtype=np.uint16)
    paths = []
    for i in range(INSPECT_AHEAD + 2):
        paths.append(tmp_path / f"s{i}.h5")
        with h5py.File(paths[-1], "w") as f:
            f["data"] = data + np.uint16(i)
    names = [f"long{i}" for i in range(len(paths))]
    with pytest.raises(FileNotFoundError):
        svc.load(paths[:-1] + [tmp_path / "absent.h5"], dataset="/data", name=names, progress=False)
    assert not [n for n in names if n in svc]
    series = svc.load(paths, dataset="/data", name=names, progress=False)
    assert [a.name for a in series] == names
    assert all((a.frame(1, 0) == data[1, 0] + np.uint16(i)).all() for i, a in enumerate(series))
    series.release()
    still_usable(acq)


def test_a_series_past_a_full_shard_keeps_what_fits_when_streamed_and_nothing_when_loaded(svc, acq, tmp_path, rng):
    """Files that fill a pinned shard part-way: ``stream`` holds those before the first that does not fit and
    then refuses it and the rest by name; ``load`` of the list refuses it by name and holds none of them."""
    import hashlib

    shard = sorted(s["worker"] for s in svc.info()["shards"])[0]
    mine = {s["worker"]: s for s in svc.info()["shards"]}[shard]
    free = mine["budget"] - mine["resident_bytes"]
    frames = int(free / 2.5) // (64 * 64 * 2)  # two fit, the third does not
    arrays = [rng.integers(0, 9, (frames, 1, 64, 64), dtype=np.uint16) for _ in range(4)]
    paths = []
    for i, array in enumerate(arrays):
        paths.append(tmp_path / f"fill{i}.npy")
        np.save(paths[-1], array)
    wanted = [f"fill{i}" for i in range(4)]
    with pytest.raises(ValueError, match=r"acquisition 'fill2' \(.*fill2\.npy\) needs .* more than fits on worker .*: release "
                                         r"acquisitions to make room, or add workers; none of the 4 was loaded"):
        svc.load(paths, name=wanted, worker=shard, layout="dense", progress=False)
    assert not [n for n in wanted if n in svc]
    streamed = []
    with pytest.raises(ValueError, match=r"acquisition 'fill2' .* needs .*; it and the 1 after it \(to 'fill3'\) were not loaded "
                                         r"\(2 of 4 were\)"):
        for a in svc.stream(paths, name=wanted, worker=shard, layout="dense", progress=False):
            streamed.append(a)
    assert sorted(a.name for a in streamed) == ["fill0", "fill1"] and "fill2" not in svc and "fill3" not in svc
    for a in streamed:
        assert a.checksum() == hashlib.sha256(arrays[int(a.name[-1])].tobytes()).hexdigest()
        a.release()
    still_usable(acq)


def test_names_in_use(svc, acq):
    with pytest.raises(ValueError, match="already in use"):
        svc.put(acq.data, name=acq.name)
    still_usable(acq)


def test_put_bad_arrays(svc, acq):
    with pytest.raises(ValueError, match="4-D"):
        svc.put(np.zeros((3, 4, 5), np.uint16), name="three-d")
    with pytest.raises(ValueError, match="empty axis"):
        svc.put(np.zeros((0, 4, 5, 5), np.uint16), name="empty")
    with pytest.raises(ValueError, match="not supported"):
        svc.put(np.zeros((2, 2, 2, 2), np.complex128), name="complex")
    assert "empty" not in svc and "complex" not in svc
    still_usable(acq)


def test_load_beyond_budget_refused(svc, acq):
    """Budget is 256 MiB per shard: 300 MiB fits nowhere, refused before any allocation."""
    big = np.zeros((300, 1, 1024, 512), np.uint16)
    with pytest.raises(qd.errors.OverBudget, match="more than fits on any shard"):  # a ValueError
        svc.put(big, name="too-big")
    with pytest.raises(qd.errors.OverBudget, match=r"needs 300\.00 MiB.*256\.00 MiB budget"):  # a ValueError
        svc.router.call(acq.owner, Shard.put, "too-big", big).result()
    assert "too-big" not in svc
    info = {s["worker"]: s for s in svc.info()["shards"]}
    assert info[acq.owner]["reserved_bytes"] == 0
    still_usable(acq)
