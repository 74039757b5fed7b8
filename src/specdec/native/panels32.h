// What the panel kernels of the 32-weight block formats share (q4_0p16.cpp: a matrix re-laid out once at load in
// panels of 16 output rows, one zmm = 16 output elements; panels.h is the same for the 256-weight K-quants): the
// activations' quantizer, the panel geometry, packing and decoding the panels, the scalar reference's loops, the
// driver over panels and row groups, the AVX2 build's wide product (wide_gemm: prompt32.h's row kernels over each
// panel converted on the fly) and the C entry points. The format's arithmetic and its kernels stay in its .cpp file.
//
// Activations, per row and 32-block (q32.h's quantizer q32::quantize_block, the one of every 32-weight kernel and
// of their prompt product, prompt32.h: dx = amax/127, round half away from zero, clamped to [-127,127]): a int8 [K]
// natural order, dx [nb], and off [nb] = -BIAS * (sum of the block's a), the offset of the format's unsigned codes
// u = w + BIAS (so that sum w*a = sum u*a + off, exact).
//
// Panel g (output rows 16g..16g+15) of a matrix of nb = K/32 blocks a row, panels [N/16] one after the other, its
// blocks in pairs (b, b + 1), b even, of 64 + 2 CB bytes (a last odd block alone: 64 + CB bytes):
//   [0, 32)               d fp16[16] of block b (column c at 2c: the block's bytes 0..1)
//   [32, 64)              d fp16[16] of block b + 1 (zero for a last odd block)
//   [64, 64 + CB)         block b's codes, CB bytes (the format's layout: its .cpp file)
//   [64 + CB, 64 + 2 CB)  block b + 1's codes
// so the codes are whole cache lines (CB a multiple of 64) and a thread reads its panels as one forward stream
// (the scales beside the codes: a stream of them apart from the codes restarted at every panel, which cost a
// fifth of the bandwidth on the draft's 28-block rows).
#pragma once
#include "q32.h"   // q32::quantize_block, q32::h2f, Q32_PATH_512 / Q32_PATH_AVX2, q32::ISA_NAME

namespace {
namespace p32 {
using q32::QK;

// the rows' activations: a [k][K], dx [k][nb], off [k][nb]
template <int BIAS>
void quant_rows(const float* x, int k, int K, int8_t* A, float* DX, int32_t* OFF) {
    const int nb = K / QK;
    for (int r = 0; r < k; ++r)
        for (int b = 0; b < nb; ++b) {
            const size_t i = (size_t)r * nb + b;
            int8_t* q = A + (size_t)r * K + (size_t)b * QK;
            DX[i] = q32::quantize_block(x + (size_t)r * K + (size_t)b * QK, q);
            int s = 0;
            for (int j = 0; j < QK; ++j) s += q[j];
            OFF[i] = -BIAS * s;
        }
}

// bytes of one panel (nb blocks, CB code bytes each); where block b's codes and d's are in it
template <int CB>
inline size_t panel_bytes(int nb) { return (size_t)(nb / 2) * (64 + 2 * CB) + (nb & 1) * (64 + CB); }
template <int CB>
inline size_t pair_at(int b) { return (size_t)(b >> 1) * (64 + 2 * CB); }
template <int CB>
inline size_t codes_at(int b) { return pair_at<CB>(b) + 64 + (size_t)CB * (b & 1); }
template <int CB>
inline size_t d_at(int b) { return pair_at<CB>(b) + 32 * (b & 1); }

// W: N rows of K/32 blocks of BB bytes (fp16 d at bytes 0..1) -> the panels (zeroed first): COLUMN(block, panel
// block's codes, c) writes column c's codes; -1 when N % 16, K % 32 or K <= 0
template <int BB, int CB, void (*COLUMN)(const uint8_t*, uint8_t*, int)>
int pack_panels(const uint8_t* W, int N, int K, uint8_t* out, int nthreads) {
    if (N % 16 || K % QK || N < 0 || K <= 0) return -1;
    const int nb = K / QK;
    if (nthreads < 1) nthreads = omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int g = 0; g < N / 16; ++g) {
        uint8_t* P = out + (size_t)g * panel_bytes<CB>(nb);
        memset(P, 0, panel_bytes<CB>(nb));
        for (int b = 0; b < nb; ++b)
            for (int c = 0; c < 16; ++c) {
                const uint8_t* blk = W + ((size_t)(16 * g + c) * nb + b) * BB;
                memcpy(P + d_at<CB>(b) + 2 * c, blk, 2);
                COLUMN(blk, P + codes_at<CB>(b), c);
            }
    }
    return 0;
}

// the panels back to N rows of float32 weights: d * WEIGHTS(codes, c, j) (gguf.quants.dequantize's d * w)
template <int CB, int (*WEIGHT)(const uint8_t*, int, int)>
void dequant_panels(const uint8_t* P, int N, int K, float* out) {
    const int nb = K / QK;
    for (int n = 0; n < N; ++n) {
        const uint8_t* Pg = P + (size_t)(n / 16) * panel_bytes<CB>(nb);
        const int c = n % 16;
        for (int b = 0; b < nb; ++b) {
            const float d = q32::h2f(Pg + d_at<CB>(b) + 2 * c);
            for (int j = 0; j < QK; ++j) out[(size_t)n * K + (size_t)b * QK + j] = d * (float)WEIGHT(Pg + codes_at<CB>(b), c, j);
        }
    }
}

// The scalar reference over every panel and row: per block, isum = ISUM(codes, column c, the row's a of the block,
// its off) (exact int32), then acc = fma(float(isum), d * dx, acc) (prompt32.h's reference, step for step)
template <int CB, int32_t (*ISUM)(const uint8_t*, int, const int8_t*, int32_t)>
void reference_panels(const uint8_t* P, int N, int K, const int8_t* A, const float* DX, const int32_t* OFF, int k,
                      float* y, int nthreads) {
    const int nb = K / QK;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int g = 0; g < N / 16; ++g) {
        const uint8_t* Pg = P + (size_t)g * panel_bytes<CB>(nb);
        for (int r = 0; r < k; ++r) {
            float acc[16] = {0};
            for (int b = 0; b < nb; ++b) {
                const size_t i = (size_t)r * nb + b;
                for (int c = 0; c < 16; ++c) {
                    const int32_t isum = ISUM(Pg + codes_at<CB>(b), c, A + (size_t)r * K + (size_t)b * QK, OFF[i]);
                    const float S = q32::h2f(Pg + d_at<CB>(b) + 2 * c) * DX[i];
                    acc[c] = fmaf((float)isum, S, acc[c]);
                }
            }
            memcpy(y + (size_t)r * N + 16 * g, acc, sizeof acc);
        }
    }
}

