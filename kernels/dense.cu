// Exact reductions over dense 4D-STEM counts held on the GPU.
//
// The twins of qgpu_dask/resident/cpu/dense.py; compiled at run time by
// qgpu_dask/resident/cuda/dense.py (CuPy RawModule, NVRTC, -std=c++17), which
// instantiates the templates below by name. Data is (n_frames, frame_len),
// C-contiguous, in its native dtype.
//
// Exactness: integer sums are computed in wrapping unsigned (or bounded signed)
// arithmetic, so any order of additions gives the same bits as the CPU twin as
// long as the true result fits the output type (the caller proves that). The
// host picks a 32-bit "inner" accumulator only where it has proven that no
// per-thread partial can leave the 32-bit range; partials are then widened
// (zero- or sign-extended) into the 64-bit accumulator.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// Load flavour for data read once (set by the host with -DQGPU_LOAD=n; the
// benchmark compares them): 0 plain read-only __ldg (default; on an H200 2 and 3
// matched it and 1 was 5-8 % slower),
// 1 ld.global.nc without L1 allocation plus an L2 256-byte prefetch hint,
// 2 ld.global.nc without L1 allocation, 3 __ldcs (evict-first streaming).
#ifndef QGPU_LOAD
#define QGPU_LOAD 0
#endif

// Block sizes and the blocks per SM the launch bounds promise, written only in
// qgpu_dask/resident/cuda/dense.py (which sizes the grids by them) and passed
// from there as -D options (qgpu_dask/compile.py defines).
#ifndef MASK_THREADS
#error "MASK_THREADS comes from qgpu_dask/resident/cuda/dense.py"
#endif
#ifndef MASK_BLOCKS_PER_SM
#error "MASK_BLOCKS_PER_SM comes from qgpu_dask/resident/cuda/dense.py"
#endif
#ifndef ROI_THREADS
#error "ROI_THREADS comes from qgpu_dask/resident/cuda/dense.py"
#endif
#ifndef ROI_BLOCKS_PER_SM
#error "ROI_BLOCKS_PER_SM comes from qgpu_dask/resident/cuda/dense.py"
#endif
#ifndef READ_THREADS
#error "READ_THREADS comes from qgpu_dask/resident/cuda/dense.py"
#endif
#ifndef READ_BLOCKS_PER_SM
#error "READ_BLOCKS_PER_SM comes from qgpu_dask/resident/cuda/dense.py"
#endif
#ifndef IMAGE_FRAMES
#error "IMAGE_FRAMES comes from qgpu_dask/resident/cuda/dense.py"
#endif
static_assert(IMAGE_FRAMES % 32 == 0, "pixel_images loads and stores a tile's frames 32 at a time");

// ---------------------------------------------------------------- helpers

// Arithmetic type of an output (accumulator) type: int64 accumulates in
// wrapping uint64 (same bits, no signed-overflow UB), the rest as themselves.
template <class A> struct Arith { typedef A type; };
template <> struct Arith<i64> { typedef u64 type; };

// Exact sum type of a data type (read_sum only): uint64 / int64 / float64.
template <class T> struct SumOf { typedef u64 type; };
template <> struct SumOf<i8> { typedef i64 type; };
template <> struct SumOf<i16> { typedef i64 type; };
template <> struct SumOf<i32> { typedef i64 type; };
template <> struct SumOf<float> { typedef double type; };
template <> struct SumOf<double> { typedef double type; };

// 16 bytes of data read once.
__device__ __forceinline__ uint4 load16(const void* p) {
#if QGPU_LOAD == 1
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
#elif QGPU_LOAD == 2
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
#elif QGPU_LOAD == 3
    return __ldcs(reinterpret_cast<const uint4*>(p));
#else
    return __ldg(reinterpret_cast<const uint4*>(p));
#endif
}

template <class T>
__device__ __forceinline__ T load1(const T* p) {
    return __ldg(p);
}

