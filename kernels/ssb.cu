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

// (sin v, cos v) for the phase differences of the kernels below: v reduced to [-pi, pi] in two steps
// (2 pi = 6.28125 + 0.0019353071795864769, the first part exact in float), then the fast intrinsic:
// within about 1e-6 rad of sincosf for |v| up to 1e3, as close as chi itself is in float32.
__device__ __forceinline__ void phase_factor(float v, float* s, float* c) {
    float turns = rintf(v * 0.15915494309189535f);
    __sincosf(fmaf(-turns, 0.0019353071795864769f, fmaf(-turns, 6.28125f, v)), s, c);
}

// (Gamma_plus, Gamma_minus) of pixel k = (x, y), chi(k) = here, at frequency (qy, qx): exp(i (chi(k) - chi(k - q)))
// where k - q is inside the aperture and exp(i (chi(k + q) - chi(k))) where k + q is, else 0; whether either is.
// The aperture tests are made in float64, as the CPU twin makes them: a pixel on an aperture edge is in or out
// on both; chi and the phase factors are float32.
template <int MM, int MP>
__device__ __forceinline__ bool trotters(double x, double y, float here, double qy, double qx, const float2* table, double kmax2,
                                         float2& plus, float2& minus) {
    double my = y - qy, mx = x - qx, py = y + qy, px = x + qx;
    float s, c;
    plus = float2{0.f, 0.f};
    minus = float2{0.f, 0.f};
    bool in_plus = mx * mx + my * my <= kmax2, in_minus = px * px + py * py <= kmax2;
    if (in_plus) {
        phase_factor(here - chi<MM, MP>((float)mx, (float)my, table), &s, &c);
        plus = float2{c, s};
    }
    if (in_minus) {
        phase_factor(chi<MM, MP>((float)px, (float)py, table) - here, &s, &c);
        minus = float2{c, s};
    }
    return in_plus || in_minus;
}

template <int MM, int MP>
__global__ void sideband_sum(const float2* __restrict__ G, i64 n_pix, int rows, int half_cols, const double* __restrict__ ky,
                             const double* __restrict__ kx, const float* __restrict__ chi_k, const float2* __restrict__ table,
                             double dqy, double dqx, double kmax2, float floor, i64 per_slice, double* __restrict__ total_re,
                             double* __restrict__ total_im, double* __restrict__ weight) {
    i64 nq = (i64)rows * half_cols;
    i64 q = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= nq) return;
    int r = (int)(q / half_cols), c = (int)(q % half_cols);
    double qy = (r < (rows + 1) / 2 ? r : r - rows) * dqy;
    double qx = c * dqx;
    i64 lo = (i64)blockIdx.y * per_slice;
    i64 hi = min(n_pix, lo + per_slice);
    double sr = 0.0, si = 0.0, sw = 0.0;
    for (i64 k = lo; k < hi; ++k) {
        double y = ky[k], x = kx[k];
        float2 plus, minus;
        if (x * x + y * y > kmax2 || !trotters<MM, MP>(x, y, chi_k[k], qy, qx, table, kmax2, plus, minus)) continue;
        float gr = plus.x - minus.x, gi = plus.y - minus.y;
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

// D += A B for one 8 x 8 x 4 float64 tensor-core product: A 8 x 4 (row-major), B 4 x 8 (column-major); a lane
// holds A[lane / 4][lane % 4], B[lane % 4][lane / 4] and D[lane / 4][2 (lane % 4) + {0, 1}].
__device__ __forceinline__ void mma_f64(double& d0, double& d1, double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+d"(d0), "+d"(d1)
                 : "d"(a), "d"(b));
}

constexpr int COLUMN_STRIDE = 36;  // double2 per column of a warp's buffer: 32 pixels, padded so fragment loads meet no bank conflict

