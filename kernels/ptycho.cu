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
// per block of `columns` (TILE_C) and the rows per block of rows_forward and rows_inverse (ROW_WARPS), written only in qgpu_dask/phase/iterative/cuda.py (which
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
#ifndef ROW_WARPS
#error "ROW_WARPS comes from qgpu_dask/phase/iterative/cuda.py"
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
// projection, inverse FFTs along columns), rows_inverse (inverse FFTs along rows, the probe's sums). A block
// transforms several lines at once in shared memory, each line of N = P Q points in two steps held in registers
// (Line<Dft<P, radices...>, Dft<Q, radices...>>, natural order in and out):
//   step 1: for each q < Q, one thread: the P-point DFT of x[Q p + q] over p, times exp(-+2 pi i q k / N) (k < P);
//   step 2: for each k < P, one thread: the Q-point DFT of step 1's values over q, which is X[k + P s] (s < Q).
// The P- and Q-point DFTs are mixed-radix in registers (radices 2, 3, 4, 5, 8), their twiddles compile-time
// constants; the N-point twiddles come from a table (`roots`, float32 of float64 values). Each point is read
// and written in shared memory twice per FFT.

// Where point i of a line sits in shared memory: one pad after every 16 points, so a line's neighbours fall in
// different banks. A line of n points takes padded(n).
__device__ __forceinline__ int at(int i) { return i + (i >> 4); }
__host__ __device__ constexpr int padded(int n) { return n + (n >> 4) + 1; }

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


// Compile-time loops: f(Index<i>{}) for BEGIN <= i < END, so each i can name a constant twiddle.
template <int I>
struct Index {
    static constexpr int value = I;
};
template <int BEGIN, int END, class F>
__device__ __forceinline__ void unrolled(F&& f) {
    if constexpr (BEGIN < END) {
        f(Index<BEGIN>{});
        unrolled<BEGIN + 1, END>(f);
    }
}

// cos and sin of 2 pi j / n in float64, evaluated by the compiler (Taylor series on [-pi, pi]).
__host__ __device__ constexpr double turn_series(int j, int n, bool sine) {
    double x = 6.283185307179586476925 * ((double)(j % n) / n - ((j % n) * 2 > n ? 1.0 : 0.0));
    double term = sine ? x : 1.0, sum = term;
    for (int i = sine ? 3 : 2; i < 40; i += 2) {
        term *= -x * x / ((double)i * (i - 1));
        sum += term;
    }
    return sum;
}

// z exp(-+2 pi i J / N) (forward: -), J a compile-time constant.
template <bool INVERSE, int N, int J>
__device__ __forceinline__ float2 turned(float2 z) {
    if constexpr (J % N == 0) {
        return z;
    } else {
        constexpr float c = (float)turn_series(J, N, false), s = (float)turn_series(J, N, true);
        return times(z, make_float2(c, INVERSE ? s : -s));
    }
}

// The N-point DFT of v in registers (natural order in and out), N = R M: the R M-point DFTs of v[R m + r] over m,
// each value times exp(-+2 pi i r k / N), then R-point butterflies across r (decimation in time).
template <bool INVERSE, int N, int R, int... REST>
__device__ __forceinline__ void dft(float2 (&v)[N]) {
    if constexpr (sizeof...(REST) == 0) {
        static_assert(N == R, "a Dft's radices multiply to its size");
        butterfly<INVERSE, R>(v);
    } else {
        constexpr int M = N / R;
        float2 y[R][M];
        unrolled<0, R>([&](auto ri) {
            constexpr int r = decltype(ri)::value;
            unrolled<0, M>([&](auto mi) { y[r][decltype(mi)::value] = v[R * decltype(mi)::value + r]; });
            dft<INVERSE, M, REST...>(y[r]);
        });
        unrolled<0, M>([&](auto ki) {
            constexpr int k = decltype(ki)::value;
            float2 u[R];
            unrolled<0, R>([&](auto ri) { u[decltype(ri)::value] = turned<INVERSE, N, decltype(ri)::value * k>(y[decltype(ri)::value][k]); });
            butterfly<INVERSE, R>(u);
            unrolled<0, R>([&](auto qi) { v[k + M * decltype(qi)::value] = u[decltype(qi)::value]; });
        });
    }
}

