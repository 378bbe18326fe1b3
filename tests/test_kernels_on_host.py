"""CUDA kernels run on the host (tests/cuda_on_host.h: a std::thread per CUDA thread, barriers for the block's and
the warp's synchronisation) against their CPU twins, as the GPU tests compare them: their indexing, tiling and
synchronisation checked where no GPU is (float arithmetic is the host's, not the device's fast intrinsics).

The sources are compiled with the host's C++ compiler (C++20, for std::barrier); the launches are the ones the
CUDA modules make (``fused_launches``), their constants the same -D options (``DEFINES``)."""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import compiling_module
from qgpu_dask.formats import codec
from qgpu_dask.phase import cpu as phase_cpu
from qgpu_dask.phase import direct_cpu
from qgpu_dask.resident.compressed import CompressedCounts
from qgpu_dask.phase.iterative import cpu
from qgpu_dask.phase.iterative.geometry import Geometry
from qgpu_dask.phase.iterative.update import batch_of

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # direct_gpu's aberrations
COMPILER = shutil.which("g++")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="needs a C++20 compiler (g++)")
SHARED = re.compile(r"extern __shared__ (?:__align__\(\d+\) )?(\w+(?: \w+)*) (\w+)\[\];")


def host_source(file: str) -> str:
    """kernels/``file``, its headers inlined as for NVRTC, with its dynamic shared memory pointed at the host's buffer."""
    compile = compiling_module("qgpu_dask.compile")
    text = (ROOT / "kernels" / file).read_text()
    for header in ("cluster.cuh", "mma.cuh"):  # cuda_on_host.h has their functions
        text = text.replace(f'#include "{header}"\n', "")
    text = compile.inlined(text, ROOT / "kernels")
    return SHARED.sub(r"\1* \2 = reinterpret_cast<\1*>(host_shared);", text)


