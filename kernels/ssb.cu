// The single-sideband sum over bright-field pixels, fused: Gamma evaluated in registers, exact zeros skipped.
//
// The twin of qgpu_dask/phase/cpu.py; compiled at run time by qgpu_dask/phase/cuda.py, which instantiates
// sideband_sum<N> by the degree N of chi's polynomial (qgpu_dask/phase/optics.py chi_table).
//
// G is (n_pix, rows, half_cols) complex64: the rfft2 over the scan of every bright-field pixel's image.
// For each scan frequency Q of that half spectrum and each pixel k (1/A, scan axes) inside the aperture:
//   Gamma = [|k - Q| <= kmax] exp(i (chi(k) - chi(k - Q))) - [|k + Q| <= kmax] exp(i (chi(k + Q) - chi(k)))
//   total(Q) += G(k, Q) conj(Gamma) / |Gamma|,  weight(Q) += |Gamma|,   where |Gamma| > floor.
// One thread per Q; blockIdx.y takes one slice of the pixels; each slice's sums (float64) are written
// apart and added in slice order by the host, so the result does not depend on scheduling.

typedef long long i64;

#include "mma.cuh"

// chi as a polynomial of degree N in k_x and k_y, from the polar table of qgpu_dask/phase/optics.py (chi_table,
// expanded by qgpu_dask/phase/cuda.py monomials). Passed by value: the coefficients stay in the kernel's parameter
// bank, read by the multiply-adds themselves.
template <int N>
struct Poly {
    float c[(N + 1) * (N + 1)];  // chi = sum_{a + b <= N} c[b (N + 1) + a] k_x^a k_y^b
};

// chi(k): Horner in k_x within each power of k_y, then in k_y; about 27 multiply-adds at N = 6, a third of the
// polar form's work.
template <int N>
__device__ __forceinline__ float chi(float x, float y, const Poly<N>& poly) {
    float total = 0.f;
#pragma unroll
    for (int b = N; b >= 0; --b) {
        float row = poly.c[b * (N + 1) + N - b];
#pragma unroll
        for (int a = N - b - 1; a >= 0; --a) row = fmaf(row, x, poly.c[b * (N + 1) + a]);
        total = fmaf(total, y, row);
    }
    return total;
}

// (sin v, cos v) for the phase differences of the kernels below: v reduced to [-pi, pi] in two steps
// (2 pi = 6.28125 + 0.0019353071795864769, the first part exact in float), then the fast intrinsic:
// within about 1e-6 rad of sincosf for |v| up to 1e3, as close as chi itself is in float32.
__device__ __forceinline__ void phase_factor(float v, float* s, float* c) {
    float turns = (v * 0.15915494309189535f + 12582912.f) - 12582912.f;  // rintf by the 1.5 2^23 shift, on the multiply-add units
    __sincosf(fmaf(-turns, 0.0019353071795864769f, fmaf(-turns, 6.28125f, v)), s, c);
}

// Which of k - q (bit 0) and k + q (bit 1) lie inside the aperture, |.|^2 <= kmax2, in float64 from k = (*y, *x)
// and q, as the CPU twin decides: a pixel on an aperture edge is in or out on both. Called only near the edge
// (a real branch, rarely taken: the only place sideband_sum reads k in float64).
__device__ __noinline__ int sides_exactly(const double* y, const double* x, const double2* q, double kmax2) {
    double my = *y - q->x, mx = *x - q->y, py = *y + q->x, px = *x + q->y;
    return (int)(mx * mx + my * my <= kmax2) | ((int)(px * px + py * py <= kmax2) << 1);
}

