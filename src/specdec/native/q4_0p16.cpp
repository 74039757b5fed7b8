// Q4_0 in panels of 16 output rows: the scoring and prompt-reading product of a Q4_0 matrix whose rows are a
// multiple of 16, over a copy of its blocks re-laid out once at load (q4_0p16_pack), y[k,N] = x[k,K] . W[N,K]^T.
//
// Why: q4_0.cpp's scoring kernel (q32.h) keeps 16 partial sums per output element (one zmm = 4 blocks x 4 dwords of
// ONE output), unpacks each group of 4 blocks by permutes and ends every output with a horizontal sum: the draft's
// rows are only 896 weights (28 blocks), so the cost per output is large. Here a zmm holds 16 output elements
// (columns) and every op is shared by all 16 (q4k16.cpp's design, over panels32.h): a block's integer dot is 8
// vpdpbusd of 4 codes x 16 columns against 4 activations broadcast from memory, its float steps run once for 16
// outputs, and there is no horizontal sum. The row groups (at most 8 rows; 6 on AVX2) run inside each panel, so a
// panel's weights come from memory once for all rows.
//
// Panel g (16 output rows 16g..16g+15) of nb = K/32 blocks a row, panels32.h's geometry (blocks in pairs: the two
// blocks' d fp16[16] each, 64 bytes, then their codes, CB = 256 bytes each; the file's bytes exactly, 576 bytes per
// 16 x 2 blocks, plus 32 bytes a panel where nb is odd). A block's codes, 256 bytes = 4 rows of 64: row i, column c,
// byte 4c + e: low nibble = q[4i + e], high nibble = q[16 + 4i + e] (q = the block's 4-bit codes in natural order:
// ggml's q_j = qs[j] & 15, q_{j+16} = qs[j] >> 4);
// so one 64-byte load gives, after & 0x0F and >> 4 & 0x0F, two vpdpbusd operands whose dword lane c holds 4
// consecutive codes of column c.
// Activations, per row and 32-block (q32.h's quantizer: dx = amax/127, round half away from zero, clamped to
// [-127,127]; the same as q4_0.cpp's scoring and prompt product): a int8 [K] natural order, dx [nb], off [nb] =
// -8 * (sum of the block's a).
//
// Per output element (r, n), blocks b in order (acc = 0 first; y = acc):
//   isum = sum_i (q_i - 8) * a_i = off + sum_i q_i * a_i          (exact int32, |isum| <= 32*8*127 = 32512)
//   S    = d_b * dx_rb                                            (d_b the fp16 scale as float32; one float32 mul)
//   acc  = fma(float(isum), S, acc)                               (float(isum) exact; one rounding)
// which is prompt32.h's definition of the Q4_0 prompt product (q4_0_gemm mode 2) step for step: the same bits
// (tested), so a model reading its prompt and scoring its tokens sees the same numbers. Every op is one IEEE
// float32 operation on one (r, n): a row's result does not depend on the other rows, the row count, the thread
// count or the path. How isum is obtained (the same integer everywhere):
//   AVX-512 VNNI: off + 8 vpdpbusd (codes u = q unsigned, a signed; no saturation), one or two chains
//   AVX2 + AVX-VNNI: the same with vpdpbusd on ymm (8 columns a ymm, half h = columns 8h..8h+7)
//   AVX2: maddubs(u, a) int16 pairs (|pair| <= 2*15*127 = 3810), the 8 of a block added in int16 (<= 30480 <
//         32767, no wrap in any order), madd by ones to int32, plus off
//   scalar (also the reference, mode bit 1): the formula above, element by element.
// Mode bit 2 (a prompt) runs the same product; no AMX path; in the AVX2 build from AVX2_ROWS32 (16) rows on, each
// panel converted on the fly into prompt32.h's packed panel and run by its row kernels (panels32.h wide_gemm: a
// prompt of 64-256 rows 0.69-0.70x the row groups' time on an AVX2-only Zen 3), the same bits. Software prefetch
// PF_DIST bytes ahead in the panel's stream. -ffp-contract=off.
#include "panels32.h"