// An N-point DFT in registers and its radices (none for N = 1).
template <int N, int... RADICES>
struct Dft {
    static constexpr int n = N;
    template <bool INVERSE>
    __device__ static void run(float2 (&v)[N]) {
        if constexpr (sizeof...(RADICES) > 0) dft<INVERSE, N, RADICES...>(v);
    }
};

// A line of N = P Q points (FIRST: the P-point DFT, SECOND: the Q-point one). fft transforms `lines` lines, line l
// at data + l * pitch (point i at at(i)), in place, by all the block's threads (it syncs them: call it from every
// thread); scratch holds lines * P * scratch_pitch points; roots[m] = exp(-2 pi i m / N).
template <class FIRST, class SECOND>
struct Line {
    static constexpr int P = FIRST::n, Q = SECOND::n, N = P * Q;
    static constexpr int scratch_pitch = Q | 1;  // odd: a step's 16 threads of a half-warp meet distinct bank pairs
    template <bool INVERSE>
    __device__ static void fft(float2* data, int pitch, int lines, float2* scratch, const float2* __restrict__ roots) {
        for (int j = threadIdx.x; j < lines * Q; j += blockDim.x) {
            int l = j / Q, q = j - l * Q;
            const float2* x = data + l * pitch;
            float2 v[P];
#pragma unroll
            for (int p = 0; p < P; ++p) v[p] = x[at(Q * p + q)];
            FIRST::template run<INVERSE>(v);
            float2* y = scratch + l * P * scratch_pitch + q;
            y[0] = v[0];
#pragma unroll
            for (int k = 1; k < P; ++k) {
                float2 w = roots[q * k];
                y[k * scratch_pitch] = times(v[k], make_float2(w.x, INVERSE ? -w.y : w.y));
            }
        }
        __syncthreads();
        for (int j = threadIdx.x; j < lines * P; j += blockDim.x) {
            int l = j / P, k = j - l * P;
            const float2* y = scratch + (l * P + k) * scratch_pitch;
            float2 u[Q];
#pragma unroll
            for (int q = 0; q < Q; ++q) u[q] = y[q];
            SECOND::template run<INVERSE>(u);
            float2* x = data + l * pitch;
#pragma unroll
            for (int s = 0; s < Q; ++s) x[at(k + P * s)] = u[s];
        }
        __syncthreads();
    }
};

