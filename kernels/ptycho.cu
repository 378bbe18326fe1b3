// One batch of a ptychographic pass on one frame's object: the twin of qgpu_dask/phase/iterative/cpu.py, compiled at run
// time by qgpu_dask/phase/iterative/cuda.py. The two FFTs between these kernels are cuFFT's.
//
// The object is (rows, cols) complex64; a batch is positions [first, first + n) of the frame, whose windows of
// R x C pixels have their top-left pixels at corners (n_positions, 2) int64. psi, far and updated are (n, R, C)
// complex64: the exit waves P O_R, their far fields, and the inverse FFT of the projected far fields.
// Every sum runs in a fixed order (no atomics), so a frame's pass gives the same bits however often it runs.

typedef long long i64;

__device__ __forceinline__ float2 times(float2 a, float2 b) { return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }
__device__ __forceinline__ float2 conj_times(float2 a, float2 b) { return make_float2(a.x * b.x + a.y * b.y, a.x * b.y - a.y * b.x); }
__device__ __forceinline__ float norm2(float2 a) { return a.x * a.x + a.y * a.y; }

// psi[k, r, s] = probe[r, s] object[corner_k + (r, s)]. Position k = blockIdx.x, window pixels by blockDim.x
// along blockIdx.y (no 64-bit divisions).
__global__ void exit_waves(const float2* __restrict__ object, i64 cols, const float2* __restrict__ probe, int R, int C,
                           const i64* __restrict__ corners, i64 first, float2* __restrict__ psi) {
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= R * C) return;
    i64 k = blockIdx.x;
    int r = j / C, s = j - r * C;
    const i64* corner = corners + 2 * (first + k);
    psi[k * R * C + j] = times(probe[j], object[(corner[0] + r) * cols + corner[1] + s]);
}

// The measured amplitude of a detector pixel: given, or sqrt of the counts (in float32, as the feed's amplitudes).
__device__ __forceinline__ float amplitude_of(float v) { return v; }
__device__ __forceinline__ float amplitude_of(unsigned char v) { return sqrtf((float)v); }
__device__ __forceinline__ float amplitude_of(unsigned short v) { return sqrtf((float)v); }
__device__ __forceinline__ float amplitude_of(unsigned int v) { return sqrtf((float)v); }

// The modulus projection, in place: far <- far a / |far| * scale (0 where |far| = 0), a the measured amplitude of
// the same frequency (measured[k] holds detector pixels, amplitudes or counts: frequency (r, s) is pixel
// (r + cr, s + cs) mod (R, C)); partial[block] = the block's sum of (|far| - a)^2 in float64, squares made in
// float32. Blocks as exit_waves'.
template <class T>
__global__ void project(float2* __restrict__ far, const T* __restrict__ measured, int R, int C, int cr, int cs,
                        float scale, double* __restrict__ partial) {
    __shared__ double sums[32];
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    double error = 0.0;
    if (j < R * C) {
        i64 at = (i64)blockIdx.x * R * C;
        int r = j / C, s = j - r * C;
        int ar = r + cr >= R ? r + cr - R : r + cr, as = s + cs >= C ? s + cs - C : s + cs;
        float a = amplitude_of(measured[at + ar * C + as]);
        float2 f = far[at + j];
        float m = sqrtf(norm2(f));
        float d = m - a;
        error = (double)(d * d);
        float ratio = m > 0.f ? a / m * scale : 0.f;
        far[at + j] = make_float2(f.x * ratio, f.y * ratio);
    }
    for (int o = 16; o > 0; o >>= 1) error += __shfl_down_sync(0xffffffffu, error, o);
    if ((threadIdx.x & 31) == 0) sums[threadIdx.x >> 5] = error;
    __syncthreads();
    if (threadIdx.x < 32) {
        error = threadIdx.x < (blockDim.x + 31) / 32 ? sums[threadIdx.x] : 0.0;
        for (int o = 16; o > 0; o >>= 1) error += __shfl_down_sync(0xffffffffu, error, o);
        if (threadIdx.x == 0) partial[(i64)blockIdx.y * gridDim.x + blockIdx.x] = error;
    }
}

