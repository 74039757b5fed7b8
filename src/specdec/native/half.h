// What f16.cpp and bf16.cpp share: y[k,N] = x[k,K] . W[N,K]^T over 16-bit float weights as the file stores them
// (2 bytes a weight, never a float32 copy), f32.cpp's arithmetic on their exact float32 values. Per output element
// (r, n), with w_i the float32 value of weight (n, i) (exact: every F16 and BF16 value is a float32):
//   lane j (0..15): acc_j = 0, then for i = j, j + 16, j + 32, ... in order: acc_j = acc_j + x[r,i] * w_i
//                   (the product rounded, then the sum rounded: -ffp-contract=off, no fma)
//   y = tree16(acc): (acc_i + acc_{i+8}), then + 4, then (c0 + c2) + (c1 + c3)
// which is f32.cpp's dot16 of the row and the de-quantized weight row, bit for bit. Every op is one IEEE float32
// operation on one (r, n), so a row's result does not depend on the other rows, the row count, the thread count or
// the path. Paths: GCC vectors of one register (`vreg`: a zmm of 16 lanes on AVX-512; a ymm of 8 on AVX2, two per
// 16 lanes; SSE2 pairs on the scalar build) over tiles of RT rows x CT columns, each weight vector converted once
// per tile (F16: vcvtph2ps where F16C is, else an exact bit conversion; BF16: a 16-bit shift); mode 1 is the
// scalar reference, element by element.
// Speed: decoding (k = 1) is bound by reading the weights from memory, not by the CT dependent add chains (one
// zmm add per 32 bytes of weights per chain); a tile's CT rows of 2K bytes each are too short streams for the
// hardware prefetcher, so each tile prefetches the thread's next tile into L2 in address order while it runs
// (one core: about 10 -> 22 GB/s of weights, its memory bandwidth). More accumulators per output or fma would
// change the bits, which must stay f32.cpp's (the float32 twin of an F16 / BF16 model gives the same logits).
// The prompt mode (bit 2) is the same arithmetic (as f32.cpp's). Weights that are NaN give NaN outputs whose
// payload is outside the bitwise contract (F16C quiets signaling NaNs); inf and every finite value are exact.
#pragma once
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <utility>
#include "hsum.h"   // hsum16_ref: the same tree as lanes.h's tree16
#include "lanes.h"  // v16f, load16, tree16
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {
namespace half {
// a tile: RT rows x CT columns (-DHALF_RT=.. -DHALF_CT=.. to measure others: benchmarks/kernel_ab.py --flags)
#if defined(HALF_RT) != defined(HALF_CT)
#error "HALF_RT and HALF_CT go together"
#endif
#if defined(__AVX512F__)
#ifndef HALF_RT
#define HALF_RT 4  // 16 zmm accumulators
#define HALF_CT 4
#endif
const char* const ISA_NAME = "avx512";
#elif defined(__AVX2__)
#ifndef HALF_RT
#define HALF_RT 3  // 6 x 2 ymm accumulators: 0.89x the time of 2 x 2 at 4 and 8 rows on a Zen 3, the same at 1
#define HALF_CT 2
#endif
const char* const ISA_NAME = "avx2";
#else
#ifndef HALF_RT
#define HALF_RT 2
#define HALF_CT 2
#endif
const char* const ISA_NAME = "scalar";
#endif
const int RT = HALF_RT, CT = HALF_CT;

// one register of float lanes: a zmm (16 lanes) on AVX-512, else a ymm (8 lanes; on AVX2 GCC keeps arrays of the
// 16-lane v16f in memory, moving halves through general registers, so the tiles work on ymm halves: lane j of the
// 16 is lane j % 8 of half j / 8, the same sums in the same order)
#if defined(__AVX512F__)
typedef v16f vreg;
#else
typedef float vreg __attribute__((vector_size(32)));
#endif
const int VL = sizeof(vreg) / sizeof(float), H = LANES / VL;  // lanes a register, registers a 16-lane vector

inline vreg load_reg(const float* p) {
    vreg v;
    memcpy(&v, p, sizeof v);
    return v;
}

#ifndef HALF_PF_TILES  // how many tiles ahead a tile prefetches (0: none; 2 and 4 were no better on a Zen 3)
#define HALF_PF_TILES 1
#endif
#ifndef HALF_PF_LOCALITY  // __builtin_prefetch's locality: 2 = prefetcht1 (L2), 3 = prefetcht0 (L1)
#define HALF_PF_LOCALITY 2
#endif

// exact IEEE binary16 -> binary32; quiet: NaNs quieted like F16C's vcvtph2ps (the kernels), else payload kept as
// numpy's astype(float32) (the decoder)
template <bool QUIET>
inline float h2f_bits(uint16_t h) {
    const uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t f;
    if (e == 0) {
        if (m == 0) f = s;
        else {
            int sh = 0;
            uint32_t mm = m;
            while (!(mm & 0x400u)) { mm <<= 1; ++sh; }
            f = s | ((uint32_t)(113 - sh) << 23) | ((mm & 0x3ffu) << 13);
        }
    } else if (e == 31) f = s | 0x7f800000u | (m << 13) | (QUIET && m ? 0x400000u : 0u);
    else f = s | ((e + 112u) << 23) | (m << 13);
    float r;
    memcpy(&r, &f, 4);
    return r;
}

inline float bf2f(uint16_t h) {
    const uint32_t f = (uint32_t)h << 16;
    float r;
    memcpy(&r, &f, 4);
    return r;
}

struct F16 {
    static inline float value(uint16_t h) { return h2f_bits<true>(h); }
    static inline float decoded(uint16_t h) { return h2f_bits<false>(h); }  // = numpy's
    static inline vreg load(const uint16_t* p) {  // VL weights
        vreg v;
#if defined(__AVX512F__)
        const __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
        memcpy(&v, &f, sizeof v);
#elif defined(__AVX2__) && defined(__F16C__)
        const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
        memcpy(&v, &f, sizeof v);
#else
        float f[VL];
        for (int i = 0; i < VL; ++i) f[i] = value(p[i]);
        memcpy(&v, f, sizeof v);
#endif
        return v;
    }
};

struct BF16 {
    static inline float value(uint16_t h) { return bf2f(h); }
    static inline float decoded(uint16_t h) { return bf2f(h); }  // = gguf's (int32(int16) << 16)
    static inline vreg load(const uint16_t* p) {  // VL weights
        vreg v;
#if defined(__AVX512F__)
        const __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16);
        memcpy(&v, &u, sizeof v);
#elif defined(__AVX2__)
        const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16);
        memcpy(&v, &u, sizeof v);
#else
        typedef uint16_t vh __attribute__((vector_size(VL * 2)));
        typedef int32_t vi __attribute__((vector_size(VL * 4)));
        vh h;
        memcpy(&h, p, sizeof h);
        const vi u = __builtin_convertvector(h, vi) << 16;
        memcpy(&v, &u, sizeof v);
#endif
        return v;
    }
};