inline int ld4(const int8_t* p) { int v; memcpy(&v, p, 4); return v; }

#if defined(Q32_PATH_512)
// one row's isum of a block over 16 columns: off + 8 vpdpbusd of W[i] (dword lane c: 4 unsigned codes of column c,
// those of weights 4i..4i+3 for i < 4, 16 + 4(i - 4).. for i >= 4) against a's bytes (the row's 32 activations of
// the block); exact int32, the same integer in any order. R <= 2 rows: two dependency chains (latency, not
// throughput, bounds them); else one.
template <int R>
inline __m512i block_isum(const __m512i W[8], const int8_t* a, int32_t off) {
    __m512i s = _mm512_set1_epi32(off);
    if constexpr (R <= 2) {
        __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[4], _mm512_set1_epi32(ld4(a + 16)));
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) s = _mm512_dpbusd_epi32(s, W[j], _mm512_set1_epi32(ld4(a + 4 * j)));
#pragma GCC unroll 3
        for (int j = 5; j < 8; ++j) t = _mm512_dpbusd_epi32(t, W[j], _mm512_set1_epi32(ld4(a + 4 * j)));
        return _mm512_add_epi32(s, t);
    } else {
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) s = _mm512_dpbusd_epi32(s, W[j], _mm512_set1_epi32(ld4(a + 4 * j)));
        return s;
    }
}
#endif

// wide(P, N, K, x, k, y, nthreads): the product for many rows over converted panels (wide_gemm), or nullptr
typedef int (*panel_wide_fn)(const uint8_t*, int, int, const float*, int, float*, int);
#ifndef AVX2_ROWS32
#define AVX2_ROWS32 16  // from this many rows on, wide_gemm in the AVX2 build (a Zen 3: 12 even, 16 ahead)
#endif

#if defined(Q32_PATH_AVX2)
// what prompt32.h's row kernels read of a format: its codes' offset (BIAS 128: the sign trick on q = u ^ 0x80)
template <int BIAS_>
struct Wide {
    static const int BIAS = BIAS_;
    static const bool MIN = false;
};

// y[k,N] on AVX2 for many rows: prompt32.h's product over each panel converted on the fly (CONVERT(a panel's nb
// blocks -> prompt32.h's packed panel: per block 8 rows of 64 bytes, dword lane c = column c's unsigned codes
// u = w + BIAS of weights 4g..4g+3, then its 16 scales as float32). The row-group kernels unpack the codes again for
// each group of at most 6 rows; here a converted panel stays in L1/L2 while every row runs through it, 4 rows a
// time. Same arithmetic per (row, column) (prompt32.h's definition): the same bits.
template <int BIAS, size_t (*PBYTES)(int), void (*CONVERT)(const uint8_t*, int, uint8_t*)>
int wide_gemm(const uint8_t* P, int N, int K, const float* x, int k, float* y, int nthreads) {
    using B = Wide<BIAS>;
    q32::prompt::Rows R;
    if (!q32::prompt::quantize_rows<BIAS>(x, k, K, nthreads, R)) return -2;
    const int nb = K / QK;
    const size_t pbytes = PBYTES(nb);
#pragma omp parallel num_threads(nthreads)
    {
        uint8_t* panel = (uint8_t*)aligned_alloc(64, (size_t)nb * q32::prompt::PB<B>);
#pragma omp for schedule(static)
        for (int g = 0; g < N / 16; ++g) {
            CONVERT(P + (size_t)g * pbytes, nb, panel);
            q32::prompt::panel_product<B>(panel, R, g, 16, y, N);
        }
        free(panel);
    }
    return 0;
}
#endif

