// Q3_K in panels of 16 output rows: the scoring and prompt-reading product of a Q3_K matrix whose rows are a
// multiple of 16, over a copy of its blocks re-laid out once at load (q3k16_pack), y[k,N] = x[k,K] . W[N,K]^T.
// The design is q6k16.cpp's (and q4k16.cpp's, why: its header; the driver: panels.h): no mins, 16 signed scales of
// 16-weight sub-blocks, codes with an offset. Each (row, 16-weight sub-block) costs 4 vpdpbusd; on AVX-512 each (row,
// pair of sub-blocks) a vpdpwssd of their two sums (int16: |S| <= 16*4*127) by their two scales instead of q6k16's
// 2 vpmulld + 2 vpaddd (the same exact int32 I).
//
// The file's block_q3_K (110 bytes / 256 weights: hmask[32], qs[64], scales[12] = 16 packed 6-bit scales s_j, fp16
// d; q3k.cpp) has, for weight w = 128h + 32c + i (natural order), the 3-bit code u = ((qs[32h + i] >> 2c) & 3) |
// ((hmask[i] >> (4h + c)) & 1) << 2 (0..7) and the weight d * (s_j - 32) * (u - 4), j = w / 16.
//
// Panel block (16 output rows 16g..16g+15, one 256-weight block b), PB = 1824 bytes, panels [N/16][nb]:
//   [0, 32)       d    fp16[16]
//   [32, 288)     sc   int8[16 sub-blocks][16 columns]: sc_j = s_j - 32 (-32..31)
//   [288, 1312)   L    16 x 64 bytes: row j (sub-block j), column c, byte 4c + e: bits 2i..2i+1 = the low 2 bits of
//                      u[16j + 4i + e] (i = 0..3)
//   [1312, 1824)  H    8 x 64 bytes: row s (sub-blocks 2s, 2s + 1), byte 4c + e, bit 4t + i = bit 2 of
//                      u[32s + 16t + 4i + e]
//   (u = the block's 3-bit codes 0..7 in natural order; the weight is d * sc_j * (u - 4))
// Activations (panels.h), and per row and block t_j = the sum of sub-block j's a, stored as 4 * t_j.
//
// Per output element (r, n), blocks b in order (acc = 0 first; y = acc):
//   I   = sum over j of sc_j * (sum over sub-block j of u_i * a_i  -  4 * t_j)   (exact int32, |I| <= 256*32*4*127)
//   v   = float(I) * d_b;  acc = fma(v, dx_rb, acc)
// which is prompt.h's definition of the Q3_K prompt product (q3k_gemm mode 2: kgroups.h's Prompt<Q3K>, 16
// sub-blocks of 16 weights, OFF = 4, no mins; ext = 4 * the 16-weight sums) step for step: the same bits (tested).
// Every op is one IEEE float32 operation on one (r, n): a row's result does not depend on the other rows, the row
// count, the thread count or the path (AVX-512 VNNI; AVX2, with AVX-VNNI where compiled with it; scalar). Mode
// bit 1: the scalar reference; mode bit 2 (a prompt) runs the same product; from AMX_ROWS rows on, AMX tiles where
// compiled and granted (mode bit 4: never): each panel converted on the fly into prompt.h's AMX panel (w = (u - 4)
// * sc as int16, its low and high bytes; d), the same bits. Software prefetch of the next block. -ffp-contract=off.
#include "panels.h"

static const int BB = 110, PB = 1824, LO = 288, HI = 1312;
static int PF_DIST = PB;   // software prefetch distance in bytes: the next block (0 = off; q3k16_set_prefetch)

// what the kernels need of a block's activations: 4 * the 16 sub-block sums
static void sums(const int8_t* q, int32_t* t) {
    for (int j = 0; j < 16; ++j) {
        int s = 0;
        for (int i = 0; i < 16; ++i) s += q[16 * j + i];
        t[j] = 4 * s;
    }
}

