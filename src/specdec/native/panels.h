// What the panel kernels share (q4k16.cpp, q6k16.cpp, q5k16.cpp, q2k16.cpp, q3k16.cpp: a K-quant matrix re-laid out
// once at load in panels of 16 output rows, one zmm = 16 output elements): the activations' quantizer, packing
// (Codes32: a column's codes into the panel rows eight bytes a word) and decoding the panels, the
// scalar reference's loops, the driver over panels and row groups, the AMX product (prompt.h's tiles, each panel
// converted on the fly by the format) and the C entry points. The format's arithmetic, its panel layout and its
// kernels stay in its .cpp file.
//
// Activations, per row and 256-block (the other K-quant kernels' quantizer: d = amax/127, round-half-even as x86
// cvtps2dq, clamped to [-127,127]): a int8 [K] natural order, dx [nb], and E int32 a block of what the format
// needs of the block's a (SUMS: Q4_K the sub-block sums as int16 pairs, Q6_K 32 x the 16-weight sums).
#pragma once
#include "kquant.h"
#include "prompt.h"   // AMX: prompt.h's tile product over its AMX panels, made from the panels on the fly

namespace {

// one 256-block of one row -> q [256] (natural order); returns d
inline float quant_block(const float* xs, int8_t* q) {
#if defined(KQ_AVX512)
    const float amax = block_amax(xs);
    if (amax == 0.f) { memset(q, 0, QK); return 0.f; }
    const __m512 is = _mm512_set1_ps(127.f / amax);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int i = 0; i < QK; i += 16) {
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + i), is));
        _mm_storeu_si128((__m128i*)(q + i), _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(v, lo), hi)));
    }
    return amax / 127.f;
#else
    alignas(32) int32_t qi[QK];
    const float d = quantize_block_qi(xs, qi);
    for (int i = 0; i < QK; ++i) q[i] = (int8_t)qi[i];
    return d;
#endif
}

// the rows' activations: a [k][K], dx [k][nb], ex [k][nb][E] (SUMS(q of a block, its E ints))
template <int E, void (*SUMS)(const int8_t*, int32_t*)>
void quant_rows(const float* x, int k, int K, int8_t* A, float* DX, int32_t* EX) {
    const int nb = K / QK;
    for (int r = 0; r < k; ++r)
        for (int b = 0; b < nb; ++b) {
            const size_t i = (size_t)r * nb + b;
            int8_t* q = A + (size_t)r * K + (size_t)b * QK;
            DX[i] = quant_block(x + (size_t)r * K + (size_t)b * QK, q);
            SUMS(q, EX + i * E);
        }
}

// what the formats with mins need of a block's activations (q4k16, q5k16: W = 32; q2k16, q5k16's AVX2 wide product:
// W = 16): the sums of each W activations, as int16 pairs mp[p] = sum_2p | sum_2p+1 << 16 (|sum| <= 32 * 127)
template <int W>
void pair_sums(const int8_t* q, int32_t* mp) {
    int t[QK / W];
    for (int j = 0; j < QK / W; ++j) {
        int s = 0;
        for (int i = 0; i < W; ++i) s += q[W * j + i];
        t[j] = s;
    }
    for (int p = 0; p < QK / W / 2; ++p) mp[p] = (int32_t)((uint32_t)(uint16_t)t[2 * p] | ((uint32_t)(uint16_t)t[2 * p + 1] << 16));
}
// W: N rows of K/256 blocks of BB bytes -> the panels (N/16 x nb blocks of PB bytes, zeroed first): COLUMN(block,
// panel block, c) writes column c of one panel block; -1 when N % 16 or K % 256
template <int BB, int PB, void (*COLUMN)(const uint8_t*, uint8_t*, int)>
int pack_panels(const uint8_t* W, int N, int K, uint8_t* out, int nthreads) {
    if (N % 16 || K % QK || N < 0 || K <= 0) return -1;
    const int nb = K / QK;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int g = 0; g < N / 16; ++g)
        for (int b = 0; b < nb; ++b) {
            uint8_t* pb = out + ((size_t)g * nb + b) * PB;
            memset(pb, 0, PB);
            for (int c = 0; c < 16; ++c) COLUMN(W + ((size_t)(16 * g + c) * nb + b) * BB, pb, c);
        }
    return 0;
}