// 16 bytes of data seen as elements.
template <class T> union Vec16 {
    uint4 raw;
    T e[16 / sizeof(T)];
};

template <int B> struct PackAlign { static constexpr int value = B < 16 ? B : 16; };

// N weights loaded with as few shared-memory instructions as alignment allows.
template <class W, int N> struct alignas(PackAlign<N * int(sizeof(W))>::value) WPack {
    W e[N];
};

template <class V>
__device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <class T> struct IsSigned { static constexpr bool value = T(-1) < T(0); };

template <bool C, class X, class Y> struct Pick { typedef X type; };
template <class X, class Y> struct Pick<false, X, Y> { typedef Y type; };

// One product term in the inner type I. Integer I wraps (unsigned) or is
// proven in range (int), so the bits are those of the exact product. A zero
// float weight leaves its pixel out: a masked-out NaN or inf never reaches the sum.
template <class I, class W, class T>
__device__ __forceinline__ I term(W w, T x) {
    if constexpr (I(0.5) != I(0)) return w == W(0) ? I(0) : I(w) * I(x);
    return I(w) * I(x);
}

// dp2a/dp4a: packed 16x8 / 8x8 dot products accumulated in 32 bits, for
// 8/16-bit data with 8-bit weights (the common bool-mask case). Same bits as
// the scalar terms: 32-bit wrapping arithmetic.
#define QGPU_PACKED_DOT(NAME, OP)                                                         \
    template <class T, class W>                                                           \
    __device__ __forceinline__ u32 NAME(u32 a, u32 b, u32 c) {                            \
        u32 d;                                                                            \
        if constexpr (IsSigned<T>::value && IsSigned<W>::value)                           \
            asm(OP ".s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));        \
        else if constexpr (IsSigned<T>::value)                                            \
            asm(OP ".s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));        \
        else if constexpr (IsSigned<W>::value)                                            \
            asm(OP ".u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));        \
        else                                                                              \
            asm(OP ".u32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));        \
        return d;                                                                         \
    }
QGPU_PACKED_DOT(dp2a_lo, "dp2a.lo")
QGPU_PACKED_DOT(dp2a_hi, "dp2a.hi")
QGPU_PACKED_DOT(dp4a, "dp4a")
#undef QGPU_PACKED_DOT

// acc += sum_i w[i] * x[i] over one 16-byte vector of data.
template <class T, class W, class I>
__device__ __forceinline__ I dot16(const Vec16<T>& x, const W* wp, I acc) {
    constexpr int VEC = 16 / sizeof(T);
    constexpr bool packed8 = sizeof(W) == 1 && (sizeof(I) == 4) &&
                             (sizeof(T) == 1 || sizeof(T) == 2) && (I(0.5) == I(0));
    if constexpr (packed8 && sizeof(T) == 2) {
        const uint2 w = *reinterpret_cast<const uint2*>(wp);
        u32 a = u32(acc);
        a = dp2a_lo<T, W>(x.raw.x, w.x, a);
        a = dp2a_hi<T, W>(x.raw.y, w.x, a);
        a = dp2a_lo<T, W>(x.raw.z, w.y, a);
        a = dp2a_hi<T, W>(x.raw.w, w.y, a);
        return I(a);
    } else if constexpr (packed8 && sizeof(T) == 1) {
        const uint4 w = *reinterpret_cast<const uint4*>(wp);
        u32 a = u32(acc);
        a = dp4a<T, W>(x.raw.x, w.x, a);
        a = dp4a<T, W>(x.raw.y, w.y, a);
        a = dp4a<T, W>(x.raw.z, w.z, a);
        a = dp4a<T, W>(x.raw.w, w.w, a);
        return I(a);
    } else {
        const WPack<W, VEC> w = *reinterpret_cast<const WPack<W, VEC>*>(wp);
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc += term<I>(w.e[i], x.e[i]);
        return acc;
    }
}

