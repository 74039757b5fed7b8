// What q4k.cpp and q6k.cpp share (and kgroups.h, for q5k, q3k, q2k): the 256-weight K-quant blocks against int8 activations quantized per row per
// 256-block (d = amax/127, round-half-even as x86 cvtps2dq, clamped to [-127,127]), in 384-byte records per
// (block, row), block-major ([nb][k]): [0,256) int8 a, [256,320) per format, [320,324) dx float.
// Here: the compiled path (KQ_AVX512 / KQ_AVX2 / KQ_SCALAR, the same conditions for both formats), fp16 -> fp32,
// the fixed-tree horizontal sums, Q4_K's / Q5_K's scale decode, Q6_K's code decode (also q6k16.cpp's), the AVX2 / scalar per-block quantizer (the AVX-512 one stays in each format,
// where it is fused with the format's record layout), prefetch, the AVX2 record permutation, the dispatch tables
// over 1..16 rows, the tile driver (run_tiles: q4k, q6k) and the gemm driver. The format arithmetic stays in the .cpp files; see their header comments.
#pragma once
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && defined(__F16C__) && defined(__FMA__)
#define KQ_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KQ_AVX2 1
#else
#define KQ_SCALAR 1
#endif
#if !defined(KQ_SCALAR)
#include <immintrin.h>
#endif
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#include <omp.h>
#include "hsum.h"   // hsum16_ref, AVX2 hsum16

namespace {
const int QK = 256;
const int REC = 384;   // record bytes per (block, row)
const int DXO = 320;   // offset of dx in a record

#if defined(KQ_AVX512)
const char* const KQ_ISA_NAME = "avx512-vnni";
#elif defined(KQ_AVX2)
const char* const KQ_ISA_NAME = "avx2";
#else
const char* const KQ_ISA_NAME = "scalar";
#endif

#if defined(KQ_SCALAR)
// portable IEEE binary16 -> binary32 (exact; NaNs quieted like F16C vcvtph2ps; equal to it on all 65536 inputs)
inline float h2f_bits(uint16_t h) {
    const uint32_t s = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t f;
    if (e == 0) {
        if (m == 0) f = s;
        else {
            int sh = 0; uint32_t mm = m;
            while (!(mm & 0x400u)) { mm <<= 1; ++sh; }
            f = s | ((uint32_t)(113 - sh) << 23) | ((mm & 0x3ffu) << 13);
        }
    } else if (e == 31) f = s | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);
    else f = s | ((e + 112u) << 23) | (m << 13);
    float r; memcpy(&r, &f, 4); return r;
}
inline float h2f(const uint8_t* p) { uint16_t h; memcpy(&h, p, 2); return h2f_bits(h); }
#else
inline float h2f(const uint8_t* p) { uint16_t h; memcpy(&h, p, 2); return _cvtsh_ss(h); }
#endif

#if defined(KQ_AVX512)
inline float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 e = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(e);
}
#endif

// ---------------- activation quantization (per row, independent of k) ----------------
#if defined(KQ_AVX512)
// amax = max|x| of one 256-block
inline float block_amax(const float* xs) {
    const __m512 sgn = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < QK; i += 16) m = _mm512_max_ps(m, _mm512_and_ps(_mm512_loadu_ps(xs + i), sgn));
    return _mm512_reduce_max_ps(m);
}
#else
// Non-AVX-512 quantizers (same bits as the AVX-512 ones): amax = max|x|, d = amax/127,
// q = round-half-even(x * (127/amax)) with x86 cvtps2dq semantics (out of range -> INT_MIN), clamped to [-127,127].
inline int32_t cvt_rne(float v) {
    if (!(fabsf(v) < 2147483648.f)) return INT32_MIN;
    return (int32_t)nearbyintf(v);
}
// one 256-block: qi[256] (natural order) and d
inline float quantize_block_qi(const float* xs, int32_t* qi) {
#if defined(KQ_AVX2)
    const __m256 sgn = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < QK; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(xs + i), sgn));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    float d = amax / 127.f;
    if (amax == 0.f) { memset(qi, 0, QK * sizeof(int32_t)); d = 0.f; }
    else {
        const __m256 is = _mm256_set1_ps(127.f / amax);
        const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
        for (int i = 0; i < QK; i += 8) {
            const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + i), is));
            _mm256_store_si256((__m256i*)(qi + i), _mm256_min_epi32(_mm256_max_epi32(v, lo), hi));
        }
    }
