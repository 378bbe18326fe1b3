// One batch of a ptychographic pass on one frame's object: the twin of qgpu_dask/ptycho/cpu.py, compiled at run
// time by qgpu_dask/ptycho/cuda.py. The two FFTs between these kernels are cuFFT's.
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

#define TILE_COLS 32
#define TILE_ROWS 8  // a block's tile of object pixels: one thread each, TILE_COLS x TILE_ROWS threads

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
