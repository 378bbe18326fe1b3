// The qgpu-ans-1 codec and exact queries over compressed counts, on the GPU.
//
// The twins of qgpu_dask/resident/cpu/compressed.py (same bytes, same bits);
// compiled at run time by qgpu_dask/resident/cuda/compressed.py (CuPy
// RawModule, NVRTC), which instantiates the templates by name. The byte layout
// is documented in docs/compressed-format.md; the per-pixel tables come from
// qgpu_dask/formats/codec.py.
//
// Counts are (n_frames, frame_len), C-contiguous, unsigned (T = u8, u16, u32).
// The stream of pixel p in scan block b holds counts[b * block .. , p].

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// Constants shared with Python, written only there and passed by
// qgpu_dask/resident/cuda/compressed.py as -D options (qgpu_dask/compile.py defines):
// the codec's (formats/codec.py), the decoders' error codes (resident/cpu/compressed.py,
// negated there), the LUT size and the error word's layout (resident/cuda/compressed.py).
#ifndef PROB_BITS
#error "PROB_BITS comes from qgpu_dask/formats/codec.py"
#endif
#ifndef STATE_LOW
#error "STATE_LOW comes from qgpu_dask/formats/codec.py"
#endif
#ifndef HIST_BINS
#error "HIST_BINS comes from qgpu_dask/formats/codec.py"
#endif
#ifndef RUN_SLOT
#error "RUN_SLOT comes from qgpu_dask/formats/codec.py"
#endif
#ifndef TOKEN_SLOTS
#error "TOKEN_SLOTS comes from qgpu_dask/formats/codec.py"
#endif
#ifndef FORM_SHIFT
#error "FORM_SHIFT comes from qgpu_dask/formats/codec.py"
#endif
#ifndef OFFSET_MASK
#error "OFFSET_MASK comes from qgpu_dask/formats/codec.py"
#endif
#ifndef EMPTY
#error "EMPTY comes from qgpu_dask/formats/codec.py"
#endif
#ifndef CONSTANT
#error "CONSTANT comes from qgpu_dask/formats/codec.py"
#endif
#ifndef SPARSE
#error "SPARSE comes from qgpu_dask/formats/codec.py"
#endif
#ifndef ANS
#error "ANS comes from qgpu_dask/formats/codec.py"
#endif
#ifndef RAW
#error "RAW comes from qgpu_dask/formats/codec.py"
#endif
#ifndef SLOT_MASK
#error "SLOT_MASK comes from qgpu_dask/resident/cpu/compressed.py"
#endif
#ifndef E_LENGTH
#error "E_LENGTH comes from qgpu_dask/resident/cpu/compressed.py"
#endif
#ifndef E_TRUNCATED
#error "E_TRUNCATED comes from qgpu_dask/resident/cpu/compressed.py"
#endif
#ifndef E_STATE
#error "E_STATE comes from qgpu_dask/resident/cpu/compressed.py"
#endif
#ifndef E_POSITION
#error "E_POSITION comes from qgpu_dask/resident/cpu/compressed.py"
#endif
#ifndef E_VALUE
#error "E_VALUE comes from qgpu_dask/resident/cpu/compressed.py"
#endif
#ifndef E_SPARSE
#error "E_SPARSE comes from qgpu_dask/resident/cpu/compressed.py"
#endif
#ifndef E_FORM
#error "E_FORM comes from qgpu_dask/resident/cpu/compressed.py"
#endif
#ifndef LUT_SIZE
#error "LUT_SIZE comes from qgpu_dask/resident/cuda/compressed.py"
#endif
#ifndef ERROR_CODE_BITS
#error "ERROR_CODE_BITS comes from qgpu_dask/resident/cuda/compressed.py"
#endif
#ifndef TILE_BYTES
#error "TILE_BYTES comes from qgpu_dask/resident/cuda/compressed.py"
#endif
#ifndef DECODE_RING
#error "DECODE_RING comes from qgpu_dask/resident/cuda/compressed.py"
#endif
#ifndef DECODE_FLUSH
#error "DECODE_FLUSH comes from qgpu_dask/resident/cuda/compressed.py"
#endif
static_assert((DECODE_RING & (DECODE_RING - 1)) == 0 && DECODE_FLUSH <= DECODE_RING, "a ring of a power of two rows, stored in parts");
#ifndef LUT_PITCH
#error "LUT_PITCH comes from qgpu_dask/resident/cuda/compressed.py"
#endif
static_assert(LUT_PITCH >= 2 * LUT_SIZE && LUT_PITCH % 8 == 4, "a pixel's two LUTs, an odd number of words apart");

struct Model {
    const u8* run;
    const u8* values;
    const u32* table_start;
    const u16* cum;
    const u8* lut;  // per pixel: LUT_SIZE starting symbols of the value table, then LUT_SIZE of the run table
    int chunks;
    int itemsize;
    u32 maxval;
};

#define LUT_SHIFT 6  // slot >> LUT_SHIFT picks a LUT entry: LUT_SIZE per table
static_assert(LUT_SIZE << LUT_SHIFT == 1 << PROB_BITS, "a table's LUT_SIZE entries cover its 1 << PROB_BITS slots");

struct Streams {
    const u32* index;
    const u64* block_base;
    const u8* payload;
    i64 payload_bytes;
    int frame_len;
};

// Kernel parameters carrying a Model and Streams (CuPy passes scalars and pointers, not structs).
#define MODEL_PARAMS const u8 *run_of, const u8 *values_of, const u32 *table_start, const u16 *cum, const u8 *lut, int chunks, int itemsize, u32 maxval
#define MAKE_MODEL Model model{run_of, values_of, table_start, cum, lut, chunks, itemsize, maxval};
#define STREAM_PARAMS const u32 *index, const u64 *block_base, const u8 *payload, i64 payload_bytes, int frame_len, MODEL_PARAMS
#define MAKE_STREAMS Streams st{index, block_base, payload, payload_bytes, frame_len}; MAKE_MODEL

// ---------------------------------------------------------------- histograms

template <class T>
__global__ void value_histogram(const T* __restrict__ flat, i64 n_frames, int frame_len, i64 frames_per_chunk, u64* hist) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= frame_len) return;
    i64 lo = (i64)blockIdx.y * frames_per_chunk;
    i64 hi = min(n_frames, lo + frames_per_chunk);
    u64 zeros = 0;
    for (i64 f = lo; f < hi; ++f) {
        u32 v = flat[f * frame_len + p];
        if (v == 0) ++zeros;
        else atomicAdd(&hist[(i64)p * HIST_BINS + min(v, (u32)(HIST_BINS - 1))], 1ull);
    }
    if (zeros) atomicAdd(&hist[(i64)p * HIST_BINS], zeros);
}

__device__ __forceinline__ int value_symbol(u32 v, int run, int nv) {
    int base = run > 0 ? 1 : 0;
    return (int)min((u64)v - base, (u64)nv);
}