// the 3-bit code of weight w (natural order) of column c in a panel block
static inline int code(const uint8_t* pb, int c, int w) {
    const int j = w / 16, t = j & 1, i = (w / 4) & 3, e = w & 3;
    const uint8_t lo = pb[LO + 64 * j + 4 * c + e], hi = pb[HI + 64 * (j / 2) + 4 * c + e];
    return ((lo >> (2 * i)) & 3) | (((hi >> (4 * t + i)) & 1) << 2);
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
// bit p of each byte of H moved to bit 2 (the other bits: whatever; the caller masks with 4)
template <int p>
static inline __m512i hbit512(__m512i H) {
    if constexpr (p < 2) return _mm512_slli_epi16(H, 2 - p);
    else if constexpr (p == 2) return H;
    else return _mm512_srli_epi16(H, p - 2);
}
// the codes u of sub-block j = 2s + t of the 16 columns, W[i] = group i (weights 16j + 4i .. + 3): bits 2i..2i+1 of
// the row L of j | bit 4t + i of the row H of s, moved to bit 2
template <int t>
static inline void subblock_codes(__m512i L, __m512i H, __m512i W[4]) {
    const __m512i m03 = _mm512_set1_epi8(0x03), m04 = _mm512_set1_epi8(0x04);
    W[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(L, m03), hbit512<4 * t + 0>(H), m04, 0xF8);
    W[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(L, 2), m03), hbit512<4 * t + 1>(H), m04, 0xF8);
    W[2] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(L, 4), m03), hbit512<4 * t + 2>(H), m04, 0xF8);
    W[3] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(L, 6), m03), hbit512<4 * t + 3>(H), m04, 0xF8);
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
            prefetch_block<4>(pb + 256 * s, PF_DIST, 0);   // the next block (29 lines a block)
            const __m512i H = _mm512_loadu_si512(pb + HI + 64 * s);
            // the scales of sub-blocks 2s, 2s + 1 as int16 pairs: sc_2s | sc_2s+1 << 16 (column c: dword c)
            const __m512i SC = _mm512_mask_blend_epi16(
                0xAAAAAAAA, _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(pb + 32 + 32 * s))),
                _mm512_slli_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(pb + 48 + 32 * s))), 16));
            __m512i W[4], S0[R];
            subblock_codes<0>(_mm512_loadu_si512(pb + LO + 128 * s), H, W);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const int8_t* a = A + (size_t)r * K + (size_t)b * QK + 32 * s;
                __m512i S = _mm512_set1_epi32(-T[((size_t)r * nb + b) * 16 + 2 * s]);
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i) S = _mm512_dpbusd_epi32(S, W[i], _mm512_set1_epi32(*(const int*)(a + 4 * i)));
                S0[r] = S;
            }
            subblock_codes<1>(_mm512_loadu_si512(pb + LO + 128 * s + 64), H, W);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const int8_t* a = A + (size_t)r * K + (size_t)b * QK + 32 * s + 16;
                __m512i S = _mm512_set1_epi32(-T[((size_t)r * nb + b) * 16 + 2 * s + 1]);
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i) S = _mm512_dpbusd_epi32(S, W[i], _mm512_set1_epi32(*(const int*)(a + 4 * i)));
                // |S| <= 16 * 4 * 127: int16; the pair (S of 2s, S of 2s + 1) times the scales' pair, exact int32
                I[r] = _mm512_dpwssd_epi32(I[r], _mm512_mask_blend_epi16(0xAAAAAAAA, S0[r], _mm512_slli_epi32(S, 16)), SC);
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
template <int p>
static inline __m256i hbit256(__m256i H) {
    if constexpr (p < 2) return _mm256_slli_epi16(H, 2 - p);
    else if constexpr (p == 2) return H;
    else return _mm256_srli_epi16(H, p - 2);
}
template <int t>
static inline void subblock_codes256(__m256i L, __m256i H, __m256i W[4]) {
    const __m256i m03 = _mm256_set1_epi8(0x03), m04 = _mm256_set1_epi8(0x04);
    W[0] = _mm256_or_si256(_mm256_and_si256(L, m03), _mm256_and_si256(hbit256<4 * t + 0>(H), m04));
    W[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L, 2), m03), _mm256_and_si256(hbit256<4 * t + 1>(H), m04));
    W[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L, 4), m03), _mm256_and_si256(hbit256<4 * t + 2>(H), m04));
    W[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L, 6), m03), _mm256_and_si256(hbit256<4 * t + 3>(H), m04));
}
// ---------------- AVX2: the same with 8 columns a ymm (half h = columns 8h..8h+7) ----------------
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
                if (h == 0 && t == 0) prefetch_block<4>(pb + 256 * s, PF_DIST, 0);   // the next block
                const __m256i H = _mm256_loadu_si256((const __m256i*)(pb + HI + 64 * s + 32 * h));
                const __m256i L = _mm256_loadu_si256((const __m256i*)(pb + LO + 64 * j + 32 * h));
                __m256i W[4];
                if (t == 0) subblock_codes256<0>(L, H, W);
                else subblock_codes256<1>(L, H, W);
                const __m256i SC = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(pb + 32 + 16 * j + 8 * h)));
                for (int r = 0; r < R; ++r) {
                    const int8_t* a = A + (size_t)r * K + (size_t)b * QK + 16 * j;
                    __m256i S = _mm256_set1_epi32(-T[((size_t)r * nb + b) * 16 + j]);
                    for (int i = 0; i < 4; ++i)
#if defined(__AVXVNNI__)
                        S = _mm256_dpbusd_avx_epi32(S, W[i], prompt::bcast4(a + 4 * i));
#else   // int16 words of 2 products (<= 2*7*127): exact, then int32
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
struct Q3KPanelAMX {   // what prompt.h's Panel, finish and panel_amx read of the format
    static const int NSUB = 16, EXTRA = 0;
    static inline __m512 tail(const uint8_t*, const int32_t*, __m512 v) { return v; }
};

// panel g's nb blocks -> prompt.h's AMX panel blocks: w = (u - 4) * sc as int16, its low and high bytes; d
static void amx_panel(const uint8_t* P, int nb, uint8_t* out) {
    const __m512i off = _mm512_set1_epi16(4);
    const __m512i QUAD = quad_index();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pb = P + (size_t)b * PB;
        uint8_t* o = out + (size_t)b * prompt::Panel<Q3KPanelAMX>::AMX;
        for (int s = 0; s < 8; ++s) {
            const __m512i H = _mm512_loadu_si512(pb + HI + 64 * s);
            for (int t = 0; t < 2; ++t) {
                const int j = 2 * s + t;
                __m512i U[4];
                const __m512i L = _mm512_loadu_si512(pb + LO + 64 * j);
                if (t == 0) subblock_codes<0>(L, H, U);
                else subblock_codes<1>(L, H, U);
                const __m512i sc4 = _mm512_permutexvar_epi8(QUAD, _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(pb + 32 + 16 * j))));
                const __m512i sc0 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(sc4));
                const __m512i sc1 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(sc4, 1));
                for (int i = 0; i < 4; ++i)   // group 4j + i: weights 16j + 4i .. + 3
                    store_lo_hi(o, 4 * j + i,
                                _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(U[i])), off), sc0),
                                _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(U[i], 1)), off), sc1));
            }
        }
        _mm512_store_ps((float*)(o + prompt::Panel<Q3KPanelAMX>::AMX_D), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)pb)));
    }
}
#define Q3K16_WIDE amx_gemm<Q3KPanelAMX, PB, 16, sums, amx_panel>
#else
#define Q3K16_WIDE nullptr
#endif