// rows r0..r0+R-1 x columns n0..n0+C-1: each weight vector converted once, then met by the R rows. pf: the
// thread's next tile (its C rows are C * K * 2 contiguous bytes), prefetched into L2 in address order, C 64-byte
// lines per 32 weights of this tile, so it is in L2 when its turn comes (at k = 1 a tile's C row streams of 2K
// bytes are too short for the hardware prefetcher: without it one core read about half the bandwidth it can);
// the arithmetic does not depend on it.
template <class F, int R, int C>
void tile(const uint16_t* W, int N, int K, const float* x, int r0, int n0, float* y, const uint16_t* pf) {
    const uint16_t* w[C];
    for (int c = 0; c < C; ++c) w[c] = W + (size_t)(n0 + c) * K;
    vreg acc[R][C][H];  // lanes h * VL .. of output (r0 + r, n0 + c)
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c)
            for (int h = 0; h < H; ++h) acc[r][c][h] = vreg{};
    auto step = [&](int i) {
        for (int h = 0; h < H; ++h) {
            vreg wv[C];
            for (int c = 0; c < C; ++c) wv[c] = F::load(w[c] + i + h * VL);
            for (int r = 0; r < R; ++r) {
                const vreg xv = load_reg(x + (size_t)(r0 + r) * K + i + h * VL);
                for (int c = 0; c < C; ++c) acc[r][c][h] += xv * wv[c];
            }
        }
    };
    int i = 0;
    for (; i + 2 * LANES <= K; i += 2 * LANES) {
        if (HALF_PF_TILES > 0) {
            const char* line = (const char*)pf + (size_t)(i / (2 * LANES)) * C * 64;
            for (int c = 0; c < C; ++c) __builtin_prefetch(line + 64 * c, 0, HALF_PF_LOCALITY);
        }
        step(i);
        step(i + LANES);
    }
    if (i < K) step(i);
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            v16f a;
            memcpy(&a, acc[r][c], sizeof a);
            y[(size_t)(r0 + r) * N + n0 + c] = tree16(a);
        }
}