template <class T>
__global__ void token_histogram(const T* __restrict__ flat, i64 n_frames, int frame_len, int block, int n_blocks,
                                const u8* run_of, const u8* values_of, u64* hist) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y;
    if (p >= frame_len || b >= n_blocks) return;
    int r = run_of[p], nv = values_of[p];
    u64* h = hist + (i64)p * TOKEN_SLOTS;
    i64 lo = (i64)b * block, hi = min(n_frames, lo + block);
    if (r == 0) {
        for (i64 f = lo; f < hi; ++f) atomicAdd(&h[value_symbol(flat[f * frame_len + p], r, nv)], 1ull);
        return;
    }
    i64 zeros = 0;
    for (i64 f = lo; f < hi; ++f) {
        u32 v = flat[f * frame_len + p];
        if (v == 0) { ++zeros; continue; }
        if (zeros >= r) atomicAdd(&h[RUN_SLOT + r], (u64)(zeros / r));
        atomicAdd(&h[RUN_SLOT + zeros % r], 1ull);
        atomicAdd(&h[value_symbol(v, r, nv)], 1ull);
        zeros = 0;
    }
    if (zeros) atomicAdd(&h[RUN_SLOT + r + 1], 1ull);
}

// ---------------------------------------------------------------- encoder

// Where a stream's rANS words go. The sizing pass codes into a slot as large as the stream's raw counts:
// emitted word k at word 2 + k after the 4-byte state, reversed when packed; words past the slot are dropped
// (a stream larger than its raw counts is never written as ANS), and with no slot (room 0) only counted.
struct Slotted {
    u8* slot;
    i64 room;  // words that fit after the state
    __device__ void put(i64 k, u32 word) {
        if (k < room) *reinterpret_cast<u16*>(slot + 4 + 2 * k) = (u16)word;
    }
};

// A stream coded again in its own place: emitted word k at word 2 + words - 1 - k (the decoder reads forward).
struct Placed {
    u8* stream;
    i64 words;
    __device__ void put(i64 k, u32 word) { *reinterpret_cast<u16*>(stream + 2 * (2 + words - 1 - k)) = (u16)word; }
};

template <class Out>
struct Writer {
    Out out;
    i64 k;  // words emitted
    __device__ void emit(u32 word) {
        out.put(k, word);
        ++k;
    }
    __device__ void put_symbol(u32& x, u32 c, u32 f) {
        if ((u64)x >= ((u64)f << (32 - PROB_BITS))) {
            emit(x & 0xFFFFu);
            x >>= 16;
        }
        x = ((x / f) << PROB_BITS) + x % f + c;
    }
    __device__ void put_raw(u32& x, u32 chunk) {
        emit(x & 0xFFFFu);
        x = ((x >> 16) << 16) | chunk;
    }
};

template <class Out>
__device__ void put_value(Writer<Out>& w, u32& x, u32 v, int run, int nv, const u16* vt, int chunks) {
    int s = value_symbol(v, run, nv);
    if (s == nv) {
        u32 excess = v - nv - (run > 0 ? 1 : 0);
        if (chunks == 2) w.put_raw(x, (excess >> 16) & 0xFFFFu);
        w.put_raw(x, excess & 0xFFFFu);
    }
    w.put_symbol(x, vt[s], vt[s + 1] - vt[s]);
}

// The rANS coder of one stream, fed its counts last first (take), then finished: the stream's tokens in
// reverse. In run mode a nonzero count is preceded by the run token of the zeros that follow it in the
// stream (counted since the nonzero taken before it), or by the end token where only zeros follow it.
template <class Out>
struct BackwardCoder {
    Writer<Out> w;
    u32 x;
    int run, nv, chunks;
    const u16* vt;
    const u16* rt;
    int zeros;  // zeros taken since the last nonzero
    bool seen;  // a nonzero was taken
    __device__ BackwardCoder(Writer<Out> w, int run, int nv, const u16* vt, int chunks)
        : w(w), x(STATE_LOW), run(run), nv(nv), chunks(chunks), vt(vt), rt(vt + nv + 2), zeros(0), seen(false) {}
    __device__ void put_run(int s) { w.put_symbol(x, rt[s], rt[s + 1] - rt[s]); }
    __device__ void zero_run() {
        put_run(zeros % run);
        for (int q = zeros / run; q > 0; --q) put_run(run);
        zeros = 0;
    }
    __device__ __forceinline__ void take(u32 v) {
        if (run == 0) {
            put_value(w, x, v, run, nv, vt, chunks);
            return;
        }
        if (v == 0) {
            ++zeros;
            return;
        }
        if (seen) zero_run();
        else if (zeros) { put_run(run + 1); zeros = 0; }
        seen = true;
        put_value(w, x, v, run, nv, vt, chunks);
    }
    __device__ void finish() {
        if (run == 0) return;
        if (seen) zero_run();
        else if (zeros) put_run(run + 1);
    }
};

__device__ __forceinline__ i64 even(i64 n) { return n + (n & 1); }

// This thread's copy of pixel p's cumulative frequencies in shared memory (table_stride u16 per thread):
// the encoder looks them up for every count, so they must not be evicted by the counts streaming past.
__device__ const u16* encoder_tables(const Model& m, int p, int table_stride) {
    extern __shared__ unsigned long long smem_words[];
    u16* copy = reinterpret_cast<u16*>(smem_words) + threadIdx.x * table_stride;
    const u16* t = m.cum + m.table_start[p];
    int entries = m.values[p] + 2 + (m.run[p] ? m.run[p] + 3 : 0);
    for (int j = 0; j < entries; ++j) copy[j] = t[j];
    return copy;
}

// 16 bytes from global to shared memory without passing through registers (cp.async, sm_80 and later).
__device__ __forceinline__ void copy16_async(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    unsigned at;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(at) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(at), "l"(src) : "memory");
#else
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#endif
}

__device__ __forceinline__ void copies_committed() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Wait until at most `pending` committed groups of copies are still in flight.
template <int pending>
__device__ __forceinline__ void copies_landed() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
#endif
}

