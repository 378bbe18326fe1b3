// Warp-wide tensor-core products (sm_80 and later) for kernels/ssb.cu's normal equations; qgpu_dask/compile.py
// inlines this header, tests/cuda_on_host.h has host versions of both products.

// D += A B for one 16 x 8 x 4 float64 product (the shape the H200 runs at its full float64 rate; m8n8k4 runs at
// half): A 16 x 4 (row-major), B 4 x 8 (column-major); a lane holds A[lane / 4 + {0, 8}][lane % 4],
// B[lane % 4][lane / 4] and D[lane / 4 + {0, 8}][2 (lane % 4) + {0, 1}].
__device__ __forceinline__ void mma_f64(double (&d)[4], double a0, double a1, double b) {
    asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                 : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
                 : "d"(a0), "d"(a1), "d"(b));
}

// D += A B for one 16 x 8 x 8 product of tf32 inputs (float32 of which the tensor cores read the sign, the exponent
// and the top 10 mantissa bits), summed in float32: A 16 x 8 (row-major), B 8 x 8 (column-major); a lane holds
// A[lane / 4 + {0, 8}][lane % 4 + {0, 4}] as (a0, a1) at + 0 and (a2, a3) at + 4 columns, B[lane % 4 + {0, 4}][lane / 4]
// as (b0, b1), and D as mma_f64 does.
__device__ __forceinline__ void mma_tf32(float (&d)[4], float a0, float a1, float a2, float a3, float b0, float b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(__float_as_uint(a0)), "r"(__float_as_uint(a1)), "r"(__float_as_uint(a2)), "r"(__float_as_uint(a3)),
                   "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
}