// A pixel k (float32 yf, xf, and k_off = |k|^2 - kmax2; float64 at y, x) with chi(k) = here, at a frequency q
// (float32 qf = (q_y, q_x, |q|^2, unused); float64 *q): (Gamma_plus, Gamma_minus) = exp(i (chi(k) - chi(k - q)))
// where k - q is inside the aperture and exp(i (chi(k + q) - chi(k))) where k + q is, else 0; which sides are
// inside (bits 0, 1). The aperture tests take |k -+ q|^2 - kmax2 = k_off + |q|^2 -+ 2 k.q in float32, good to
// about 2e-6 kmax2 where it matters (|q| <= 2 kmax); within `edge` (1e-5 kmax2) of 0 they are made in float64.
// chi and the phase factors are float32.
template <int N>
__device__ __forceinline__ int trotters(float yf, float xf, float k_off, const double* y, const double* x, float here, float4 qf, const double2* q,
                                        const Poly<N>& poly, float edge, double kmax2, float2& plus, float2& minus) {
    float kq = fmaf(yf, qf.x, xf * qf.y), base = k_off + qf.z;
    float out_plus = fmaf(-2.f, kq, base), out_minus = fmaf(2.f, kq, base);
    bool in_plus = out_plus <= 0.f, in_minus = out_minus <= 0.f;
    if (fminf(fabsf(out_plus), fabsf(out_minus)) <= edge) {
        int sides = sides_exactly(y, x, q, kmax2);
        in_plus = sides & 1;
        in_minus = sides & 2;
    }
    float s, c;
    plus = float2{0.f, 0.f};
    minus = float2{0.f, 0.f};
    if (in_plus) {
        phase_factor(here - chi<N>(xf - qf.y, yf - qf.x, poly), &s, &c);
        plus = float2{c, s};
    }
    if (in_minus) {
        phase_factor(chi<N>(xf + qf.y, yf + qf.x, poly) - here, &s, &c);
        minus = float2{c, s};
    }
    return (int)in_plus | ((int)in_minus << 1);
}

// Terms a thread sums in float32 before adding them to its float64 sums: each is at most |G|, so a partial is good
// to about SUM_RUN float32 roundings of the largest, far inside the twins' agreement.
constexpr int SUM_RUN = 32;

// pixel[k] = (k_y, k_x, |k|^2 - kmax2, chi(k)) in float32, the third +inf for a pixel outside the aperture (decided
// in float64, as the CPU twin does); ky, kx the same k in float64 for the aperture tests near an edge.
template <int N>
__global__ void sideband_sum(const float2* __restrict__ G, i64 n_pix, int rows, int half_cols, const float4* __restrict__ pixel,
                             const double* __restrict__ ky, const double* __restrict__ kx, const Poly<N> poly, double dqy, double dqx,
                             double kmax2, float floor, i64 per_slice, double* __restrict__ total_re, double* __restrict__ total_im,
                             double* __restrict__ weight) {
    i64 nq = (i64)rows * half_cols;
    i64 q = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= nq) return;
    int r = (int)(q / half_cols), c = (int)(q % half_cols);
    double qy = (r < (rows + 1) / 2 ? r : r - rows) * dqy;
    double qx = c * dqx;
    i64 lo = (i64)blockIdx.y * per_slice;
    i64 hi = min(n_pix, lo + per_slice);
    float4 qf{(float)qy, (float)qx, (float)(qy * qy + qx * qx), 0.f};
    double2 qd{qy, qx};
    float edge = 1e-5f * (float)kmax2;
    double sr = 0.0, si = 0.0, sw = 0.0;
    for (i64 run = lo; run < hi; run += SUM_RUN) {
        float fr = 0.f, fi = 0.f, fw = 0.f;
        for (i64 k = run; k < min(hi, run + SUM_RUN); ++k) {
            float4 p = pixel[k];
            float2 plus, minus;
            if (!(p.z <= 0.f) || !trotters<N>(p.x, p.y, p.z, ky + k, kx + k, p.w, qf, &qd, poly, edge, kmax2, plus, minus)) continue;
            float gr = plus.x - minus.x, gi = plus.y - minus.y;
            float size = sqrtf(gr * gr + gi * gi);
            if (!(size > floor)) continue;
            float2 g = G[k * nq + q];
            float inv = 1.f / size;
            fr += (g.x * gr + g.y * gi) * inv;
            fi += (g.y * gr - g.x * gi) * inv;
            fw += size;
        }
        sr += (double)fr;
        si += (double)fi;
        sw += (double)fw;
    }
    i64 at = (i64)blockIdx.y * nq + q;
    total_re[at] = sr;
    total_im[at] = si;
    weight[at] = sw;
}