// The counts of a CTA's pixels (blockDim.x consecutive ones from p0) over frames [lo, lo + n), staged through
// two shared-memory buffers of TILE_BYTES, last frames first: each thread then walks its pixel's counts
// backwards out of shared memory, instead of through a chain of dependent strided loads. Rows go up as
// 16-byte copies where they are 16-byte aligned, else count by count.
template <class T>
struct Tiles {
    T* buf;
    const T* src;  // the CTA's first pixel in frame lo
    int frame_len, width, rows, n, count;
    bool vector;
    __device__ Tiles(T* buf, const T* flat, i64 lo, int n, int frame_len, int p0)
        : buf(buf), src(flat + lo * frame_len + p0), frame_len(frame_len), width(min((int)blockDim.x, frame_len - p0)),
          rows(TILE_BYTES / (blockDim.x * (int)sizeof(T))), n(n), count((n + rows - 1) / rows),
          vector(reinterpret_cast<size_t>(flat) % 16 == 0 && (frame_len * sizeof(T)) % 16 == 0) {}
    __device__ int first(int t) const { return max(0, n - (t + 1) * rows); }  // tile t: frames [first, end)
    __device__ int end(int t) const { return n - t * rows; }
    __device__ T* held(int t) const { return buf + (t & 1) * rows * blockDim.x; }
    __device__ void load(int t) {
        T* dst = held(t);
        int f0 = first(t), nr = end(t) - f0;
        const T* from = src + (i64)f0 * frame_len;
        if (vector) {
            constexpr int V = 16 / sizeof(T);
            int per_row = width / V;  // whole: frame_len and p0 are multiples of V
            for (int i = threadIdx.x; i < nr * per_row; i += blockDim.x) {
                int r = i / per_row, c = (i - r * per_row) * V;
                copy16_async(dst + r * blockDim.x + c, from + (i64)r * frame_len + c);
            }
        } else {
            for (int i = threadIdx.x; i < nr * width; i += blockDim.x) {
                int r = i / width, c = i - r * width;
                dst[r * blockDim.x + c] = from[(i64)r * frame_len + c];
            }
        }
        copies_committed();
    }
    // take(i, count) for this thread's pixel at every frame i, last first; every thread of the CTA calls it
    // (the tiles are shared), those with nothing to take with wants false.
    template <class Take>
    __device__ void walk_backwards(bool wants, Take& take) {
        load(0);
        for (int t = 0; t < count; ++t) {
            if (t + 1 < count) {
                load(t + 1);
                copies_landed<1>();
            } else {
                copies_landed<0>();
            }
            __syncthreads();
            if (wants) {
                const T* mine = held(t) + threadIdx.x;
                int f0 = first(t);
                for (int i = end(t) - 1; i >= f0; --i) take(i, (u32)mine[(i - f0) * blockDim.x]);
            }
            __syncthreads();
        }
    }
};

// The tiles sit in dynamic shared memory after the tables (table_stride u16 per thread, a multiple of 1024 bytes).
template <class T>
__device__ T* tile_buffers(int table_stride) {
    extern __shared__ unsigned long long smem_words[];
    return reinterpret_cast<T*>(reinterpret_cast<u16*>(smem_words) + blockDim.x * table_stride);
}

// Bytes of one slot: a stream's raw counts, padded to an even length (ANS is chosen only when no longer).
__device__ __forceinline__ i64 slot_bytes(int n, int itemsize) { return even((i64)n * itemsize); }

// Stream (b, p)'s slot: the blocks before b are whole (block frames each), its own holds n frames.
__device__ __forceinline__ u8* slot_of(u8* slots, int b, int p, int block, int n, int frame_len, int itemsize) {
    return slots + (i64)b * frame_len * slot_bytes(block, itemsize) + (i64)p * slot_bytes(n, itemsize);
}

__device__ __forceinline__ void put_le(u8* payload, i64 at, u32 v, int nbytes) {
    for (int i = 0; i < nbytes; ++i) payload[at + i] = (u8)(v >> (8 * i));
}

// Form and bytes of every stream (b = blockIdx.y, pixel p): one pass over its counts, coding it with rANS on
// the way into its slot (slots null: only measured).
template <class T>
__global__ void encode_sizes(const T* __restrict__ flat, i64 n_frames, int frame_len, int block, int table_stride, MODEL_PARAMS,
                             u8* forms, i64* sizes, u8* slots) {
    MAKE_MODEL
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y;
    bool active = p < frame_len;
    i64 lo = (i64)b * block;
    int n = (int)min((i64)block, n_frames - lo);
    Tiles<T> tiles(tile_buffers<T>(table_stride), flat, lo, n, frame_len, blockIdx.x * blockDim.x);
    const u16* vt = active ? encoder_tables(model, p, table_stride) : nullptr;
    u8* slot = slots && active ? slot_of(slots, b, p, block, n, frame_len, sizeof(T)) : nullptr;
    i64 room = slot ? (slot_bytes(n, sizeof(T)) - 4) / 2 : 0;
    BackwardCoder<Slotted> coder(Writer<Slotted>{{slot, room}, 0}, active ? model.run[p] : 0, active ? model.values[p] : 0, vt,
                                 model.chunks);
    i64 nnz = 0;
    u32 vmin = 0xFFFFFFFFu, vmax = 0;
    auto take = [&](int, u32 v) {
        nnz += v != 0;
        vmin = min(vmin, v);
        vmax = max(vmax, v);
        coder.take(v);
    };
    tiles.walk_backwards(active, take);
    if (!active) return;
    coder.finish();
    if (slot && coder.w.k <= room) put_le(slot, 0, coder.x, 4);
    i64 s = (i64)b * frame_len + p;
    if (nnz == 0) { forms[s] = EMPTY; sizes[s] = 0; return; }
    if (vmin == vmax) { forms[s] = CONSTANT; sizes[s] = 4; return; }
    i64 ans = 4 + 2 * coder.w.k;
    i64 sparse = even(nnz * (2 + (i64)sizeof(T)));
    i64 raw = slot_bytes(n, sizeof(T));
    if (ans <= sparse && ans <= raw) { forms[s] = ANS; sizes[s] = ans; }
    else if (sparse <= raw) { forms[s] = SPARSE; sizes[s] = sparse; }
    else { forms[s] = RAW; sizes[s] = raw; }
}

__device__ __forceinline__ void stream_bounds(const Streams& st, int b, int p, i64& start, i64& end, int& form) {
    i64 base = (i64)st.block_base[b];
    u32 entry = st.index[(i64)b * st.frame_len + p];
    start = base + (entry & OFFSET_MASK);
    end = p + 1 < st.frame_len ? base + (st.index[(i64)b * st.frame_len + p + 1] & OFFSET_MASK) : (i64)st.block_base[b + 1];
    form = (int)(entry >> FORM_SHIFT);
}

// An ANS stream from its slot to its place: the state, then the words in reverse.
__device__ void unslot(u8* out, i64 start, i64 end, const u8* slot) {
    for (int i = 0; i < 4; ++i) out[start + i] = slot[i];
    const u16* words = reinterpret_cast<const u16*>(slot + 4);
    u16* to = reinterpret_cast<u16*>(out + start + 4);
    i64 k = (end - start - 4) / 2;
    for (i64 j = 0; j < k; ++j) to[j] = words[k - 1 - j];
}

