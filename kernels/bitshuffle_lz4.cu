// Bitshuffle-LZ4 HDF5 chunks (filter 32008) decoded on the GPU, one warp per chunk.
//
// The twin of qgpu_dask/formats/bitshuffle_lz4.py (decode_chunk): same layout,
// same checks in the same order, same error codes and details, same bytes out;
// compiled at run time by qgpu_dask/formats/bitshuffle_lz4_cuda.py, which
// instantiates decode<T> by name. Every lane of the warp walks the chunk's
// header, block sizes and LZ4 tokens itself (the same bytes, so the reads are
// broadcasts and the control flow stays uniform); the lanes share the copies
// of each literal run and match, into the warp's block of shared memory, and
// then the bit-unshuffle, 8 elements a lane at a time, into the frame.

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// decode_chunk's error codes and the header's size, written only in qgpu_dask/formats/bitshuffle_lz4.py
// and passed by qgpu_dask/formats/bitshuffle_lz4_cuda.py as -D options (qgpu_dask/compile.py defines).
#ifndef OK
#error "OK comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef HEADER_SHORT
#error "HEADER_SHORT comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef TOTAL_SIZE
#error "TOTAL_SIZE comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef BLOCK_SIZE
#error "BLOCK_SIZE comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef SIZE_FIELD_CUT
#error "SIZE_FIELD_CUT comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef BLOCK_PAST_END
#error "BLOCK_PAST_END comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef LENGTH_CUT
#error "LENGTH_CUT comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef LITERALS_PAST_INPUT
#error "LITERALS_PAST_INPUT comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef LITERALS_PAST_OUTPUT
#error "LITERALS_PAST_OUTPUT comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef OFFSET_CUT
#error "OFFSET_CUT comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef OFFSET_ZERO
#error "OFFSET_ZERO comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef OFFSET_BEFORE_START
#error "OFFSET_BEFORE_START comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef MATCH_PAST_OUTPUT
#error "MATCH_PAST_OUTPUT comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef WRONG_LENGTH
#error "WRONG_LENGTH comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef TRAILING_MISSING
#error "TRAILING_MISSING comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef EXTRA_BYTES
#error "EXTRA_BYTES comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif
#ifndef HEADER_BYTES
#error "HEADER_BYTES comes from qgpu_dask/formats/bitshuffle_lz4.py"
#endif

struct Error {
    i64 code, block, a, b, c;
};

__device__ __forceinline__ Error error(i64 code, i64 block, i64 a, i64 b, i64 c) {
    Error e = {code, block, a, b, c};
    return e;
}

// Big-endian unsigned integer of n (<= 8) bytes; 8 bytes with the top bit set wrap negative, as on the CPU.
__device__ __forceinline__ i64 read_be(const u8* p, int n) {
    u64 v = 0;
    for (int t = 0; t < n; ++t) v = (v << 8) | p[t];
    return (i64)v;
}

// An LZ4 length whose 4-bit field is 15: the bytes that follow are added up to one below 255; -1 if the input ends.
__device__ __forceinline__ i64 long_length(const u8* src, i64& ip, i64 iend) {
    i64 length = 15;
    while (true) {
        if (ip >= iend) return -1;
        i64 more = src[ip++];
        length += more;
        if (more != 255) return length;
    }
}

// Decode the LZ4 block src[0:iend] into exactly dst[0:oend] (shared memory); every lane returns the same.
__device__ Error lz4_block(const u8* __restrict__ src, i64 iend, u8* dst, i64 oend, i64 block, int lane) {
    i64 ip = 0, op = 0;
    while (ip < iend) {
        i64 token = src[ip++];
        i64 lit = token >> 4;
        if (lit == 15) {
            lit = long_length(src, ip, iend);
            if (lit < 0) return error(LENGTH_CUT, block, iend, 0, 0);
        }
        if (lit > iend - ip) return error(LITERALS_PAST_INPUT, block, lit, ip, iend);
        if (lit > oend - op) return error(LITERALS_PAST_OUTPUT, block, lit, op, oend);
        for (i64 t = lane; t < lit; t += 32) dst[op + t] = src[ip + t];
        ip += lit;
        op += lit;
        if (ip == iend) break;
        if (iend - ip < 2) return error(OFFSET_CUT, block, iend, 0, 0);
        i64 offset = (i64)src[ip] | ((i64)src[ip + 1] << 8);
        ip += 2;
        if (offset == 0) return error(OFFSET_ZERO, block, op, 0, 0);
        if (offset > op) return error(OFFSET_BEFORE_START, block, offset, op, 0);
        i64 length = token & 15;
        if (length == 15) {
            length = long_length(src, ip, iend);
            if (length < 0) return error(LENGTH_CUT, block, iend, 0, 0);
        }
        length += 4;
        if (length > oend - op) return error(MATCH_PAST_OUTPUT, block, length, op, oend);
        __syncwarp();  // the bytes the match repeats are written
        // byte t of the match repeats byte t % offset of the offset bytes before it
        const u8* from = dst + op - offset;
        if (offset >= length) {
            for (i64 t = lane; t < length; t += 32) dst[op + t] = from[t];
        } else {
            for (i64 t = lane; t < length; t += 32) dst[op + t] = from[t % offset];
        }
        op += length;
        __syncwarp();
    }
    if (op != oend) return error(WRONG_LENGTH, block, op, oend, 0);
    return error(OK, -1, 0, 0, 0);
}