// Copy n bytes of weights from global to shared memory: 16-byte words, several
// in flight per thread, when the source is 16-byte aligned; bytes otherwise.
__device__ __forceinline__ void stage_weights(unsigned char* dst, const unsigned char* src, long long n) {
    long long done = 0;
    if ((reinterpret_cast<unsigned long long>(src) & 15) == 0) {
        const long long n16 = n / 16;
        const uint4* s16 = reinterpret_cast<const uint4*>(src);
        uint4* d16 = reinterpret_cast<uint4*>(dst);
#pragma unroll 4
        for (long long i = threadIdx.x; i < n16; i += blockDim.x) d16[i] = s16[i];
        done = n16 * 16;
    }
    for (long long i = done + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
    __syncthreads();
}

// ---------------------------------------------------------------- mask_sums
//
// out[m, f] = sum_j w[m, j] * data[f, start + j] for NM masks at once.
// One warp per frame (grid-stride over frames), the NM weight rows staged once
// per block in shared memory (compacted to the smallest type that holds them),
// per-lane accumulation in I, widened to the output's arithmetic type, warp
// shuffle reduction, one store per mask and frame.
// VECTOR: frames and [start, start + len) are 16-byte aligned and len is a
// multiple of 16 / sizeof(T) (the host widens the span with zero weights);
// otherwise one element per lane per step.

constexpr int MASK_UNROLL = 4;

template <class T, class W, class I, class Acc, int NM, bool VECTOR>
__global__ void __launch_bounds__(MASK_THREADS, MASK_BLOCKS_PER_SM)
mask_sums(const T* __restrict__ data, long long n_frames, long long frame_len, long long start,
          long long len, const W* __restrict__ weights, Acc* __restrict__ out) {
    typedef typename Arith<Acc>::type A;
    extern __shared__ __align__(16) unsigned char smem[];
    W* sw = reinterpret_cast<W*>(smem);
    stage_weights(smem, reinterpret_cast<const unsigned char*>(weights),
                  (long long)NM * len * (long long)sizeof(W));

    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long f = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); f < n_frames;
         f += warps) {
        const T* frame = data + f * frame_len + start;
        I acc[NM];
#pragma unroll
        for (int m = 0; m < NM; ++m) acc[m] = I(0);

        if constexpr (VECTOR) {
            constexpr int VEC = 16 / sizeof(T);
            const long long nvec = len / VEC;
            long long v = lane;
            // Full steps: MASK_UNROLL independent 16-byte loads in flight per lane.
            for (; v + 32 * (MASK_UNROLL - 1) < nvec; v += 32 * MASK_UNROLL) {
                Vec16<T> x[MASK_UNROLL];
#pragma unroll
                for (int u = 0; u < MASK_UNROLL; ++u) x[u].raw = load16(frame + (v + 32 * u) * VEC);
#pragma unroll
                for (int u = 0; u < MASK_UNROLL; ++u)
#pragma unroll
                    for (int m = 0; m < NM; ++m)
                        acc[m] = dot16<T, W, I>(x[u], sw + m * len + (v + 32 * u) * VEC, acc[m]);
            }
            for (; v < nvec; v += 32) {
                Vec16<T> x;
                x.raw = load16(frame + v * VEC);
#pragma unroll
                for (int m = 0; m < NM; ++m) acc[m] = dot16<T, W, I>(x, sw + m * len + v * VEC, acc[m]);
            }
        } else {
            constexpr int U = 8;
            long long j = lane;
            for (; j + 32 * (U - 1) < len; j += 32 * U) {
                T x[U];
#pragma unroll
                for (int u = 0; u < U; ++u) x[u] = load1(frame + j + 32 * u);
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int m = 0; m < NM; ++m) acc[m] += term<I>(sw[m * len + j + 32 * u], x[u]);
            }
            for (; j < len; j += 32) {
                const T x = load1(frame + j);
#pragma unroll
                for (int m = 0; m < NM; ++m) acc[m] += term<I>(sw[m * len + j], x);
            }
        }