// far[k, r, :] = FFT along the row of probe[r, :] object[corner_k + (r, :)], ROW_WARPS rows of the batch per
// block (a warp per row loads and stores). ROW is the Line of C points. Shared memory: ROW_WARPS padded(C) points, then
// the FFT's scratch.
template <class ROW>
__global__ void rows_forward(const float2* __restrict__ object, i64 cols, const float2* __restrict__ probe, int R, int C,
                             const i64* __restrict__ corners, i64 first, i64 n, const float2* __restrict__ roots, float2* __restrict__ far) {
    extern __shared__ float2 shared[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5, pitch = padded(C);
    const i64 row0 = (i64)blockIdx.x * ROW_WARPS;
    const int count = (int)min((i64)ROW_WARPS, n * R - row0);
    float2 *lines = shared, *scratch = shared + ROW_WARPS * pitch;
    for (int l = warp; l < count; l += warps) {
        i64 row = row0 + l, k = row / R;
        int r = (int)(row - k * R);
        const i64* corner = corners + 2 * (first + k);
        const float2* o = object + (corner[0] + r) * cols + corner[1];
        for (int s = lane; s < C; s += 32) lines[l * pitch + at(s)] = times(probe[r * C + s], o[s]);
    }
    __syncthreads();
    ROW::template fft<false>(lines, pitch, count, scratch, roots);
    for (int l = warp; l < count; l += warps)
        for (int s = lane; s < C; s += 32) far[(row0 + l) * C + s] = lines[l * pitch + at(s)];
}

// For a tile of TILE_C columns of position k = blockIdx.y: FFTs along the columns, the modulus projection (as
// `project`, with `scale`), inverse FFTs along the columns, in place; partial[block] = the tile's error sum.
// COLUMN is the Line of R points. Shared memory: TILE_C padded(R) points, then the FFT's scratch.
template <class T, class COLUMN>
__global__ void columns(float2* __restrict__ far, const T* __restrict__ measured, int R, int C, int cr, int cs, float scale,
                        const float2* __restrict__ roots, double* __restrict__ partial) {
    extern __shared__ float2 shared[];
    __shared__ double sums[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, pitch = padded(R);
    const i64 k = blockIdx.y;
    const int s0 = blockIdx.x * TILE_C, width = min(TILE_C, C - s0);
    float2 *tile = shared, *scratch = shared + TILE_C * pitch;  // column c: tile + c pitch
    float2* wave = far + k * R * C + s0;
    for (int t = threadIdx.x; t < R * TILE_C; t += blockDim.x) {
        int r = t / TILE_C, c = t - r * TILE_C;
        if (c < width) tile[c * pitch + at(r)] = wave[(i64)r * C + c];
    }
    __syncthreads();
    COLUMN::template fft<false>(tile, pitch, width, scratch, roots);
    double error = 0.0;
    const T* pattern = measured + k * R * C;
    for (int t = threadIdx.x; t < R * TILE_C; t += blockDim.x) {
        int r = t / TILE_C, c = t - r * TILE_C;
        if (c < width) {
            int ar = r + cr >= R ? r + cr - R : r + cr, s = s0 + c, as = s + cs >= C ? s + cs - C : s + cs;
            float amp = amplitude_of(pattern[(i64)ar * C + as]);
            float2* f = tile + c * pitch + at(r);
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
    COLUMN::template fft<true>(tile, pitch, width, scratch, roots);
    for (int t = threadIdx.x; t < R * TILE_C; t += blockDim.x) {
        int r = t / TILE_C, c = t - r * TILE_C;
        if (c < width) wave[(i64)r * C + c] = tile[c * pitch + at(r)];
    }
}

// Inverse FFTs along the rows, in place: far becomes the updated waves; and the probe's sums as probe_sums',
// by groups of per_group positions (blockIdx.y), ROW_WARPS rows r per block (a warp each) for
// each of the group's positions in order. ROW is the Line of C points, SLOTS >= C / 32 the row's pixels each lane
// sums. Shared memory: ROW_WARPS padded(C) points, then the FFT's scratch.
template <int SLOTS, class ROW>
__global__ void rows_inverse(float2* __restrict__ far, const float2* __restrict__ object, i64 cols, const float2* __restrict__ probe,
                             int R, int C, const i64* __restrict__ corners, i64 first, i64 n, int per_group,
                             const float2* __restrict__ roots, float2* __restrict__ numerator, float* __restrict__ denominator) {
    extern __shared__ float2 shared[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, pitch = padded(C);
    const int r0 = blockIdx.x * ROW_WARPS, count = min(ROW_WARPS, R - r0), r = r0 + warp;
    float2 *lines = shared, *scratch = shared + ROW_WARPS * pitch, *mine = lines + warp * pitch;
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
        if (warp < count)
            for (int s = lane; s < C; s += 32) mine[at(s)] = wave[s];
        __syncthreads();
        ROW::template fft<true>(lines, pitch, count, scratch, roots);
        if (warp < count) {
            const i64* corner = corners + 2 * (first + k);
            const float2* o = object + (corner[0] + r) * cols + corner[1];
#pragma unroll
            for (int i = 0; i < SLOTS; ++i) {
                int s = lane + 32 * i;
                if (s < C) {
                    float2 v = mine[at(s)], ob = o[s], po = times(probe[r * C + s], ob);
                    wave[s] = v;
                    float2 t = conj_times(ob, make_float2(v.x - po.x, v.y - po.y));
                    top[i].x += t.x;
                    top[i].y += t.y;
                    bottom[i] += norm2(ob);
                }
            }
        }
        __syncthreads();
    }
    if (warp >= count) return;
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
        int s = lane + 32 * i;
        if (s < C) {
            numerator[((i64)blockIdx.y * R + r) * C + s] = top[i];
            denominator[((i64)blockIdx.y * R + r) * C + s] = bottom[i];
        }
    }
}