// Packing one column's sub-block s of natural-order codes u (32 bytes at u + 32s), eight bytes a word: the rows of
// the panel layouts (q4k16.cpp, q5k16.cpp, q6k16.cpp, q3k16.cpp, q2k16.cpp) hold, for i = 0..3 and e = 0..3, byte 4i + e of the 16 codes
// u[32s + 4i + e] (A) and of u[32s + 16 + 4i + e] (B)
struct Codes32 {
    uint64_t a[2], b[2];   // A and B, bytes 4i + e
    explicit Codes32(const uint8_t* u) { memcpy(a, u, 16); memcpy(b, u + 16, 16); }
    // the nibble rows: row i, byte e = A & 15 | (B & 15) << 4, stored at out + stride * i (4 bytes)
    void store_nibbles(uint8_t* out, size_t stride) const {
        const uint64_t m = 0x0F0F0F0F0F0F0F0Full;
        store_rows(out, stride, (a[0] & m) | (b[0] & m) << 4, (a[1] & m) | (b[1] & m) << 4);
    }
    // bit 4 of the codes, as pairs: byte e, bit 2i = bit 4 of A(4i + e), bit 2i + 1 = that of B(4i + e)
    uint32_t fifth_bits() const {
        const uint64_t m = 0x0101010101010101ull;
        return gather((a[0] >> 4 & m) | (b[0] >> 4 & m) << 1, (a[1] >> 4 & m) | (b[1] >> 4 & m) << 1, 2);
    }
    // bits sh, sh + 1 of the codes of A (of_b: of B): byte e, bits 2i..2i+1 = those of code 4i + e
    uint32_t two_bits(bool of_b, int sh) const {
        const uint64_t m = 0x0303030303030303ull, *x = of_b ? b : a;
        return gather(x[0] >> sh & m, x[1] >> sh & m, 2);
    }
    // bit sh of the codes: byte e, bit i = that of A(4i + e), bit 4 + i = that of B(4i + e)
    uint32_t one_bit(int sh) const {
        const uint64_t m = 0x0101010101010101ull;
        return gather(a[0] >> sh & m, a[1] >> sh & m, 1) | gather(b[0] >> sh & m, b[1] >> sh & m, 1) << 4;
    }
    // fields of width w in bytes 4i + e of (x, y) -> byte e of dwords i, at bit w * i
    static uint32_t gather(uint64_t x, uint64_t y, int w) {
        return (uint32_t)x | (uint32_t)(x >> 32) << w | (uint32_t)y << 2 * w | (uint32_t)(y >> 32) << 3 * w;
    }
    static void store_rows(uint8_t* out, size_t stride, uint64_t x, uint64_t y) {
        const uint32_t d[4] = {(uint32_t)x, (uint32_t)(x >> 32), (uint32_t)y, (uint32_t)(y >> 32)};
        for (int i = 0; i < 4; ++i) memcpy(out + stride * i, d + i, 4);
    }
};
// the panels back to N rows of float32 weights: DECODE(panel block, c, out) writes column c's 256 weights
template <int PB, void (*DECODE)(const uint8_t*, int, float*)>
void dequant_panels(const uint8_t* P, int N, int K, float* out) {
    const int nb = K / QK;
    for (int n = 0; n < N; ++n)
        for (int b = 0; b < nb; ++b)
            DECODE(P + ((size_t)(n / 16) * nb + b) * PB, n % 16, out + (size_t)n * K + (size_t)b * QK);
}

#if defined(KP_AMX)
// vpermb index: byte 4c + e <- byte c (a column's value into its dword's 4 bytes)
inline __m512i quad_index() {
    alignas(64) int8_t quad[64];
    for (int i = 0; i < 64; ++i) quad[i] = (int8_t)(i >> 2);
    return _mm512_load_si512(quad);
}
// row g of an AMX panel block o: the low bytes of w (int16: columns 0..7 in w0, 8..15 in w1), and the high bytes
inline void store_lo_hi(uint8_t* o, int g, __m512i w0, __m512i w1) {
    _mm256_store_si256((__m256i*)(o + 64 * g), _mm512_cvtepi16_epi8(w0));
    _mm256_store_si256((__m256i*)(o + 64 * g + 32), _mm512_cvtepi16_epi8(w1));
    _mm256_store_si256((__m256i*)(o + prompt::WQ + 64 * g), _mm512_cvtepi16_epi8(_mm512_srai_epi16(w0, 8)));
    _mm256_store_si256((__m256i*)(o + prompt::WQ + 64 * g + 32), _mm512_cvtepi16_epi8(_mm512_srai_epi16(w1, 8)));
}