#pragma unroll
        for (int m = 0; m < NM; ++m) {
            // int -> uint64 sign-extends, uint32 -> uint64 zero-extends: exact.
            const A s = warp_sum<A>(A(acc[m]));
            if (lane == 0) out[m * n_frames + f] = Acc(s);
        }
    }
}

// ---------------------------------------------------------------- roi_reduce (sum, max)
//
// Per detector pixel over the frames idx[lo:hi] of chunk blockIdx.y (lo, hi as
// in the CPU twin). Threads own 16 / sizeof(T) consecutive pixels (VECTOR) or
// one pixel; a warp reads 512 contiguous bytes of a frame per load. Each chunk
// starts from its first frame (a max never starts from 0) and folds the rest
// in with Op; results go to partial[chunk, pixel] and the host reduces the
// partials exactly. The host never makes more chunks than selected frames.

constexpr int ROI_UNROLL = 4;

struct SumOp {
    template <class I>
    static __device__ __forceinline__ I step(I a, I v) { return a + v; }
};

struct MaxOp {
    // v != v: a NaN sample wins and then stays (v > NaN is false), as in NumPy.
    template <class I>
    static __device__ __forceinline__ I step(I a, I v) { return (v > a || v != v) ? v : a; }
};

// The VEC values (or one) of one frame at pixel vector p.
template <class T, bool VECTOR>
struct Pixels {
    static constexpr int VEC = VECTOR ? 16 / sizeof(T) : 1;
    Vec16<T> v;
    T s;
    __device__ __forceinline__ void load(const T* row, long long p) {
        if constexpr (VECTOR) v.raw = load16(row + p * VEC);
        else s = load1(row + p);
    }
    __device__ __forceinline__ T operator[](int k) const {
        if constexpr (VECTOR) return v.e[k];
        else return s;
    }
};

template <class T, class I, class Acc, class Op, bool VECTOR>
__global__ void __launch_bounds__(ROI_THREADS, ROI_BLOCKS_PER_SM)
roi_reduce(const T* __restrict__ data, long long frame_len, const long long* __restrict__ idx,
           long long n_sel, long long n_chunks, Acc* __restrict__ partial) {
    typedef Pixels<T, VECTOR> Px;
    constexpr int VEC = Px::VEC;
    const long long c = blockIdx.y;
    const long long lo = n_sel * c / n_chunks, hi = n_sel * (c + 1) / n_chunks;
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // vector (or pixel) index
    if (p * VEC >= frame_len || lo >= hi) return;
    I acc[VEC];
    {
        Px x;
        x.load(data + __ldg(idx + lo) * frame_len, p);
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] = I(x[k]);
    }
    long long i = lo + 1;
    for (; i + ROI_UNROLL <= hi; i += ROI_UNROLL) {
        Px x[ROI_UNROLL];
#pragma unroll
        for (int u = 0; u < ROI_UNROLL; ++u) x[u].load(data + __ldg(idx + i + u) * frame_len, p);
#pragma unroll
        for (int u = 0; u < ROI_UNROLL; ++u)
#pragma unroll
            for (int k = 0; k < VEC; ++k) acc[k] = Op::step(acc[k], I(x[u][k]));
    }
    for (; i < hi; ++i) {
        Px x;
        x.load(data + __ldg(idx + i) * frame_len, p);
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] = Op::step(acc[k], I(x[k]));
    }
    Acc* dst = partial + c * frame_len + p * VEC;
#pragma unroll
    for (int k = 0; k < VEC; ++k) dst[k] = Acc(typename Arith<Acc>::type(acc[k]));
}

// ---------------------------------------------------------------- read_sum
//
// Bandwidth reference: the sum of every element, one partial per block.
// Persistent grid, 16-byte loads, READ_UNROLL loads in flight per thread; each
// vector is summed in a type that cannot overflow for it, then widened.
// Requires a 16-byte aligned base; n_vec 16-byte vectors, then `tail` elements.

