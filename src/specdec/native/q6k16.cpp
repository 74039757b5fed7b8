// Q6_K in panels of 16 output rows: the scoring and prompt-reading product of a Q6_K matrix whose rows are a
// multiple of 16, over a copy of its blocks re-laid out once at load (q6k16_pack, the same bytes as the file's),
// y[k,N] = x[k,K] . W[N,K]^T. The design is q4k16.cpp's (why: its header; the driver: panels.h). Each (row,
// 16-weight sub-block) costs 4 vpdpbusd and a vpmulld, twice Q4_K's multiplies a weight.
//
// Panel block (16 output rows 16g..16g+15, one 256-weight block b), PB = 3360 bytes = 16 x 210, panels [N/16][nb]:
//   [0, 32)       d    fp16[16]
//   [32, 288)     sc   int8[16 sub-blocks][16 columns]
//   [288, 2336)   L    32 x 64 bytes: row 4s + i (s = 0..7, i = 0..3), column c, byte 4c + e: low nibble = the low
//                      4 bits of u[32s + 4i + e], high nibble = those of u[32s + 16 + 4i + e]
//   [2336, 3360)  H    16 x 64 bytes: row 2s + t, byte 4c + e, bits 2i..2i+1 = the high 2 bits of u[32s + 16t + 4i + e]
//   (u = the block's 6-bit codes 0..63 in natural order; the weight is d * sc_j * (u - 32), j = its 16-weight sub-block)
// Activations (panels.h), and per row and block t_j = the sum of sub-block j's a, stored as 32 * t_j.
//
// Per output element (r, n), blocks b in order (acc = 0 first; y = acc):
//   I   = sum over j of sc_j * (sum over sub-block j of u_i * a_i  -  32 * t_j)   (exact int32, |I| < 256*32*128*127)
//   v   = float(I) * d_b;  acc = fma(v, dx_rb, acc)
// which is prompt.h's definition of the Q6_K prompt product (q6k_gemm mode 2) step for step: the same bits (tested).
// Every op is one IEEE float32 operation on one (r, n): a row's result does not depend on the other rows, the row
// count, the thread count or the path (AVX-512 VNNI; AVX2, with AVX-VNNI where compiled with it; scalar). Mode
// bit 1: the scalar reference; mode bit 2 (a prompt) runs the same product; from AMX_ROWS rows on, AMX tiles where
// compiled and granted (mode bit 4: never), the same bits.
#include "panels.h"

static const int BB = 210, PB = 3360, LO = 288, HI = 2336;
static int PF_DIST = PB;   // software prefetch distance in bytes: the next block (0 = off; q6k16_set_prefetch)

// what the kernels need of a block's activations: 32 * the 16 sub-block sums
static void sums(const int8_t* q, int32_t* t) {
    for (int j = 0; j < 16; ++j) {
        int s = 0;
        for (int i = 0; i < 16; ++i) s += q[16 * j + i];
        t[j] = 32 * s;
    }
}

// the 6-bit code of weight w (natural order) of column c in a panel block
static inline int code(const uint8_t* pb, int c, int w) {
    const int s = w / 32, t = (w / 16) & 1, i = (w / 4) & 3, e = w & 3;
    const uint8_t lo = pb[LO + 64 * (4 * s + i) + 4 * c + e], hi = pb[HI + 64 * (2 * s + t) + 4 * c + e];
    return ((t ? lo >> 4 : lo) & 15) | (((hi >> (2 * i)) & 3) << 4);
}

// ---------------- the scalar reference (and the scalar build's path): v of column c for one row and block -------
static float reference_block(const uint8_t* pb, int c, const int8_t* a, const int32_t* t) {
    int32_t I = 0;
    for (int j = 0; j < 16; ++j) {
        int32_t S = -t[j];
        for (int i = 0; i < 16; ++i) S += code(pb, c, 16 * j + i) * a[16 * j + i];
        I += (int32_t)((const int8_t*)pb)[32 + 16 * j + c] * S;
    }
    return (float)I * h2f(pb + 2 * c);
}

#if defined(KQ_AVX512)
// the codes u of sub-block j = 2s + t of the 16 columns, W[i] = group i (weights 16j + 4i .. + 3), from the rows L of
// pair s: (low nibble t of L[i]) | (the high 2 bits, moved to bits 4..5)
static inline void subblock_codes(const __m512i L[4], const uint8_t* pb, int s, int t, __m512i W[4]) {
    const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i H = _mm512_loadu_si512(pb + HI + 64 * (2 * s + t));
    const __m512i Hs[4] = {_mm512_slli_epi16(H, 4), _mm512_slli_epi16(H, 2), H, _mm512_srli_epi16(H, 2)};
    for (int i = 0; i < 4; ++i)
        W[i] = _mm512_ternarylogic_epi32(_mm512_and_si512(t ? _mm512_srli_epi16(L[i], 4) : L[i], m0f), Hs[i], m30, 0xF8);
}

