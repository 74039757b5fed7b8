// Q4_K in panels of 16 output rows: the scoring and prompt-reading product of a Q4_K matrix whose rows are a
// multiple of 16, over a copy of its blocks re-laid out once at load (q4k16_pack), y[k,N] = x[k,K] . W[N,K]^T.
//
// Why (issue 27, benchmarks/kernel_shape): q4k.cpp keeps 16 partial sums per output element (one zmm = the 8
// sub-blocks' scale and min terms of ONE output), so every (row, block, output) costs ~10 vector ops beside the 4
// integer dots, and a horizontal sum ends each output. Here a zmm holds 16 output elements (columns) and every op
// is shared by all 16: the integer dot of a sub-block is 8 vpdpbusd of 4 weights x 16 columns against 4 activations
// broadcast from memory, the float steps run once per block for 16 outputs. The row groups (at most 8 rows; 4 on
// AVX2) run inside each panel, so a panel's weights come from memory once for all rows (from L1/L2 for the later groups).
//
// Panel block (16 output rows 16g..16g+15, one 256-weight block b), PB = 2368 bytes, panels [N/16][nb]:
//   [0, 32)      d    fp16[16]            [32, 64)   dmin fp16[16]
//   [64, 192)    sc   u8[8 sub-blocks][16 columns]
//   [192, 320)   m    u8[8][16]
//   [320, 2368)  qs   32 x 64 bytes: row 4s + i, column c, byte 4c + e: low nibble = q[32s + 4i + e],
//                     high nibble = q[32s + 16 + 4i + e] (q = the block's 4-bit codes in natural order)
// Activations, per row and 256-block (the other K-quant kernels' quantizer: d = amax/127, round-half-even,
// clamped to [-127,127]): a int8 [K] natural order, dx [nb], bs [nb][8] = the sums of each sub-block's a, stored
// as int16 pairs mp [nb][4] = bs_2p | bs_2p+1 << 16.
//
// Per output element (r, n), blocks b in order (acc = 0 first; y = acc):
//   I   = sum over s of sc_s * (sum over sub-block s of q_i * a_i)       (exact int32, |I| <= 256*15*63*127)
//   M   = sum over s of m_s * bs_s                                        (exact int32)
//   v   = float(I) * d_b;  v = fnmadd(float(M), dmin_b, v);  acc = fma(v, dx_rb, acc)
// (each sub-block's low nibbles' and high nibbles' dots, |sum| < 2^15 each, are paired as int16 in one lane and
// multiplied by the scale pair with one vpdpwssd, where a vpmulld and an add were: the same integer I, 3% faster a
// prompt, AMD EPYC; the AVX2 path without VNNI multiplies its int16 sums by the scale in its vpmaddwd)
// which is prompt.h's definition of the Q4_K prompt product (q4k_gemm mode 2) step for step: the same bits
// (tested), so a model reading its prompt and scoring its tokens sees the same numbers. Every op is one IEEE
// float32 operation on one (r, n): a row's result does not depend on the other rows, the row count, the thread
// count or the path (AVX-512 VNNI; AVX2, with AVX-VNNI where compiled with it; scalar). Mode bit 1: the scalar
// reference; mode bit 2 (a prompt) runs the same product; from AMX_ROWS (33) rows on, AMX tiles where compiled and
// granted (mode bit 4: never; panels.h), the same bits. Software prefetch of the next block. -ffp-contract=off.
#include "panels.h"

static const int BB = 144, PB = 2368, QS = 320;
static int PF_DIST = PB;   // software prefetch distance in bytes: the next block (0 = off; q4k16_set_prefetch)

// what the kernels need of a block's activations: the sub-block sums bs as int16 pairs bs_2p | bs_2p+1 << 16
static constexpr void (*sums)(const int8_t*, int32_t*) = pair_sums<32>;

// ---------------- the scalar reference (and the scalar build's path): v of column c for one row and block -------
static float reference_block(const uint8_t* pb, int c, const int8_t* a, const int32_t* mp) {
    int32_t I = 0, M = 0;
    for (int s = 0; s < 8; ++s) {
        int32_t S = 0;
        for (int i = 0; i < 4; ++i)
            for (int e = 0; e < 4; ++e) {
                const uint8_t z = pb[QS + 64 * (4 * s + i) + 4 * c + e];
                S += (z & 15) * a[32 * s + 4 * i + e] + (z >> 4) * a[32 * s + 16 + 4 * i + e];
            }
        I += (int32_t)pb[64 + 16 * s + c] * S;
        const uint32_t w = (uint32_t)mp[s / 2];
        M += (int32_t)pb[192 + 16 * s + c] * (int32_t)(int16_t)(s & 1 ? w >> 16 : w);
    }
    const float v = (float)I * h2f(pb + 2 * c);
    return fmaf(-(float)M, h2f(pb + 32 + 2 * c), v);
}