static const int BB = 18, CB = 256, BIAS = 8;
static int PF_DIST = 1024;   // software prefetch distance in bytes (0 = off; q4_0p16_set_prefetch)

// column c of a panel block's codes from its block_q4_0 (fp16 d, qs[16])
static void pack_column(const uint8_t* blk, uint8_t* codes, int c) {
    const uint8_t* qs = blk + 2;
    for (int i = 0; i < 4; ++i)
        for (int e = 0; e < 4; ++e) codes[64 * i + 4 * c + e] = qs[4 * i + e];   // low: q[4i+e], high: q[16+4i+e]
}

// code j (0..31) of column c
static inline int code(const uint8_t* codes, int c, int j) {
    const uint8_t z = codes[64 * ((j & 15) >> 2) + 4 * c + (j & 3)];
    return j < 16 ? (z & 15) : (z >> 4);
}

// the weight w = q - 8 of code j, column c (the decoder: d * w, as gguf.quants.dequantize)
static int weight(const uint8_t* codes, int c, int j) { return code(codes, c, j) - 8; }

// ---------------- the scalar reference (and the scalar build's path): isum of column c for one row and block -------
static int32_t isum_block(const uint8_t* codes, int c, const int8_t* a, int32_t off) {
    int32_t s = off;
    for (int j = 0; j < 32; ++j) s += code(codes, c, j) * a[j];
    return s;
}

#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)
// software prefetch of the panel's stream pf bytes past a block's codes (4.5 lines a block on average: 5 lines)
__attribute__((always_inline)) inline void prefetch(const uint8_t* pc, int pf) {
    if (pf) {
        const char* pp = (const char*)pc + pf;
        _mm_prefetch(pp, _MM_HINT_T0); _mm_prefetch(pp + 64, _MM_HINT_T0); _mm_prefetch(pp + 128, _MM_HINT_T0);
        _mm_prefetch(pp + 192, _MM_HINT_T0); _mm_prefetch(pp + 256, _MM_HINT_T0);
    }
}
#endif

#if defined(Q32_PATH_512)
// ---------------- AVX-512 VNNI: R rows x the 16 columns of one panel ----------------
template <int R>
static void panel_rows(const uint8_t* P, int nb, int K, const int8_t* A, const float* DX, const int32_t* OFF, float* y,
                       int N) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const int pf = PF_DIST;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pc = P + p32::codes_at<CB>(b);
        const uint8_t* pd = P + p32::d_at<CB>(b);
        prefetch(pc, pf);
        __m512i W[8];   // W[j]: codes 4j..4j+3 of each column (j < 4: low nibbles of row j; else high of row j - 4)
        for (int i = 0; i < 4; ++i) {
            const __m512i z = _mm512_loadu_si512(pc + 64 * i);
            W[i] = _mm512_and_si512(z, m4);
            W[4 + i] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
        }
        const __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)pd));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const int8_t* a = A + (size_t)r * K + (size_t)b * p32::QK;
            const __m512i s = p32::block_isum<R>(W, a, OFF[(size_t)r * nb + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(D, _mm512_set1_ps(DX[(size_t)r * nb + b])),
                                     acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (size_t)r * N, acc[r]);
}
static const int ROWS = 8;   // rows a group
static const p32::panel_fn PANEL_ROWS[9] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>,
                                            panel_rows<5>, panel_rows<6>, panel_rows<7>, panel_rows<8>};