typedef void (*tfn)(const uint16_t*, int, int, const float*, int, int, float*, const uint16_t*);

template <class F, int R, int... Cs>
constexpr void fill_row(tfn* row, std::integer_sequence<int, Cs...>) { ((row[Cs] = tile<F, R, Cs + 1>), ...); }

template <class F>
struct Tiles {
    tfn T[RT][CT];  // T[R - 1][C - 1]
    Tiles() { fill<0>(); }
    template <int R>
    void fill() {
        if constexpr (R < RT) {
            fill_row<F, R + 1>(T[R], std::make_integer_sequence<int, CT>{});
            fill<R + 1>();
        }
    }
};

// the scalar reference: the lane formula element by element
template <class F>
void reference(const uint16_t* W, int N, int K, const float* x, int k, float* y, int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n)
        for (int r = 0; r < k; ++r) {
            float acc[16] = {0};
            const float* xr = x + (size_t)r * K;
            const uint16_t* wr = W + (size_t)n * K;
            for (int i = 0; i < K; ++i) {
                const float p = xr[i] * F::value(wr[i]);
                acc[i % 16] = acc[i % 16] + p;
            }
            y[(size_t)r * N + n] = hsum16_ref(acc);
        }
}

// y[k,N] = x[k,K] . W^T; mode 1 (and 3): the scalar reference; else the tiles (the prompt mode is the same)
template <class F>
int gemm(const uint8_t* Wb, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    if (K <= 0 || K % LANES || k < 0 || N < 0) return -1;
    if (k == 0 || N == 0) return 0;
    if (nthreads < 1) nthreads = omp_get_max_threads();
    const uint16_t* W = (const uint16_t*)Wb;
    if (mode & 1) {
        reference<F>(W, N, K, x, k, y, nthreads);
        return 0;
    }
    static const Tiles<F> tiles;
    const int nt = (N + CT - 1) / CT;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int t = 0; t < nt; ++t) {
        const int n0 = t * CT, C = N - n0 < CT ? N - n0 : CT;
        // the next tile's rows (CT rows inside the matrix; the last tile: its own); only row block 0 prefetches
        const int ahead = n0 + HALF_PF_TILES * CT, last = N - CT > 0 ? N - CT : 0;
        const uint16_t* next = W + (size_t)(t + HALF_PF_TILES < nt ? (ahead < last ? ahead : last) : n0) * K;
        for (int r0 = 0; r0 < k; r0 += RT) {
            const int R = k - r0 < RT ? k - r0 : RT;
            tiles.T[R - 1][C - 1](W, N, K, x, r0, n0, y, r0 == 0 ? next : W + (size_t)n0 * K);
        }
    }
    return 0;
}

// float32 weights, bit for bit gguf.quants.dequantize
template <class F>
void dequant(const uint8_t* Wb, int N, int K, float* out) {
    const uint16_t* W = (const uint16_t*)Wb;
    const size_t n = (size_t)N * K;
    for (size_t i = 0; i < n; ++i) out[i] = F::decoded(W[i]);
}
}  // namespace half
}  // namespace

// the C entry points NAME_isa, NAME_gemm, NAME_dequant of the weight type T
#define HALF_ENTRY_POINTS(NAME, T)                                                                             \
    extern "C" {                                                                                               \
    const char* NAME##_isa(void) { return half::ISA_NAME; }                                                    \
    int NAME##_gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) { \
        return half::gemm<half::T>(W, N, K, x, k, y, nthreads, mode);                                          \
    }                                                                                                          \
    void NAME##_dequant(const uint8_t* W, int N, int K, float* out) { half::dequant<half::T>(W, N, K, out); }  \
    }
