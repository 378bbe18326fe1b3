// One batch of a ptychographic pass on one frame's object: the twin of qgpu_dask/phase/iterative/cpu.py, compiled at run
// time by qgpu_dask/phase/iterative/cuda.py. The two FFTs between these kernels are cuFFT's; the fused kernels further
// down take their FFTs from fft.cuh.
//
// The object is (rows, cols) complex64; a batch is positions [first, first + n) of the frame, whose windows of
// R x C pixels have their top-left pixels at corners (n_positions, 2) int64. psi, far and updated are (n, R, C)
// complex64: the exit waves P O_R, their far fields, and the inverse FFT of the projected far fields.
// Every sum runs in a fixed order (no atomics), so a frame's pass gives the same bits however often it runs.

typedef long long i64;

#include "fft.cuh"
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // thread-block clusters: compute capability 9.0 and later
#include "cluster.cuh"
#endif

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

// The measured amplitude of frequency (r, s) of a pattern of detector pixels: pixel (r + cr, s + cs) mod (R, C).
template <class T>
__device__ __forceinline__ float amplitude_at(const T* __restrict__ pattern, int r, int s, int R, int C, int cr, int cs) {
    int ar = r + cr >= R ? r + cr - R : r + cr, as = s + cs >= C ? s + cs - C : s + cs;
    return amplitude_of(pattern[(i64)ar * C + as]);
}

// The modulus projection of one frequency, in place: f <- f a / |f| * scale (0 where |f| = 0); (|f| - a)^2 in float32.
__device__ __forceinline__ float projected(float2& f, float a, float scale) {
    float m = sqrtf(norm2(f)), d = m - a, ratio = m > 0.f ? a / m * scale : 0.f;
    f = make_float2(f.x * ratio, f.y * ratio);
    return d * d;
}

// The sum of every thread's value over the block, in thread 0 (warps' sums, then warp 0's; a fixed order). Every
// thread calls it; sums: 32 doubles of shared memory.
__device__ double block_sum(double value, double* sums) {
    for (int o = 16; o > 0; o >>= 1) value += __shfl_down_sync(0xffffffffu, value, o);
    if ((threadIdx.x & 31) == 0) sums[threadIdx.x >> 5] = value;
    __syncthreads();
    if (threadIdx.x >= 32) return 0.0;
    value = threadIdx.x < (blockDim.x + 31) / 32 ? sums[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1) value += __shfl_down_sync(0xffffffffu, value, o);
    return value;
}

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
        error = (double)projected(far[at + j], amplitude_at(measured + at, r, s, R, C, cr, cs), scale);
    }
    error = block_sum(error, sums);
    if (threadIdx.x == 0) partial[(i64)blockIdx.y * gridDim.x + blockIdx.x] = error;
}

// Loads a thread of probe_sums or object_update issues before it adds their values: enough bytes in flight for the
// memory's latency (one at a time, object_update read the updated waves at 1.4 TB/s on the H200).
constexpr int LOAD_RUN = 8;

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
    for (i64 k0 = lo; k0 < hi; k0 += LOAD_RUN) {
        // a run of positions: every load first, then the sums in position order (past hi: zeros, which add nothing)
        float2 o[LOAD_RUN], u[LOAD_RUN];
#pragma unroll
        for (int i = 0; i < LOAD_RUN; ++i) {
            i64 k = k0 + i;
            const i64* corner = corners + 2 * (first + (k < hi ? k : lo));
            o[i] = k < hi ? object[(corner[0] + r) * cols + corner[1] + s] : make_float2(0.f, 0.f);
            u[i] = k < hi ? updated[k * w + j] : make_float2(0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < LOAD_RUN; ++i) {
            float2 po = times(p, o[i]), t = conj_times(o[i], make_float2(u[i].x - po.x, u[i].y - po.y));
            top.x += t.x;
            top.y += t.y;
            bottom += norm2(o[i]);
        }
    }
    numerator[blockIdx.y * w + j] = top;
    denominator[blockIdx.y * w + j] = bottom;
}