// Every stream written in the form and at the offset its index entry gives: an ANS stream from its slot
// (slots null: coded again in place), the others from the counts, walked last first, so a sparse stream's
// positions and counts are written from its end. A stream's padding byte is written too (out is not zeroed).
template <class T>
__global__ void encode_write(const T* __restrict__ flat, i64 n_frames, int block, int table_stride, STREAM_PARAMS, u8* out,
                             const u8* slots) {
    MAKE_STREAMS
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y;
    i64 lo = (i64)b * block;
    int n = (int)min((i64)block, n_frames - lo);
    i64 start = 0, end = 0;
    int form = EMPTY;
    if (p < frame_len) stream_bounds(st, b, p, start, end, form);
    if (form == CONSTANT) put_le(out, start, flat[lo * frame_len + p], 4);
    if (form == ANS && slots) unslot(out, start, end, slot_of(const_cast<u8*>(slots), b, p, block, n, frame_len, sizeof(T)));
    i64 nnz = form == SPARSE ? (end - start) / (2 + (i64)sizeof(T)) : 0;  // its bytes are nnz (2 + itemsize), made even
    i64 bare = form == SPARSE ? nnz * (2 + (i64)sizeof(T)) : form == RAW ? (i64)n * sizeof(T) : end - start;
    if (bare < end - start) out[end - 1] = 0;  // an odd length, made even
    bool ans = form == ANS && !slots;
    bool walks = ans || form == SPARSE || form == RAW;
    if (!__syncthreads_or(walks)) return;  // the whole CTA: nothing left to write from the counts
    Tiles<T> tiles(tile_buffers<T>(table_stride), flat, lo, n, frame_len, blockIdx.x * blockDim.x);
    const u16* vt = ans ? encoder_tables(model, p, table_stride) : nullptr;
    BackwardCoder<Placed> coder(Writer<Placed>{{out + start, (end - start - 4) / 2}, 0}, ans ? model.run[p] : 0,
                                ans ? model.values[p] : 0, vt, model.chunks);
    i64 j = nnz;
    auto take = [&](int i, u32 v) {
        if (ans) {
            coder.take(v);
        } else if (form == SPARSE) {
            if (v) {
                --j;
                put_le(out, start + 2 * j, i, 2);
                put_le(out, start + 2 * nnz + sizeof(T) * j, v, sizeof(T));
            }
        } else {
            put_le(out, start + sizeof(T) * i, v, sizeof(T));
        }
    };
    tiles.walk_backwards(walks, take);
    if (ans) {
        coder.finish();
        put_le(out, start, coder.x, 4);
    }
}

// ---------------------------------------------------------------- decoder

// LUT entry j of a table: the last symbol whose cumulative frequency is <= j << LUT_SHIFT.
__global__ void build_lut(const u8* run_of, const u8* values_of, const u32* table_start, const u16* cum, int frame_len, u8* lut) {
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (i64)frame_len * 2 * LUT_SIZE) return;
    int p = (int)(t / (2 * LUT_SIZE)), which = (int)(t / LUT_SIZE) & 1, j = (int)(t % LUT_SIZE);
    int nv = values_of[p], run = run_of[p];
    const u16* table = cum + table_start[p] + (which ? nv + 2 : 0);
    int nsym = which ? run + 2 : nv + 1;
    if (which && run == 0) { lut[t] = 0; return; }
    u32 slot = (u32)j << LUT_SHIFT;
    int s = 0;
    while (s + 1 < nsym && table[s + 1] <= slot) ++s;
    lut[t] = (u8)s;
}

__device__ __forceinline__ u32 get_le(const u8* payload, i64 at, int nbytes) {
    u32 v = 0;
    for (int i = 0; i < nbytes; ++i) v |= (u32)payload[at + i] << (8 * i);
    return v;
}

// A stream's 16-bit words in order, read 16 bytes at a time into registers (one load per eight
// words). Streams start on even bytes and the payload allocation is padded to 16 bytes, so every
// line holding a word of a stream is readable.
struct WordReader {
    const uint4* line;
    uint4 buf;
    int k;  // index of the next word in buf, 0..7
    WordReader() = default;
    __device__ explicit WordReader(const u8* at)
        : line(reinterpret_cast<const uint4*>(reinterpret_cast<size_t>(at) & ~(size_t)15)),
          k((int)(reinterpret_cast<size_t>(at) & 15) >> 1) {
        buf = __ldg(line);
    }
    __device__ __forceinline__ u32 next() {
        if (k == 8) {
            buf = __ldg(++line);
            k = 0;
        }
        u32 v = k < 4 ? (k < 2 ? buf.x : buf.y) : (k < 6 ? buf.z : buf.w);
        u32 word = (k & 1) ? v >> 16 : v & 0xFFFFu;
        ++k;
        return word;
    }
};

// Decode one symbol of the table t; the LUT gives the first candidate, at most a few steps from the answer.
// x is left before renormalisation.
__device__ __forceinline__ int get_symbol(u32& x, const u16* t, const u8* lut) {
    u32 slot = x & SLOT_MASK;
    int s = lut[slot >> LUT_SHIFT];
    while (t[s + 1] <= slot) ++s;
    u32 c = t[s], f = t[s + 1] - c;
    x = f * (x >> PROB_BITS) + slot - c;
    return s;
}

// The state renormalised after a symbol: a word read in below STATE_LOW; false if the stream has none left.
__device__ __forceinline__ bool refill(u32& x, WordReader& word, int& left) {
    if (x >= STATE_LOW) return true;
    if (left == 0) return false;
    x = (x << 16) | word.next();
    --left;
    return true;
}

// The excess of an escaped value: `chunks` 16-bit chunks from the state's low bits, a word read in after each;
// false if the stream has no word left for one.
__device__ __forceinline__ bool escape(u32& x, WordReader& word, int& left, int chunks, u64& excess) {
    excess = 0;
    for (int c = 0; c < chunks; ++c) {
        excess |= (u64)(x & 0xFFFFu) << (16 * c);
        x >>= 16;
        if (left == 0) return false;
        x = (x << 16) | word.next();
        --left;
    }
    return true;
}

// One pixel's tables: where its value and run tables and their LUTs are (device or shared memory).
struct PixelTables {
    int run;
    int nv;
    const u16* vt;
    const u16* rt;
    const u8* vlut;
    const u8* rlut;
};

__device__ __forceinline__ int table_entries(const Model& m, int p) {
    return m.values[p] + 2 + (m.run[p] ? m.run[p] + 3 : 0);
}

__device__ __forceinline__ PixelTables device_tables(const Model& m, int p) {
    const u16* vt = m.cum + m.table_start[p];
    const u8* vlut = m.lut + (i64)p * 2 * LUT_SIZE;
    return PixelTables{m.run[p], m.values[p], vt, vt + m.values[p] + 2, vlut, vlut + LUT_SIZE};
}

// Pixel p's tables copied to cum_copy (table_entries values) and lut_copy (2 * LUT_SIZE bytes).
__device__ PixelTables copy_tables(const Model& m, int p, u16* cum_copy, u8* lut_copy) {
    PixelTables g = device_tables(m, p);
    int entries = table_entries(m, p);
    for (int j = 0; j < entries; ++j) cum_copy[j] = g.vt[j];
    for (int j = 0; j < 2 * LUT_SIZE; ++j) lut_copy[j] = g.vlut[j];
    return PixelTables{g.run, g.nv, cum_copy, cum_copy + g.nv + 2, lut_copy, lut_copy + LUT_SIZE};
}

// This thread's copy of pixel p's tables in the shared memory at smem: every thread of the block
// has table_stride u16 entries, then 2 * LUT_SIZE bytes of LUTs.
__device__ PixelTables thread_tables(const Model& m, int p, void* smem, int table_stride) {
    u16* cums = reinterpret_cast<u16*>(smem);
    u8* luts = reinterpret_cast<u8*>(cums + blockDim.x * table_stride);
    return copy_tables(m, p, cums + threadIdx.x * table_stride, luts + threadIdx.x * 2 * LUT_SIZE);
}

struct NoEmit {
    __device__ void operator()(int, u32) {}
};