// the 16 unsigned 6-bit scales s_j of a block_q3_K (ggml's aux decode, as q3k.cpp): byte j of aux[0..3]
static void scale_words(const uint8_t* blk, uint32_t aux[4]) {
    const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
    memcpy(aux, blk + 96, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
    aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
    aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4);
    aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
}

// column c of a panel block (zeroed) from its block_q3_K
static void pack_column(const uint8_t* blk, uint8_t* pb, int c) {
    memcpy(pb + 2 * c, blk + 108, 2);
    uint32_t aux[4];
    scale_words(blk, aux);
    for (int j = 0; j < 16; ++j) pb[32 + 16 * j + c] = (uint8_t)(int8_t)((int)((aux[j >> 2] >> (8 * (j & 3))) & 0xff) - 32);
    uint8_t u[QK];
    for (int h = 0; h < 2; ++h)
        for (int cc = 0; cc < 4; ++cc)
            for (int i = 0; i < 32; ++i)
                u[128 * h + 32 * cc + i] = ((blk[32 + 32 * h + i] >> (2 * cc)) & 3) | (((blk[i] >> (4 * h + cc)) & 1) << 2);
    for (int s = 0; s < 8; ++s) {
        const Codes32 codes(u + 32 * s);   // sub-blocks 2s (A) and 2s + 1 (B)
        for (int t = 0; t < 2; ++t) {
            const uint32_t lo = codes.two_bits(t, 0);
            memcpy(pb + LO + 64 * (2 * s + t) + 4 * c, &lo, 4);
        }
        const uint32_t hi = codes.one_bit(2);
        memcpy(pb + HI + 64 * s + 4 * c, &hi, 4);
    }
}

// column c's 256 weights of a panel block, as gguf.quants.dequantize: (d * sc) * (u - 4)
static void decode_column(const uint8_t* pb, int c, float* o) {
    const float d = h2f(pb + 2 * c);
    for (int w = 0; w < QK; ++w) o[w] = d * (float)((const int8_t*)pb)[32 + 16 * (w / 16) + c] * (float)(code(pb, c, w) - 4);
}

static const int E = 16;   // int32s a block of what the kernels need of the activations (sums)
PANEL_ENTRY_POINTS(q3k16, Q3K16_WIDE)