// A block's tile of object pixels (one thread each, TILE_COLS x TILE_ROWS threads) and, further down, the columns
// per block of `columns` (TILE_C), the rows per block of rows_forward and rows_inverse (ROW_WARPS) and the lines
// far_field_pair transforms at once (PAIR_LINES), written only in qgpu_dask/phase/iterative/cuda.py (which launches
// the blocks) and passed from there as -D options (qgpu_dask/compile.py defines), as are far_field_pair's threads
// (PAIR_THREADS, its launch bound).
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
#ifndef PAIR_LINES
#error "PAIR_LINES comes from qgpu_dask/phase/iterative/cuda.py"
#endif
#ifndef PAIR_THREADS
#error "PAIR_THREADS comes from qgpu_dask/phase/iterative/cuda.py"
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
        for (int h0 = 0; h0 < hits; h0 += LOAD_RUN) {
            // a run of hits: every load first (LOAD_RUN of them in flight), then the sums in position order
            float2 p[LOAD_RUN], u[LOAD_RUN];
#pragma unroll
            for (int j = 0; j < LOAD_RUN; ++j) {
                int h = h0 + j, r = h < hits ? dy - hit_rows[h] : -1, s = h < hits ? dx - hit_cols[h] : -1;
                bool in = r >= 0 && r < R && s >= 0 && s < C;
                p[j] = in ? probe[r * C + s] : make_float2(0.f, 0.f);
                u[j] = in ? updated[(base + hit_index[h]) * w + (i64)r * C + s] : make_float2(0.f, 0.f);
            }
#pragma unroll
            for (int j = 0; j < LOAD_RUN; ++j) {
                float2 t = conj_times(p[j], u[j]);
                top.x += t.x;
                top.y += t.y;
                lit += norm2(p[j]);
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
// transforms several lines at once in shared memory (fft.cuh Line).

// far[k, r, :] = FFT along the row of probe[r, :] object[corner_k + (r, :)], ROW_WARPS rows of the batch per
// block (a warp per row loads and stores). ROW is the Line of C points. Shared memory: ROW_WARPS lines of ROW::pitch points, then
// the FFT's scratch.
template <class ROW>
__global__ void rows_forward(const float2* __restrict__ object, i64 cols, const float2* __restrict__ probe, int R, int C,
                             const i64* __restrict__ corners, i64 first, i64 n, const float2* __restrict__ roots, float2* __restrict__ far) {
    extern __shared__ float2 shared[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5, pitch = ROW::pitch;
    const i64 row0 = (i64)blockIdx.x * ROW_WARPS;
    const int count = (int)min((i64)ROW_WARPS, n * R - row0);
    float2 *lines = shared, *scratch = shared + ROW_WARPS * pitch;
    for (int l = warp; l < count; l += warps) {
        i64 row = row0 + l, k = row / R;
        int r = (int)(row - k * R);
        const i64* corner = corners + 2 * (first + k);
        const float2* o = object + (corner[0] + r) * cols + corner[1];
        for (int s = lane; s < C; s += 32) lines[l * pitch + s] = times(probe[r * C + s], o[s]);
    }
    __syncthreads();
    ROW::template fft<false>(lines, count, scratch, roots);
    for (int l = warp; l < count; l += warps)
        for (int s = lane; s < C; s += 32) far[(row0 + l) * C + s] = lines[l * pitch + s];
}

// Where thread t of a columns block loads, projects and stores: (column, row) of the tile, a half-warp taking
// an A x B block (A columns of 8 bytes side by side in memory, B = 16 / A rows), A chosen so that the block's
// points, columns PITCH apart, fall in 16 distinct bank pairs: 8 for a pitch of 2 modulo 4, 4 for 4 modulo 8,
// 2 for 8 modulo 16 (an odd pitch takes 8, with conflicts). Threads t < points(R) cover R rows rounded up to B.
template <int PITCH>
struct TileOrder {
    static constexpr int A = PITCH % 4 == 2 ? 8 : PITCH % 8 == 4 ? 4 : PITCH % 16 == 8 ? 2 : 8, B = 16 / A, GROUPS = TILE_C / A;
    static_assert(TILE_C % A == 0, "whole blocks of columns");
    __device__ static int points(int R) { return TILE_C * B * ((R + B - 1) / B); }
    __device__ static int2 point(int t) {
        const int h = t >> 4, i = t & 15;
        return int2{i % A + A * (h % GROUPS), i / A + B * (h / GROUPS)};
    }
};

// For a tile of TILE_C columns of position k = blockIdx.y: FFTs along the columns, the modulus projection (as
// `project`, with `scale`), inverse FFTs along the columns, in place; partial[block] = the tile's error sum.
// COLUMN is the Line of R points. Shared memory: TILE_C lines of COLUMN::pitch points, then the FFT's scratch.
template <class T, class COLUMN>
__global__ void columns(float2* __restrict__ far, const T* __restrict__ measured, int R, int C, int cr, int cs, float scale,
                        const float2* __restrict__ roots, double* __restrict__ partial) {
    extern __shared__ float2 shared[];
    __shared__ double sums[32];
    constexpr int pitch = COLUMN::pitch;
    const i64 k = blockIdx.y;
    using order = TileOrder<pitch>;
    const int s0 = blockIdx.x * TILE_C, width = min(TILE_C, C - s0), points = order::points(R);
    float2 *tile = shared, *scratch = shared + TILE_C * pitch;  // column c: tile + c pitch
    float2* wave = far + k * R * C + s0;
    for (int t = threadIdx.x; t < points; t += blockDim.x) {
        const int2 p = order::point(t);
        if (p.x < width && p.y < R) tile[p.x * pitch + p.y] = wave[(i64)p.y * C + p.x];
    }
    __syncthreads();
    COLUMN::template fft<false>(tile, width, scratch, roots);
    double error = 0.0;
    const T* pattern = measured + k * R * C;
    for (int t = threadIdx.x; t < points; t += blockDim.x) {
        const int2 p = order::point(t);
        if (p.x < width && p.y < R)
            error += (double)projected(tile[p.x * pitch + p.y], amplitude_at(pattern, p.y, s0 + p.x, R, C, cr, cs), scale);
    }
    error = block_sum(error, sums);
    if (threadIdx.x == 0) partial[(i64)blockIdx.y * gridDim.x + blockIdx.x] = error;
    COLUMN::template fft<true>(tile, width, scratch, roots);
    for (int t = threadIdx.x; t < points; t += blockDim.x) {
        const int2 p = order::point(t);
        if (p.x < width && p.y < R) wave[(i64)p.y * C + p.x] = tile[p.x * pitch + p.y];
    }
}

// Inverse FFTs along the rows, in place: far becomes the updated waves; and the probe's sums as probe_sums',
// by groups of per_group positions (blockIdx.y), ROW_WARPS rows r per block (a warp each) for
// each of the group's positions in order. ROW is the Line of C points, SLOTS >= C / 32 the row's pixels each lane
// sums. Shared memory: ROW_WARPS lines of ROW::pitch points, then the FFT's scratch.
template <int SLOTS, class ROW>
__global__ void rows_inverse(float2* __restrict__ far, const float2* __restrict__ object, i64 cols, const float2* __restrict__ probe,
                             int R, int C, const i64* __restrict__ corners, i64 first, i64 n, int per_group,
                             const float2* __restrict__ roots, float2* __restrict__ numerator, float* __restrict__ denominator) {
    extern __shared__ float2 shared[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, pitch = ROW::pitch;
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
            for (int s = lane; s < C; s += 32) mine[s] = wave[s];
        __syncthreads();
        ROW::template fft<true>(lines, count, scratch, roots);
        if (warp < count) {
            const i64* corner = corners + 2 * (first + k);
            const float2* o = object + (corner[0] + r) * cols + corner[1];
#pragma unroll
            for (int i = 0; i < SLOTS; ++i) {
                int s = lane + 32 * i;
                if (s < C) {
                    float2 v = mine[s], ob = o[s], po = times(probe[r * C + s], ob);
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

// ---------------------------------------------------------------- one position per pair of CTAs
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // clusters (phase/iterative/cuda.py asks for this kernel only there)
// The same as rows_forward, columns and the FFTs of rows_inverse for position k = blockIdx.x / 2, its wave never
// leaving the two CTAs of a cluster: rank c holds rows c H .. c H + H - 1 (H = R / 2) in shared memory. Exit waves
// and FFTs along its rows; the column FFTs' first radix-2 step across the pair (decimation in frequency: rank 0's
// row n becomes a + b, rank 1's (a - b) w^n, w = exp(-2 pi i / R), a and b the two ranks' rows n), so rank c then
// holds frequency rows 2 n + c and takes H-point FFTs of its columns; the projection (as `columns`, the error's
// partial sum per CTA in partial[blockIdx.x]); the inverse H-point FFTs, the inverse radix-2 step (rank 0's row n
// becomes E + w^-n O, rank 1's E - w^-n O) and the inverse FFTs along the rows: the updated wave, written to
// updated[k]. Each rank takes half the rows n of a radix-2 step and reads and writes both ranks' points of them,
// so no point is read after another thread wrote it. ROW is the Line of C points, HALF of H. Shared memory: H
// padded(C) points, then the FFTs' scratch (scratch_points), then 32 doubles.
template <class T, class ROW, class HALF>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(PAIR_THREADS)
far_field_pair(const float2* __restrict__ object, i64 cols, const float2* __restrict__ probe, int R, int C, const i64* __restrict__ corners,
               i64 first, const T* __restrict__ measured, int cr, int cs, float scale, const float2* __restrict__ roots_c,
               const float2* __restrict__ roots_h, const float2* __restrict__ roots_r, int scratch_points, float2* __restrict__ updated,
               double* __restrict__ partial) {
    extern __shared__ float2 shared[];
    const unsigned rank = cluster_rank();
    const int H = R / 2, pitch = padded(C);
    const i64 k = blockIdx.x / 2;
    float2 *rows = shared, *scratch = shared + H * pitch;
    double* sums = reinterpret_cast<double*>(scratch + scratch_points);
    float2 *even = rank == 0 ? rows : in_cta(rows, 0), *odd = rank == 1 ? rows : in_cta(rows, 1);
    const i64* corner = corners + 2 * (first + k);
    const float2* window = object + (corner[0] + rank * H) * cols + corner[1];
    for (int t = threadIdx.x; t < H * C; t += blockDim.x) {
        int r = t / C, s = t - r * C;
        rows[r * pitch + at(s)] = times(probe[(rank * H + r) * C + s], window[r * cols + s]);
    }
    __syncthreads();
    auto row_point = [=](int l, int i) -> float2& { return rows[l * pitch + at(i)]; };
    for (int l0 = 0; l0 < H; l0 += PAIR_LINES)
        ROW::template fft_at<false>([=](int l, int i) -> float2& { return row_point(l0 + l, i); }, min(PAIR_LINES, H - l0), scratch, roots_c);
    const int n0 = rank == 0 ? 0 : (H + 1) / 2, n1 = rank == 0 ? (H + 1) / 2 : H;  // this rank's rows of the radix-2 steps
    cluster_sync();
    for (int t = threadIdx.x; t < (n1 - n0) * C; t += blockDim.x) {
        int n = n0 + t / C, s = t % C, i = n * pitch + at(s);
        float2 a = even[i], b = odd[i];
        even[i] = plus(a, b);
        odd[i] = times(minus(a, b), roots_r[n]);
    }
    cluster_sync();
    double error = 0.0;
    const T* pattern = measured + k * R * C;
    for (int c0 = 0; c0 < C; c0 += PAIR_LINES) {
        const int width = min(PAIR_LINES, C - c0);
        auto point = [=](int l, int i) -> float2& { return rows[i * pitch + at(c0 + l)]; };
        HALF::template fft_at<false>(point, width, scratch, roots_h);
        for (int t = threadIdx.x; t < H * width; t += blockDim.x) {
            int n = t / width, s = c0 + t - n * width;
            error += (double)projected(rows[n * pitch + at(s)], amplitude_at(pattern, 2 * n + (int)rank, s, R, C, cr, cs), scale);
        }
        __syncthreads();
        HALF::template fft_at<true>(point, width, scratch, roots_h);
    }
    error = block_sum(error, sums);
    if (threadIdx.x == 0) partial[blockIdx.x] = error;
    cluster_sync();
    for (int t = threadIdx.x; t < (n1 - n0) * C; t += blockDim.x) {
        int n = n0 + t / C, s = t % C, i = n * pitch + at(s);
        float2 w = roots_r[n], o = times(odd[i], make_float2(w.x, -w.y)), e = even[i];
        even[i] = plus(e, o);
        odd[i] = minus(e, o);
    }
    cluster_sync();
    for (int l0 = 0; l0 < H; l0 += PAIR_LINES)
        ROW::template fft_at<true>([=](int l, int i) -> float2& { return row_point(l0 + l, i); }, min(PAIR_LINES, H - l0), scratch, roots_c);
    float2* out = updated + (k * R + rank * H) * C;
    for (int t = threadIdx.x; t < H * C; t += blockDim.x) {
        int r = t / C, s = t - r * C;
        out[(i64)r * C + s] = rows[r * pitch + at(s)];
    }
}
#endif