// A stream decoded in pieces: open it, then advance(upto, emit) hands emit(position, count) every nonzero count
// before position upto, in order, and stops there (a rANS stream between two symbols), so a decoder can take a
// stream a few rows at a time; finish() checks what is left: a sparse stream's remaining positions, and that a rANS
// stream decoded to its end ended where it should. Each returns 0 or an error code.
struct Cursor {
    const Model& m;
    const PixelTables& tb;
    const u8* pl;
    i64 start, length;
    int form, n;
    int i = 0;  // the next position (RAW, CONSTANT, ANS)
    // ANS: the state, the words not read yet, whether a value symbol is next (its run is read), the end token read
    WordReader word;
    u32 x = 0;
    int left = 0;
    bool value_due = false, ended = false;
    // SPARSE: the next entry, the entries, the last position
    i64 j = 0, nnz = 0;
    int last = -1;

    __device__ Cursor(const Model& model, const PixelTables& tables) : m(model), tb(tables) {}

    __device__ int open(const Streams& st, int b, int p, int n_positions) {
        i64 end;
        stream_bounds(st, b, p, start, end, form);
        length = end - start;
        pl = st.payload;
        n = n_positions;
        const int isz = m.itemsize;
        if (length < 0 || start < 0 || end > st.payload_bytes) return E_LENGTH;
        if (form == EMPTY) return length == 0 ? 0 : E_LENGTH;
        if (form == CONSTANT) {
            if (length != 4) return E_LENGTH;
            u32 v = get_le(pl, start, 4);
            return v == 0 || v > m.maxval ? E_VALUE : 0;
        }
        if (form == RAW) return length == even((i64)n * isz) ? 0 : E_LENGTH;
        if (form == SPARSE) {
            nnz = length / (2 + isz);
            return length != even(nnz * (2 + isz)) || nnz > n ? E_LENGTH : 0;
        }
        if (form != ANS) return E_FORM;
        if ((length & 1) || length < 4) return E_LENGTH;
        word = WordReader(pl + start);
        x = word.next();
        x |= word.next() << 16;
        left = (int)(length / 2) - 2;
        return x < STATE_LOW ? E_STATE : 0;
    }

    // PIECES: a value whose run reaches upto waits for the next advance (its symbol not read yet); otherwise it
    // is read and emitted with its run, and the stream stops at the first run that starts at or after upto.
    template <bool PIECES, class Emit>
    __device__ int advance(int upto, Emit& emit) {
        const int stop = min(upto, n), isz = m.itemsize;
        if (form == CONSTANT) {
            u32 v = get_le(pl, start, 4);
            for (; i < stop; ++i) emit(i, v);
            return 0;
        }
        if (form == RAW) {
            for (; i < stop; ++i) {
                u32 v = get_le(pl, start + (i64)isz * i, isz);
                if (v) emit(i, v);
            }
            return 0;
        }
        if (form == SPARSE) {
            for (; j < nnz; ++j) {
                int at = (int)get_le(pl, start + 2 * j, 2);
                if (at <= last || at >= n) return E_SPARSE;
                if (at >= stop) return 0;
                last = at;
                emit(at, get_le(pl, start + 2 * nnz + isz * j, isz));
            }
            return 0;
        }
        if (form != ANS) return 0;
        while (!ended) {
            if (i >= stop && (!value_due || PIECES)) return 0;
            if (const int code = token(emit)) return code;
        }
        return 0;
    }

    // The next symbol of a rANS stream not yet ended: a run of zeros, or the value due (emitted). advance takes
    // them in turn; decode_rows' lanes take one a round, through the same steps for either (only the table
    // differs), so a round's lanes take one path.
    template <class Emit>
    __device__ int token(Emit& emit) {
        const int run = tb.run;
        const bool is_run = !value_due && run > 0;
        const int s = get_symbol(x, is_run ? tb.rt : tb.vt, is_run ? tb.rlut : tb.vlut);
        if (!refill(x, word, left)) return E_TRUNCATED;
        if (is_run) {
            if (s == run + 1) {
                ended = true;
                return 0;
            }
            i += s;
            value_due = s != run;
            return i >= n ? E_POSITION : 0;
        }
        u64 v = (u64)s + (run > 0 ? 1 : 0);
        if (s == tb.nv) {
            u64 excess;
            if (!escape(x, word, left, m.chunks, excess)) return E_TRUNCATED;
            v += excess;
        }
        if (v > m.maxval) return E_VALUE;
        if (v) emit(i, (u32)v);
        ++i;
        value_due = false;
        return 0;
    }

    // Every count before this position has been emitted (all of them once the stream is through).
    __device__ int decoded() const {
        if (form == ANS) return ended ? n : i;
        if (form == SPARSE) return j < nnz ? min((int)get_le(pl, start + 2 * j, 2), n) : n;
        return form == EMPTY ? n : i;
    }

    // The checks left when the stream has been read as far as wanted: a sparse stream's positions not read yet
    // (advanced over to its end, emitting nothing: all of them are checked, as the CPU twin does); a rANS stream
    // advanced to its end (every position, or its end token) has its first state back and every word read, one
    // stopped before that is not checked.
    __device__ int finish() {
        if (form == SPARSE) {
            NoEmit none;
            return advance<false>(n, none);
        }
        if (form != ANS || (!ended && i < n)) return 0;
        return x != STATE_LOW || left != 0 ? E_STATE : 0;
    }
};

// Nonzero counts of stream (b, p), each handed to emit(position, count). Returns 0 or an error code. An ANS
// stream is decoded and checked up to position upto only (from there on nothing is emitted or checked):
// a frame needs the tokens before its position, on average half of its block's; a sparse stream's positions
// are all checked.
template <class Emit>
__device__ int decode_stream(const Streams& st, const Model& m, const PixelTables& tb, int b, int p, int n, Emit& emit,
                             int upto = 0x7FFFFFFF) {
    Cursor c(m, tb);
    int code = c.open(st, b, p, n);
    if (!code) code = c.advance<false>(upto, emit);
    return code ? code : c.finish();
}

// First error by stream: err holds (stream << ERROR_CODE_BITS) | code, ~0 when none.
__device__ __forceinline__ void report(u64* err, int b, int p, int frame_len, int code) {
    atomicMin(err, (((u64)b * frame_len + p) << ERROR_CODE_BITS) | (u64)code);
}

__device__ __forceinline__ void atomic_add(u32* a, u32 v) { atomicAdd(a, v); }
__device__ __forceinline__ void atomic_add(u64* a, u64 v) { atomicAdd(a, v); }
__device__ __forceinline__ void atomic_add(double* a, double v) { atomicAdd(a, v); }

// Sums of weights[m, k] * count[f, pixels[k]]: one block per (scan block, pixel chunk), accumulated in
// shared memory over the block's scan positions, then added into out (zeroed; wrapping u64 or double).
template <class W, int NM>
struct MaskEmit {
    W* acc;
    int block;
    W w[NM];  // this pixel's weight in each mask
    __device__ __forceinline__ void operator()(int pos, u32 v) {
#pragma unroll
        for (int m = 0; m < NM; ++m) atomic_add(&acc[m * block + pos], w[m] * (W)v);
    }
};

