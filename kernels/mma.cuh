// A warp-wide tensor-core product (sm_80 and later) for kernels/ssb.cu's normal equations; qgpu_dask/compile.py
// inlines this header, tests/cuda_on_host.h has a host version.

// D += A B for one 16 x 8 x 4 float64 product (the shape the H200 runs at its full float64 rate; m8n8k4 runs at
// half): A 16 x 4 (row-major), B 4 x 8 (column-major); a lane holds A[lane / 4 + {0, 8}][lane % 4],
// B[lane % 4][lane / 4] and D[lane / 4 + {0, 8}][2 (lane % 4) + {0, 1}].
__device__ __forceinline__ void mma_f64(double (&d)[4], double a0, double a1, double b) {
    asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                 : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
                 : "d"(a0), "d"(a1), "d"(b));
}