// ---------------------------------------------------------------- the aberration fit's signal

// The part of a detector pixel at radius r (1/A) inside the aperture: a ramp one pixel wide across its edge.
__device__ __forceinline__ float inside(float r, float cutoff, float inv_pixel) {
    return fminf(fmaxf(fmaf(cutoff - r, inv_pixel, 0.5f), 0.f), 1.f);
}

// The coherent SSB signal's terms for a batch of trial aberrations (qgpu_dask/phase/fit.py Signal), twin of
// qgpu_dask/phase/cpu.py fit_terms_loop. Block (q, p): scan frequency q = (qy[q / nqx], qx[q % nqx]) and trial
// row p = (pi lambda C10, pi lambda C12a, pi lambda C12b, cos t, sin t) of the detector rotation t; its threads
// take the pixels k = 0, step, 2 step, ... of uv (coordinates before the rotation: k_y = cos t u - sin t v,
// k_x = sin t u + cos t v) and Gt (nq, n_pix). With the overlaps o- = a(k) a(k - q), o+ = a(k) a(k + q) (a: inside)
// and the phase differences d- = chi(k) - chi(k - q), d+ = chi(k + q) - chi(k) (the quadratic part of chi
// differenced exactly, the rest by chi<N>), Gamma = o- exp(i d-) - o+ exp(i d+), and
//   terms[p, q] = | sum_k max(o-, o+) G(k, q) conj(Gamma) / |Gamma| |   over |Gamma| > floor.
// Evaluated in float32, summed in float64 (each thread, then the block's warps in a fixed order).
// Threads of a block (a multiple of 32): qgpu_dask/phase/cuda.py launches fit_terms with as many.
#ifndef FIT_THREADS
#error "FIT_THREADS comes from qgpu_dask/phase/cuda.py"
#endif

template <int N>
__global__ void __launch_bounds__(FIT_THREADS) fit_terms(const float2* __restrict__ Gt, i64 n_pix, int step, const float2* __restrict__ uv,
                                                         const float* __restrict__ params, const float* __restrict__ qy,
                                                         const float* __restrict__ qx, int nqx, const Poly<N> poly, float cutoff,
                                                         float inv_pixel, float floor, double* __restrict__ terms) {
    __shared__ double partial[FIT_THREADS / 32][2];
    i64 nq = gridDim.x, q = blockIdx.x, p = blockIdx.y;
    const float* row = params + 5 * p;
    float c10 = row[0], a = row[1], b = row[2], ct = row[3], st = row[4];
    float fy = qy[q / nqx], fx = qx[q % nqx];
    float quad = c10 * (fx * fx + fy * fy) + a * (fx * fx - fy * fy) + 2.f * b * fx * fy;
    const float2* g_row = Gt + q * n_pix;
    double sr = 0.0, si = 0.0;
    for (i64 k = (i64)threadIdx.x * step; k < n_pix; k += (i64)FIT_THREADS * step) {
        float2 w = uv[k];
        float y = ct * w.x - st * w.y, x = st * w.x + ct * w.y;
        float here = inside(hypotf(x, y), cutoff, inv_pixel);
        float om = here * inside(hypotf(x - fx, y - fy), cutoff, inv_pixel);
        float op = here * inside(hypotf(x + fx, y + fy), cutoff, inv_pixel);
        if (om == 0.f && op == 0.f) continue;
        float lin = 2.f * (c10 * (y * fy + x * fx) + a * (x * fx - y * fy) + b * (x * fy + y * fx));
        float dm = lin - quad, dp = lin + quad;
        if constexpr (N > 0) {
            float centre = chi<N>(x, y, poly);
            dm += centre - chi<N>(x - fx, y - fy, poly);
            dp += chi<N>(x + fx, y + fy, poly) - centre;
        }
        float sm, cm, sp, cp;
        phase_factor(dm, &sm, &cm);
        phase_factor(dp, &sp, &cp);
        float gr = om * cm - op * cp, gi = om * sm - op * sp;
        float size = sqrtf(gr * gr + gi * gi);
        if (!(size > floor)) continue;
        float2 g = g_row[k];
        float f = fmaxf(om, op) / size;
        sr += (double)((g.x * gr + g.y * gi) * f);
        si += (double)((g.y * gr - g.x * gi) * f);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        sr += __shfl_down_sync(0xffffffffu, sr, offset);
        si += __shfl_down_sync(0xffffffffu, si, offset);
    }
    int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        partial[warp][0] = sr;
        partial[warp][1] = si;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double re = 0.0, im = 0.0;
        for (int i = 0; i < FIT_THREADS / 32; ++i) {
            re += partial[i][0];
            im += partial[i][1];
        }
        terms[p * nq + q] = sqrt(re * re + im * im);
    }
}