#else
    float amax = 0.f;
    for (int i = 0; i < QK; ++i) { const float v = fabsf(xs[i]); amax = amax > v ? amax : v; }
    float d = amax / 127.f;
    if (amax == 0.f) { memset(qi, 0, QK * sizeof(int32_t)); d = 0.f; }
    else {
        const float is = 127.f / amax;
        for (int i = 0; i < QK; ++i) {
            const int32_t v = cvt_rne(xs[i] * is);
            qi[i] = v < -127 ? -127 : v > 127 ? 127 : v;
        }
    }
#endif
    return d;
}
// one row: FINISH(qi, d, record) writes the record of each block (records at rec0 + b * bstride)
template <void (*FINISH)(const int32_t*, float, uint8_t*)>
void quantize_row_qi(const float* x, int K, uint8_t* rec0, size_t bstride) {
    const int nb = K / QK;
    for (int b = 0; b < nb; ++b) {
        alignas(32) int32_t qi[QK];
        const float d = quantize_block_qi(x + (size_t)b * QK, qi);
        FINISH(qi, d, rec0 + (size_t)b * bstride);
    }
}
#endif

// the 8 6-bit scales and mins of Q4_K and Q5_K (ggml get_scale_min_k4 via 32-bit tricks)
static inline void decode_scales(const uint8_t* s12, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[4];
    memcpy(u, s12, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    uint32_t ua = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = ua;
    u[0] &= k1;
    memcpy(sc, u, 8);
    memcpy(mn, u + 2, 8);
}

// Q6_K: the natural-order decode of one block to unsigned codes q+32 (0..63), straight from the ggml formula
inline void decode_codes(const uint8_t* blk, uint8_t u[256]) {
    for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = blk + 64 * h; const uint8_t* qh = blk + 128 + 32 * h;
        for (int l = 0; l < 32; ++l) {
            u[128 * h + l] = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
            u[128 * h + l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            u[128 * h + l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            u[128 * h + l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
}

#if !defined(KQ_SCALAR)
// software prefetch of NL cache lines PF bytes past blk (nothing when pf = 0); hint 0: T0, else T1
template <int NL>
__attribute__((always_inline)) inline void prefetch_block(const uint8_t* blk, int pf, int hint) {
    if (pf) {
        const char* pp = (const char*)blk + pf;
        if (hint == 0) {
#pragma GCC unroll 8
            for (int i = 0; i < NL; ++i) _mm_prefetch(pp + 64 * i, _MM_HINT_T0);
        } else {
#pragma GCC unroll 8
            for (int i = 0; i < NL; ++i) _mm_prefetch(pp + 64 * i, _MM_HINT_T1);
        }
    }
}
#endif

#if defined(KQ_AVX2)
// the AVX2 kernels' activation order: a[p] = a_before[perm[p]] in each of the nrec records
void permute_records(uint8_t* rec, size_t nrec, const int* perm) {
    for (size_t i = 0; i < nrec; ++i) {
        uint8_t* a = rec + i * REC;
        uint8_t tmp[256];
        memcpy(tmp, a, 256);
        for (int p = 0; p < 256; ++p) a[p] = tmp[perm[p]];
    }
}
#define KQ_AVX2_PERM(perm) (perm)
#else
#define KQ_AVX2_PERM(perm) nullptr
#endif

// ---------------- dispatch over the row count and the gemm driver ----------------
// kernel_rows<R>(W, N, K, rec, r0, kall, y, nthreads): rows r0..r0+R-1 of the kall rows whose records are rec
// (kgroups.h's formats); q4k and q6k give tile kernels instead (below)
typedef void (*kfn)(const uint8_t*, int, int, const uint8_t*, int, int, float*, int);

// Tile kernels, the alternative to kernel_rows: tile<R>(W, n0, n1, N, K, rec, r0, kall, y) computes rows r0..r0+R-1
// of outputs n0..n1-1 on the calling thread. The driver (run_tiles) gives each thread whole tiles of NT outputs and
// runs every row group over a tile before the next, so a tile's weights come from memory once for all k rows (from
// cache for the later groups); the k rows make ceil(k / G) groups whose sizes differ by at most 1 (<= G rows each).
// A row's arithmetic is the same in every group (one template per row count, the same per-row code).
typedef void (*tfn)(const uint8_t*, int, int, int, int, const uint8_t*, int, int, float*);
struct Tiles { const tfn* tab; int G; int NT; };   // tab[1..16]; G <= 16; NT: the largest tile
#if defined(KQ_SCALAR)
#define KQ_TILES(kernel, G, NT) const Tiles TILES = {nullptr, G, NT}
#else
#define KQ_TILES(kernel, G, NT) const tfn TILE_FNS[17] = {nullptr, \
    kernel<1>, kernel<2>, kernel<3>, kernel<4>, kernel<5>, kernel<6>, \
    kernel<7>, kernel<8>, kernel<9>, kernel<10>, kernel<11>, kernel<12>, \
    kernel<13>, kernel<14>, kernel<15>, kernel<16>}; \
    const Tiles TILES = {TILE_FNS, G, NT}

inline void run_tiles(const Tiles& t, const uint8_t* W, int N, int K, const uint8_t* rec, int k, float* y,
                      int nthreads) {
    const int ng = (k + t.G - 1) / t.G, small = k / ng, big = k % ng;   // the first big groups: small + 1 rows
    int nt = t.NT;   // smaller tiles where N gives fewer than 4 a thread (the arithmetic does not depend on them)
    while (nt > 8 && (N + nt - 1) / nt < 4 * nthreads) nt /= 2;
    const int ntiles = (N + nt - 1) / nt;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int i = 0; i < ntiles; ++i) {
        const int n0 = i * nt, n1 = n0 + nt < N ? n0 + nt : N;
        for (int g = 0, r0 = 0; g < ng; ++g) {
            const int R = small + (g < big);
            t.tab[R](W, n0, n1, N, K, rec, r0, k, y);
            r0 += R;
        }
    }
}
#endif

// y[k,N] = x[k,K] . W^T: records of the k rows (QROW per row), then mode 1 (and the scalar build) REF, the scalar
// reference, else the compiled kernels: tiles' (run_tiles) when given, else ktab's in groups of at most 16 rows
// (AVX2: records permuted by perm first)
template <void (*QROW)(const float*, int, uint8_t*, size_t),
          void (*REF)(const uint8_t*, int, int, const uint8_t*, int, float*, int)>
int gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode,
         const kfn* ktab, const int* perm, const Tiles* tiles = nullptr) {
    if (K % QK || k < 0 || N < 0) return -1;
    if (k == 0 || N == 0) return 0;
    const int nb = K / QK;
    uint8_t* rec = (uint8_t*)aligned_alloc(64, (size_t)k * nb * REC);
    if (!rec) return -2;
    for (int r = 0; r < k; ++r) QROW(x + (size_t)r * K, K, rec + (size_t)r * REC, (size_t)k * REC);
#if defined(KQ_SCALAR)
    (void)mode; (void)ktab; (void)perm; (void)tiles;
    REF(W, N, K, rec, k, y, nthreads);
#else
    if (mode == 1) REF(W, N, K, rec, k, y, nthreads);
    else {
#if defined(KQ_AVX2)
        if (perm) permute_records(rec, (size_t)k * nb, perm);   // nullptr: the records' order is the kernel's
#else
        (void)perm;
#endif
        if (tiles && tiles->tab) run_tiles(*tiles, W, N, K, rec, k, y, nthreads);
        else
            for (int r0 = 0; r0 < k; r0 += 16) {
                const int R = k - r0 < 16 ? k - r0 : 16;
                ktab[R](W, N, K, rec, r0, k, y, nthreads);
            }
    }
#endif
    free(rec);
    return 0;
}
}  // namespace
