// FFTs of lines in shared memory, each line of N = P Q points in two steps held in registers (Line<Dft<P,
// radices...>, Dft<Q, radices...>>, natural order in and out):
//   step 1: for each q < Q, one thread: the P-point DFT of x[Q p + q] over p, times exp(-+2 pi i q k / N) (k < P);
//   step 2: for each k < P, one thread: the Q-point DFT of step 1's values over q, which is X[k + P s] (s < Q).
// The P- and Q-point DFTs are mixed-radix in registers (radices 2, 3, 4, 5, 8), their twiddles compile-time
// constants; the N-point twiddles come from a table (`roots`, float32 of float64 values). Each point is read
// and written in shared memory twice per FFT. Included by ptycho.cu (qgpu_dask/compile.py inlines it);
// qgpu_dask/phase/line_fft.py names the Line of an N and sizes its shared memory.

__device__ __forceinline__ float2 times(float2 a, float2 b) { return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }

// The padded layout of far_field_pair's rows, whose columns are transformed too: point i of a row at(i), one pad
// after every 16 points, so a column's neighbours fall in different banks; a row of n points takes padded(n).
__device__ __forceinline__ int at(int i) { return i + (i >> 4); }
__host__ __device__ constexpr int padded(int n) { return n + (n >> 4) + 1; }
// The least count >= n that is m modulo 16 (float2 points: 16 fill the 32 banks once).
__host__ __device__ constexpr int congruent(int n, int m) { return n + ((m - n) % 16 + 16) % 16; }

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
// at data + l * pitch (point i at i), in place, by all the block's threads (it syncs them: call it from every
// thread); scratch holds lines * scratch_line points; roots[m] = exp(-2 pi i m / N). Step 1's threads take
// line l's points q < Q, then line l + 1's: with lines (and their scratch) Q apart modulo 16, the 16 threads
// of a half-warp meet 16 neighbouring points, all in distinct banks (3.3-way conflicts on an H100 before,
// at 205 and 208 points a line).
template <class FIRST, class SECOND>
struct Line {
    static constexpr int P = FIRST::n, Q = SECOND::n, N = P * Q;
    static constexpr int scratch_pitch = Q | 1;  // odd: step 2's 16 threads of a half-warp meet distinct bank pairs
    static constexpr int scratch_line = congruent(P * scratch_pitch, Q);
    // Points a line takes in shared memory: Q modulo 16, or 2 where Q is a multiple of 16 (no half-warp spans two
    // lines then, any pitch serves step 1; 2 modulo 4 suits ptycho.cu's column loads best).
    static constexpr int pitch = congruent(N, Q % 16 ? Q : 2);
    // Lines l < lines whose point i is point(l, i) (a float2&), in place.
    template <bool INVERSE, class POINT>
    __device__ static void fft_at(POINT point, int lines, float2* scratch, const float2* __restrict__ roots) {
        for (int j = threadIdx.x; j < lines * Q; j += blockDim.x) {
            int l = j / Q, q = j - l * Q;
            float2 v[P];
#pragma unroll
            for (int p = 0; p < P; ++p) v[p] = point(l, Q * p + q);
            FIRST::template run<INVERSE>(v);
            float2* y = scratch + l * scratch_line + q;
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
            const float2* y = scratch + l * scratch_line + k * scratch_pitch;
            float2 u[Q];
#pragma unroll
            for (int q = 0; q < Q; ++q) u[q] = y[q];
            SECOND::template run<INVERSE>(u);
#pragma unroll
            for (int s = 0; s < Q; ++s) point(l, k + P * s) = u[s];
        }
        __syncthreads();
    }
    // Lines l < lines at data + l pitch, point i at i.
    template <bool INVERSE>
    __device__ static void fft(float2* data, int lines, float2* scratch, const float2* __restrict__ roots) {
        fft_at<INVERSE>([=](int l, int i) -> float2& { return data[l * pitch + i]; }, lines, scratch, roots);
    }
};