template <class W, int NM>
__global__ void mask_sums(STREAM_PARAMS, i64 n_frames, int block, const i64* pixels, i64 n_pix, int table_stride,
                          const W* weights, W* out, u64* err) {
    const int n_masks = NM;
    MAKE_STREAMS
    // shared: accumulators (n_masks x block), then each thread's copy of its pixel's tables and LUTs,
    // so the symbol searches of the decode loop never leave the multiprocessor.
    extern __shared__ unsigned long long smem_words[];
    W* acc = reinterpret_cast<W*>(smem_words);
    int b = blockIdx.x;
    i64 lo = (i64)b * block;
    int n = (int)min((i64)block, n_frames - lo);
    for (int j = threadIdx.x; j < n_masks * block; j += blockDim.x) acc[j] = W(0);
    __syncthreads();
    i64 k = (i64)blockIdx.y * blockDim.x + threadIdx.x;
    if (k < n_pix) {
        int p = (int)pixels[k];
        PixelTables tb = thread_tables(model, p, acc + n_masks * block, table_stride);
        MaskEmit<W, NM> emit{acc, block, {}};
#pragma unroll
        for (int m = 0; m < NM; ++m) emit.w[m] = weights[m * n_pix + k];
        int code = decode_stream(st, model, tb, b, p, n, emit);
        if (code) report(err, b, p, st.frame_len, code);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n_masks * n; j += blockDim.x) {
        int m = j / n, i = j % n;
        W v = acc[m * block + i];
        if (v != W(0)) atomic_add(&out[m * n_frames + lo + i], v);
    }
}

// Per-pixel sum (counted mult times) or max over frames with mult > 0, from the scan blocks listed.
struct RoiEmit {
    const u32* mult;
    i64 first;
    bool is_max;
    u64 total;
    __device__ void operator()(int pos, u32 v) {
        u32 k = mult[first + pos];
        if (k) total = is_max ? max(total, (u64)v) : total + (u64)v * k;
    }
};

__global__ void roi_reduce(STREAM_PARAMS, i64 n_frames, int block, int table_stride, const i64* blocks, i64 n_sel_blocks,
                           i64 per_chunk, const u32* mult, int is_max, u64* out, u64* err) {
    MAKE_STREAMS
    extern __shared__ unsigned long long smem_words[];
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= st.frame_len) return;
    PixelTables tb = thread_tables(model, p, smem_words, table_stride);
    i64 k0 = (i64)blockIdx.y * per_chunk, k1 = min(n_sel_blocks, k0 + per_chunk);
    RoiEmit emit{mult, 0, is_max != 0, 0};
    for (i64 k = k0; k < k1; ++k) {
        int b = (int)blocks[k];
        i64 lo = (i64)b * block;
        emit.first = lo;
        int code = decode_stream(st, model, tb, b, p, (int)min((i64)block, n_frames - lo), emit);
        if (code) { report(err, b, p, st.frame_len, code); return; }
    }
    if (emit.total) {
        if (is_max) atomicMax(&out[p], emit.total);
        else atomicAdd(&out[p], emit.total);
    }
}

struct FrameEmit {
    int at;
    u32 value;
    __device__ void operator()(int pos, u32 v) { if (pos == at) value = v; }
};

// The count at position `at` of a value-mode rANS stream of `length` bytes at `bytes`: decode_stream's
// value-mode loop up to that position, less what a frame does not need (run tokens, emits; a count below the
// escape is at most 61, so only escaped ones are held to maxval). The same checks, in the same order.
__device__ int frame_value(const u8* bytes, i64 length, const Model& m, const PixelTables& tb, int at, u32& value) {
    if ((length & 1) || length < 4) return E_LENGTH;
    WordReader word(bytes);
    u32 x = word.next();
    x |= word.next() << 16;
    if (x < STATE_LOW) return E_STATE;
    int left = (int)(length / 2) - 2;
    const int nv = tb.nv;
    const u16* vt = tb.vt;
    const u8* vlut = tb.vlut;
    u64 v = 0;
    for (int i = 0; i <= at; ++i) {
        int s = get_symbol(x, vt, vlut);
        if (!refill(x, word, left)) return E_TRUNCATED;
        v = (u64)s;
        if (s == nv) {
            u64 excess;
            if (!escape(x, word, left, m.chunks, excess)) return E_TRUNCATED;
            v += excess;
            if (v > m.maxval) return E_VALUE;
        }
    }
    value = (u32)v;
    return 0;
}

// Frame f's counts of every pixel into out, the first error into err. Thread t decodes pixel order[t]: the value-mode pixels (a token per
// position, the longest streams) come first, so no warp holds both kinds and runs both decode paths.
__global__ void frame(STREAM_PARAMS, i64 n_frames, int block, int table_stride, i64 f, const int* order, u32* out, u64* err) {
    MAKE_STREAMS
    extern __shared__ unsigned long long smem_words[];
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= st.frame_len) return;
    int p = order[t];
    PixelTables tb = thread_tables(model, p, smem_words, table_stride);
    int b = (int)(f / block);
    i64 lo = (i64)b * block;
    int n = (int)min((i64)block, n_frames - lo);
    FrameEmit emit{(int)(f - lo), 0};
    i64 start, end;
    int form;
    stream_bounds(st, b, p, start, end, form);
    int code;
    if (tb.run == 0 && form == ANS && start >= 0 && end >= start && end <= st.payload_bytes)
        code = frame_value(st.payload + start, end - start, model, tb, emit.at, emit.value);
    else
        code = decode_stream(st, model, tb, b, p, n, emit, emit.at + 1);
    if (code) report(err, b, p, st.frame_len, code);
    out[p] = emit.value;
}

template <class T>
struct DenseEmit {
    T* out;  // where frame `from` of the stream's pixel goes
    i64 frame_stride;
    int from, to;  // the stream's frames (block-relative) inside the decoded range
    __device__ void operator()(int pos, u32 v) {
        if (pos >= from && pos < to) out[(i64)(pos - from) * frame_stride] = (T)v;
    }
};

// The counts of the listed pixels in frames [frame_lo, frame_hi) back into out (zeroed): count[f, pixels[k]] goes
// to out[k * pixel_stride + (f - frame_lo) * frame_stride], frames x pixels or pixels x frames (a pixel's image
// contiguous, as SSB wants; every pixel's counts are decode_rows'). One thread per stream; blockIdx.y runs over
// the blocks from first_block that hold the range.
template <class T>
__global__ void decode(STREAM_PARAMS, i64 n_frames, int block, int table_stride, int first_block, int n_blocks, i64 frame_lo,
                       i64 frame_hi, const i64* pixels, i64 n_pix, i64 pixel_stride, i64 frame_stride, T* out, u64* err) {
    MAKE_STREAMS
    extern __shared__ unsigned long long smem_words[];
    i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    int b = first_block + blockIdx.y;
    if (k >= n_pix || (int)blockIdx.y >= n_blocks) return;
    int p = (int)pixels[k];
    PixelTables tb = thread_tables(model, p, smem_words, table_stride);
    i64 lo = (i64)b * block;
    int from = (int)max((i64)0, frame_lo - lo), to = (int)min((i64)block, frame_hi - lo);
    DenseEmit<T> emit{out + k * pixel_stride + (lo + from - frame_lo) * frame_stride, frame_stride, from, to};
    int code = decode_stream(st, model, tb, b, p, (int)min((i64)block, n_frames - lo), emit);
    if (code) report(err, b, p, st.frame_len, code);
}