#if defined(KQ_AVX512)
// ---------------- AVX-512 VNNI: R rows x the 16 columns of one panel ----------------
template <int R>
static void panel_rows(const uint8_t* P, int nb, int K, const int8_t* A, const float* DX, const int32_t* MP, float* y,
                       int N) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pb = P + (size_t)b * PB;
        __m512i I[R];
        for (int r = 0; r < R; ++r) I[r] = _mm512_setzero_si512();
        for (int s = 0; s < 8; ++s) {
            prefetch_block<5>(pb + 320 * s, PF_DIST, 0);   // the panel's next blocks (37 lines a block)
            // the scale as an int16 pair per column (sc | sc << 16): one vpdpwssd multiplies both halves' dots
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(pb + 64 + 16 * s)));
            const __m512i SC = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
            __m512i W[8];
            for (int i = 0; i < 4; ++i) {
                const __m512i z = _mm512_loadu_si512(pb + QS + 64 * (4 * s + i));
                W[i] = _mm512_and_si512(z, m4);
                W[4 + i] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const int8_t* a = A + (size_t)r * K + (size_t)b * QK + 32 * s;
                // the low nibbles' 16 products and the high nibbles' 16, each |sum| <= 16*15*127 < 2^15: int16 each,
                // paired in one lane (low | high << 16) and multiplied by the scale pair: sc * (lo + hi), exact
                __m512i L = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[0], _mm512_set1_epi32(*(const int*)a));
                __m512i H = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[4], _mm512_set1_epi32(*(const int*)(a + 16)));
#pragma GCC unroll 4
                for (int i = 1; i < 4; ++i) {
                    L = _mm512_dpbusd_epi32(L, W[i], _mm512_set1_epi32(*(const int*)(a + 4 * i)));
                    H = _mm512_dpbusd_epi32(H, W[4 + i], _mm512_set1_epi32(*(const int*)(a + 16 + 4 * i)));
                }
                I[r] = _mm512_dpwssd_epi32(I[r], _mm512_mask_blend_epi16(0xAAAAAAAA, L, _mm512_slli_epi32(H, 16)), SC);
            }
        }
        __m512i MV[4];   // per column: m_2p | m_2p+1 << 16, the int16 pairs of vpdpwssd
        for (int p = 0; p < 4; ++p)
            MV[p] = _mm512_or_si512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(pb + 192 + 32 * p))),
                                    _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(pb + 208 + 32 * p))), 16));
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)pb));
        const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(pb + 32)));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const int32_t* mp = MP + ((size_t)r * nb + b) * 4;
            __m512i M = _mm512_dpwssd_epi32(_mm512_setzero_si512(), MV[0], _mm512_set1_epi32(mp[0]));
            for (int p = 1; p < 4; ++p) M = _mm512_dpwssd_epi32(M, MV[p], _mm512_set1_epi32(mp[p]));
            const __m512 v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), mv, _mm512_mul_ps(_mm512_cvtepi32_ps(I[r]), dv));
            acc[r] = _mm512_fmadd_ps(v, _mm512_set1_ps(DX[(size_t)r * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (size_t)r * N, acc[r]);
}
static const int ROWS = 8;   // rows a group
#elif defined(KQ_AVX2)
// ---------------- AVX2: the same with 8 columns a ymm (half h = columns 8h..8h+7) ----------------
template <int R>
static void panel_rows(const uint8_t* P, int nb, int K, const int8_t* A, const float* DX, const int32_t* MP, float* y,
                       int N) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pb = P + (size_t)b * PB;
        for (int h = 0; h < 2; ++h) {
            __m256i I[R];
            for (int r = 0; r < R; ++r) I[r] = _mm256_setzero_si256();
            for (int s = 0; s < 8; ++s) {
                if (h == 0) prefetch_block<5>(pb + 320 * s, PF_DIST, 0);   // the panel's next blocks
                const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(pb + 64 + 16 * s + 8 * h)));
#if !defined(__AVXVNNI__)
                const __m256i SC = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));   // sc in both int16 words
#endif
                __m256i W[8];
                for (int i = 0; i < 4; ++i) {
                    const __m256i z = _mm256_loadu_si256((const __m256i*)(pb + QS + 64 * (4 * s + i) + 32 * h));
                    W[i] = _mm256_and_si256(z, m4);
                    W[4 + i] = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
                }
                for (int r = 0; r < R; ++r) {
                    const int8_t* a = A + (size_t)r * K + (size_t)b * QK + 32 * s;
#if defined(__AVXVNNI__)
                    __m256i S = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), W[0], prompt::bcast4(a));
                    for (int i = 1; i < 8; ++i) S = _mm256_dpbusd_avx_epi32(S, W[i], prompt::bcast4(a + 4 * i));
                    I[r] = _mm256_add_epi32(I[r], _mm256_mullo_epi32(S, sc));