// The probe's sums of the batch, by groups of `per_group` positions (blockIdx.y): with O_k the window of position k
// and chi_k = updated_k - P O_k, numerator[g, j] = sum_k conj(O_k[j]) chi_k[j] and denominator[g, j] = sum_k |O_k[j]|^2
// over the group's positions in order.
__global__ void probe_sums(const float2* __restrict__ object, i64 cols, const float2* __restrict__ probe,
                           const float2* __restrict__ updated, int R, int C, const i64* __restrict__ corners, i64 first, i64 n,
                           int per_group, float2* __restrict__ numerator, float* __restrict__ denominator) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    i64 w = (i64)R * C;
    if (j >= w) return;
    int r = j / C, s = j - r * C;
    float2 p = probe[j], top = make_float2(0.f, 0.f);
    float bottom = 0.f;
    i64 lo = (i64)blockIdx.y * per_group, hi = min(n, lo + per_group);
    for (i64 k = lo; k < hi; ++k) {
        const i64* corner = corners + 2 * (first + k);
        float2 o = object[(corner[0] + r) * cols + corner[1] + s];
        float2 u = updated[k * w + j], po = times(p, o);
        float2 t = conj_times(o, make_float2(u.x - po.x, u.y - po.y));
        top.x += t.x;
        top.y += t.y;
        bottom += norm2(o);
    }
    numerator[blockIdx.y * w + j] = top;
    denominator[blockIdx.y * w + j] = bottom;
}

// A block's tile of object pixels (one thread each, TILE_COLS x TILE_ROWS threads) and, further down, the columns
// per block of `columns` (TILE_C, one warp each), written only in qgpu_dask/phase/iterative/cuda.py (which
// launches the blocks) and passed from there as -D options (qgpu_dask/compile.py defines).
#ifndef TILE_ROWS
#error "TILE_ROWS comes from qgpu_dask/phase/iterative/cuda.py"
#endif
#ifndef TILE_COLS
#error "TILE_COLS comes from qgpu_dask/phase/iterative/cuda.py"
#endif
#ifndef TILE_C
#error "TILE_C comes from qgpu_dask/phase/iterative/cuda.py"
#endif