#elif defined(Q32_PATH_AVX2)
// ---------------- AVX2: the same with 8 columns a ymm (half h = columns 8h..8h+7) ----------------
template <int R>
static void panel_rows(const uint8_t* P, int nb, int K, const int8_t* A, const float* DX, const int32_t* OFF, float* y,
                       int N) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const int pf = PF_DIST;
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pc = P + p32::codes_at<CB>(b);
        const uint8_t* pd = P + p32::d_at<CB>(b);
        prefetch(pc, pf);
        for (int h = 0; h < 2; ++h) {
#if defined(__AVXVNNI__)
            __m256i s[R];
            for (int r = 0; r < R; ++r) s[r] = _mm256_set1_epi32(OFF[(size_t)r * nb + b]);
#else
            __m256i p[R];   // int16 sums of the maddubs pairs
            for (int r = 0; r < R; ++r) p[r] = _mm256_setzero_si256();
#endif
            for (int i = 0; i < 4; ++i) {
                const __m256i z = _mm256_loadu_si256((const __m256i*)(pc + 64 * i + 32 * h));
                const __m256i wl = _mm256_and_si256(z, m4), wh = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
                for (int r = 0; r < R; ++r) {
                    const int8_t* a = A + (size_t)r * K + (size_t)b * p32::QK;
                    const __m256i al = _mm256_set1_epi32(p32::ld4(a + 4 * i)), ah = _mm256_set1_epi32(p32::ld4(a + 16 + 4 * i));
#if defined(__AVXVNNI__)
                    s[r] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(s[r], wl, al), wh, ah);
#else
                    p[r] = _mm256_add_epi16(p[r], _mm256_add_epi16(_mm256_maddubs_epi16(wl, al), _mm256_maddubs_epi16(wh, ah)));
                    asm("" : "+x"(p[r]));   // keep the adds in this order: GCC would tree a row's 8 and spill
#endif
                }
            }
            const __m256 D = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(pd + 16 * h)));
            for (int r = 0; r < R; ++r) {
#if defined(__AVXVNNI__)
                const __m256i isum = s[r];
#else
                const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(p[r], _mm256_set1_epi16(1)),
                                                      _mm256_set1_epi32(OFF[(size_t)r * nb + b]));
#endif
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                                            _mm256_mul_ps(D, _mm256_set1_ps(DX[(size_t)r * nb + b])), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(y + (size_t)r * N, acc[r][0]);
        _mm256_storeu_ps(y + (size_t)r * N + 8, acc[r][1]);
    }
}
static const int ROWS = 6;
static const p32::panel_fn PANEL_ROWS[7] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>,
                                            panel_rows<5>, panel_rows<6>};
#else
static const p32::panel_fn* const PANEL_ROWS = nullptr;
static const int ROWS = 1;
#endif

#if defined(Q32_PATH_AVX2)
// a panel's nb blocks -> prompt32.h's packed panel: row g < 4 = the low nibbles of codes row g (weights 4g..4g+3),
// row g >= 4 = the high nibbles of codes row g - 4 (weights 16 + 4(g - 4)..); d as float32
static void wide_panel(const uint8_t* P, int nb, uint8_t* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pc = P + p32::codes_at<CB>(b);
        const uint8_t* pd = P + p32::d_at<CB>(b);
        uint8_t* o = out + (size_t)b * q32::prompt::PB<p32::Wide<BIAS>>;
        for (int i = 0; i < 4; ++i)
            for (int h = 0; h < 2; ++h) {
                const __m256i z = _mm256_loadu_si256((const __m256i*)(pc + 64 * i + 32 * h));
                _mm256_store_si256((__m256i*)(o + 64 * i + 32 * h), _mm256_and_si256(z, m4));
                _mm256_store_si256((__m256i*)(o + 64 * (4 + i) + 32 * h), _mm256_and_si256(_mm256_srli_epi16(z, 4), m4));
            }
        for (int h = 0; h < 2; ++h)
            _mm256_store_ps((float*)(o + 512) + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(pd + 16 * h))));
    }
}
#define Q4_0P16_WIDE p32::wide_gemm<BIAS, p32::panel_bytes<CB>, wide_panel>
#else
#define Q4_0P16_WIDE nullptr
#endif

PANEL32_ENTRY_POINTS(q4_0p16, Q4_0P16_WIDE)