def library(file: str, defines: tuple[str, ...], entry: str, tmp: Path) -> ctypes.CDLL:
    """``entry`` (extern "C" functions launching the kernels) compiled with kernels/``file`` into a library."""
    (tmp / file).write_text(host_source(file))
    (tmp / "entry.cpp").write_text(f'#include "{ROOT / "tests" / "cuda_on_host.h"}"\n#include "{file}"\n{entry}')
    subprocess.run([COMPILER, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", *defines, str(tmp / "entry.cpp"), "-o", str(tmp / "entry.so")],
                   check=True, cwd=tmp)
    return ctypes.CDLL(str(tmp / "entry.so"))


def pointer(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(ctypes.c_void_p)


def a_batch(window: tuple[int, int], seed: int, positions: int, first: int, n: int):
    """(geometry, object, probe, batch, measured counts) of random windows, two of them the same, for the
    far-field kernels' tests."""
    rng = np.random.default_rng(seed)
    corners = rng.integers(0, 40, (positions, 2))
    corners[5] = corners[4]
    geo = Geometry(corners, (40 + window[0], 40 + window[1]), window, (1.0, 1.0), (5, 7))
    cplx = lambda *shape: (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(np.complex64)
    obj, probe = cplx(*geo.object_shape), cplx(*window)
    batch = batch_of(geo, first, n)
    return geo, obj, probe, batch, rng.poisson(3.0, (batch.n, *window)).astype(np.uint16)


@pytest.mark.parametrize("window", [(24, 20), (45, 64), (64, 36)], ids=["6x4,5x4", "9x5,8x8", "8x8,6x6"])
def test_fused_ptycho_kernels_against_their_twin(window, tmp_path):
    """rows_forward, columns and rows_inverse as updated_waves launches them: partial tiles of columns, a last
    block of fewer rows, a last group of fewer positions, repeated windows; columns' loads in blocks of 4, 8 and 2
    columns (line pitches 36, 53 and 72)."""
    cuda = compiling_module("qgpu_dask.phase.iterative.cuda")
    R, C = window
    geo, obj, probe, batch, measured = a_batch(window, 5, 20, 3, 10)
    corners = geo.corners
    numerator, denominator = np.zeros(window, np.complex64), np.zeros(window, np.float32)
    updated, error = cpu.updated_waves(obj, probe, measured, corners, batch, geo.center, 0.25, numerator, denominator)

    forward, columns, inverse = cuda.fused_launches(R, C, batch.n, "unsigned short")
    dim = lambda grid: "Dim{" + ", ".join(map(str, grid)) + "}"
    entry = f"""
extern "C" void fused(const float2* obj, i64 cols, const float2* probe, int R, int C, const i64* corners, i64 first, i64 n,
                      const unsigned short* measured, int cr, int cs, float scale, const float2* roots_r, const float2* roots_c,
                      float2* wave, double* partial, float2* top, float* bottom) {{
    launch({dim(forward.grid)}, {forward.threads}, [&] {{ {forward.name}(obj, cols, probe, R, C, corners, first, n, roots_c, wave); }});
    launch({dim(columns.grid)}, {columns.threads}, [&] {{ {columns.name}(wave, measured, R, C, cr, cs, scale, roots_r, partial); }});
    launch({dim(inverse.grid)}, {inverse.threads}, [&] {{
        {inverse.name}(wave, obj, cols, probe, R, C, corners, first, n, {cuda.FUSED_GROUP}, roots_c, top, bottom); }});
}}"""
    fused = library("ptycho.cu", cuda.DEFINES, entry, tmp_path).fused
    roots = lambda m: np.exp(-2j * np.pi * np.arange(m) / m).astype(np.complex64)  # as line_fft.roots makes them
    wave = np.zeros((batch.n, R, C), np.complex64)
    partial = np.zeros(math.prod(columns.grid))
    top = np.zeros((inverse.grid[1], R, C), np.complex64)
    bottom = np.zeros((inverse.grid[1], R, C), np.float32)
    arrays = [np.ascontiguousarray(a) for a in (obj, probe, corners.astype(np.int64), measured, roots(R), roots(C))]
    fused(pointer(arrays[0]), ctypes.c_int64(obj.shape[1]), pointer(arrays[1]), R, C, pointer(arrays[2]), ctypes.c_int64(batch.first),
          ctypes.c_int64(batch.n), pointer(arrays[3]), geo.center[0] % R, geo.center[1] % C, ctypes.c_float(0.25), pointer(arrays[4]),
          pointer(arrays[5]), pointer(wave), pointer(partial), pointer(top), pointer(bottom))

    close = lambda got, want: np.abs(got - want).max() <= 1e-5 * np.abs(want).max()  # the GPU test's tolerances
    assert close(wave, updated) and abs(partial.sum() - error) <= 1e-5 * error
    assert close(top.sum(axis=0), numerator) and close(bottom.sum(axis=0), denominator)


@pytest.mark.parametrize("window", [(24, 20), (90, 36)], ids=["12x20", "45x36"])
def test_far_field_pair_against_its_twin(window, tmp_path):
    """far_field_pair as updated_waves launches it (two CTAs of a cluster together, their radix-2 steps through
    each other's shared memory, an odd half height splitting them unevenly, more rows and columns than PAIR_LINES):
    the updated waves and the error."""
    cuda = compiling_module("qgpu_dask.phase.iterative.cuda")
    R, C = window
    geo, obj, probe, batch, measured = a_batch(window, 9, 12, 2, 9)
    corners = geo.corners
    updated, error = cpu.updated_waves(obj, probe, measured, corners, batch, geo.center, 0.25, np.zeros(window, np.complex64),
                                       np.zeros(window, np.float32))
    pair, scratch = cuda.pair_launch(R, C, batch.n, "unsigned short")
    entry = f"""
extern "C" void pair(const float2* obj, i64 cols, const float2* probe, int R, int C, const i64* corners, i64 first,
                     const unsigned short* measured, int cr, int cs, float scale, const float2* roots_c, const float2* roots_h,
                     const float2* roots_r, int scratch, float2* updated, double* partial) {{
    launch_clusters(Dim{{{pair.grid[0]}}}, 2, Dim{{{pair.threads}}}, [&] {{
        {pair.name}(obj, cols, probe, R, C, corners, first, measured, cr, cs, scale, roots_c, roots_h, roots_r, scratch, updated, partial); }});
}}"""
    roots = lambda m: np.exp(-2j * np.pi * np.arange(m) / m).astype(np.complex64)  # as line_fft.roots makes them
    arrays = [np.ascontiguousarray(a) for a in (obj, probe, corners.astype(np.int64), measured, roots(C), roots(R // 2), roots(R))]
    got = np.zeros((batch.n, R, C), np.complex64)
    partial = np.zeros(pair.grid[0])
    library("ptycho.cu", cuda.DEFINES, entry, tmp_path).pair(
        pointer(arrays[0]), ctypes.c_int64(obj.shape[1]), pointer(arrays[1]), R, C, pointer(arrays[2]), ctypes.c_int64(batch.first),
        pointer(arrays[3]), geo.center[0] % R, geo.center[1] % C, ctypes.c_float(0.25), pointer(arrays[4]), pointer(arrays[5]),
        pointer(arrays[6]), scratch, pointer(got), pointer(partial))
    assert np.abs(got - updated).max() <= 1e-5 * np.abs(updated).max() and abs(partial.sum() - error) <= 1e-5 * error


def test_gathered_sums_against_their_twins(tmp_path):
    """object_update and probe_sums as the CUDA module launches them (object tiles of the batch's box, groups of
    positions, loads taken LOAD_RUN at a time with a last run of fewer, windows missing a tile's pixels) against the
    twins' update of the same box and probe sums."""
    cuda = compiling_module("qgpu_dask.phase.iterative.cuda")
    R, C = 24, 20
    rng = np.random.default_rng(8)
    corners = rng.integers(0, 40, (29, 2))
    geo = Geometry(corners, (40 + R, 40 + C), (R, C), (1.0, 1.0), (5, 7))
    cplx = lambda *shape: (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(np.complex64)
    obj, probe = cplx(*geo.object_shape), cplx(R, C)
    batch = batch_of(geo, 2, 27)
    updated = cplx(batch.n, R, C)
    row0, row1, col0, col1 = batch.box
    grid = (math.ceil((col1 - col0) / cuda.TILE_COLS), math.ceil((row1 - row0) / cuda.TILE_ROWS))
    groups = math.ceil(batch.n / cuda.PER_GROUP)
    entry = f"""
extern "C" void update(float2* obj, i64 cols, i64 row0, i64 row1, i64 col0, i64 col1, const float2* probe, const float2* updated, int R,
                       int C, const i64* corners, i64 first, i64 n, float step, float floor) {{
    launch(Dim{{{grid[0]}, {grid[1]}}}, {cuda.THREADS}, [&] {{
        object_update(obj, cols, row0, row1, col0, col1, probe, updated, R, C, corners, first, n, step, floor); }});
}}
extern "C" void sums(const float2* obj, i64 cols, const float2* probe, const float2* updated, int R, int C, const i64* corners, i64 first,
                     i64 n, float2* top, float* bottom) {{
    launch(Dim{{{math.ceil(R * C / cuda.THREADS)}, {groups}}}, {cuda.THREADS}, [&] {{
        probe_sums(obj, cols, probe, updated, R, C, corners, first, n, {cuda.PER_GROUP}, top, bottom); }});
}}"""
    lib = library("ptycho.cu", cuda.DEFINES, entry, tmp_path)
    arrays = [np.ascontiguousarray(a) for a in (probe, updated, corners.astype(np.int64))]
    numerator, denominator = np.zeros((R, C), np.complex64), np.zeros((R, C), np.float32)
    cpu.probe_sums(obj, probe, updated, corners, batch, numerator, denominator)
    top, bottom = np.zeros((groups, R, C), np.complex64), np.zeros((groups, R, C), np.float32)
    lib.sums(pointer(obj), ctypes.c_int64(obj.shape[1]), pointer(arrays[0]), pointer(arrays[1]), R, C, pointer(arrays[2]),
             ctypes.c_int64(batch.first), ctypes.c_int64(batch.n), pointer(top), pointer(bottom))
    close = lambda got, want: np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert close(top.sum(axis=0), numerator) and close(bottom.sum(axis=0), denominator)
    want = obj.copy()
    cpu.object_update(want, probe, updated, corners, batch, 0.5, 1e-3)
    got = obj.copy()
    lib.update(pointer(got), ctypes.c_int64(obj.shape[1]), *(ctypes.c_int64(v) for v in (row0, row1, col0, col1)), pointer(arrays[0]),
               pointer(arrays[1]), R, C, pointer(arrays[2]), ctypes.c_int64(batch.first), ctypes.c_int64(batch.n), ctypes.c_float(0.5),
               ctypes.c_float(1e-3))
    assert (got != obj).any() and close(got, want)


@pytest.mark.parametrize("C", [1, 6, 16])
def test_shifted_solve_kernel_against_its_twin(C, tmp_path):
    """A thread per system, Cholesky in registers: against the Numba twin, on singular matrices too."""
    solve = compiling_module("qgpu_dask.phase.solve_cuda")
    rng = np.random.default_rng(C)
    n = solve.SOLVE_THREADS + 7  # two blocks, the second partly empty
    A = rng.normal(size=(n, max(1, C - 2), C)) + 1j * rng.normal(size=(n, max(1, C - 2), C))
    matrix = np.ascontiguousarray(np.einsum("nki,nkj->nij", A.conj(), A))
    rhs = np.ascontiguousarray(rng.normal(size=(n, C)) + 1j * rng.normal(size=(n, C)))
    entry = f"""
extern "C" void solve(const double2* matrix, const double2* rhs, i64 n, double shift, double2* x) {{
    launch(Dim{{{math.ceil(n / solve.SOLVE_THREADS)}}}, {solve.SOLVE_THREADS}, [&] {{ shifted_solve<{C}>(matrix, rhs, n, shift, x); }});
}}"""
    x = np.zeros((n, C), np.complex128)
    library("solve.cu", solve.DEFINES, entry, tmp_path).solve(pointer(matrix), pointer(rhs), ctypes.c_int64(n), ctypes.c_double(0.05), pointer(x))
    want = direct_cpu.shifted_solve(matrix, rhs, 0.05)
    assert np.abs(x - want).max() <= 1e-9 * np.abs(want).max()


def every_form(rng) -> np.ndarray:
    """uint16 counts whose streams take every form: empty, constant, sparse, rANS in value and run mode, raw."""
    flat = np.zeros((1600, 45), np.uint16)
    flat[:, 6:] = rng.poisson(0.5, (1600, 39))  # run mode
    flat[:, 40:] = rng.poisson(3.0, (1600, 5))  # value mode
    flat[:, 1] = 65535  # constant
    flat[:, 2] = rng.poisson(1.0, 1600)
    flat[:, 3] = rng.integers(0, 65536, 1600)  # raw
    flat[:1000, 4] = rng.poisson(5.0, 1000)  # the later blocks sparse
    flat[[1200, 1500], 4] = 3
    flat[::97, 44] = 40000  # escapes
    return flat


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    """The compressed kernels' host library, its CUDA module, and a resident of every form with its LUTs."""
    cuda = compiling_module("qgpu_dask.resident.cuda.compressed")
    rng = np.random.default_rng(11)
    flat = every_form(rng)
    resident = CompressedCounts.encode("t", flat, (40, 40, 5, 9))
    assert all(resident.forms()[name] > 0 for name in codec.FORM_NAMES), resident.forms()
    params = """const unsigned* index, const unsigned long long* base, const unsigned char* payload, i64 payload_bytes, int frame_len,
    const unsigned char* run, const unsigned char* values, const unsigned* table_start, const unsigned short* cum,
    const unsigned char* lut, int chunks, int itemsize, unsigned maxval, i64 n_frames, int block, int stride"""
    args = "index, base, payload, payload_bytes, frame_len, run, values, table_start, cum, lut, chunks, itemsize, maxval, n_frames, block, stride"
    entry = f"""
extern "C" void luts(const unsigned char* run, const unsigned char* values, const unsigned* table_start, const unsigned short* cum,
                     int frame_len, unsigned char* lut) {{
    launch(Dim{{(frame_len * 2 * LUT_SIZE + 255) / 256}}, 256, [&] {{ build_lut(run, values, table_start, cum, frame_len, lut); }});
}}
extern "C" void rows(int amplitude, int gx, int gy, int threads, {params}, int first, i64 lo, i64 hi, void* out,
                     unsigned long long* err) {{
    launch(Dim{{gx, gy}}, threads, [&] {{
        if (amplitude) decode_rows<float, true, unsigned short>({args}, first, lo, hi, (float*)out, err);
        else decode_rows<unsigned short, false, unsigned short>({args}, first, lo, hi, (unsigned short*)out, err);
    }});
}}
extern "C" void one_frame(int gx, {params}, i64 f, const int* order, unsigned* out, unsigned long long* err) {{
    launch(Dim{{gx}}, 128, [&] {{ frame({args}, f, order, out, err); }});
}}
extern "C" void pixels(int gx, int gy, {params}, int first, int n_blocks, i64 lo, i64 hi, const i64* pixels, i64 n_pix,
                       unsigned short* out, unsigned long long* err) {{
    launch(Dim{{gx, gy}}, 128, [&] {{
        decode<unsigned short>({args}, first, n_blocks, lo, hi, pixels, n_pix, hi - lo, 1, out, err);
    }});
}}"""
    lib = library("compressed.cu", cuda.DEFINES, entry, tmp_path_factory.mktemp("compressed"))
    model, streams = resident.model, resident.streams
    lut = np.zeros(resident.frame_len * 2 * cuda.LUT_SIZE, np.uint8)
    lib.luts(pointer(model.run), pointer(model.values), pointer(model.table_start), pointer(model.cum), resident.frame_len, pointer(lut))
    payload = np.zeros(-(-streams.payload.size // 16) * 16, np.uint8)  # the decoders read whole 16-byte lines
    payload[: streams.payload.size] = streams.payload
    keep = [streams.index, streams.block_base, payload, lut]

    def common(stride: int) -> list:
        return [pointer(streams.index), pointer(streams.block_base), pointer(payload), ctypes.c_int64(streams.payload.size), resident.frame_len,
                pointer(model.run), pointer(model.values), pointer(model.table_start), pointer(model.cum), pointer(lut), 1, 2,
                ctypes.c_uint(65535), ctypes.c_int64(resident.n_frames), resident.block, stride]

    return lib, cuda, resident, flat, common, keep


@pytest.mark.parametrize("frames,amplitude", [((0, 1600), False), ((100, 1013), False), ((1023, 1025), False), ((1599, 1600), False),
                                              ((100, 1013), True), ((1599, 1600), True)])
def test_decode_rows_against_the_counts(decoders, frames, amplitude):
    """decode_rows as decode_frames launches it: every value of the rows written (zeros too, no zeroing pass),
    ranges starting and ending inside scan blocks, partial warps (45 pixels), every stream form; the amplitude
    variant (which differs only in what it writes) on a range inside blocks and on the last frame. Each host
    launch runs a thread per CUDA thread, so the ranges are few."""
    lib, cuda, resident, flat, common, _ = decoders
    lo, hi = frames
    launch, stride = cuda.rows_launch(resident.frame_len, resident.block, lo, hi, cuda.table_stride(resident.model.run, resident.model.values),
                                      "float" if amplitude else "unsigned short", amplitude, 2)
    assert launch.shared_bytes <= 48 * 1024 and stride % 4 == 2
    assert launch.name == ("decode_rows<float, true, unsigned short>" if amplitude else "decode_rows<unsigned short, false, unsigned short>")
    out = np.full((hi - lo, resident.frame_len), 7, np.float32 if amplitude else np.uint16)
    err = np.full(1, cuda.NO_ERROR, np.uint64)
    lib.rows(int(amplitude), *launch.grid, launch.threads, *common(stride), lo // resident.block, ctypes.c_int64(lo), ctypes.c_int64(hi),
             pointer(out), pointer(err))
    assert int(err[0]) == cuda.NO_ERROR
    want = flat[lo:hi]
    assert (out == (np.sqrt(want.astype(np.float32)) if amplitude else want)).all()


def test_decode_of_listed_pixels_against_the_counts(decoders):
    """The pixel-major decode kernel, which now shares decode_rows' stream cursor, over a range of frames."""
    lib, cuda, resident, flat, common, _ = decoders
    lo, hi = 300, 1400
    pixels = np.array([44, 0, 3, 17, 4, 1, 2, 40], np.int64)
    out = np.zeros((pixels.size, hi - lo), np.uint16)
    err = np.full(1, cuda.NO_ERROR, np.uint64)
    first, last = lo // resident.block, -(-hi // resident.block)
    lib.pixels(cuda.grid(pixels.size, 128), last - first, *common(cuda.table_stride(resident.model.run, resident.model.values)), first, last - first, ctypes.c_int64(lo),
               ctypes.c_int64(hi), pointer(pixels), ctypes.c_int64(pixels.size), pointer(out), pointer(err))
    assert int(err[0]) == cuda.NO_ERROR
    assert (out == flat[lo:hi, pixels].T).all()


def test_frame_kernel_against_the_counts(decoders):
    """One frame of every pixel (run-mode streams decoded up to the frame only), first, inner and last frames."""
    lib, cuda, resident, flat, common, _ = decoders
    order = np.concatenate([np.flatnonzero(resident.model.run == 0), np.flatnonzero(resident.model.run > 0)]).astype(np.int32)
    for f in (0, 511, 700, 1599):
        out = np.zeros(resident.frame_len, np.uint32)
        err = np.full(1, cuda.NO_ERROR, np.uint64)
        lib.one_frame(cuda.grid(resident.frame_len, 128), *common(cuda.table_stride(resident.model.run, resident.model.values)),
                      ctypes.c_int64(f), pointer(order), pointer(out), pointer(err))
        assert int(err[0]) == cuda.NO_ERROR and (out == flat[f]).all()


def test_decode_rows_reports_a_damaged_stream(decoders):
    """A flipped bit of a rANS stream: the error word names that stream (scan block, pixel) and its kind."""
    lib, cuda, resident, flat, common, keep = decoders
    index, payload = keep[0], keep[2]
    b, p = map(int, np.argwhere((index >> codec.FORM_SHIFT) == codec.ANS)[3])
    start = int(keep[1][b]) + int(index[b, p] & codec.OFFSET_MASK)
    payload[start + 5] ^= 0x10
    try:
        launch, stride = cuda.rows_launch(resident.frame_len, resident.block, 0, resident.n_frames,
                                          cuda.table_stride(resident.model.run, resident.model.values), "unsigned short", False, 2)
        out = np.zeros(flat.shape, np.uint16)
        err = np.full(1, cuda.NO_ERROR, np.uint64)
        lib.rows(0, *launch.grid, launch.threads, *common(stride), 0, ctypes.c_int64(0), ctypes.c_int64(resident.n_frames), pointer(out),
                 pointer(err))
    finally:
        payload[start + 5] ^= 0x10
    with pytest.raises(ValueError, match=f"scan block {b}, detector pixel {p}"):
        cuda.check_word(int(err[0]), resident.frame_len)


@pytest.mark.parametrize("n_frames", [300, 128])
def test_pixel_images_against_the_counts(n_frames, tmp_path):
    """pixel_images as resident/cuda/dense.py launches it: a last tile of fewer frames and of fewer pixels,
    pixels in any order."""
    dense = compiling_module("qgpu_dask.resident.cuda.dense")
    rng = np.random.default_rng(3)
    data = rng.integers(0, 60000, (n_frames, 57), dtype=np.uint16)
    pixels = np.concatenate([np.arange(10, 40), [3, 56, 0, 41, 7]]).astype(np.int64)
    entry = f"""
extern "C" void images(const unsigned short* data, i64 n_frames, int frame_len, const i64* pixels, int n_pix, float* out) {{
    launch(Dim{{{math.ceil(n_frames / dense.IMAGE_FRAMES)}, {math.ceil(pixels.size / 32)}}}, Dim{{32, 8}},
           [&] {{ pixel_images<unsigned short>(data, n_frames, frame_len, pixels, n_pix, out); }});
}}"""
    out = np.full((pixels.size, n_frames), 7, np.float32)
    library("dense.cu", dense.DEFINES, entry, tmp_path).images(pointer(data), ctypes.c_int64(n_frames), data.shape[1], pointer(pixels),
                                                               pixels.size, pointer(out))
    assert (out == data[:, pixels].T.astype(np.float32)).all()


def test_sideband_sum_kernel_against_its_twin(tmp_path):
    """sideband_sum over two slices of the pixels (pixels in, out and at the edge of the aperture), as the GPU
    test compares it: within float32 rounding of the terms."""
    from test_ssb_kernels import OPTICS, sideband_inputs
    from qgpu_dask.phase import sideband
    from qgpu_dask.phase.optics import chi, chi_table, monomials

    cuda = compiling_module("qgpu_dask.phase.cuda")
    G, ky, kx, dqy, dqx, kmax = sideband_inputs(3)
    for k, (qy, qx), sign in ((5, (dqy, 2 * dqx), 1.0), (6, (-2 * dqy, dqx), -1.0)):  # k -+ q on the aperture's edge
        ky[k], kx[k] = sign * np.array([qy, qx]) * (1 - kmax / math.hypot(qy, qx))
    chi_k, table = chi(kx, ky, OPTICS), chi_table(OPTICS)
    degree, poly = monomials(np.asarray(table))
    n_pix, rows, half = G.shape
    per_slice = math.ceil(n_pix / 2)
    entry = f"""
extern "C" void sums(const float2* G, i64 n_pix, int rows, int half, const float4* pixel, const double* ky, const double* kx, const float* c,
                     double dqy, double dqx, double kmax2, float floor, i64 per_slice, double* re, double* im, double* w) {{
    Poly<{degree}> poly;
    for (int i = 0; i < {poly.size}; ++i) poly.c[i] = c[i];
    launch(Dim{{{math.ceil(rows * half / cuda.THREADS)}, 2}}, {cuda.THREADS}, [&] {{
        sideband_sum<{degree}>(G, n_pix, rows, half, pixel, ky, kx, poly, dqy, dqx, kmax2, floor, per_slice, re, im, w); }});
}}"""
    parts = np.zeros((3, 2, rows * half))
    arrays = [np.ascontiguousarray(a) for a in (G, cuda.pixel_table(ky, kx, chi_k, kmax**2), ky, kx, poly.ravel().astype(np.float32))]
    library("ssb.cu", cuda.DEFINES, entry, tmp_path).sums(
        pointer(arrays[0]), ctypes.c_int64(n_pix), rows, half, pointer(arrays[1]), pointer(arrays[2]), pointer(arrays[3]), pointer(arrays[4]),
        ctypes.c_double(dqy), ctypes.c_double(dqx), ctypes.c_double(kmax**2), ctypes.c_float(sideband.GAMMA_FLOOR), ctypes.c_int64(per_slice),
        pointer(parts[0]), pointer(parts[1]), pointer(parts[2]))
    total, weight = phase_cpu.sideband_sum(G, ky, kx, chi_k, table, dqy, dqx, kmax**2, sideband.GAMMA_FLOOR)
    sums = parts.sum(axis=1).reshape(3, rows, half)
    assert np.abs(sums[0] + 1j * sums[1] - total).max() <= 1e-5 * np.abs(total).max()
    assert np.abs(sums[2] - weight).max() <= 1e-5 * weight.max()


def test_series_mask_sums_against_the_counts(tmp_path):
    """series_mask_sums over one acquisition as SeriesStreams launches it: a warp of value-mode rANS streams
    decoded in lockstep and a warp of fewer pixels decoded stream by stream, two masks, against the sums."""
    cuda = compiling_module("qgpu_dask.resident.cuda.compressed")
    twin = compiling_module("qgpu_dask.resident.cpu.compressed")
    rng = np.random.default_rng(12)
    flat = rng.poisson(3.0, (700, 40)).astype(np.uint16)
    flat[::41, 7] = 50000  # escapes
    resident = CompressedCounts.encode("t", flat, (35, 20, 5, 8))
    assert (resident.model.run == 0).all() and (resident.forms()["ans"] == flat.shape[1] * -(-700 // resident.block))
    model, streams = resident.model, resident.streams
    lut = np.zeros(resident.frame_len * 2 * cuda.LUT_SIZE, np.uint8)
    payload = np.zeros(-(-streams.payload.size // 16) * 16, np.uint8)
    payload[: streams.payload.size] = streams.payload
    fields = {"index": streams.index, "block_base": streams.block_base, "payload": payload, "run": model.run, "values": model.values,
              "table_start": model.table_start, "cum": model.cum, "lut": lut, "totals": resident.totals}
    desc = np.array([[fields[k].ctypes.data if k in fields else {"payload_bytes": streams.payload.size, "block": resident.block,
                      "coding": 1 | 2 << 8, "maxval": 65535}[k] for k in twin.DESC_FIELDS]], np.uint64)
    blocks = streams.index.shape[0]
    pixels = np.arange(40, dtype=np.int64)
    weights = rng.integers(0, 1000, (2, 40)).astype(np.uint64)
    stride = cuda.table_stride(model.run, model.values)
    entry = f"""
extern "C" void luts(const unsigned char* run, const unsigned char* values, const unsigned* table_start, const unsigned short* cum,
                     int frame_len, unsigned char* lut) {{
    launch(Dim{{(frame_len * 2 * LUT_SIZE + 255) / 256}}, 256, [&] {{ build_lut(run, values, table_start, cum, frame_len, lut); }});
}}
extern "C" void sums(const unsigned long long* desc, const int* item_acq, const int* item_block, int frame_len, i64 n_frames, const i64* spans,
                     const i64* pixels, i64 pix_len, int stride, const unsigned long long* weights, unsigned long long* out,
                     unsigned long long* err) {{
    launch(Dim{{{blocks}, {math.ceil(40 / cuda.MASK_THREADS)}}}, {cuda.MASK_THREADS}, [&] {{
        series_mask_sums<unsigned long long, 2>(desc, item_acq, item_block, frame_len, n_frames, spans, pixels, pix_len, stride, weights,
                                                nullptr, 2, 0, out, err); }});
}}"""
    lib = library("compressed.cu", cuda.DEFINES, entry, tmp_path)
    lib.luts(pointer(model.run), pointer(model.values), pointer(model.table_start), pointer(model.cum), 40, pointer(lut))
    items = [np.zeros(blocks, np.int32), np.arange(blocks, dtype=np.int32), np.array([0, 40], np.int64)]
    out = np.zeros((1, 2, 700), np.uint64)
    err = np.full(1, cuda.NO_ERROR, np.uint64)
    lib.sums(pointer(desc), pointer(items[0]), pointer(items[1]), 40, ctypes.c_int64(700), pointer(items[2]), pointer(pixels), ctypes.c_int64(40),
             stride, pointer(weights), pointer(out), pointer(err))
    assert int(err[0]) == cuda.NO_ERROR
    assert (out[0] == weights @ flat.T.astype(np.uint64)).all()


@pytest.mark.parametrize("terms", ["C10 C12", "all"])
def test_normal_equations_kernel_against_its_twin(terms, tmp_path):
    """normal_equations and normal_gram with the launches phase.cuda makes (pixels in a shuffled order), both
    methods on three frequencies of each alias group (8 and 9 aliases: the complex method's Y^T Y in two passes over
    the pixels), against the CPU twin within the GPU test's 1e-5 of the largest entry; chi of degree 2 and of
    degree 6 (all 14 aberration terms, as the benchmark's)."""
    from test_direct import OPTICS, SCAN, U, bright_field
    from direct_gpu import ABERRATIONS  # all 14 terms, as the benchmark measures them
    from qgpu_dask.phase import direct
    from qgpu_dask.phase.optics import chi, chi_table, monomials

    cuda = compiling_module("qgpu_dask.phase.cuda")
    optics = OPTICS.with_(det_sampling_mrad=2.0, **({"aberrations": ABERRATIONS} if terms == "all" else {}))
    ky, kx = bright_field(optics)
    rng = np.random.default_rng(9)
    G = (rng.standard_normal((len(ky), SCAN[0], SCAN[1] // 2 + 1)) + 1j * rng.standard_normal((len(ky), SCAN[0], SCAN[1] // 2 + 1))).astype(np.complex64)
    weights, chi_k, table, kmax2 = rng.uniform(0.5, 2.0, len(ky)), chi(kx, ky, optics), chi_table(optics), optics.aperture_k**2
    degree, poly = monomials(np.asarray(table))
    order = rng.permutation(len(ky)).astype(np.int64)
    found = direct.aliases(SCAN, OPTICS, U)
    twin = {m: direct_cpu.normal_equations(G, ky, kx, weights, chi_k, table, found, m, kmax2) for m in (False, True)}
    cases = [(g.freq[:3], g.q[:3], m, *(e[:3] for e in twin[m][i])) for i, g in enumerate(found.groups) for m in (False, True)]
    assert {q.shape[1] for _, q, *_ in cases} == {8, 9}
    entry = ""
    for case, (freq, alias_q, complex_method, *_) in enumerate(cases):
        n, d = alias_q.shape[:2]
        cols = 2 * d if complex_method else d
        name = f"normal_equations<{degree}, {d}, {str(complex_method).lower()}>"
        entry += f"""
extern "C" void equations{case}(const float2* G, i64 nq, const i64* pixel, i64 n_pix, const i64* freq, i64 n, const double* ky, const double* kx,
                               const float2* k_f, const float* chi_k, const float* root_w, const float* c, const double* alias_q, double kmax2,
                               float inv_u2, double* yy, double2* gram, double2* rhs) {{
    Poly<{degree}> poly;
    for (int i = 0; i < {poly.size}; ++i) poly.c[i] = c[i];
    launch(Dim{{1}}, {32 * cuda.NORMAL_WARPS}, [&] {{
        {name}(G, nq, pixel, n_pix, freq, n, ky, kx, k_f, chi_k, root_w, poly, alias_q, kmax2, inv_u2, yy); }});
    launch(Dim{{{math.ceil(n * cols * (cols + 1) / cuda.THREADS)}}}, {cuda.THREADS}, [&] {{ normal_gram<{cols}>(yy, n, gram, rhs); }});
}}"""
    equations = library("ssb.cu", cuda.DEFINES, entry, tmp_path)
    ky_o, kx_o = ky[order], kx[order]
    pixels = [np.ascontiguousarray(a) for a in (G, order, ky_o, kx_o, np.stack([ky_o, kx_o], axis=1).astype(np.float32),
                                                chi_k[order].astype(np.float32), np.sqrt(weights[order]).astype(np.float32), poly.ravel().astype(np.float32))]
    for case, (freq, alias_q, complex_method, gram, rhs) in enumerate(cases):
        n, cols = rhs.shape
        width = 2 * (cols + 1)
        yy, got_gram, got_rhs = np.zeros((n, width, width)), np.zeros((n, cols, cols), np.complex128), np.zeros((n, cols), np.complex128)
        frequencies, aliases = np.ascontiguousarray(freq, np.int64), np.ascontiguousarray(alias_q, np.float64)
        getattr(equations, f"equations{case}")(
            pointer(pixels[0]), ctypes.c_int64(G[0].size), pointer(pixels[1]), ctypes.c_int64(len(ky)), pointer(frequencies), ctypes.c_int64(n),
            *(pointer(a) for a in pixels[2:]), pointer(aliases), ctypes.c_double(kmax2), ctypes.c_float(1.0 / U**2), pointer(yy),
            pointer(got_gram), pointer(got_rhs))
        assert np.abs(got_gram - gram).max() <= 1e-5 * np.abs(gram).max()
        assert np.abs(got_rhs - rhs).max() <= 1e-5 * np.abs(rhs).max()


def damaged(decoders, form: int, change) -> tuple[int, int]:
    """The first stream of ``form`` with two or more positions, changed in place by change(payload, start, end);
    its (scan block, pixel)."""
    from qgpu_dask.resident.cpu.compressed import stream_bounds

    lib, cuda, resident, flat, common, keep = decoders
    index, base, payload = keep[0], keep[1], keep[2]
    for b, p in np.argwhere((index >> codec.FORM_SHIFT) == form):
        start, end, _ = stream_bounds(index, base, int(b), int(p))
        if end - start >= 8:
            change(payload, int(start), int(end))
            return int(b), int(p)
    raise AssertionError(f"no stream of form {form} with two positions")


@pytest.mark.parametrize("form", ["sparse", "ans"])
def test_partial_decodes_check_the_whole_stream(decoders, form):
    """A range of frames ending inside a scan block, and one frame: a sparse stream whose last position does not
    increase is reported (all its positions are checked, as the CPU twin does), and by decode_rows a rANS stream
    that does not end in its initial state (the rest of the stream read to check it)."""
    lib, cuda, resident, flat, common, keep = decoders
    payload = keep[2]
    original = payload.copy()

    def change(payload, start, end):
        if form == "sparse":  # the last position made the first's
            nnz = (end - start) // 4
            payload[start + 2 * (nnz - 1) : start + 2 * nnz] = payload[start : start + 2]
        else:  # a bit of the stream's last word
            payload[end - 1] ^= 0x04

    b, p = damaged(decoders, codec.SPARSE if form == "sparse" else codec.ANS, change)
    try:
        lo = b * resident.block
        launch, stride = cuda.rows_launch(resident.frame_len, resident.block, lo, lo + 3,
                                          cuda.table_stride(resident.model.run, resident.model.values), "unsigned short", False, 2)
        out = np.zeros((3, resident.frame_len), np.uint16)
        err = np.full(1, cuda.NO_ERROR, np.uint64)
        lib.rows(0, *launch.grid, launch.threads, *common(stride), b, ctypes.c_int64(lo), ctypes.c_int64(lo + 3), pointer(out), pointer(err))
        with pytest.raises(ValueError, match=f"scan block {b}, detector pixel {p}"):
            cuda.check_word(int(err[0]), resident.frame_len)
        if form == "sparse":
            order = np.arange(resident.frame_len, dtype=np.int32)
            one = np.zeros(resident.frame_len, np.uint32)
            err = np.full(1, cuda.NO_ERROR, np.uint64)
            lib.one_frame(cuda.grid(resident.frame_len, 128), *common(cuda.table_stride(resident.model.run, resident.model.values)),
                          ctypes.c_int64(lo), pointer(order), pointer(one), pointer(err))
            with pytest.raises(ValueError, match=f"scan block {b}, detector pixel {p}"):
                cuda.check_word(int(err[0]), resident.frame_len)
    finally:
        payload[:] = original
