// The pixel-group index on the GPU: per-frame sums over rings and sector leaves, their packing, and the
// coefficient-weighted group sums of a series' members.
//
// The twins of qgpu_dask/resident/cpu/groups.py (same bits); compiled at run time by
// qgpu_dask/resident/cuda/groups.py. The packing is docs/compressed-format.md's: per (packed block b,
// group g) of GROUP_BLOCK frames, base[b, g] + a width[b, g]-bit field per frame, at bit
// start[b, g] + i * width[b, g] of a little-endian stream of u64 words.

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#ifndef GROUP_BLOCK
#error "GROUP_BLOCK comes from qgpu_dask/formats/groups.py"
#endif
#ifndef GDESC_WORDS
#error "GDESC_WORDS comes from qgpu_dask/resident/cuda/groups.py"
#endif

// A warp's sums of one count per lane: 32 counts of 8 or 16 bits fit 32 bits, of 32 bits need 64.
template <int ITEMSIZE>
struct SumOf {
    typedef u32 type;
};
template <>
struct SumOf<4> {
    typedef u64 type;
};

#define GROUP_UNROLL 4  // pixels a thread loads before adding them (loads in flight)

// Add every lane's v to acc[g] of its group g (g < 0: nothing), given the warp's inclusive prefix sums of v
// (sum): lanes in a run of one group (neighbouring pixels mostly share their ring and leaf) add once, by the
// run's first lane, so one shared-memory atomic per run instead of one per pixel.
template <class S>
__device__ __forceinline__ void add_by_run(u64* acc, int g, u32 v, S sum, int lane) {
    int before = __shfl_up_sync(0xFFFFFFFFu, g, 1);
    u32 heads = __ballot_sync(0xFFFFFFFFu, lane == 0 || before != g);
    u32 after = heads & ~(0xFFFFFFFFu >> (31 - lane));  // heads of the runs after this lane's
    int last = after ? __ffs(after) - 2 : 31;  // the last lane of the run this lane is in
    S through = __shfl_sync(0xFFFFFFFFu, sum, last);
    bool head = (heads >> lane) & 1;
    S run = through - (sum - v);
    if (head && g >= 0 && run) atomicAdd(&acc[g], (u64)run);
}

// sums[f, g] = the counts of frame f over group g, for every ring (groups[p] & 0xFFFF) and leaf (groups[p] >> 16,
// a group id): one block per frame, accumulated in shared memory; every lane of a warp takes part in each step.
template <class T>
__global__ void group_totals(const T* __restrict__ flat, i64 n_frames, int frame_len, const u32* __restrict__ groups, int n_groups,
                             u64* sums) {
    typedef typename SumOf<sizeof(T)>::type Sum;
    extern __shared__ u64 acc[];
    i64 f = blockIdx.x;
    int lane = threadIdx.x & 31;
    for (int g = threadIdx.x; g < n_groups; g += blockDim.x) acc[g] = 0;
    __syncthreads();
    const T* row = flat + f * frame_len;
    for (int p0 = 0; p0 < frame_len; p0 += GROUP_UNROLL * blockDim.x) {
        u32 v[GROUP_UNROLL], ids[GROUP_UNROLL];
#pragma unroll
        for (int u = 0; u < GROUP_UNROLL; ++u) {
            int p = p0 + u * blockDim.x + threadIdx.x;
            v[u] = p < frame_len ? (u32)row[p] : 0;
            ids[u] = p < frame_len ? groups[p] : 0xFFFFFFFFu;
        }
#pragma unroll
        for (int u = 0; u < GROUP_UNROLL; ++u) {
            if (!__any_sync(0xFFFFFFFFu, v[u] != 0)) continue;
            Sum sum = v[u];  // the warp's inclusive prefix sums
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                Sum up = __shfl_up_sync(0xFFFFFFFFu, sum, d);
                if (lane >= d) sum += up;
            }
            bool in = ids[u] != 0xFFFFFFFFu;
            add_by_run<Sum>(acc, in ? (int)(ids[u] & 0xFFFFu) : -1, v[u], sum, lane);
            add_by_run<Sum>(acc, in ? (int)(ids[u] >> 16) : -1, v[u], sum, lane);
        }
    }
    __syncthreads();
    for (int g = threadIdx.x; g < n_groups; g += blockDim.x) sums[f * n_groups + g] = acc[g];
}

// Every (frame, group) field of sums into bits (zeroed): fields never share bits, so ORs write them all.
__global__ void pack_fields(const u64* sums, i64 n_frames, int n_groups, const u64* base, const u8* width, const u64* start, u64* bits) {
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_frames * n_groups) return;
    i64 f = t / n_groups;
    int g = (int)(t % n_groups);
    i64 b = f / GROUP_BLOCK, i = f % GROUP_BLOCK;
    i64 at = b * n_groups + g;
    int w = width[at];
    if (w == 0) return;
    u64 v = sums[t] - base[at];
    u64 pos = start[at] + (u64)i * w;
    u64 word = pos >> 6;
    int shift = (int)(pos & 63);
    atomicOr(&bits[word], v << shift);
    if (shift + w > 64) atomicOr(&bits[word + 1], v >> (64 - shift));
}

__device__ __forceinline__ u64 field(const u64* bits, u64 pos, int w) {
    u64 word = pos >> 6;
    int shift = (int)(pos & 63);
    u64 v = bits[word] >> shift;
    if (shift + w > 64) v |= bits[word + 1] << (64 - shift);
    return w < 64 ? v & ((1ull << w) - 1) : v;
}

// One member's index: GDESC_WORDS u64 (base, width, bits, start pointers; its groups per block).
enum { G_BASE, G_WIDTH, G_BITS, G_START, G_GROUPS, G_COUNT };
static_assert(G_COUNT <= GDESC_WORDS, "the descriptor holds every field");

// out[a, m, f] += sum_j coef[m, j] * (sum of group groups[j] in frame f) for member a = blockIdx.y, over its span
// spans[2a] .. + spans[2a + 1] of groups and of every row of coef (list_len entries a row); wrapping (coef is
// int64 seen as u64). One thread per frame.
template <class W>
__global__ void series_group_sums(const u64* gdesc, i64 n_frames, const i64* spans, const i64* groups, const u64* coef, i64 list_len,
                                  int n_masks, W* out) {
    int a = blockIdx.y;
    i64 f = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    i64 count = spans[2 * a + 1];
    if (f >= n_frames || count == 0) return;
    const u64* d = gdesc + (i64)a * GDESC_WORDS;
    const u64* base = reinterpret_cast<const u64*>(d[G_BASE]);
    const u8* width = reinterpret_cast<const u8*>(d[G_WIDTH]);
    const u64* bits = reinterpret_cast<const u64*>(d[G_BITS]);
    const u64* start = reinterpret_cast<const u64*>(d[G_START]);
    i64 n_groups = (i64)d[G_GROUPS];
    i64 first = spans[2 * a];
    i64 b = f / GROUP_BLOCK, i = f % GROUP_BLOCK;
    for (int m = 0; m < n_masks; ++m) {
        u64 total = 0;
        for (i64 j = 0; j < count; ++j) {
            i64 at = b * n_groups + groups[first + j];
            int w = width[at];
            u64 v = base[at] + (w ? field(bits, start[at] + (u64)i * w, w) : 0ull);
            total += coef[(i64)m * list_len + first + j] * v;
        }
        W* o = out + ((i64)a * n_masks + m) * n_frames + f;
        *o += (W)total;
    }
}
