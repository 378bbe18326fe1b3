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

// ---------------------------------------------------------------- direct ptychography

// The normal equations of regularized direct ptychography (qgpu_dask/ssb/direct.py), per coarse scan
// frequency q of the half spectrum: gram = T^H W T (C x C) and rhs = T^H W g, with one column per alias
// (phase: i (Gamma_plus - Gamma_minus) / u^2) or two (complex: Gamma_plus / u^2, then Gamma_minus / u^2).
// One warp per frequency. The warp takes 32 pixels at a time: each lane evaluates its pixel's C columns
// in registers (chi from the table, the trotter tests; a pixel with no term is marked by weight 0 and
// skipped) into the warp's shared buffer; then each lane adds its own entries of the upper triangle and
// of the right side over those 32 pixels, in float64. Twin: normal_equations in qgpu_dask/ssb/cpu.py.
template <int MM, int MP, int D, bool COMPLEX>
__global__ void normal_equations(const float2* __restrict__ G, i64 n_pix, i64 nq, const float* __restrict__ ky,
                                 const float* __restrict__ kx, const float* __restrict__ chi_k, const float* __restrict__ weights,
                                 const float2* __restrict__ table, const float* __restrict__ alias_q,
                                 const unsigned char* __restrict__ valid, float kmax2, float inv_u2, double2* __restrict__ gram,
                                 double2* __restrict__ rhs) {
    constexpr int C = COMPLEX ? 2 * D : D;
    constexpr int TRIANGLE = C * (C + 1) / 2;
    constexpr int PER_LANE = (TRIANGLE + C + 31) / 32;
    constexpr int STRIDE = C + 2;  // per pixel in the buffer: C columns, then g, then (w, 0)
    extern __shared__ float2 buffer_all[];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    i64 q = (i64)blockIdx.x * (blockDim.x / 32) + warp;
    if (q >= nq) return;  // whole warps leave; only __syncwarp is used below
    float2* buffer = buffer_all + (i64)warp * 32 * STRIDE;

    float qy[D], qx[D];
    bool on[D];
#pragma unroll
    for (int m = 0; m < D; ++m) {
        qy[m] = alias_q[(q * D + m) * 2];
        qx[m] = alias_q[(q * D + m) * 2 + 1];
        on[m] = valid[q * D + m] != 0;
    }
    // this lane's entries: e < TRIANGLE is (i, j), i <= j, of the upper triangle; the rest are rhs[i]
    int ei[PER_LANE], ej[PER_LANE];
    double2 acc[PER_LANE];
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        int e = lane + 32 * t;
        ei[t] = -1;
        ej[t] = -1;
        acc[t] = double2{0.0, 0.0};
        if (e < TRIANGLE) {
            int i = 0, row_len = C;
            while (e >= row_len) { e -= row_len; ++i; --row_len; }
            ei[t] = i;
            ej[t] = i + e;
        } else if (e < TRIANGLE + C) {
            ei[t] = e - TRIANGLE;
        }
    }

    for (i64 base = 0; base < n_pix; base += 32) {
        i64 k = base + lane;
        float2* mine = buffer + lane * STRIDE;
        bool any = false;
        float y = 0.f, x = 0.f, here = 0.f;
        if (k < n_pix) {
            y = ky[k];
            x = kx[k];
            here = chi_k[k];
        }
        bool inside = k < n_pix && x * x + y * y <= kmax2;
#pragma unroll
        for (int m = 0; m < D; ++m) {
            float2 plus{0.f, 0.f}, minus{0.f, 0.f};
            if (inside && on[m]) {
                float my = y - qy[m], mx = x - qx[m], py = y + qy[m], px = x + qx[m];
                float s, c;
                if (mx * mx + my * my <= kmax2) {
                    sincosf(here - chi<MM, MP>(mx, my, table), &s, &c);
                    plus = float2{c * inv_u2, s * inv_u2};
                    any = true;
                }
                if (px * px + py * py <= kmax2) {
                    sincosf(chi<MM, MP>(px, py, table) - here, &s, &c);
                    minus = float2{c * inv_u2, s * inv_u2};
                    any = true;
                }
            }
            if (COMPLEX) {
                mine[m] = plus;
                mine[D + m] = minus;
            } else {
                mine[m] = float2{-(plus.y - minus.y), plus.x - minus.x};  // i (plus - minus)
            }
        }
        mine[C] = any ? G[k * nq + q] : float2{0.f, 0.f};
        mine[C + 1] = float2{any ? weights[k] : 0.f, 0.f};
        __syncwarp();
        for (int p = 0; p < 32; ++p) {
            const float2* col = buffer + p * STRIDE;
            double w = col[C + 1].x;
            if (w == 0.0) continue;  // the same p for every lane: no divergence
#pragma unroll
            for (int t = 0; t < PER_LANE; ++t) {
                if (ei[t] < 0) continue;
                float2 a = col[ei[t]];
                float2 b = ej[t] >= 0 ? col[ej[t]] : col[C];
                double ar = w * a.x, ai = w * a.y;  // w conj(a) b
                acc[t].x += ar * b.x + ai * b.y;
                acc[t].y += ar * b.y - ai * b.x;
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        if (ei[t] < 0) continue;
        if (ej[t] >= 0) {
            gram[(q * C + ei[t]) * C + ej[t]] = acc[t];
            if (ej[t] != ei[t]) gram[(q * C + ej[t]) * C + ei[t]] = double2{acc[t].x, -acc[t].y};
        } else {
            rhs[q * C + ei[t]] = acc[t];
        }
    }
}
