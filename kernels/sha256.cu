// SHA-256 (FIPS 180-4) of many byte ranges of one device buffer at once, one thread a range.
//
// A saved container's leaf digests (formats/container.py: an array's checksum is the SHA-256 of the
// SHA-256 digests of its LEAF-byte leaves), taken in the device memory a reopen copied the arrays into,
// so the host's cores only read the file. Compiled at run time by qgpu_dask/formats/sha256_cuda.py; the
// twin is hashlib.sha256 of each range (container.leaf_digests), tested with ==.

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

__constant__ u32 ROUND_K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u,
};

__device__ __forceinline__ u32 rotr(u32 x, int n) { return __funnelshift_r(x, x, n); }

// One 64-byte block (16 big-endian words w, overwritten as the message schedule rolls) into the state.
__device__ __forceinline__ void compress(u32 state[8], u32 w[16]) {
    u32 a = state[0], b = state[1], c = state[2], d = state[3], e = state[4], f = state[5], g = state[6], h = state[7];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        if (i >= 16) {
            u32 w15 = w[(i - 15) & 15], w2 = w[(i - 2) & 15];
            w[i & 15] += (rotr(w15, 7) ^ rotr(w15, 18) ^ (w15 >> 3)) + w[(i - 7) & 15] + (rotr(w2, 17) ^ rotr(w2, 19) ^ (w2 >> 10));
        }
        u32 t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + ROUND_K[i] + w[i & 15];
        u32 t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    state[0] += a; state[1] += b; state[2] += c; state[3] += d;
    state[4] += e; state[5] += f; state[6] += g; state[7] += h;
}

// digest[32 r .. 32 r + 31] = SHA-256 of data[start[r] .. start[r] + length[r]), for r < n.
extern "C" __global__ void sha256_ranges(const u8* data, const u64* start, const u64* length, i64 n, u8* digest) {
    i64 r = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (r >= n) return;
    const u8* p = data + start[r];
    const u64 len = length[r];
    u32 state[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au, 0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    u32 w[16];
    const u64 whole = len / 64;
    const bool lines = ((u64)p & 15) == 0;  // 16-byte loads where the range starts on a line (a leaf always does)
    for (u64 blk = 0; blk < whole; ++blk) {
        const u8* q = p + 64 * blk;
        if (lines) {
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                uint4 x = reinterpret_cast<const uint4*>(q)[v];
                w[4 * v] = __byte_perm(x.x, 0, 0x0123);
                w[4 * v + 1] = __byte_perm(x.y, 0, 0x0123);
                w[4 * v + 2] = __byte_perm(x.z, 0, 0x0123);
                w[4 * v + 3] = __byte_perm(x.w, 0, 0x0123);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 16; ++i)
                w[i] = (u32)q[4 * i] << 24 | (u32)q[4 * i + 1] << 16 | (u32)q[4 * i + 2] << 8 | (u32)q[4 * i + 3];
        }
        compress(state, w);
    }
    // The tail: the last len % 64 bytes, the 0x80 byte, zeros, and the length in bits (big-endian, 64 bits)
    // in the last 8 bytes of one block, or of a second when the tail leaves fewer than 9 bytes free.
    const u8* q = p + 64 * whole;
    const int rest = (int)(len - 64 * whole);
    const int blocks = rest < 56 ? 1 : 2;
    const u64 bits = len * 8;
    for (int t = 0; t < blocks; ++t) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            u32 word = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int at = 64 * t + 4 * i + k;
                const u32 byte = at < rest ? q[at] : (at == rest ? 0x80u : 0u);
                word = word << 8 | byte;
            }
            w[i] = word;
        }
        if (t == blocks - 1) {
            w[14] = (u32)(bits >> 32);
            w[15] = (u32)bits;
        }
        compress(state, w);
    }
    u8* out = digest + 32 * r;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        out[4 * i] = (u8)(state[i] >> 24);
        out[4 * i + 1] = (u8)(state[i] >> 16);
        out[4 * i + 2] = (u8)(state[i] >> 8);
        out[4 * i + 3] = (u8)state[i];
    }
}
