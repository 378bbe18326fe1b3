// CUDA kernels of kernels/*.cu run on the host, for tests on machines without a GPU (tests/test_kernels_on_host.py):
// one std::thread per CUDA thread of a block, __syncthreads a barrier of the block, __syncwarp and the warp's
// shuffles, votes and reductions barriers of the warp, atomics std::atomic_ref; blocks one after another, or the
// blocks of a cluster together (launch_clusters: cluster_sync a barrier of all their threads, in_cta an address in
// another block's shared memory, for kernels/cluster.cuh's functions), the tensor-core products of kernels/mma.cuh
// from every lane's operands. Shared memory: a kernel's `extern
// __shared__` array is rewritten (by the test) to point at host_shared, its block's buffer; its fixed __shared__
// arrays become function statics (so a kernel launched in clusters keeps its shared arrays in the dynamic one).
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __noinline__
#define __align__(n) alignas(n)
#define __launch_bounds__(...)
#define __cluster_dims__(...)

struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned int x, y; };
struct int2 { int x, y; };
struct uint4 { unsigned int x, y, z, w; };
struct double2 { double x, y; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct Dim { int x = 1, y = 1, z = 1; };
typedef long long i64;

thread_local Dim threadIdx, blockIdx;
thread_local int linear;  // the thread's index in its block, x fastest: its warp is linear / 32
Dim blockDim, gridDim;

namespace host {
constexpr int SHARED_BYTES = 1 << 20;
struct Block {
    std::unique_ptr<std::barrier<>> barrier;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    unsigned long long words[32][32];  // the warps' shuffles
    double fragments[32][32][3];       // the warps' tensor-core operands (kernels/mma.cuh)
    std::atomic<int> any;
    std::unique_ptr<unsigned char[]> shared{new (std::align_val_t(16)) unsigned char[SHARED_BYTES]};
};
inline thread_local Block* block;
inline thread_local unsigned rank;  // in the cluster
inline std::vector<std::unique_ptr<Block>> cluster_blocks;
inline std::unique_ptr<std::barrier<>> cluster;
}  // namespace host

thread_local unsigned char* host_shared;

inline void __syncthreads() { host::block->barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { host::block->warps[linear / 32]->arrive_and_wait(); }
inline unsigned cluster_rank() { return host::rank; }
inline void cluster_sync() { host::cluster->arrive_and_wait(); }
template <class T>
T* in_cta(T* at, unsigned rank) {
    auto offset = reinterpret_cast<unsigned char*>(at) - host::block->shared.get();
    return reinterpret_cast<T*>(host::cluster_blocks[rank]->shared.get() + offset);
}
// Lane `from`'s value of v (any type of up to 8 bytes), every lane of the warp calling it.
template <class T>
T shuffled(T v, int from) {
    static_assert(sizeof(T) <= 8);
    int warp = linear / 32, lane = linear % 32;
    std::memcpy(&host::block->words[warp][lane], &v, sizeof(T));
    __syncwarp();
    T got;
    std::memcpy(&got, &host::block->words[warp][from], sizeof(T));
    __syncwarp();
    return got;
}
template <class T>
T __shfl_sync(unsigned, T v, int from) { return shuffled(v, from); }
template <class T>
T __shfl_xor_sync(unsigned, T v, int mask) { return shuffled(v, (linear % 32) ^ mask); }
inline double __shfl_down_sync(unsigned, double v, int offset) {
    int lane = linear % 32;
    return shuffled(v, lane + offset < 32 ? lane + offset : lane);
}
inline unsigned __reduce_add_sync(unsigned, unsigned v) {
    unsigned total = 0;
    for (int lane = 0; lane < 32; ++lane) total += shuffled(v, lane);
    return total;
}
inline int __all_sync(unsigned, int p) {
    int all = 1;
    for (int lane = 0; lane < 32; ++lane) all &= shuffled(p != 0, lane);
    return all;
}
inline int __syncthreads_or(int p) {
    __syncthreads();
    if (linear == 0) host::block->any = 0;
    __syncthreads();
    if (p) host::block->any = 1;
    __syncthreads();
    return host::block->any.load();
}
inline unsigned __ballot_sync(unsigned, int p) {
    unsigned bits = 0;
    for (int lane = 0; lane < 32; ++lane) bits |= (unsigned)shuffled(p != 0, lane) << lane;
    return bits;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
// kernels/mma.cuh's product from every lane's operands: lane (g, t) = (lane / 4, lane % 4) holds A[g + {0, 8}][t],
// B[t][g] and D[g + {0, 8}][2 t + {0, 1}].
inline void mma_f64(double (&d)[4], double a0, double a1, double b) {
    auto& f = host::block->fragments[linear / 32];
    f[linear % 32][0] = a0;
    f[linear % 32][1] = a1;
    f[linear % 32][2] = b;
    __syncwarp();
    int g = linear % 32 / 4, t = linear % 4;
    for (int v = 0; v < 4; ++v) {
        int i = g + 8 * (v / 2), j = 2 * t + v % 2;
        for (int k = 0; k < 4; ++k) d[v] += f[(i % 8) * 4 + k][i / 8] * f[j * 4 + k][2];
    }
    __syncwarp();
}
template <class T>
T __ldg(const T* at) { return *at; }
template <class T>
T __ldcs(const T* at) { return *at; }
template <class T>
T atomicAdd(T* at, T v) { return std::atomic_ref<T>(*at).fetch_add(v); }
template <class T>
T atomicMin(T* at, T v) {
    std::atomic_ref<T> a(*at);
    T old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {}
    return old;
}
template <class T>
T atomicMax(T* at, T v) {
    std::atomic_ref<T> a(*at);
    T old = a.load();
    while (v > old && !a.compare_exchange_weak(old, v)) {}
    return old;
}
template <class T>
T min(T a, T b) { return a < b ? a : b; }
template <class T>
T max(T a, T b) { return a > b ? a : b; }
inline float sqrtf(float v) { return std::sqrt(v); }
inline void __sincosf(float v, float* s, float* c) {
    *s = std::sin(v);
    *c = std::cos(v);
}
using std::fmax;
using std::sqrt;

// Every cluster of `cluster` consecutive blocks (along x) of grid, one after another, the blocks of a cluster together,
// each with block.x * block.y host threads running kernel() (whole warps).
template <class Kernel>
void launch_clusters(Dim grid, int cluster, Dim block, Kernel&& kernel) {
    gridDim = grid;
    blockDim = block;
    const int threads = block.x * block.y * block.z;
    host::cluster_blocks.clear();
    for (int c = 0; c < cluster; ++c) host::cluster_blocks.push_back(std::make_unique<host::Block>());
    for (int by = 0; by < grid.y; ++by)
        for (int bx0 = 0; bx0 < grid.x; bx0 += cluster) {
            host::cluster = std::make_unique<std::barrier<>>(threads * cluster);
            std::vector<std::thread> team;
            for (int c = 0; c < cluster; ++c) {
                host::Block& b = *host::cluster_blocks[c];
                b.barrier = std::make_unique<std::barrier<>>(threads);
                b.warps.clear();
                for (int w = 0; w < threads / 32; ++w) b.warps.push_back(std::make_unique<std::barrier<>>(32));
                for (int t = 0; t < threads; ++t)
                    team.emplace_back([&, t, c, bx0, by] {
                        host::block = host::cluster_blocks[c].get();
                        host::rank = c;
                        host_shared = host::block->shared.get();
                        linear = t;
                        threadIdx = Dim{t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                        blockIdx = Dim{bx0 + c, by, 0};
                        kernel();
                    });
            }
            for (auto& thread : team) thread.join();
        }
}
template <class Kernel>
void launch(Dim grid, Dim block, Kernel&& kernel) { launch_clusters(grid, 1, block, kernel); }
template <class Kernel>
void launch(Dim grid, int threads, Kernel&& kernel) { launch(grid, Dim{threads, 1, 1}, kernel); }
