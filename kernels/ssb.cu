// The single-sideband sum over bright-field pixels, fused: Gamma evaluated in registers, exact zeros skipped.
//
// The twin of qgpu_dask/ssb/cpu.py; compiled at run time by qgpu_dask/ssb/cuda.py, which instantiates
// sideband_sum<MM, MP> by the size of the aberration table (qgpu_dask/ssb/optics.py chi_table).
//
// G is (n_pix, rows, half_cols) complex64: the rfft2 over the scan of every bright-field pixel's image.
// For each scan frequency Q of that half spectrum and each pixel k (1/A, scan axes) inside the aperture:
//   Gamma = [|k - Q| <= kmax] exp(i (chi(k) - chi(k - Q))) - [|k + Q| <= kmax] exp(i (chi(k + Q) - chi(k)))
//   total(Q) += G(k, Q) conj(Gamma) / |Gamma|,  weight(Q) += |Gamma|,   where |Gamma| > floor.
// One thread per Q; blockIdx.y takes one slice of the pixels; each slice's sums (float64) are written
// apart and added in slice order by the host, so the result does not depend on scheduling.

typedef long long i64;

// chi(k) = sum_m Re(T[m, p] (x + i y)^m) |k|^(2p), T of (MM + 1) x (MP + 1) complex entries.
template <int MM, int MP>
__device__ __forceinline__ float chi(float x, float y, const float2* __restrict__ table) {
    float r2 = x * x + y * y;
    float zr = 1.f, zi = 0.f;
    float total = 0.f;
#pragma unroll
    for (int m = 0; m <= MM; ++m) {
        float ar = 0.f, ai = 0.f;
#pragma unroll
        for (int p = MP; p >= 0; --p) {
            float2 c = table[m * (MP + 1) + p];
            ar = ar * r2 + c.x;
            ai = ai * r2 + c.y;
        }
        total += ar * zr - ai * zi;
        float nr = zr * x - zi * y;
        zi = zr * y + zi * x;
        zr = nr;
    }
    return total;
}

template <int MM, int MP>
__global__ void sideband_sum(const float2* __restrict__ G, i64 n_pix, int rows, int half_cols, const float* __restrict__ ky,
                             const float* __restrict__ kx, const float* __restrict__ chi_k, const float2* __restrict__ table,
                             float dqy, float dqx, float kmax2, float floor, i64 per_slice, double* __restrict__ total_re,
                             double* __restrict__ total_im, double* __restrict__ weight) {
    i64 nq = (i64)rows * half_cols;
    i64 q = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= nq) return;
    int r = (int)(q / half_cols), c = (int)(q % half_cols);
    float qy = (float)(r < (rows + 1) / 2 ? r : r - rows) * dqy;
    float qx = (float)c * dqx;
    i64 lo = (i64)blockIdx.y * per_slice;
    i64 hi = min(n_pix, lo + per_slice);
    double sr = 0.0, si = 0.0, sw = 0.0;
    for (i64 k = lo; k < hi; ++k) {
        float y = ky[k], x = kx[k];
        float my = y - qy, mx = x - qx, py = y + qy, px = x + qx;
        bool in_minus = mx * mx + my * my <= kmax2;
        bool in_plus = px * px + py * py <= kmax2;
        if (!(in_minus || in_plus) || x * x + y * y > kmax2) continue;
        float here = chi_k[k];
        float gr = 0.f, gi = 0.f, s, co;
        if (in_minus) {
            sincosf(here - chi<MM, MP>(mx, my, table), &s, &co);
            gr += co;
            gi += s;
        }
        if (in_plus) {
            sincosf(chi<MM, MP>(px, py, table) - here, &s, &co);
            gr -= co;
            gi -= s;
        }
        float size = sqrtf(gr * gr + gi * gi);
        if (!(size > floor)) continue;
        float2 g = G[k * nq + q];
        float inv = 1.f / size;
        sr += (double)((g.x * gr + g.y * gi) * inv);
        si += (double)((g.y * gr - g.x * gi) * inv);
        sw += (double)size;
    }
    i64 at = (i64)blockIdx.y * nq + q;
    total_re[at] = sr;
    total_im[at] = si;
    weight[at] = sw;
}