// The normal equations of regularized direct ptychography (qgpu_dask/ssb/direct.py) for frequencies with
// D aliases each: for the n frequencies freq[f] of the half spectrum (flat, nq of them), with the aliases'
// q at alias_q[f, m] (1/A, (q_y, q_x)), gram[f] = T^H W T (C x C) and rhs[f] = T^H W g, one column per alias
// (phase: i (Gamma_plus - Gamma_minus) / u^2) or two (complex: Gamma_plus / u^2, then Gamma_minus / u^2).
// One warp per frequency. The warp takes 32 pixels at a time: each lane evaluates its pixel's columns in
// float32 registers (chi from the table in shared memory), scales them and g by sqrt(W) and stores them as
// float64 in the warp's buffer, column by column (zeros for a pixel with no term). Then X^H X of the
// chunk's X = [columns, g] (32 x (C + 1), padded to tiles of 8 columns) is added 4 pixels at a time on the
// float64 tensor cores: real part Xr^T Xr + Xi^T Xi, imaginary part Xr^T Xi - Xi^T Xr, for each pair of tiles
// on or above the diagonal; four-pixel steps with no term are skipped. Twin: normal_equations in
// qgpu_dask/ssb/cpu.py.
template <int MM, int MP, int D, bool COMPLEX>
__global__ void normal_equations(const float2* __restrict__ G, i64 n_pix, i64 nq, const i64* __restrict__ freq, i64 n,
                                 const double* __restrict__ ky, const double* __restrict__ kx, const float* __restrict__ chi_k,
                                 const float* __restrict__ root_w, const float2* __restrict__ table_in,
                                 const double* __restrict__ alias_q, double kmax2, float inv_u2, double2* __restrict__ gram,
                                 double2* __restrict__ rhs) {
    constexpr int C = COMPLEX ? 2 * D : D;
    constexpr int TILES = (C + 8) / 8;  // tiles of 8 columns covering the C columns and g
    constexpr int PAIRS = TILES * (TILES + 1) / 2;
    constexpr int TABLE = (MM + 1) * (MP + 1);
    __shared__ float2 table[TABLE];
    extern __shared__ double2 buffer_all[];
    for (int t = threadIdx.x; t < TABLE; t += blockDim.x) table[t] = table_in[t];
    __syncthreads();
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    i64 f = (i64)blockIdx.x * (blockDim.x / 32) + warp;
    if (f >= n) return;  // whole warps leave; only warp-level synchronisation follows
    i64 q = freq[f];
    double2* buffer = buffer_all + (i64)warp * (8 * TILES * COLUMN_STRIDE + D);  // buffer[c * COLUMN_STRIDE + p]
    double2* alias = buffer + 8 * TILES * COLUMN_STRIDE;  // the aliases' (q_y, q_x), read by every lane at once
    for (int m = lane; m < D; m += 32) alias[m] = double2{alias_q[(f * D + m) * 2], alias_q[(f * D + m) * 2 + 1]};
    for (int c = C + 1; c < 8 * TILES; ++c) buffer[c * COLUMN_STRIDE + lane] = double2{0.0, 0.0};  // padding columns
    __syncwarp();

    double acc[PAIRS][4];  // per pair of tiles: the real part's two entries, then the imaginary part's
#pragma unroll
    for (int t = 0; t < PAIRS; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0;
    int row = lane / 4, quad = lane % 4;

    for (i64 base = 0; base < n_pix; base += 32) {
        i64 k = base + lane;
        bool any = false;
        if (k < n_pix) {
            double y = ky[k], x = kx[k];
            float here = chi_k[k], w = root_w[k] * inv_u2;
            bool inside = x * x + y * y <= kmax2;
#pragma unroll
            for (int m = 0; m < D; ++m) {
                float2 plus{0.f, 0.f}, minus{0.f, 0.f};
                any = (inside && trotters<MM, MP>(x, y, here, alias[m].x, alias[m].y, table, kmax2, plus, minus)) || any;
                if (COMPLEX) {
                    buffer[m * COLUMN_STRIDE + lane] = double2{w * plus.x, w * plus.y};
                    buffer[(D + m) * COLUMN_STRIDE + lane] = double2{w * minus.x, w * minus.y};
                } else {  // i (plus - minus)
                    buffer[m * COLUMN_STRIDE + lane] = double2{-w * (plus.y - minus.y), w * (plus.x - minus.x)};
                }
            }
            float2 g = any ? G[k * nq + q] : float2{0.f, 0.f};
            float rw = root_w[k];
            buffer[C * COLUMN_STRIDE + lane] = double2{rw * g.x, rw * g.y};
        } else {
            for (int c = 0; c <= C; ++c) buffer[c * COLUMN_STRIDE + lane] = double2{0.0, 0.0};
        }
        unsigned live = __ballot_sync(0xffffffffu, any);
        __syncwarp();
        for (int step = 0; step < 8; ++step) {
            if (((live >> (4 * step)) & 0xFu) == 0u) continue;  // the same for the whole warp
            double re[TILES], im[TILES];
#pragma unroll
            for (int t = 0; t < TILES; ++t) {  // X[4 step + quad][8 t + row]: A of tile t as rows, B as columns
                double2 v = buffer[(8 * t + row) * COLUMN_STRIDE + 4 * step + quad];
                re[t] = v.x;
                im[t] = v.y;
            }
            int pair = 0;
#pragma unroll
            for (int I = 0; I < TILES; ++I) {
#pragma unroll
                for (int J = I; J < TILES; ++J, ++pair) {
                    mma_f64(acc[pair][0], acc[pair][1], re[I], re[J]);
                    mma_f64(acc[pair][0], acc[pair][1], im[I], im[J]);
                    mma_f64(acc[pair][2], acc[pair][3], re[I], im[J]);
                    mma_f64(acc[pair][2], acc[pair][3], -im[I], re[J]);
                }
            }
        }
        __syncwarp();
    }
    int pair = 0;
#pragma unroll
    for (int I = 0; I < TILES; ++I) {
#pragma unroll
        for (int J = I; J < TILES; ++J, ++pair) {
#pragma unroll
            for (int v = 0; v < 2; ++v) {
                int i = 8 * I + row, j = 8 * J + 2 * quad + v;
                if (i >= C || j < i || j > C) continue;
                double2 value{acc[pair][v], acc[pair][2 + v]};
                if (j < C) {
                    gram[(f * C + i) * C + j] = value;
                    if (j != i) gram[(f * C + j) * C + i] = double2{value.x, -value.y};
                } else {
                    rhs[f * C + i] = value;
                }
            }
        }
    }
}