// This warp's 32 pixels from p0 (those below frame_len): their tables and LUTs copied to the warp's shared memory
// together (the LUTs in 16-byte loads, both in neighbouring addresses), lane q's at cums + q * stride and
// luts + q * LUT_PITCH; stride (u16 entries) and LUT_PITCH (bytes) an odd number of words, so the lanes'
// searches fall in different banks. Every lane of the warp calls it.
__device__ PixelTables warp_tables(const Model& m, int p0, int frame_len, int stride, u16* cums, u8* luts) {
    const int lane = threadIdx.x & 31, p = p0 + lane, pixels = min(32, frame_len - p0);
    const bool has = lane < pixels;
    u32 first = has ? m.table_start[p] : 0;
    int entries = has ? table_entries(m, p) : 0;
#pragma unroll 4
    for (int e = lane; e < 32 * stride; e += 32) {
        int q = e / stride, j = e - q * stride;
        u32 from = __shfl_sync(0xFFFFFFFFu, first, q);
        int count = __shfl_sync(0xFFFFFFFFu, entries, q);
        if (j < count) cums[e] = m.cum[from + j];
    }
    const int lines = 2 * LUT_SIZE / 16;  // 16-byte lines of a pixel's two LUTs
    const uint4* src = reinterpret_cast<const uint4*>(m.lut + (i64)p0 * 2 * LUT_SIZE);
#pragma unroll 4
    for (int e = lane; e < 32 * lines; e += 32) {
        int q = e / lines;
        if (q < pixels) {
            uint4 v = __ldg(src + e);
            u32* to = reinterpret_cast<u32*>(luts + q * LUT_PITCH) + 4 * (e - q * lines);
            to[0] = v.x;
            to[1] = v.y;
            to[2] = v.z;
            to[3] = v.w;
        }
    }
    __syncwarp();
    const u16* vt = cums + lane * stride;
    const u8* vlut = luts + lane * LUT_PITCH;
    int nv = has ? m.values[p] : 0;
    return PixelTables{has ? m.run[p] : 0, nv, vt, vt + nv + 2, vlut, vlut + LUT_SIZE};
}

// A lane's counts from position `from` on, in its column of the warp's ring of DECODE_RING rows (position mod
// DECODE_RING; the rows of the ring are 32 entries apart).
template <class S>
struct RingEmit {
    S* column;
    int from;
    __device__ void operator()(int pos, u32 v) {
        if (pos >= from) column[(pos & (DECODE_RING - 1)) * 32] = (S)v;
    }
};

// Every pixel's counts of frames [frame_lo, frame_hi) into out ((frame_hi - frame_lo) x frame_len, every value
// written: no zeroing pass), or float T sqrt(count) (AMPLITUDE). A warp takes 32 neighbouring pixels of one scan
// block (blockIdx.y from first_block). Its lanes decode their streams into the warp's ring of counts (S, the
// counts' type), each lane one rANS symbol a round, and the warp stores DECODE_FLUSH rows, 32 neighbouring values a
// store, once every lane has decoded them; a lane ahead goes on up to the end of the ring meanwhile, so lanes
// wait for each other only there (decoding a fixed number of rows at a time made every round as long as its
// slowest lane's: about half the lanes idle, ncu on an H100). A range ending inside a scan block reads the rest of
// its streams to check them, as the CPU twin does. Shared memory per warp (decode_rows_bytes in
// resident/cuda/compressed.py): the ring (DECODE_RING x 32 S), then 32 tables of stride u16 entries, then 32
// LUTs of LUT_PITCH bytes.
template <class T, bool AMPLITUDE, class S>
__global__ void decode_rows(STREAM_PARAMS, i64 n_frames, int block, int stride, int first_block, i64 frame_lo, i64 frame_hi, T* out,
                            u64* err) {
    MAKE_STREAMS
    extern __shared__ unsigned long long smem_words[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    S* ring = reinterpret_cast<S*>(reinterpret_cast<u8*>(smem_words) +
                                   (i64)warp * (DECODE_RING * 32 * sizeof(S) + 32 * 2 * stride + 32 * LUT_PITCH));
    u16* cums = reinterpret_cast<u16*>(ring + DECODE_RING * 32);
    const int p0 = blockIdx.x * blockDim.x + warp * 32, p = p0 + lane;
    if (p0 >= st.frame_len) return;  // the whole warp
    PixelTables tb = warp_tables(model, p0, st.frame_len, stride, cums, reinterpret_cast<u8*>(cums + 32 * stride));
    const bool has = p < st.frame_len;
    const int b = first_block + blockIdx.y;
    const i64 lo = (i64)b * block;
    const int n = (int)min((i64)block, n_frames - lo);
    const int from = (int)max((i64)0, frame_lo - lo), to = (int)min((i64)n, frame_hi - lo);
    Cursor c(model, tb);
    int code = has ? c.open(st, b, p, n) : 0;
    S* column = ring + lane;
    for (int r = 0; r < DECODE_RING; ++r) column[r * 32] = 0;
    RingEmit<S> emit{column, from};
    T* row = out + (lo + from - frame_lo) * st.frame_len + p;
    for (int stored = from; stored < to;) {
        const int target = min(stored + DECODE_FLUSH, to), end = min(stored + DECODE_RING, to);
        while (true) {
            const int upto = has && !code ? c.decoded() : to;
            if (__all_sync(0xFFFFFFFFu, upto >= target)) break;
            if (upto < end) code = c.form == ANS ? c.token(emit) : c.advance<true>(end, emit);
        }
#pragma unroll 4
        for (; stored < target; ++stored, row += st.frame_len) {
            S& at = column[(stored & (DECODE_RING - 1)) * 32];
            const u32 v = at;
            at = 0;
            if (has) *row = AMPLITUDE ? (T)sqrtf((float)v) : (T)v;
        }
    }
    if (has && !code && to < n) {  // the rest of the stream read and checked, as the CPU twin decodes whole streams
        NoEmit none;
        code = c.advance<false>(n, none);
    }
    if (has && !code) code = c.finish();
    if (code) report(err, b, p, st.frame_len, code);
}

__global__ void check(STREAM_PARAMS, i64 n_frames, int block, int table_stride, int n_blocks, u64* err) {
    MAKE_STREAMS
    extern __shared__ unsigned long long smem_words[];
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y;
    if (p >= st.frame_len || b >= n_blocks) return;
    PixelTables tb = thread_tables(model, p, smem_words, table_stride);
    i64 lo = (i64)b * block;
    NoEmit emit;
    int code = decode_stream(st, model, tb, b, p, (int)min((i64)block, n_frames - lo), emit);
    if (code) report(err, b, p, st.frame_len, code);
}

// ---------------------------------------------------------------- series

// One acquisition of a series as the series kernels take it: DESC_WORDS u64 per acquisition, in the order
// of qgpu_dask/resident/cuda/compressed.py's SeriesTable (pointers as integers).
#ifndef DESC_WORDS
#error "DESC_WORDS comes from qgpu_dask/resident/cpu/compressed.py"
#endif
enum { D_INDEX, D_BASE, D_PAYLOAD, D_PAYLOAD_BYTES, D_RUN, D_VALUES, D_TABLE_START, D_CUM, D_LUT, D_TOTALS, D_BLOCK, D_CODING, D_MAXVAL,
       D_COUNT };
static_assert(D_COUNT <= DESC_WORDS, "the descriptor holds every field");

struct Member {
    Streams st;
    Model model;
    const u64* totals;
    int block;
};

__device__ __forceinline__ Member member_of(const u64* desc, int a, int frame_len) {
    const u64* d = desc + (i64)a * DESC_WORDS;
    u64 coding = d[D_CODING];
    Member m;
    m.st = Streams{reinterpret_cast<const u32*>(d[D_INDEX]), reinterpret_cast<const u64*>(d[D_BASE]),
                   reinterpret_cast<const u8*>(d[D_PAYLOAD]), (i64)d[D_PAYLOAD_BYTES], frame_len};
    m.model = Model{reinterpret_cast<const u8*>(d[D_RUN]), reinterpret_cast<const u8*>(d[D_VALUES]),
                    reinterpret_cast<const u32*>(d[D_TABLE_START]), reinterpret_cast<const u16*>(d[D_CUM]),
                    reinterpret_cast<const u8*>(d[D_LUT]), (int)(coding & 0xFF), (int)((coding >> 8) & 0xFF), (u32)d[D_MAXVAL]};
    m.totals = reinterpret_cast<const u64*>(d[D_TOTALS]);
    m.block = (int)d[D_BLOCK];
    return m;
}

// Sums of weights[m, k] * count[f, pixels[k]] for every acquisition of a series in one launch: work item
// blockIdx.x is (acquisition item_acq[i], scan block item_block[i]) and blockIdx.y a chunk of that
// acquisition's pixels: spans[2a] .. spans[2a] + spans[2a + 1] of pixels and of every row of weights
// (pix_len entries a row; acquisitions of one decomposition share theirs). The chunk-0 block of each item
// also adds offsets[m] * the frame totals (the complement), when offsets is given. out is (n_acq,
// n_masks_all, n_frames), zeroed or holding a previous result; masks m0 .. m0 + NM of it are added to.
// The sum of v over the 32 lanes of a warp (every lane calls it), wrapping for integers.
__device__ __forceinline__ u32 warp_sum(u32 v) { return __reduce_add_sync(0xFFFFFFFFu, v); }
template <class W>
__device__ __forceinline__ W warp_sum(W v) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, d);
    return v;
}

