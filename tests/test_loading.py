"""Loading: checksums of the logical counts, streamed series loads, and what a failing load leaves."""

from __future__ import annotations

import hashlib

import h5py
import numpy as np
import pytest

from conftest import cupy_available, make_service


def sha256(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def write_h5(path, data, **options) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("/entry/data", data=data, **options)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "int16", "float32"])
def test_checksum_is_the_same_for_every_layout(svc, names, rng, dtype):
    data = (rng.poisson(0.7, (5, 6, 9, 7)) * (1 if dtype != "float32" else 0.5)).astype(dtype)
    held = [svc.put(data, name=names(), layout="dense")]
    if np.dtype(dtype).kind == "u":
        held.append(svc.put(data, name=names(), layout="compressed"))
    for acq in held:
        assert acq.checksum() == sha256(data)


def test_checksum_of_a_loaded_file(svc, names, rng, tmp_path):
    data = rng.poisson(0.4, (6, 5, 12, 10)).astype(np.uint16)
    write_h5(tmp_path / "a.h5", data, chunks=(1, 1, 12, 10), compression="gzip")
    acq = svc.load(tmp_path / "a.h5", name=names())
    assert acq.checksum() == sha256(data)
    data[2, 3, 4, 5] += 1
    assert acq.checksum() != sha256(data)


@pytest.mark.parametrize("sampled", [False, True])
def test_compressed_load_codes_block_by_block(rng, tmp_path, sampled):
    # 40 x 30 frames in reads of 7 frames: many reads per codec block, and a short last block; the model from
    # the first frames, or from frames spread over the scan with the payload sized from them.
    from qgpu_dask.io.load import model_sample, read_coded
    from qgpu_dask.io.registry import open_reader
    from qgpu_dask.io.source import Source
    from qgpu_dask.resident.live import Coding

    data = rng.poisson(0.6, (40, 30, 6, 5)).astype(np.uint16)
    write_h5(tmp_path / "a.h5", data)
    reader = open_reader(Source(str(tmp_path / "a.h5"), "/entry/data", None))
    try:
        coding = Coding.chosen(model_sample(reader), (6, 5), np) if sampled else None
        resident = read_coded("a", reader, coding, np, block_bytes=7 * 6 * 5 * 2)
    finally:
        reader.close()
    assert resident.describe()["layout"] == "compressed" and resident.nbytes < data.nbytes
    assert (resident.data == data).all()
    mask = rng.integers(0, 3, (6, 5))
    assert (resident.virtual_images(mask[None]) == (data.astype(np.int64) * mask).sum(axis=(2, 3))).all()
    if sampled:
        assert resident.streams.payload.size == int(resident.streams.block_base[-1])  # the room left over went back
        assert abs(resident.nbytes / coding.expected_bytes(data.shape) - 1) < 0.1


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
def test_a_coded_load_on_a_gpu_keeps_nothing_in_the_passing_pool(rng, tmp_path):
    """A GPU load's buffers come from the passing pool and what the resident keeps from the held one, so a
    filled GPU holds no resident among freed buffers. The second of two loads is measured: the first makes
    the kernels' tables for this frame size, made once a process."""
    from qgpu_dask.device import pools

    def passing() -> int:
        return pools().passing.used_bytes()

    data = rng.poisson(0.6, (40, 30, 6, 5)).astype(np.uint16)
    write_h5(tmp_path / "a.h5", data, chunks=(1, 7, 6, 5))
    svc = make_service("gpu", n_workers=1)
    try:
        svc.load(tmp_path / "a.h5", name="first", layout="compressed", progress=False)
        before = list(svc.client.run(passing).values())[0]
        acq = svc.load(tmp_path / "a.h5", name="second", layout="compressed", progress=False)
        assert list(svc.client.run(passing).values())[0] == before
        assert acq.info()["layout"] == "compressed" and acq.checksum() == sha256(data)
    finally:
        svc.close()