// y[k,N] by AMX tiles: CONVERT(a panel's nb blocks of PB bytes -> prompt.h's AMX panel of format F), rows padded to a multiple of
// 16 (zero rows) in prompt.h's activation layout (ext: the E ints of SUMS first of each block's 16)
template <class F, int PB, int E, void (*SUMS)(const int8_t*, int32_t*), void (*CONVERT)(const uint8_t*, int, uint8_t*)>
int amx_gemm(const uint8_t* P, int N, int K, const float* x, int k, float* y, int nthreads) {
    const int nb = K / QK, kp = (k + 15) / 16 * 16;
    int8_t* A = (int8_t*)aligned_alloc(64, (size_t)kp * K);
    float* DX = (float*)aligned_alloc(64, ((size_t)kp * nb * 4 + 63) / 64 * 64);
    int32_t* MP = (int32_t*)aligned_alloc(64, ((size_t)kp * nb * E * 4 + 63) / 64 * 64);
    int32_t* EXT = (int32_t*)aligned_alloc(64, (size_t)kp * nb * 64);
    if (!A || !DX || !MP || !EXT) { free(A); free(DX); free(MP); free(EXT); return -2; }
    quant_rows<E, SUMS>(x, k, K, A, DX, MP);
    memset(A + (size_t)k * K, 0, (size_t)(kp - k) * K);
    memset(DX + (size_t)k * nb, 0, sizeof(float) * (size_t)(kp - k) * nb);
    memset(EXT, 0, (size_t)kp * nb * 64);
    for (size_t i = 0; i < (size_t)k * nb; ++i) memcpy(EXT + 16 * i, MP + E * i, 4 * E);
#pragma omp parallel num_threads(nthreads)
    {
        prompt::tile_config();
        uint8_t* panel = (uint8_t*)aligned_alloc(64, (size_t)nb * prompt::Panel<F>::AMX);
        float* acc = (float*)aligned_alloc(64, sizeof(float) * 16 * (size_t)kp);
#pragma omp for schedule(static)
        for (int g = 0; g < N / 16; ++g) {
            CONVERT(P + (size_t)g * nb * PB, nb, panel);
            prompt::panel_amx<F>(panel, nb, K, kp, A, DX, EXT, acc);
            for (int r = 0; r < k; ++r) memcpy(y + (size_t)r * N + 16 * g, acc + 16 * r, 64);
        }
        free(acc); free(panel);
        _tile_release();
    }
    free(A); free(DX); free(MP); free(EXT);
    return 0;
}
#endif

#if defined(KQ_AVX2)
// y[k,N] on AVX2 for many rows: prompt_avx2.h's block product over each panel block converted on the fly
// (CONVERT: one panel block -> prompt.h's VNNI packed block of format F: its codes one byte a weight, 64-byte rows
// g = weights 4g..4g+3, the scales as int32, d and the format's extra as floats). Each converted block stays in L1
// while every row runs through it, 4 rows a time, one broadcast of a row's 4 activations serving all 16 columns
// (the row-group kernels unpack the nibbles again for each group and broadcast once per 8 columns: on an AVX2 CPU
// without VNNI their prompt ran 1.36x the blocks' time, benchmarks/results/target-rows-zen3). Rows block-major
// (ab [nb][kr][QK], db [nb][kr], eb [nb][kr][16]: the E ints of SUMS first), padded with zero rows to kr, a
// multiple of 4; without AVX-VNNI a format with an offset (Q6_K) gets prompt_avx2.h's word offsets in eb instead.
// Same arithmetic per (row, column) as the row-group kernels (prompt.h's definition): the same bits.
template <class F, int PB, int E, void (*SUMS)(const int8_t*, int32_t*), void (*CONVERT)(const uint8_t*, uint8_t*)>
int avx2_gemm(const uint8_t* P, int N, int K, const float* x, int k, float* y, int nthreads) {
    const int R = 4, nb = K / QK, kr = (k + R - 1) / R * R;
    int8_t* ab = (int8_t*)aligned_alloc(64, (size_t)nb * kr * QK);
    float* db = (float*)aligned_alloc(64, ((size_t)nb * kr * 4 + 63) / 64 * 64);
    int32_t* eb = (int32_t*)aligned_alloc(64, (size_t)nb * kr * 64);
    if (!ab || !db || !eb) { free(ab); free(db); free(eb); return -2; }
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < kr; ++r)
            for (int b = 0; b < nb; ++b) {
                const size_t i = (size_t)b * kr + r;
                memset(eb + 16 * i, 0, 64);
                if (r < k) {
                    db[i] = quant_block(x + (size_t)r * K + (size_t)b * QK, ab + i * QK);
#if !defined(__AVXVNNI__)
                    if (F::OFF) prompt::word_offsets(F::OFF, ab + i * QK, eb + 16 * i); else   // prompt_avx2.h's words
#endif
                    SUMS(ab + i * QK, eb + 16 * i);
                } else {
                    memset(ab + i * QK, 0, QK);
                    db[i] = 0.f;
                }
            }
        uint8_t* pk = (uint8_t*)aligned_alloc(64, (prompt::Panel<F>::VNNI + 63) / 64 * 64);
        float* acc = (float*)aligned_alloc(64, sizeof(float) * 16 * (size_t)kr);