#else   // int16 words of 2 products (<= 2*15*127), 8 of them added: <= 30480, exact; times sc by one vpmaddwd
                    __m256i p = _mm256_maddubs_epi16(W[0], prompt::bcast4(a));
                    for (int i = 1; i < 8; ++i) {
                        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(W[i], prompt::bcast4(a + 4 * i)));
                        asm("" : "+x"(p));   // keep the adds in this order: GCC would tree them and spill
                    }
                    I[r] = _mm256_add_epi32(I[r], _mm256_madd_epi16(p, SC));
#endif
                }
            }
            __m256i MV[4];
            for (int p = 0; p < 4; ++p)
                MV[p] = _mm256_or_si256(
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(pb + 192 + 32 * p + 8 * h))),
                    _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(pb + 208 + 32 * p + 8 * h))), 16));
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(pb + 16 * h)));
            const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(pb + 32 + 16 * h)));
            for (int r = 0; r < R; ++r) {
                const int32_t* mp = MP + ((size_t)r * nb + b) * 4;
                __m256i M = _mm256_madd_epi16(MV[0], _mm256_set1_epi32(mp[0]));
                for (int p = 1; p < 4; ++p) M = _mm256_add_epi32(M, _mm256_madd_epi16(MV[p], _mm256_set1_epi32(mp[p])));
                const __m256 v = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), mv, _mm256_mul_ps(_mm256_cvtepi32_ps(I[r]), dv));
                acc[r][h] = _mm256_fmadd_ps(v, _mm256_set1_ps(DX[(size_t)r * nb + b]), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(y + (size_t)r * N, acc[r][0]);
        _mm256_storeu_ps(y + (size_t)r * N + 8, acc[r][1]);
    }
}
static const int ROWS = 4;
#endif

#if defined(KQ_SCALAR)
static const panel_fn* const PANEL_ROWS = nullptr;
static const int ROWS = 1;
#elif defined(KQ_AVX512)
static const panel_fn PANEL_ROWS[9] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>,
                                       panel_rows<5>, panel_rows<6>, panel_rows<7>, panel_rows<8>};
#else
static const panel_fn PANEL_ROWS[5] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>};
#endif

// ---------------- AMX (where compiled with AMX-INT8 and the kernel grants the tile state: panels.h) ----------------
#if defined(KP_AMX)
struct Q4KPanelAMX {   // what prompt.h's Panel, finish and panel_amx read of the format
    static const int NSUB = 8, EXTRA = 4 * 64 + 64;
    static inline __m512 tail(const uint8_t* X, const int32_t* e, __m512 v) { return prompt::mins_tail(X, e, v); }
};