// A warp of value-mode rANS streams of one scan block decoded in lockstep, one position per step: the lanes'
// weighted counts at each position are summed across the warp and lane 0 adds them to the block's
// accumulators (one shared atomic per position and mask instead of 32 on one address). Every lane of the
// warp calls it; a lane that meets a malformed stream adds nothing more and returns its error code.
template <class W, int NM>
__device__ int lockstep_values(const Streams& st, const Model& m, const PixelTables& tb, i64 start, i64 end, int n, const W* w,
                               W* acc, int block) {
    WordReader word(st.payload + start);
    u32 x = word.next();
    x |= word.next() << 16;
    int code = x < STATE_LOW ? E_STATE : 0;
    int left = (int)((end - start) / 2) - 2;
    const int nv = tb.nv;
    const bool lane0 = (threadIdx.x & 31) == 0;
    for (int i = 0; i < n; ++i) {
        u32 v = 0;
        if (!code) {
            int s = get_symbol(x, tb.vt, tb.vlut);
            if (!refill(x, word, left)) code = E_TRUNCATED;
            u64 value = (u64)s;
            if (s == nv && !code) {
                u64 excess;
                if (!escape(x, word, left, m.chunks, excess)) code = E_TRUNCATED;
                value += excess;
            }
            if (!code && value > m.maxval) code = E_VALUE;
            v = code ? 0u : (u32)value;
        }
#pragma unroll
        for (int k = 0; k < NM; ++k) {
            W total = warp_sum(w[k] * (W)v);
            if (lane0 && total != W(0)) atomic_add(&acc[k * block + i], total);
        }
    }
    if (!code && (x != STATE_LOW || left != 0)) code = E_STATE;
    return code;
}

template <class W, int NM>
__global__ void series_mask_sums(const u64* desc, const int* item_acq, const int* item_block, int frame_len, i64 n_frames,
                                 const i64* spans, const i64* pixels, i64 pix_len, int table_stride, const W* weights, const W* offsets,
                                 int n_masks_all, int m0, W* out, u64* err) {
    extern __shared__ unsigned long long smem_words[];
    int a = item_acq[blockIdx.x], b = item_block[blockIdx.x];
    Member mb = member_of(desc, a, frame_len);
    i64 first = spans[2 * a], n_pix = spans[2 * a + 1];
    int block = mb.block;
    W* acc = reinterpret_cast<W*>(smem_words);
    i64 lo = (i64)b * block;
    int n = (int)min((i64)block, n_frames - lo);
    bool complement = offsets != nullptr && blockIdx.y == 0;
    for (int j = threadIdx.x; j < NM * block; j += blockDim.x) {
        int m = j / block, i = j % block;
        acc[j] = complement && i < n ? offsets[m0 + m] * (W)mb.totals[lo + i] : W(0);
    }
    __syncthreads();
    i64 k = (i64)blockIdx.y * blockDim.x + threadIdx.x;
    bool has = k < n_pix;
    i64 at = first + (has ? k : 0);
    int p = has ? (int)pixels[at] : 0;
    PixelTables tb{};
    W w[NM];
    i64 start = 0, end = 0;
    int form = EMPTY;
    if (has) {
        tb = thread_tables(mb.model, p, acc + NM * block, table_stride);
#pragma unroll
        for (int m = 0; m < NM; ++m) w[m] = weights[(i64)(m0 + m) * pix_len + at];
        stream_bounds(mb.st, b, p, start, end, form);
    }
    // a warp whose every lane holds a well-framed value-mode rANS stream decodes them in lockstep
    bool ready = has && tb.run == 0 && form == ANS && start >= 0 && end <= mb.st.payload_bytes && end - start >= 4 && !((end - start) & 1);
    int code = 0;
    if (__all_sync(0xFFFFFFFFu, ready)) {
        code = lockstep_values<W, NM>(mb.st, mb.model, tb, start, end, n, w, acc, block);
    } else if (has) {
        MaskEmit<W, NM> emit{acc, block, {}};
#pragma unroll
        for (int m = 0; m < NM; ++m) emit.w[m] = w[m];
        code = decode_stream(mb.st, mb.model, tb, b, p, n, emit);
    }
    if (code) atomicMin(err, (((u64)blockIdx.x * frame_len + p) << ERROR_CODE_BITS) | (u64)code);
    __syncthreads();
    W* mine = out + (i64)a * n_masks_all * n_frames + (i64)m0 * n_frames + lo;
    for (int j = threadIdx.x; j < NM * n; j += blockDim.x) {
        int m = j / n, i = j % n;
        W v = acc[m * block + i];
        if (v != W(0)) atomic_add(&mine[(i64)m * n_frames + i], v);
    }
}