// The object's update, gathered: every pixel of the box (rows row0.., cols col0..; a grid of tiles) adds, over the
// batch's windows holding it in position order, top = sum conj(P) updated and lit = sum |P|^2, then
// O <- O + step (top - O lit) / (lit + floor), which is O + step sum conj(P) chi / (lit + floor) with chi = updated - P O.
// A block lists the positions whose windows meet its tile (in order, TILE_COLS * TILE_ROWS at a time) and each thread
// walks that list.
__global__ void object_update(float2* __restrict__ object, i64 cols, i64 row0, i64 row1, i64 col0, i64 col1,
                              const float2* __restrict__ probe, const float2* __restrict__ updated, int R, int C,
                              const i64* __restrict__ corners, i64 first, i64 n, float step, float floor) {
    __shared__ int hit_rows[TILE_COLS * TILE_ROWS], hit_cols[TILE_COLS * TILE_ROWS], hit_index[TILE_COLS * TILE_ROWS];
    __shared__ int warp_hits[TILE_COLS * TILE_ROWS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    i64 tr = row0 + (i64)blockIdx.y * TILE_ROWS, tc = col0 + (i64)blockIdx.x * TILE_COLS;
    i64 y = tr + threadIdx.x / TILE_COLS, x = tc + threadIdx.x % TILE_COLS;
    i64 w = (i64)R * C;
    float2 top = make_float2(0.f, 0.f);
    float lit = 0.f;
    for (i64 base = 0; base < n; base += blockDim.x) {
        i64 k = base + threadIdx.x;
        i64 cy = 0, cx = 0;
        bool hit = false;
        if (k < n) {
            cy = corners[2 * (first + k)];
            cx = corners[2 * (first + k) + 1];
            hit = cy < tr + TILE_ROWS && cy + R > tr && cx < tc + TILE_COLS && cx + C > tc;
        }
        unsigned mask = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_hits[warp] = __popc(mask);
        __syncthreads();
        int at = 0, hits = 0;
        for (int v = 0; v < warps; ++v) {
            at += v < warp ? warp_hits[v] : 0;
            hits += warp_hits[v];
        }
        if (hit) {
            at += __popc(mask & ((1u << lane) - 1u));
            hit_rows[at] = (int)(cy - tr);
            hit_cols[at] = (int)(cx - tc);
            hit_index[at] = (int)threadIdx.x;
        }
        __syncthreads();
        int dy = (int)(y - tr), dx = (int)(x - tc);
        for (int h = 0; h < hits; ++h) {
            int r = dy - hit_rows[h], s = dx - hit_cols[h];
            if (r >= 0 && r < R && s >= 0 && s < C) {
                float2 p = probe[r * C + s];
                float2 u = updated[(base + hit_index[h]) * w + (i64)r * C + s];
                float2 t = conj_times(p, u);
                top.x += t.x;
                top.y += t.y;
                lit += norm2(p);
            }
        }
        __syncthreads();
    }
    if (y < row1 && x < col1 && lit > 0.f) {
        float2 o = object[y * cols + x];
        float f = step / (lit + floor);
        object[y * cols + x] = make_float2(o.x + (top.x - o.x * lit) * f, o.y + (top.y - o.y * lit) * f);
    }
}

// ---------------------------------------------------------------- fused far-field update
// The same batch as exit_waves -> cuFFT -> project -> inverse cuFFT -> probe_sums, in three passes over the
// waves instead of nine: rows_forward (exit waves and their FFTs along rows), columns (FFTs along columns, the
// projection, inverse FFTs along columns), rows_inverse (inverse FFTs along rows, the probe's sums). Each FFT is
// a mixed-radix Stockham FFT (radices 2, 3, 4, 5, 8; natural order in and out) of one row or column by one warp
// in shared memory, its stages unrolled at compile time: a kernel is made for each window (Line<N, radices...>).

// Where point i of a line sits in shared memory: one pad after every 16 points, so the butterflies' strided
// stores fall in different banks. A line of n points takes padded(n).
__device__ __forceinline__ int at(int i) { return i + (i >> 4); }
__host__ __device__ constexpr int padded(int n) { return n + (n >> 4) + 1; }

// exp(-+2 pi i m / N) (forward: -), 0 <= m < N, from the fast sine and cosine (absolute error about 4e-7 on
// [-pi, pi]): no table to read.
template <bool INVERSE, int N>
__device__ __forceinline__ float2 twiddle(int m) {
    float s, c;
    __sincosf((float)(m > N / 2 ? m - N : m) * (-6.283185307179586f / N), &s, &c);
    return make_float2(c, INVERSE ? -s : s);
}

__device__ __forceinline__ float2 plus(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ float2 minus(float2 a, float2 b) { return make_float2(a.x - b.x, a.y - b.y); }
// -i z forward, +i z inverse: the quarter turn of the DFT's sign
template <bool INVERSE>
__device__ __forceinline__ float2 quarter(float2 z) { return INVERSE ? make_float2(-z.y, z.x) : make_float2(z.y, -z.x); }

// The 4-point DFT of a, b, c, d in place.
template <bool INVERSE>
__device__ __forceinline__ void dft4(float2& a, float2& b, float2& c, float2& d) {
    float2 s02 = plus(a, c), d02 = minus(a, c), s13 = plus(b, d), d13 = quarter<INVERSE>(minus(b, d));
    a = plus(s02, s13);
    c = minus(s02, s13);
    b = plus(d02, d13);
    d = minus(d02, d13);
}

// The R-point DFT of v in place (exp(-2 pi i / R) forward, its conjugate inverse), R in 2, 3, 4, 5, 8.
template <bool INVERSE, int R>
__device__ __forceinline__ void butterfly(float2* v) {
    constexpr float sign = INVERSE ? 1.f : -1.f;
    if constexpr (R == 2) {
        float2 a = v[0];
        v[0] = plus(a, v[1]);
        v[1] = minus(a, v[1]);
    } else if constexpr (R == 4) {
        dft4<INVERSE>(v[0], v[1], v[2], v[3]);
    } else if constexpr (R == 8) {  // two 4-point DFTs (even, odd points) joined by exp(-+2 pi i q / 8)
        dft4<INVERSE>(v[0], v[2], v[4], v[6]);
        dft4<INVERSE>(v[1], v[3], v[5], v[7]);
        const float h = 0.70710678118654752f;
        float2 o1 = times(v[3], make_float2(h, sign * h)), o2 = quarter<INVERSE>(v[5]), o3 = times(v[7], make_float2(-h, sign * h));
        float2 e0 = v[0], e1 = v[2], e2 = v[4], e3 = v[6], o0 = v[1];
        v[0] = plus(e0, o0);
        v[4] = minus(e0, o0);
        v[1] = plus(e1, o1);
        v[5] = minus(e1, o1);
        v[2] = plus(e2, o2);
        v[6] = minus(e2, o2);
        v[3] = plus(e3, o3);
        v[7] = minus(e3, o3);
    } else if constexpr (R == 3) {
        const float c = -0.5f, s = sign * 0.86602540378443865f;
        float2 t = plus(v[1], v[2]), d = minus(v[1], v[2]);
        float2 m = make_float2(v[0].x + c * t.x, v[0].y + c * t.y), w = make_float2(-s * d.y, s * d.x);
        v[0] = plus(v[0], t);
        v[1] = plus(m, w);
        v[2] = minus(m, w);
    } else {
        static_assert(R == 5, "radices are 2, 3, 4, 5 and 8");
        const float c1 = 0.30901699437494742f, c2 = -0.80901699437494742f;
        const float s1 = sign * 0.95105651629515357f, s2 = sign * 0.58778525229247313f;
        float2 t1 = plus(v[1], v[4]), d1 = minus(v[1], v[4]), t2 = plus(v[2], v[3]), d2 = minus(v[2], v[3]);
        float2 m1 = make_float2(v[0].x + c1 * t1.x + c2 * t2.x, v[0].y + c1 * t1.y + c2 * t2.y);
        float2 m2 = make_float2(v[0].x + c2 * t1.x + c1 * t2.x, v[0].y + c2 * t1.y + c1 * t2.y);
        float2 w1 = make_float2(-(s1 * d1.y + s2 * d2.y), s1 * d1.x + s2 * d2.x);
        float2 w2 = make_float2(-(s2 * d1.y - s1 * d2.y), s2 * d1.x - s1 * d2.x);
        v[0] = plus(v[0], plus(t1, t2));
        v[1] = plus(m1, w1);
        v[4] = minus(m1, w1);
        v[2] = plus(m2, w2);
        v[3] = minus(m2, w2);
    }
}

// Stages of one warp's N-point FFT from a (scratch b), sub-transforms of NS points done; returns where the result
// is. The caller syncs the warp before (a filled) and after (result read).
template <bool INVERSE, int N, int NS, int R, int... REST>
__device__ __forceinline__ float2* fft_stages(float2* a, float2* b, int lane) {
    constexpr int M = N / R, STEP = N / (NS * R);
#pragma unroll
    for (int j0 = 0; j0 < M; j0 += 32) {
        const int j = j0 + lane;
        if (j < M) {
            const int js = j % NS;
            float2 v[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                v[r] = a[at(j + r * M)];
                if (r > 0 && NS > 1) v[r] = times(v[r], twiddle<INVERSE, N>(js * r * STEP));
            }
            butterfly<INVERSE, R>(v);
            const int out = (j - js) * R + js;
#pragma unroll
            for (int q = 0; q < R; ++q) b[at(out + q * NS)] = v[q];
        }
    }
    __syncwarp();
    if constexpr (sizeof...(REST) == 0) {
        return b;
    } else {
        return fft_stages<INVERSE, N, NS * R, REST...>(b, a, lane);
    }
}

template <bool INVERSE, int N, int... RADICES>
__device__ __forceinline__ float2* fft(float2* a, float2* b, int lane) {
    if constexpr (sizeof...(RADICES) == 0) {
        return a;
    } else {
        return fft_stages<INVERSE, N, 1, RADICES...>(a, b, lane);
    }
}

// An N-point line: its radices, and whether its FFT ends in the scratch (an odd number of stages).
template <int N, int... RADICES>
struct Line {
    static constexpr bool odd = sizeof...(RADICES) & 1;
    template <bool INVERSE>
    __device__ static float2* fft(float2* a, float2* b, int lane) {
        return ::fft<INVERSE, N, RADICES...>(a, b, lane);
    }
};

// far[k, r, :] = FFT along the row of probe[r, :] object[corner_k + (r, :)], one warp per row of the batch;
// ROW is the Line of C points. Shared memory: 2 padded(C) per warp.
template <class ROW>
__global__ void rows_forward(const float2* __restrict__ object, i64 cols, const float2* __restrict__ probe, int R, int C,
                             const i64* __restrict__ corners, i64 first, i64 n, float2* __restrict__ far) {
    extern __shared__ float2 shared[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= n * R) return;
    i64 k = row / R;
    int r = (int)(row - k * R);
    const i64* corner = corners + 2 * (first + k);
    const float2* o = object + (corner[0] + r) * cols + corner[1];
    float2 *a = shared + 2 * warp * padded(C), *b = a + padded(C);
    for (int s = lane; s < C; s += 32) a[at(s)] = times(probe[r * C + s], o[s]);
    __syncwarp();
    const float2* x = ROW::template fft<false>(a, b, lane);
    for (int s = lane; s < C; s += 32) far[row * C + s] = x[at(s)];
}

// For a tile of TILE_C columns of position k = blockIdx.y: FFTs along the columns (one warp each), the modulus
// projection (as `project`, with `scale`), inverse FFTs along the columns, in place; partial[block] = the
// tile's error sum. COLUMN is the Line of R points. Shared memory: two padded(R) columns per warp.
template <class T, class COLUMN>
__global__ void columns(float2* __restrict__ far, const T* __restrict__ measured, int R, int C, int cr, int cs, float scale,
                        double* __restrict__ partial) {
    extern __shared__ float2 shared[];
    __shared__ double sums[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, pitch = padded(R);
    const i64 k = blockIdx.y;
    const int s0 = blockIdx.x * TILE_C, width = min(TILE_C, C - s0);
    float2* tile = shared;  // column c: tile + 2 c pitch (then its scratch)
    float2* wave = far + k * R * C + s0;
    for (int t = threadIdx.x; t < R * TILE_C; t += blockDim.x) {
        int r = t / TILE_C, c = t - r * TILE_C;
        if (c < width) tile[2 * c * pitch + at(r)] = wave[(i64)r * C + c];
    }
    __syncthreads();
    float2 *a = tile + 2 * warp * pitch, *b = a + pitch;
    if (warp < width) COLUMN::template fft<false>(a, b, lane);
    __syncthreads();
    double error = 0.0;
    const T* pattern = measured + k * R * C;
    for (int t = threadIdx.x; t < R * TILE_C; t += blockDim.x) {
        int r = t / TILE_C, c = t - r * TILE_C;
        if (c < width) {
            int ar = r + cr >= R ? r + cr - R : r + cr, s = s0 + c, as = s + cs >= C ? s + cs - C : s + cs;
            float amp = amplitude_of(pattern[(i64)ar * C + as]);
            float2* f = tile + 2 * c * pitch + (COLUMN::odd ? pitch : 0) + at(r);
            float m = sqrtf(norm2(*f));
            float d = m - amp;
            error += (double)(d * d);
            float ratio = m > 0.f ? amp / m * scale : 0.f;
            *f = make_float2(f->x * ratio, f->y * ratio);
        }
    }
    for (int o = 16; o > 0; o >>= 1) error += __shfl_down_sync(0xffffffffu, error, o);
    if (lane == 0) sums[warp] = error;
    __syncthreads();
    if (warp == 0) {
        error = lane < (blockDim.x >> 5) ? sums[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) error += __shfl_down_sync(0xffffffffu, error, o);
        if (lane == 0) partial[(i64)blockIdx.y * gridDim.x + blockIdx.x] = error;
    }
    if (warp < width) {
        if (COLUMN::odd) COLUMN::template fft<true>(b, a, lane);
        else COLUMN::template fft<true>(a, b, lane);
    }
    __syncthreads();
    for (int t = threadIdx.x; t < R * TILE_C; t += blockDim.x) {  // two FFTs of as many stages: back in the column's first half
        int r = t / TILE_C, c = t - r * TILE_C;
        if (c < width) wave[(i64)r * C + c] = tile[2 * c * pitch + at(r)];
    }
}

// Inverse FFTs along the rows, in place: far becomes the updated waves; and the probe's sums as probe_sums',
// by groups of per_group positions (blockIdx.y), one warp per row r (of the group's positions in order).
// ROW is the Line of C points, SLOTS >= C / 32 the row's pixels each lane sums. Shared memory: 2 padded(C) per
// warp.
template <int SLOTS, class ROW>
__global__ void rows_inverse(float2* __restrict__ far, const float2* __restrict__ object, i64 cols, const float2* __restrict__ probe,
                             int R, int C, const i64* __restrict__ corners, i64 first, i64 n, int per_group,
                             float2* __restrict__ numerator, float* __restrict__ denominator) {
    extern __shared__ float2 shared[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= R) return;
    float2 *a = shared + 2 * warp * padded(C), *b = a + padded(C);
    float2 top[SLOTS];
    float bottom[SLOTS];
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
        top[i] = make_float2(0.f, 0.f);
        bottom[i] = 0.f;
    }
    i64 lo = (i64)blockIdx.y * per_group, hi = min(n, lo + per_group);
    for (i64 k = lo; k < hi; ++k) {
        float2* wave = far + (k * R + r) * C;
        for (int s = lane; s < C; s += 32) a[at(s)] = wave[s];
        __syncwarp();
        const float2* u = ROW::template fft<true>(a, b, lane);
        const i64* corner = corners + 2 * (first + k);
        const float2* o = object + (corner[0] + r) * cols + corner[1];
#pragma unroll
        for (int i = 0; i < SLOTS; ++i) {
            int s = lane + 32 * i;
            if (s < C) {
                float2 v = u[at(s)], ob = o[s], po = times(probe[r * C + s], ob);
                wave[s] = v;
                float2 t = conj_times(ob, make_float2(v.x - po.x, v.y - po.y));
                top[i].x += t.x;
                top[i].y += t.y;
                bottom[i] += norm2(ob);
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
        int s = lane + 32 * i;
        if (s < C) {
            numerator[((i64)blockIdx.y * R + r) * C + s] = top[i];
            denominator[((i64)blockIdx.y * R + r) * C + s] = bottom[i];
        }
    }
}
