"""Arithmetic rates of the GPU's units that the direct-ptychography Gram kernel can use: float64 tensor-core
products by shape (m8n8k4, m16n8k4, m16n8k16), tf32 products (m16n8k8) and float32 multiply-adds, each as a
ratio to the float32 multiply-add rate of the same run.

Each kernel keeps independent accumulators per warp so that the unit, not a dependency chain, bounds it;
8 blocks per multiprocessor. A measurement of the hardware, not shipped code: the kernels here have no CPU
twin. On the H200 it shows why kernels/ssb.cu uses m16n8k4 (m8n8k4 runs at half the float64 tensor rate).

    python benchmarks/tensor_rates.py          # on the GPU machine
    python benchmarks/tensor_rates.py --small  # a short run; without a GPU it says what it skipped
"""

from __future__ import annotations

import argparse

import numpy as np

from qgpu_dask.device import cupy_or_none

import record

SOURCE = r"""
#define MMA_LOOP(N, BODY) for (int i = 0; i < iters; ++i) { _Pragma("unroll") for (int j = 0; j < N; ++j) { BODY; } }

// the accumulators' sum, written out so that no product is dead code
template <typename T, int R, int C>
__device__ void keep(const T (&d)[R][C], double* out) {
    double s = 0;
    for (int j = 0; j < R; ++j)
        for (int v = 0; v < C; ++v) s += d[j][v];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

extern "C" __global__ void f64_m8n8k4(double* out, int iters) {
    double d[8][2] = {};
    double a = threadIdx.x * 1e-3, b = 1.0 + threadIdx.x * 1e-4;
    MMA_LOOP(8, asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
                             : "+d"(d[j][0]), "+d"(d[j][1]) : "d"(a), "d"(b)))
    keep(d, out);
}

extern "C" __global__ void f64_m16n8k4(double* out, int iters) {
    double d[8][4] = {};
    double a0 = threadIdx.x * 1e-3, a1 = a0 + 1, b = 1.0 + threadIdx.x * 1e-4;
    MMA_LOOP(8, asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                             : "+d"(d[j][0]), "+d"(d[j][1]), "+d"(d[j][2]), "+d"(d[j][3]) : "d"(a0), "d"(a1), "d"(b)))
    keep(d, out);
}

extern "C" __global__ void f64_m16n8k16(double* out, int iters) {
    double d[4][4] = {};
    double a[8], b[4];
    for (int t = 0; t < 8; ++t) a[t] = threadIdx.x * 1e-3 + t;
    for (int t = 0; t < 4; ++t) b[t] = 1.0 + t * 1e-4;
    MMA_LOOP(4, asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7,%8,%9,%10,%11}, "
                             "{%12,%13,%14,%15}, {%0,%1,%2,%3};"
                             : "+d"(d[j][0]), "+d"(d[j][1]), "+d"(d[j][2]), "+d"(d[j][3])
                             : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]),
                               "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3])))
    keep(d, out);
}

extern "C" __global__ void tf32_m16n8k8(double* out, int iters) {
    float d[8][4] = {};
    unsigned a[4], b[2];
    for (int t = 0; t < 4; ++t) a[t] = __float_as_uint(threadIdx.x * 1e-3f + t);
    for (int t = 0; t < 2; ++t) b[t] = __float_as_uint(1.f + t);
    MMA_LOOP(8, asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                             : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
                             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1])))
    keep(d, out);
}

extern "C" __global__ void f32_fma(double* out, int iters) {
    float x[1][8];
    for (int j = 0; j < 8; ++j) x[0][j] = threadIdx.x * 1e-3f + j;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int r = 0; r < 16; ++r) {
#pragma unroll
            for (int j = 0; j < 8; ++j) x[0][j] = fmaf(x[0][j], 0.999f, 1e-3f);
        }
    }
    keep(x, out);
}
"""

# floating-point operations per warp per loop iteration (a multiply-add counts 2)
FLOPS_PER_ITERATION = {
    "f64_m8n8k4": 8 * 8 * 8 * 4 * 2,
    "f64_m16n8k4": 8 * 16 * 8 * 4 * 2,
    "f64_m16n8k16": 4 * 16 * 8 * 16 * 2,
    "tf32_m16n8k8": 8 * 16 * 8 * 8 * 2,
    "f32_fma": 16 * 8 * 32 * 2,
}


def tflops(cupy, kernel, blocks: int, threads: int, flops: int, iters: int) -> float:
    """TFLOPS of one timed launch, after a warm-up launch."""
    out = cupy.zeros(blocks * threads, cupy.float64)
    kernel((blocks,), (threads,), (out, np.int32(iters)))
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    kernel((blocks,), (threads,), (out, np.int32(iters)))
    stop.record()
    stop.synchronize()
    return blocks * threads / 32 * iters * flops / cupy.cuda.get_elapsed_time(start, stop) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000, help="iterations of each kernel's loop")
    args = record.parse(ap, small={"iters": 20})
    cupy = cupy_or_none()
    if cupy is None:
        skipped = ["every kernel: they are the GPU's units themselves (no CUDA device or DASK_QGPU__CPU=True)"]
        record.publish("tensor_rates_cuda", {"kernels": sorted(FLOPS_PER_ITERATION), "skipped": skipped})
        return
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",))
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    rates = {name: tflops(cupy, module.get_function(name), 8 * sms, 256, flops, args.iters) for name, flops in FLOPS_PER_ITERATION.items()}
    results = {"multiprocessors": sms, "tflops": rates, "over_f32_fma": {name: rate / rates["f32_fma"] for name, rate in rates.items()}}
    record.publish("tensor_rates_cuda", results)


if __name__ == "__main__":
    main()
