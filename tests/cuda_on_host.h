// CUDA kernels of kernels/*.cu run on the host, for tests on machines without a GPU (tests/test_kernels_on_host.py):
// one std::thread per CUDA thread of a block, __syncthreads a barrier of the block, __syncwarp and
// __shfl_down_sync barriers of the warp, blocks one after another. Shared memory: a kernel's `extern
// __shared__` array is rewritten (by the test) to point at host_shared, its fixed __shared__ arrays become
// function statics (one block runs at a time).
#include <barrier>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static

struct float2 { float x, y; };
struct double2 { double x, y; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct Dim { int x = 1, y = 1, z = 1; };
typedef long long i64;

thread_local Dim threadIdx, blockIdx;
Dim blockDim, gridDim;
alignas(16) unsigned char host_shared[1 << 20];

namespace host {
inline std::unique_ptr<std::barrier<>> block;
inline std::vector<std::unique_ptr<std::barrier<>>> warps;
inline double exchange[32][32];
}  // namespace host

inline void __syncthreads() { host::block->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { host::warps[threadIdx.x / 32]->arrive_and_wait(); }
inline double __shfl_down_sync(unsigned, double v, int offset) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    host::exchange[warp][lane] = v;
    __syncwarp();
    double got = lane + offset < 32 ? host::exchange[warp][lane + offset] : v;
    __syncwarp();
    return got;
}
inline unsigned __ballot_sync(unsigned, int p) { return p; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline i64 min(i64 a, i64 b) { return a < b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
using std::fmax;
using std::sqrt;

// Every block of grid, each with `threads` host threads running kernel() (whole warps: threads % 32 == 0).
template <class Kernel>
void launch(Dim grid, int threads, Kernel&& kernel) {
    gridDim = grid;
    blockDim = Dim{threads, 1, 1};
    for (int by = 0; by < grid.y; ++by)
        for (int bx = 0; bx < grid.x; ++bx) {
            host::block = std::make_unique<std::barrier<>>(threads);
            host::warps.clear();
            for (int w = 0; w < threads / 32; ++w) host::warps.push_back(std::make_unique<std::barrier<>>(32));
            std::vector<std::thread> team;
            for (int t = 0; t < threads; ++t)
                team.emplace_back([&, t, bx, by] {
                    threadIdx = Dim{t, 0, 0};
                    blockIdx = Dim{bx, by, 0};
                    kernel();
                });
            for (auto& thread : team) thread.join();
        }
}