// ---------------- AVX-512 VNNI: R rows x the 16 columns of one panel ----------------
template <int R>
static void panel_rows(const uint8_t* P, int nb, int K, const int8_t* A, const float* DX, const int32_t* T, float* y,
                       int N) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pb = P + (size_t)b * PB;
        __m512i I[R];
        for (int r = 0; r < R; ++r) I[r] = _mm512_setzero_si512();
        for (int s = 0; s < 8; ++s) {
            prefetch_block<7>(pb + 448 * s, PF_DIST, 0);   // the next block (53 lines a block)
            __m512i L[4];
            for (int i = 0; i < 4; ++i) L[i] = _mm512_loadu_si512(pb + LO + 64 * (4 * s + i));
            for (int t = 0; t < 2; ++t) {
                const int j = 2 * s + t;
                __m512i W[4];
                subblock_codes(L, pb, s, t, W);
                const __m512i SC = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(pb + 32 + 16 * j)));
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    const int8_t* a = A + (size_t)r * K + (size_t)b * QK + 16 * j;
                    __m512i S = _mm512_set1_epi32(-T[((size_t)r * nb + b) * 16 + j]);
#pragma GCC unroll 4
                    for (int i = 0; i < 4; ++i) S = _mm512_dpbusd_epi32(S, W[i], _mm512_set1_epi32(*(const int*)(a + 4 * i)));
                    I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(S, SC));
                }
            }
        }
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)pb));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(I[r]), dv),
                                     _mm512_set1_ps(DX[(size_t)r * nb + b]), acc[r]);
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (size_t)r * N, acc[r]);
}
static const panel_fn PANEL_ROWS[9] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>,
                                       panel_rows<5>, panel_rows<6>, panel_rows<7>, panel_rows<8>};
static const int ROWS = 8;
#elif defined(KQ_AVX2)
// ---------------- AVX2: the same with 8 columns a ymm (half h = columns 8h..8h+7) ----------------
// the codes u of sub-block j = 2s + t of columns 8h..8h+7, W[i] = group i (weights 16j + 4i .. + 3)
static inline void subblock_codes_avx2(const uint8_t* pb, int s, int t, int h, __m256i W[4]) {
    const __m256i m0f = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i H = _mm256_loadu_si256((const __m256i*)(pb + HI + 64 * (2 * s + t) + 32 * h));
    const __m256i Hs[4] = {_mm256_slli_epi16(H, 4), _mm256_slli_epi16(H, 2), H, _mm256_srli_epi16(H, 2)};
    for (int i = 0; i < 4; ++i) {
        const __m256i L = _mm256_loadu_si256((const __m256i*)(pb + LO + 64 * (4 * s + i) + 32 * h));
        W[i] = _mm256_or_si256(_mm256_and_si256(t ? _mm256_srli_epi16(L, 4) : L, m0f), _mm256_and_si256(Hs[i], m30));
    }
}
template <int R>
static void panel_rows(const uint8_t* P, int nb, int K, const int8_t* A, const float* DX, const int32_t* T, float* y,
                       int N) {
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pb = P + (size_t)b * PB;
        for (int h = 0; h < 2; ++h) {
            __m256i I[R];
            for (int r = 0; r < R; ++r) I[r] = _mm256_setzero_si256();
            for (int j = 0; j < 16; ++j) {
                const int s = j / 2, t = j & 1;
                if (h == 0 && t == 0) prefetch_block<7>(pb + 448 * s, PF_DIST, 0);   // the next block
                __m256i W[4];
                subblock_codes_avx2(pb, s, t, h, W);
                const __m256i SC = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(pb + 32 + 16 * j + 8 * h)));
                for (int r = 0; r < R; ++r) {
                    const int8_t* a = A + (size_t)r * K + (size_t)b * QK + 16 * j;
                    __m256i S = _mm256_set1_epi32(-T[((size_t)r * nb + b) * 16 + j]);
                    for (int i = 0; i < 4; ++i)
#if defined(__AVXVNNI__)
                        S = _mm256_dpbusd_avx_epi32(S, W[i], prompt::bcast4(a + 4 * i));
#else   // int16 words of 2 products (<= 2*63*127): exact, then int32
                        S = _mm256_add_epi32(S, _mm256_madd_epi16(_mm256_maddubs_epi16(W[i], prompt::bcast4(a + 4 * i)),
                                                                  _mm256_set1_epi16(1)));
#endif
                    I[r] = _mm256_add_epi32(I[r], _mm256_mullo_epi32(S, SC));
                }
            }
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(pb + 16 * h)));
            for (int r = 0; r < R; ++r)
                acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(I[r]), dv),
                                            _mm256_set1_ps(DX[(size_t)r * nb + b]), acc[r][h]);
        }
    }
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(y + (size_t)r * N, acc[r][0]);
        _mm256_storeu_ps(y + (size_t)r * N + 8, acc[r][1]);
    }
}
static const panel_fn PANEL_ROWS[5] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>};
static const int ROWS = 4;
#else
static const panel_fn* const PANEL_ROWS = nullptr;
static const int ROWS = 1;
#endif