def test_a_coded_load_takes_its_model_from_frames_spread_over_the_scan(svc, names, rng, tmp_path):
    """A dose that ramps 10x along the scan: a model from the first frames would cost 1.8x the bytes."""
    from qgpu_dask.resident.compressed import CompressedCounts
    from qgpu_dask.resident.live import LiveCounts

    n = 48 * 48
    data = rng.poisson(np.linspace(0.3, 3.0, n)[:, None, None] * np.ones((n, 24, 24))).astype(np.uint16)
    write_h5(tmp_path / "ramp.h5", data, chunks=(64, 24, 24), compression="gzip")
    acq = svc.load(tmp_path / "ramp.h5", name=names(), scan_shape=(48, 48), layout="compressed", progress=False)
    assert acq.checksum() == sha256(data)
    whole = CompressedCounts.encode("whole", data.reshape(n, -1), (48, 48, 24, 24)).nbytes
    first = LiveCounts("first", (48, 48, 24, 24), np.uint16, "compressed", np)
    for lo in range(0, n, 256):
        first.append(data[lo : lo + 256])
    assert acq.info()["nbytes"] <= 1.03 * whole < first.finished().nbytes / 1.5


def test_the_model_sample_is_an_eighth_of_a_small_scan_and_1024_frames_of_a_large_one():
    """Runs of consecutive frames spread over the scan, inside it and apart; a scan of PROBE frames or fewer
    is sampled whole."""
    from qgpu_dask.io.load import sample_runs

    for n, total in [(100, 100), (256, 256), (1024, 256), (2304, 288), (4096, 512), (8192, 1024), (262144, 1024)]:
        runs = sample_runs(n)
        assert sum(length for _, length in runs) == total
        assert runs[0][0] == 0 and runs[-1][0] + runs[-1][1] == n
        assert all(a + length <= b for (a, length), (b, _) in zip(runs, runs[1:]))


def test_stream_yields_each_acquisition_once_resident(svc, names, rng, tmp_path):
    arrays = {}
    for i in range(4):
        arrays[f"s{i}"] = rng.poisson(0.5 + i, (4, 5, 8, 8)).astype(np.uint16)
        write_h5(tmp_path / f"s{i}.h5", arrays[f"s{i}"])
    wanted = [names() for _ in range(4)]
    seen = {}
    for acq in svc.stream([tmp_path / f"s{i}.h5" for i in range(4)], name=wanted, progress=False):
        assert acq.name in svc
        seen[acq.name] = acq
    assert sorted(seen) == sorted(wanted)
    for i, name in enumerate(wanted):
        assert seen[name].checksum() == sha256(arrays[f"s{i}"])


def test_stream_failure_releases_what_was_not_yielded(svc, names, rng, tmp_path):
    good = rng.poisson(0.5, (4, 5, 8, 8)).astype(np.uint16)
    write_h5(tmp_path / "good.h5", good)
    write_h5(tmp_path / "bad.h5", good, chunks=(1, 1, 8, 8), compression="gzip")
    with h5py.File(tmp_path / "bad.h5", "r") as f:
        info = f["/entry/data"].id.get_chunk_info(3)
    raw = bytearray((tmp_path / "bad.h5").read_bytes())
    raw[info.byte_offset : info.byte_offset + info.size] = b"\xff" * info.size  # the deflate stream is destroyed
    (tmp_path / "bad.h5").write_bytes(bytes(raw))
    wanted = [names(), names()]
    yielded = []
    with pytest.raises(Exception, match="bad.h5"):
        for acq in svc.stream([tmp_path / "good.h5", tmp_path / "bad.h5"], name=wanted, progress=False):
            yielded.append(acq.name)
    assert wanted[1] not in svc
    assert all(n in svc for n in yielded)
    assert all(s["reserved_bytes"] == 0 for s in svc.info()["shards"])