// rows(P, nb, K, a, dx, off, y, N): R rows (a, dx, off at their first row; row strides K, nb, nb) x the 16 columns
// of the panel P (nb blocks) into y (row stride N)
typedef void (*panel_fn)(const uint8_t*, int, int, const int8_t*, const float*, const int32_t*, float*, int);
// ref(P, N, K, a, dx, off, k, y, nthreads): the scalar reference over every panel and row
typedef void (*panel_ref)(const uint8_t*, int, int, const int8_t*, const float*, const int32_t*, int, float*, int);

// y[k,N] = x[k,K] . W^T over the panels P (PBYTES(nb) bytes a panel: panel_bytes<CB> for the geometry above):
// every panel (threads share them out, OpenMP static), every group of rows inside it (at most G, sizes differing by
// at most 1: tab[R], R = 1..G), so a panel comes from memory once for all rows; mode bit 1 (or no tab: the scalar
// build): the reference; in the AVX2 build from AVX2_ROWS32 rows on, the wide product
template <int BIAS, size_t (*PBYTES)(int)>
int panel_gemm(const uint8_t* P, int N, int K, const float* x, int k, float* y, int nthreads, int mode,
               const panel_fn* tab, int G, panel_ref ref, panel_wide_fn wide = nullptr) {
    if (K <= 0 || K % QK || N % 16 || k < 0 || N < 0) return -1;
    if (k == 0 || N == 0) return 0;
    if (nthreads < 1) nthreads = omp_get_max_threads();
    if (wide && !(mode & 1) && k >= AVX2_ROWS32) return wide(P, N, K, x, k, y, nthreads);
    const int nb = K / QK;
    int8_t* A = (int8_t*)aligned_alloc(64, ((size_t)k * K + 63) / 64 * 64);
    float* DX = (float*)aligned_alloc(64, ((size_t)k * nb * 4 + 63) / 64 * 64);
    int32_t* OFF = (int32_t*)aligned_alloc(64, ((size_t)k * nb * 4 + 63) / 64 * 64);
    if (!A || !DX || !OFF) { free(A); free(DX); free(OFF); return -2; }
    quant_rows<BIAS>(x, k, K, A, DX, OFF);
    if ((mode & 1) || !tab) ref(P, N, K, A, DX, OFF, k, y, nthreads);
    else {
        const int ng = (k + G - 1) / G, small = k / ng, big = k % ng;   // groups of small + 1 rows first
        const size_t pbytes = PBYTES(nb);
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int g = 0; g < N / 16; ++g)
            for (int i = 0, r0 = 0; i < ng; ++i) {
                const int R = small + (i < big);
                tab[R](P + (size_t)g * pbytes, nb, K, A + (size_t)r0 * K, DX + (size_t)r0 * nb, OFF + (size_t)r0 * nb,
                       y + (size_t)r0 * N + 16 * g, N);
                r0 += R;
            }
    }
    free(A); free(DX); free(OFF);
    return 0;
}

}  // namespace p32
}  // namespace

// The C entry points of a 32-weight panel format NAME (NAME_isa, NAME_set_prefetch, NAME_bytes, NAME_pack,
// NAME_gemm, NAME_dequant), over the file's pieces: BB, CB, BIAS, PF_DIST, PANEL_ROWS / ROWS (the row-group
// kernels, nullptr in the scalar build), isum_block (the reference's integer dot), pack_column, weight (the
// decoder's w of column c, weight j of a block), WIDE (wide_gemm<...> or nullptr). NAME_gemm: y[k,N] = x[k,K] . W^T
// over the panels; mode bit 1: the scalar reference (same bits); bit 2 (a prompt): the same product; bit 4 (never
// AMX): no AMX here anyway.
#define PANEL32_ENTRY_POINTS(NAME, WIDE)                                                                     \
    extern "C" {                                                                                             \
    const char* NAME##_isa(void) { return q32::ISA_NAME; }                                                     \
    void NAME##_set_prefetch(int dist) { PF_DIST = dist; }                                                     \
    size_t NAME##_bytes(int N, int K) { return (size_t)(N / 16) * p32::panel_bytes<CB>(K / p32::QK); }        \
    int NAME##_pack(const uint8_t* W, int N, int K, uint8_t* out, int nthreads) {                              \
        return p32::pack_panels<BB, CB, pack_column>(W, N, K, out, nthreads);                                  \
    }                                                                                                          \
    int NAME##_gemm(const uint8_t* P, int N, int K, const float* x, int k, float* y, int nthreads, int mode) { \
        return p32::panel_gemm<BIAS, p32::panel_bytes<CB>>(P, N, K, x, k, y, nthreads, mode, PANEL_ROWS, ROWS,  \
                                         p32::reference_panels<CB, isum_block>, WIDE);                         \
    }                                                                                                          \
    void NAME##_dequant(const uint8_t* P, int N, int K, float* out) {                                          \
        p32::dequant_panels<CB, weight>(P, N, K, out);                                                         \
    }                                                                                                          \
    }