// ---------------- AMX (where compiled with AMX-INT8 and the kernel grants the tile state: panels.h) ----------------
#if defined(KP_AMX)
struct Q6KPanelAMX {   // what prompt.h's Panel, finish and panel_amx read of the format
    static const int NSUB = 16, EXTRA = 0;
    static inline __m512 tail(const uint8_t*, const int32_t*, __m512 v) { return v; }
};

// panel g's nb blocks -> prompt.h's AMX panel blocks: w = (u - 32) * sc as int16, its low and high bytes; d
static void amx_panel(const uint8_t* P, int nb, uint8_t* out) {
    const __m512i off = _mm512_set1_epi16(32);
    const __m512i QUAD = quad_index();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pb = P + (size_t)b * PB;
        uint8_t* o = out + (size_t)b * prompt::Panel<Q6KPanelAMX>::AMX;
        for (int s = 0; s < 8; ++s) {
            __m512i L[4];
            for (int i = 0; i < 4; ++i) L[i] = _mm512_loadu_si512(pb + LO + 64 * (4 * s + i));
            for (int t = 0; t < 2; ++t) {
                const int j = 2 * s + t;
                __m512i U[4];
                subblock_codes(L, pb, s, t, U);
                const __m512i sc4 = _mm512_permutexvar_epi8(QUAD, _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(pb + 32 + 16 * j))));
                const __m512i sc0 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(sc4));
                const __m512i sc1 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(sc4, 1));
                for (int i = 0; i < 4; ++i)   // group 4j + i: weights 16j + 4i .. + 3
                    store_lo_hi(o, 4 * j + i,
                                _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(U[i])), off), sc0),
                                _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(U[i], 1)), off), sc1));
            }
        }
        _mm512_store_ps((float*)(o + prompt::Panel<Q6KPanelAMX>::AMX_D), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)pb)));
    }
}
#define Q6K16_WIDE amx_gemm<Q6KPanelAMX, PB, 16, sums, amx_panel>
#elif defined(KQ_AVX2)
struct Q6KPanelAVX2 {   // what prompt_avx2.h's block_rows reads of the format
    static const int SUB = 16, NSUB = 16, OFF = 32, HAS_MIN = 0, EXTRA = 0;
};
// one panel block -> prompt.h's VNNI packed block (prompt_avx2.h's layout): the 6-bit codes u one byte a weight
// (rows 4j + i = weights 16j + 4i .. + 3), sc as int32, d
static void avx2_block(const uint8_t* pb, uint8_t* o) {
    int32_t* S = (int32_t*)(o + prompt::WQ);
    for (int h = 0; h < 2; ++h) {
        for (int j = 0; j < 16; ++j) {
            __m256i W[4];
            subblock_codes_avx2(pb, j / 2, j & 1, h, W);
            for (int i = 0; i < 4; ++i) _mm256_store_si256((__m256i*)(o + 64 * (4 * j + i) + 32 * h), W[i]);
            _mm256_store_si256((__m256i*)(S + 16 * j + 8 * h),
                               _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(pb + 32 + 16 * j + 8 * h))));
        }
        _mm256_store_ps((float*)(o + prompt::Panel<Q6KPanelAVX2>::VNNI_D) + 8 * h,
                        _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(pb + 16 * h))));
    }
}
#define Q6K16_WIDE avx2_gemm<Q6KPanelAVX2, PB, 16, sums, avx2_block>
#else
#define Q6K16_WIDE nullptr
#endif

// column c of a panel block (zeroed) from its block_q6_K
static void pack_column(const uint8_t* blk, uint8_t* pb, int c) {
    memcpy(pb + 2 * c, blk + 208, 2);
    for (int j = 0; j < 16; ++j) pb[32 + 16 * j + c] = blk[192 + j];
    uint8_t u[QK];
    decode_codes(blk, u);
    for (int s = 0; s < 8; ++s) {
        const Codes32 codes(u + 32 * s);
        codes.store_nibbles(pb + LO + 64 * 4 * s + 4 * c, 64);
        for (int t = 0; t < 2; ++t) {
            const uint32_t h = codes.two_bits(t, 4);
            memcpy(pb + HI + 64 * (2 * s + t) + 4 * c, &h, 4);
        }
    }
}

// column c's 256 weights of a panel block, as gguf.quants.dequantize: (d * sc) * (u - 32)
static void decode_column(const uint8_t* pb, int c, float* o) {
    const float d = h2f(pb + 2 * c);
    for (int w = 0; w < QK; ++w) o[w] = d * (float)((const int8_t*)pb)[32 + 16 * (w / 16) + c] * (float)(code(pb, c, w) - 32);
}

static const int E = 16;   // int32s a block of what the kernels need of the activations (sums)
PANEL_ENTRY_POINTS(q6k16, Q6K16_WIDE)