constexpr int READ_UNROLL = 4;

template <class T>
__device__ __forceinline__ typename SumOf<T>::type vec_sum(const Vec16<T>& x) {
    typedef typename SumOf<T>::type S;
    constexpr bool small_int = sizeof(T) <= 2 && T(0.5) == T(0);
    // 16 x 255 or 8 x 65535 fits 32 bits: sum the vector narrow, widen once.
    typedef typename Pick<small_int, typename Pick<IsSigned<T>::value, i32, u32>::type, S>::type P;
    P s = 0;
#pragma unroll
    for (int k = 0; k < int(16 / sizeof(T)); ++k) s += P(x.e[k]);
    return S(s);
}

template <class T>
__global__ void __launch_bounds__(READ_THREADS, READ_BLOCKS_PER_SM)
read_sum(const T* __restrict__ data, long long n_vec, long long tail,
         typename SumOf<T>::type* __restrict__ partial) {
    typedef typename SumOf<T>::type S;
    typedef typename Arith<S>::type A;
    constexpr int VEC = 16 / sizeof(T);
    A acc = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; v + stride * (READ_UNROLL - 1) < n_vec; v += stride * READ_UNROLL) {
        Vec16<T> x[READ_UNROLL];
#pragma unroll
        for (int u = 0; u < READ_UNROLL; ++u) x[u].raw = load16(data + (v + stride * u) * VEC);
#pragma unroll
        for (int u = 0; u < READ_UNROLL; ++u) acc += A(vec_sum<T>(x[u]));
    }
    for (; v < n_vec; v += stride) {
        Vec16<T> x;
        x.raw = load16(data + v * VEC);
        acc += A(vec_sum<T>(x));
    }
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < tail) acc += A(S(data[n_vec * VEC + t]));

    __shared__ A red[READ_THREADS / 32];
    acc = warp_sum<A>(acc);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        A s = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : A(0);
        s = warp_sum<A>(s);
        if (threadIdx.x == 0) partial[blockIdx.x] = S(s);
    }
}

// ---------------------------------------------------------------- pixel images

// out[k, f] = data[f, pixels[k]] as float: the images of chosen detector pixels, each contiguous
// (SSB and parallax take them so). A tile of IMAGE_FRAMES frames x 32 pixels goes through shared memory, so
// both the gather along each frame and the writes along each image are coalesced; each thread has
// IMAGE_FRAMES / 8 loads in flight at once (a 32 x 32 tile, four, left the H200 at 1.5 TB/s: too few bytes
// in flight for the memory's latency). Block 32 x 8.
template <class T>
__global__ void pixel_images(const T* __restrict__ data, i64 n_frames, int frame_len, const i64* __restrict__ pixels, int n_pix,
                             float* __restrict__ out) {
    __shared__ float tile[IMAGE_FRAMES][33];
    i64 f0 = (i64)blockIdx.x * IMAGE_FRAMES;
    int k0 = blockIdx.y * 32;
    int tx = threadIdx.x, ty = threadIdx.y;
    int k = k0 + tx;
    i64 p = k < n_pix ? pixels[k] : 0;
    float v[IMAGE_FRAMES / 8];
#pragma unroll
    for (int i = 0; i < IMAGE_FRAMES / 8; ++i) {
        i64 f = f0 + ty + 8 * i;
        v[i] = (f < n_frames && k < n_pix) ? (float)data[f * frame_len + p] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < IMAGE_FRAMES / 8; ++i) tile[ty + 8 * i][tx] = v[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int kk = k0 + ty + 8 * i;
#pragma unroll
        for (int m = 0; m < IMAGE_FRAMES / 32; ++m) {
            i64 f = f0 + tx + 32 * m;
            if (kk < n_pix && f < n_frames) out[(i64)kk * n_frames + f] = tile[tx + 32 * m][ty + 8 * i];
        }
    }
}