// ---------------------------------------------------------------- direct ptychography

// Doubles per column of a warp's buffer (32 pixels, padded so fragment loads meet no bank conflict), written only in
// qgpu_dask/phase/cuda.py (which sizes the shared memory by it) and passed from there as a -D option.
#ifndef COLUMN_STRIDE
#error "COLUMN_STRIDE comes from qgpu_dask/phase/cuda.py"
#endif
constexpr int BLOCKS_PER_PASS = 8;  // 16 x 8 blocks of Y^T Y a warp keeps in registers during one pass over the pixels

struct Block {
    int row, col;  // Y^T Y [16 row .. 16 row + 15, 8 col .. 8 col + 7]
};

// The index-th 16 x 8 block on or above the diagonal of a matrix of `tiles` column tiles of 8, row block by row block.
__host__ __device__ constexpr Block block_at(int index, int tiles) {
    int row = 0;
    while (index >= tiles - 2 * row) {
        index -= tiles - 2 * row;
        ++row;
    }
    return Block{row, 2 * row + index};
}

__host__ __device__ constexpr int block_count(int tiles) {
    int count = 0;
    for (int row = 0; 2 * row < tiles; ++row) count += tiles - 2 * row;
    return count;
}

// The products of regularized direct ptychography's normal equations (qgpu_dask/phase/direct.py) for frequencies
// with D aliases each: for the n frequencies freq[f] of the half spectrum (flat, nq of them), with the aliases' q
// at alias_q[f, m] (1/A, (q_y, q_x)), X = [T, g] scaled by sqrt(W) per pixel, with one column of T per alias
// (phase: i (Gamma_plus - Gamma_minus) / u^2) or two (complex: Gamma_plus / u^2, then Gamma_minus / u^2), and
// Y = [Re X, Im X] (C + 1 complex columns, 2 (C + 1) real ones): yy[f] = Y^T Y, on and above its diagonal
// (normal_gram turns it into T^H W T and T^H W g). Slot s holds the pixel of G row pixel[s] at (ky, kx)[s], k_f[s] in float32.
// One warp per frequency. The warp takes 32 slots at a time: each lane evaluates its pixel's columns in float32
// registers (chi from its monomials, kernel parameters) and stores Y's row as float64 in the warp's buffer, column by
// column (zeros for a pixel with no term). Then Y^T Y of the 32 rows is added 4 rows at a time on the float64
// tensor cores, one m16n8k4 product per 16 x 8 block on or above the diagonal (Y's 16 x 4 fragment of a row
// block holds the same values as its two 4 x 8 column tiles: one load per tile); four-row steps with no term
// are skipped. More blocks than BLOCKS_PER_PASS (many aliases) take several passes over the pixels.
// Twin: normal_equations in qgpu_dask/phase/direct_cpu.py (with normal_gram).
template <int N, int D, bool COMPLEX>
__global__ void normal_equations(const float2* __restrict__ G, i64 nq, const i64* __restrict__ pixel, i64 n_pix,
                                 const i64* __restrict__ freq, i64 n, const double* __restrict__ ky, const double* __restrict__ kx,
                                 const float2* __restrict__ k_f, const float* __restrict__ chi_k, const float* __restrict__ root_w, const Poly<N> poly,
                                 const double* __restrict__ alias_q, double kmax2, float inv_u2, double* __restrict__ yy) {
    constexpr int C = COMPLEX ? 2 * D : D;
    constexpr int WIDTH = 2 * (C + 1);             // Y's columns: Re T, Re g, Im T, Im g
    constexpr int TILES = (WIDTH + 7) / 8;          // column tiles of 8
    constexpr int SPAN = 16 * ((WIDTH + 15) / 16);  // columns in the buffer: whole row blocks of 16
    constexpr int BLOCKS = block_count(TILES);
    extern __shared__ double buffer_all[];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    i64 f = (i64)blockIdx.x * (blockDim.x / 32) + warp;
    if (f >= n) return;  // whole warps leave; only warp-level synchronisation follows
    i64 q = freq[f];
    double* buffer = buffer_all + (i64)warp * (SPAN * COLUMN_STRIDE + 4 * D);  // buffer[c * COLUMN_STRIDE + slot]
    double2* alias = (double2*)(buffer + SPAN * COLUMN_STRIDE);                 // the aliases' (q_y, q_x), read by every lane at once
    float4* alias_f = (float4*)(alias + D);                                     // and (q_y, q_x, |q|^2, 0) in float32
    for (int m = lane; m < D; m += 32) {
        double qy = alias_q[(f * D + m) * 2], qx = alias_q[(f * D + m) * 2 + 1];
        alias[m] = double2{qy, qx};
        alias_f[m] = float4{(float)qy, (float)qx, (float)(qy * qy + qx * qx), 0.f};
    }
    for (int c = WIDTH; c < SPAN; ++c) buffer[c * COLUMN_STRIDE + lane] = 0.0;  // padding columns
    __syncwarp();
    const float edge = 1e-5f * (float)kmax2;
    double* mine = buffer + lane;  // this lane's row of Y
    int row = lane / 4, quad = lane % 4;

    for (int first = 0; first < BLOCKS; first += BLOCKS_PER_PASS) {
        double acc[BLOCKS_PER_PASS][4];
#pragma unroll
        for (int b = 0; b < BLOCKS_PER_PASS; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.0;
        for (i64 base = 0; base < n_pix; base += 32) {
            i64 s = base + lane;
            int any = 0;
            if (s < n_pix) {
                double y = ky[s], x = kx[s];
                float2 kf = k_f[s];
                float yf = kf.x, xf = kf.y, here = chi_k[s], rw = root_w[s], w = rw * inv_u2;
                bool inside = x * x + y * y <= kmax2;
                float k_off = fmaf(xf, xf, yf * yf) - (float)kmax2;  // |k|^2 <= kmax2: good to about 2e-7 kmax2
#pragma unroll
                for (int m = 0; m < D; ++m) {
                    float2 plus{0.f, 0.f}, minus{0.f, 0.f};
                    if (inside) any |= trotters<N>(yf, xf, k_off, ky + s, kx + s, here, alias_f[m], alias + m, poly, edge, kmax2, plus, minus);
                    if (COMPLEX) {
                        mine[m * COLUMN_STRIDE] = w * plus.x;
                        mine[(C + 1 + m) * COLUMN_STRIDE] = w * plus.y;
                        mine[(D + m) * COLUMN_STRIDE] = w * minus.x;
                        mine[(C + 1 + D + m) * COLUMN_STRIDE] = w * minus.y;
                    } else {  // i (plus - minus)
                        mine[m * COLUMN_STRIDE] = -w * (plus.y - minus.y);
                        mine[(C + 1 + m) * COLUMN_STRIDE] = w * (plus.x - minus.x);
                    }
                }
                float2 g = any ? G[pixel[s] * nq + q] : float2{0.f, 0.f};
                mine[C * COLUMN_STRIDE] = rw * g.x;
                mine[(2 * C + 1) * COLUMN_STRIDE] = rw * g.y;
            } else {
                for (int c = 0; c < WIDTH; ++c) mine[c * COLUMN_STRIDE] = 0.0;
            }
            unsigned live = __ballot_sync(0xffffffffu, any);
            __syncwarp();
            for (int step = 0; step < 8; ++step) {
                if (((live >> (4 * step)) & 0xFu) == 0u) continue;  // the same for the whole warp
                const double* at = buffer + 4 * step + quad + row * COLUMN_STRIDE;  // Y[4 step + quad][8 t + row] at t * 8 * COLUMN_STRIDE
                if constexpr (BLOCKS <= BLOCKS_PER_PASS) {
                    double tile[SPAN / 8];
#pragma unroll
                    for (int t = 0; t < SPAN / 8; ++t) tile[t] = at[t * 8 * COLUMN_STRIDE];
#pragma unroll
                    for (int b = 0; b < BLOCKS; ++b) {
                        const Block k = block_at(b, TILES);
                        mma_f64(acc[b], tile[2 * k.row], tile[2 * k.row + 1], tile[k.col]);
                    }
                } else {
#pragma unroll
                    for (int b = 0; b < BLOCKS_PER_PASS; ++b) {
                        if (first + b >= BLOCKS) break;
                        const Block k = block_at(first + b, TILES);
                        mma_f64(acc[b], at[2 * k.row * 8 * COLUMN_STRIDE], at[(2 * k.row + 1) * 8 * COLUMN_STRIDE], at[k.col * 8 * COLUMN_STRIDE]);
                    }
                }
            }
            __syncwarp();
        }
        double* out = yy + f * WIDTH * WIDTH;
#pragma unroll
        for (int b = 0; b < BLOCKS_PER_PASS; ++b) {
            if (first + b >= BLOCKS) break;
            const Block k = block_at(first + b, TILES);
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                int i = 16 * k.row + row + 8 * (v / 2), j = 8 * k.col + 2 * quad + v % 2;
                if (i <= j && j < WIDTH) out[i * WIDTH + j] = acc[b][v];
            }
        }
    }
}

// T^H W T (n, C, C) and T^H W g (n, C) from normal_equations' yy (n, 2 (C + 1), 2 (C + 1), on and above the
// diagonal): with c = C + 1, Re X^H X [i, j] = YY[i, j] + YY[c + i, c + j], Im X^H X [i, j] = YY[i, c + j] - YY[j, c + i]
// (i <= j); column C of X is g. One thread per (frequency, i, j).
template <int C>
__global__ void normal_gram(const double* __restrict__ yy, i64 n, double2* __restrict__ gram, double2* __restrict__ rhs) {
    constexpr int c = C + 1, WIDTH = 2 * c;
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * C * c) return;
    i64 f = t / (C * c);
    int i = (int)(t % (C * c)) / c, j = (int)(t % c);
    if (j < i) return;
    const double* m = yy + f * WIDTH * WIDTH;
    double re = m[i * WIDTH + j] + m[(c + i) * WIDTH + c + j], im = m[i * WIDTH + c + j] - m[j * WIDTH + c + i];
    if (j == C) {
        rhs[f * C + i] = double2{re, im};
    } else {
        gram[(f * C + i) * C + j] = double2{re, im};
        if (j != i) gram[(f * C + j) * C + i] = double2{re, -im};
    }
}