#pragma omp for schedule(static)
        for (int g = 0; g < N / 16; ++g) {
            memset(acc, 0, sizeof(float) * 16 * (size_t)kr);
            for (int b = 0; b < nb; ++b) {
                CONVERT(P + ((size_t)g * nb + b) * PB, pk);
                const size_t i = (size_t)b * kr;
                for (int r0 = 0; r0 < k; r0 += R)
                    prompt::block_rows<F, R>(pk, ab + (i + r0) * QK, db + i + r0, eb + (i + r0) * 16, acc + 16 * r0);
            }
            for (int r = 0; r < k; ++r) memcpy(y + (size_t)r * N + 16 * g, acc + 16 * r, 64);
        }
        free(acc); free(pk);
    }
    free(ab); free(db); free(eb);
    return 0;
}
#endif

// The scalar reference over every panel and row: per block, v = BLOCK(panel block, column c, the row's a of the
// block, its E ints), then acc = fma(v, dx, acc) (the formats' last step)
template <int PB, int E, float (*BLOCK)(const uint8_t*, int, const int8_t*, const int32_t*)>
void reference_panels(const uint8_t* P, int N, int K, const int8_t* A, const float* DX, const int32_t* EX, int k,
                      float* y, int nthreads) {
    const int nb = K / QK;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int g = 0; g < N / 16; ++g)
        for (int r = 0; r < k; ++r) {
            float acc[16] = {0};
            for (int b = 0; b < nb; ++b) {
                const size_t i = (size_t)r * nb + b;
                const uint8_t* pb = P + ((size_t)g * nb + b) * PB;
                for (int c = 0; c < 16; ++c)
                    acc[c] = fmaf(BLOCK(pb, c, A + (size_t)r * K + (size_t)b * QK, EX + i * E), DX[i], acc[c]);
            }
            memcpy(y + (size_t)r * N + 16 * g, acc, sizeof acc);
        }
}

// rows(P, nb, K, a, dx, ex, y, N): R rows (a, dx, ex at their first row; row strides K, nb, nb * E) x the 16
// columns of the panel P (nb blocks) into y (row stride N)
typedef void (*panel_fn)(const uint8_t*, int, int, const int8_t*, const float*, const int32_t*, float*, int);
// ref(P, N, K, a, dx, ex, k, y, nthreads): the scalar reference over every panel and row
typedef void (*panel_ref)(const uint8_t*, int, int, const int8_t*, const float*, const int32_t*, int, float*, int);

// wide(P, N, K, x, k, y, nthreads): the product for many rows over converted panels (amx_gemm: AMX tiles;
// avx2_gemm: prompt_avx2.h's), or nullptr
typedef int (*panel_wide_fn)(const uint8_t*, int, int, const float*, int, float*, int);
#ifndef AMX_ROWS
#define AMX_ROWS 33   // from this many rows on, AMX where compiled and granted (below: converting costs more)
#endif
#ifndef AVX2_ROWS
#define AVX2_ROWS 12  // from this many rows on, avx2_gemm in the AVX2 build (a Zen 3 measured: 8 rows even, 12 ahead)
#endif