// panel g's nb blocks -> prompt.h's AMX panel blocks (Panel<Q4KPanelAMX>::AMX bytes each): w = q * sc as int16,
// its low and high bytes; d, the m pairs, dmin
static void amx_panel(const uint8_t* P, int nb, uint8_t* out) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i QUAD = quad_index();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pb = P + (size_t)b * PB;
        uint8_t* o = out + (size_t)b * prompt::Panel<Q4KPanelAMX>::AMX;
        for (int s = 0; s < 8; ++s) {
            const __m512i sc4 = _mm512_permutexvar_epi8(QUAD, _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(pb + 64 + 16 * s))));
            const __m512i sc0 = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(sc4));
            const __m512i sc1 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(sc4, 1));
            for (int i = 0; i < 4; ++i) {
                const __m512i z = _mm512_loadu_si512(pb + QS + 64 * (4 * s + i));
                const __m512i U[2] = {_mm512_and_si512(z, m4), _mm512_and_si512(_mm512_srli_epi16(z, 4), m4)};
                for (int t = 0; t < 2; ++t)   // group 8s + 4t + i: weights 32s + 16t + 4i .. + 3
                    store_lo_hi(o, 8 * s + 4 * t + i,
                                _mm512_mullo_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(U[t])), sc0),
                                _mm512_mullo_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(U[t], 1)), sc1));
            }
        }
        uint8_t* X = o + prompt::Panel<Q4KPanelAMX>::AMX_D;
        _mm512_store_ps((float*)X, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)pb)));
        for (int p = 0; p < 4; ++p)
            _mm512_store_si512(X + 64 + 64 * p, _mm512_or_si512(
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(pb + 192 + 32 * p))),
                _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(pb + 208 + 32 * p))), 16)));
        _mm512_store_ps((float*)(X + 64 + 256), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(pb + 32))));
    }
}
#define Q4K16_WIDE amx_gemm<Q4KPanelAMX, PB, 4, sums, amx_panel>
#elif defined(KQ_AVX2)
struct Q4KPanelAVX2 {   // what prompt_avx2.h's block_rows reads of the format
    static const int SUB = 32, NSUB = 8, OFF = 0, HAS_MIN = 1, EXTRA = 4 * 64 + 64;
};
// one panel block -> prompt.h's VNNI packed block (prompt_avx2.h's layout): the codes one byte a weight (rows
// 8s + i: the low nibbles of panel row 4s + i, rows 8s + 4 + i: its high nibbles), sc as int32, d, the m pairs, dmin
static void avx2_block(const uint8_t* pb, uint8_t* o) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int s = 0; s < 8; ++s)
        for (int i = 0; i < 4; ++i)
            for (int h = 0; h < 2; ++h) {
                const __m256i z = _mm256_loadu_si256((const __m256i*)(pb + QS + 64 * (4 * s + i) + 32 * h));
                _mm256_store_si256((__m256i*)(o + 64 * (8 * s + i) + 32 * h), _mm256_and_si256(z, m4));
                _mm256_store_si256((__m256i*)(o + 64 * (8 * s + 4 + i) + 32 * h),
                                   _mm256_and_si256(_mm256_srli_epi16(z, 4), m4));
            }
    int32_t* S = (int32_t*)(o + prompt::WQ);
    float* D = (float*)(o + prompt::Panel<Q4KPanelAVX2>::VNNI_D);
    int32_t* M2 = (int32_t*)(D + 16);
    for (int h = 0; h < 2; ++h) {
        for (int s = 0; s < 8; ++s)
            _mm256_store_si256((__m256i*)(S + 16 * s + 8 * h),
                               _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(pb + 64 + 16 * s + 8 * h))));
        _mm256_store_ps(D + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(pb + 16 * h))));
        for (int p = 0; p < 4; ++p)
            _mm256_store_si256((__m256i*)(M2 + 16 * p + 8 * h), _mm256_or_si256(
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(pb + 192 + 32 * p + 8 * h))),
                _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(pb + 208 + 32 * p + 8 * h))), 16)));
        _mm256_store_ps((float*)(M2 + 64) + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(pb + 32 + 16 * h))));
    }
}
#define Q4K16_WIDE avx2_gemm<Q4KPanelAVX2, PB, 4, sums, avx2_block>
#else
#define Q4K16_WIDE nullptr
#endif

// column c of a panel block from its block_q4_K
static void pack_column(const uint8_t* blk, uint8_t* pb, int c) {
    memcpy(pb + 2 * c, blk, 2);
    memcpy(pb + 32 + 2 * c, blk + 2, 2);
    uint8_t sc[8], m[8];
    decode_scales(blk + 4, sc, m);
    uint8_t q[QK];
    for (int t = 0; t < 4; ++t)
        for (int i = 0; i < 32; ++i) {
            q[64 * t + i] = blk[16 + 32 * t + i] & 15;
            q[64 * t + 32 + i] = blk[16 + 32 * t + i] >> 4;
        }
    for (int s = 0; s < 8; ++s) {
        pb[64 + 16 * s + c] = sc[s];
        pb[192 + 16 * s + c] = m[s];
        Codes32(q + 32 * s).store_nibbles(pb + QS + 64 * 4 * s + 4 * c, 64);
    }
}

// column c's 256 weights of a panel block, as gguf.quants.dequantize: (d*sc)*q - dmin*m, each op rounded
static void decode_column(const uint8_t* pb, int c, float* o) {
    const float d = h2f(pb + 2 * c), dmin = h2f(pb + 32 + 2 * c);
    for (int s = 0; s < 8; ++s) {
        const float ds = d * (float)pb[64 + 16 * s + c], dm = dmin * (float)pb[192 + 16 * s + c];
        for (int i = 0; i < 4; ++i)
            for (int e = 0; e < 4; ++e) {
                const uint8_t z = pb[QS + 64 * (4 * s + i) + 4 * c + e];
                o[32 * s + 4 * i + e] = ds * (float)(z & 15) - dm;
                o[32 * s + 16 + 4 * i + e] = ds * (float)(z >> 4) - dm;
            }
    }
}

static const int E = 4;   // int32s a block of what the kernels need of the activations (sums)
PANEL_ENTRY_POINTS(q4k16, Q4K16_WIDE)
