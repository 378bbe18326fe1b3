// The regularized solve of direct ptychography at one strength, compiled at run time by
// qgpu_dask/phase/cuda.py (shifted_solve); the twin of shifted_solve in qgpu_dask/phase/cpu.py.

typedef long long i64;

// (matrix[f] + shift I) x[f] = rhs[f] for each of n Hermitian positive semi-definite C x C systems (complex128,
// row-major; only the lower triangle is read), shift > 0: a Cholesky factorisation L L^H per thread, then the two
// triangular solves; a pivot is kept >= sqrt(shift), which M + s I's are when M >= 0 (only rounding could take one
// lower). Twin: shifted_solve in qgpu_dask/phase/cpu.py (which divides where this multiplies by a reciprocal).
template <int C>
__global__ void shifted_solve(const double2* __restrict__ matrix, const double2* __restrict__ rhs, i64 n, double shift,
                              double2* __restrict__ x) {
    i64 f = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= n) return;
    const double2* m = matrix + f * C * C;
    double2 L[C][C];
    double inv[C];
#pragma unroll
    for (int j = 0; j < C; ++j) {
        double d = m[j * C + j].x + shift;
#pragma unroll
        for (int k = 0; k < j; ++k) d -= L[j][k].x * L[j][k].x + L[j][k].y * L[j][k].y;
        inv[j] = 1.0 / sqrt(fmax(d, shift));
#pragma unroll
        for (int i = j + 1; i < C; ++i) {
            double2 v = m[i * C + j];
#pragma unroll
            for (int k = 0; k < j; ++k) {  // v -= L[i][k] conj(L[j][k])
                v.x -= L[i][k].x * L[j][k].x + L[i][k].y * L[j][k].y;
                v.y -= L[i][k].y * L[j][k].x - L[i][k].x * L[j][k].y;
            }
            L[i][j] = double2{v.x * inv[j], v.y * inv[j]};
        }
    }
    double2 y[C];
#pragma unroll
    for (int i = 0; i < C; ++i) {  // L y = rhs
        double2 v = rhs[f * C + i];
#pragma unroll
        for (int k = 0; k < i; ++k) {
            v.x -= L[i][k].x * y[k].x - L[i][k].y * y[k].y;
            v.y -= L[i][k].x * y[k].y + L[i][k].y * y[k].x;
        }
        y[i] = double2{v.x * inv[i], v.y * inv[i]};
    }
#pragma unroll
    for (int i = C - 1; i >= 0; --i) {  // L^H x = y
        double2 v = y[i];
#pragma unroll
        for (int k = i + 1; k < C; ++k) {  // v -= conj(L[k][i]) y[k], y[k] now x[k]
            v.x -= L[k][i].x * y[k].x + L[k][i].y * y[k].y;
            v.y -= L[k][i].x * y[k].y - L[k][i].y * y[k].x;
        }
        y[i] = double2{v.x * inv[i], v.y * inv[i]};
        x[f * C + i] = y[i];
    }
}