// y[k,N] = x[k,K] . W^T over the panels P (PB bytes a block, [N/16][nb]): every panel (threads share them out),
// every group of rows inside it (at most G, sizes differing by at most 1: tab[R], R = 1..G), so a panel comes from
// memory once for all rows;
// the wide product (amx_gemm from AMX_ROWS rows on, mode bit 4: never; avx2_gemm in the AVX2 build from AVX2_ROWS
// rows on; bit 1, the reference: never)
template <int E, void (*SUMS)(const int8_t*, int32_t*)>
int panel_gemm(const uint8_t* P, size_t PB, int N, int K, const float* x, int k, float* y, int nthreads, int mode,
               const panel_fn* tab, int G, panel_ref ref, panel_wide_fn wide = nullptr) {
    if (K % QK || N % 16 || k < 0 || N < 0) return -1;
    if (k == 0 || N == 0) return 0;
#if defined(KP_AMX)
    if (wide && !(mode & 5) && k >= AMX_ROWS && prompt::amx_granted()) return wide(P, N, K, x, k, y, nthreads);
#elif defined(KQ_AVX2)
    if (wide && !(mode & 1) && k >= AVX2_ROWS) return wide(P, N, K, x, k, y, nthreads);
#else
    (void)wide;
#endif
    const int nb = K / QK;
    int8_t* A = (int8_t*)aligned_alloc(64, ((size_t)k * K + 63) / 64 * 64);
    float* DX = (float*)aligned_alloc(64, ((size_t)k * nb * 4 + 63) / 64 * 64);
    int32_t* EX = (int32_t*)aligned_alloc(64, ((size_t)k * nb * E * 4 + 63) / 64 * 64);
    if (!A || !DX || !EX) { free(A); free(DX); free(EX); return -2; }
    quant_rows<E, SUMS>(x, k, K, A, DX, EX);
    if ((mode & 1) || !tab) ref(P, N, K, A, DX, EX, k, y, nthreads);
    else {
        const int ng = (k + G - 1) / G, small = k / ng, big = k % ng;   // groups of small + 1 rows first
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int g = 0; g < N / 16; ++g)
            for (int i = 0, r0 = 0; i < ng; ++i) {
                const int R = small + (i < big);
                tab[R](P + (size_t)g * nb * PB, nb, K, A + (size_t)r0 * K, DX + (size_t)r0 * nb,
                       EX + (size_t)r0 * nb * E, y + (size_t)r0 * N + 16 * g, N);
                r0 += R;
            }
    }
    free(A); free(DX); free(EX);
    return 0;
}

}  // namespace

// The C entry points of a panel format NAME (NAME_isa, NAME_set_prefetch, NAME_bytes, NAME_pack, NAME_gemm,
// NAME_dequant), over the file's pieces: BB, PB, PF_DIST, E and sums (the activations), PANEL_ROWS / ROWS (the
// row-group kernels, nullptr in the scalar build), reference_block, WIDE (amx_gemm<...>, avx2_gemm<...> or nullptr),
// pack_column, decode_column. NAME_gemm: y[k,N] = x[k,K] . W^T over the panels; mode bit 1: the scalar reference
// (same bits); bit 2 (a prompt): the same product; from AMX_ROWS rows on AMX where compiled and granted (bit 4:
// never), in the AVX2 build avx2_gemm from AVX2_ROWS rows on.
#define PANEL_ENTRY_POINTS(NAME, WIDE)                                                                         \
    extern "C" {                                                                                             \
    const char* NAME##_isa(void) { return KQ_ISA_NAME; }                                                       \
    void NAME##_set_prefetch(int dist) { PF_DIST = dist; }                                                     \
    size_t NAME##_bytes(int N, int K) { return (size_t)(N / 16) * (K / QK) * PB; }                             \
    int NAME##_pack(const uint8_t* W, int N, int K, uint8_t* out, int nthreads) {                              \
        return pack_panels<BB, PB, pack_column>(W, N, K, out, nthreads);                                       \
    }                                                                                                          \
    int NAME##_gemm(const uint8_t* P, int N, int K, const float* x, int k, float* y, int nthreads, int mode) { \
        return panel_gemm<E, sums>(P, PB, N, K, x, k, y, nthreads, mode, PANEL_ROWS, ROWS,                     \
                                   reference_panels<PB, E, reference_block>, WIDE);                            \
    }                                                                                                          \
    void NAME##_dequant(const uint8_t* P, int N, int K, float* out) {                                          \
        dequant_panels<PB, decode_column>(P, N, K, out);                                                       \
    }                                                                                                          \
    }