// Transpose the 8x8 bit matrix in x (bit 8 * row + column).
__device__ __forceinline__ u64 transpose8(u64 x) {
    u64 t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAull;
    x = x ^ t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCull;
    x = x ^ t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ull;
    return x ^ t ^ (t << 28);
}

// Undo one block's bit transpose: shuffled (8 * sizeof(T) rows of n / 8 bytes) to elements out[0:n].
template <typename T>
__device__ void unshuffle(const u8* shuffled, i64 n, T* __restrict__ out, int lane) {
    const i64 nb = n >> 3;
    for (i64 k = lane; k < nb; k += 32) {
        u64 value[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int j = 0; j < (int)sizeof(T); ++j) {
            u64 x = 0;
            for (int b = 0; b < 8; ++b) x |= (u64)shuffled[(8 * j + b) * nb + k] << (8 * b);
            x = transpose8(x);  // byte i: byte j of element 8k + i
            for (int i = 0; i < 8; ++i) value[i] |= ((x >> (8 * i)) & 0xFF) << (8 * j);
        }
        for (int i = 0; i < 8; ++i) out[8 * k + i] = (T)value[i];
    }
}

// Decode chunk w = data[starts[w]:ends[w]] into out[w * count : (w + 1) * count] (count elements of T); the
// chunk's Error goes to errors[w] (code 0 when it decoded). Shared memory: scratch bytes, >= the largest block.
template <typename T>
__global__ void decode(const u8* __restrict__ data, const i64* __restrict__ starts, const i64* __restrict__ ends, i64 n_chunks,
                       T* __restrict__ out, i64 count, i64 scratch, Error* errors) {
    extern __shared__ u8 shuffled[];
    const i64 w = blockIdx.x;
    const int lane = threadIdx.x;
    if (w >= n_chunks) return;
    const u8* src = data + starts[w];
    const i64 size = ends[w] - starts[w];
    const i64 itemsize = sizeof(T);
    const i64 nbytes = count * itemsize;
    T* frame = out + w * count;
    Error e = error(OK, -1, 0, 0, 0);
    if (size < HEADER_BYTES) {
        e = error(HEADER_SHORT, -1, size, 0, 0);
    } else if (read_be(src, 8) != nbytes) {
        e = error(TOTAL_SIZE, -1, read_be(src, 8), nbytes, itemsize);
    } else {
        const i64 block_bytes = read_be(src + 8, 4);
        if (block_bytes == 0 || block_bytes % (8 * itemsize) != 0) {
            e = error(BLOCK_SIZE, -1, block_bytes, itemsize, 0);
        } else {
            const i64 block_elems = block_bytes / itemsize;
            const i64 n_full = count / block_elems;
            const i64 last = (count % block_elems) & ~7ll;
            const i64 n_blocks = n_full + (last > 0 ? 1 : 0);
            i64 pos = HEADER_BYTES, done = 0;
            if ((block_elems < count ? block_elems : count) * itemsize > scratch) {
                e = error(BLOCK_SIZE, -1, block_bytes, itemsize, 0);  // the host sizes scratch for every block: never met
            }
            for (i64 block = 0; e.code == OK && block < n_blocks; ++block) {
                const i64 n = block < n_full ? block_elems : last;
                if (size - pos < 4) {
                    e = error(SIZE_FIELD_CUT, block, pos, size, 0);
                    break;
                }
                const i64 csize = read_be(src + pos, 4);
                pos += 4;
                if (csize > size - pos) {
                    e = error(BLOCK_PAST_END, block, csize, pos - 4, size);
                    break;
                }
                e = lz4_block(src + pos, csize, shuffled, n * itemsize, block, lane);
                if (e.code != OK) break;
                pos += csize;
                __syncwarp();
                unshuffle<T>(shuffled, n, frame + done, lane);
                __syncwarp();
                done += n;
            }
            if (e.code == OK) {
                const i64 rest = nbytes - done * itemsize;
                if (size - pos < rest) {
                    e = error(TRAILING_MISSING, -1, rest, pos, size - pos);
                } else if (size - pos > rest) {
                    e = error(EXTRA_BYTES, -1, size - pos - rest, size, pos + rest);
                } else {
                    u8* tail = (u8*)frame + done * itemsize;
                    for (i64 t = lane; t < rest; t += 32) tail[t] = src[pos + t];
                }
            }
        }
    }
    if (lane == 0) errors[w] = e;
}
