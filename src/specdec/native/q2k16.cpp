// Q2_K in panels of 16 output rows: the scoring and prompt-reading product of a Q2_K matrix whose rows are a
// multiple of 16, over a copy of its blocks re-laid out once at load (q2k16_pack), y[k,N] = x[k,K] . W[N,K]^T.
// The design of q4k16.cpp (which see): a zmm holds 16 output elements (columns), every op is shared by the 16, the
// row groups (at most 16 rows: the codes' unpacking and scaling is shared by a group, a row's own work is its 64
// vpdpbusd and 8 vpdpwssd a block; 4 rows on AVX2) run inside each panel, so a panel's weights come from memory once
// for all rows. q2k.cpp (kgroups.h) keeps 16 partial sums per output element and ends each with a horizontal sum.
//
// Panel block (16 output rows 16g..16g+15, one 256-weight block b), PB = 1344 bytes (= 16 blocks of 84: no growth),
// panels [N/16][nb]:
//   [0, 32)       d    fp16[16]            [32, 64)   dmin fp16[16]
//   [64, 320)     sc   8 pairs p of 32 bytes: byte 2c + t = column c's scale byte of sub-block 2p + t, as ggml's
//                      (4-bit scale sc | 4-bit min m << 4)
//   [320, 1344)   qs   16 rows j (sub-block j = weights 16j..16j+15) of 64 bytes: byte 4c + e, bits 2t..2t+1 =
//                      u[16j + 4t + e] of column c (u = the block's 2-bit codes in natural order)
// Activations, per row and 256-block (the other K-quant kernels' quantizer: d = amax/127, round-half-even,
// clamped to [-127,127]): a int8 [K] natural order, dx [nb], ts [nb][16] = the sums of each 16 a's (|.| <= 2032),
// stored as int16 pairs mp [nb][8] = ts_2p | ts_2p+1 << 16.
//
// Per output element (r, n), blocks b in order (acc = 0 first; y = acc):
//   I   = sum over j of sc_j * (sum over sub-block j of u_i * a_i)       (exact int32, |I| <= 256*3*15*127)
//   M   = sum over j of m_j * ts_j                                        (exact int32)
//   v   = float(I) * d_b;  v = fnmadd(float(M), dmin_b, v);  acc = fma(v, dx_rb, acc)
// which is prompt.h's definition of the Q2_K prompt product (q2k_gemm mode 2: kgroups.h's Prompt, 16 sub-blocks of
// 16 weights, 16 mins, OFF = 0) step for step: the same bits (tested). The integer sums are exact in any order:
// AVX-512 (and AVX-VNNI) takes u * sc_j as a byte (<= 45: vpmullw of the 2-bit codes by the scale in both int16
// words of a column's dword; AVX-512 unpacks the codes by gf2p8affineqb where compiled with GFNI, else shift and
// mask) and runs vpdpbusd of those against the activations (4 products <= 22860 a dword);
// AVX2 without VNNI sums maddubs of the codes (<= 4*2*3*127 a word), then vpmaddwd by sc_j. Every float op is
// one IEEE float32 operation on one (r, n): a row's result does not depend on the other rows, the row count, the
// thread count or the path (AVX-512 VNNI; AVX2, with AVX-VNNI where compiled with it; scalar). Mode bit 1: the
// scalar reference; mode bit 2 (a prompt) runs the same product; from AMX_ROWS (33) rows on, AMX tiles where
// compiled and granted (mode bit 4: never; panels.h), over prompt.h's Q2_K AMX panel (w = u * sc: the lo plane;
// the hi plane 0), the same bits. Software prefetch of the next block. -ffp-contract=off.
#include "panels.h"

static const int BB = 84, PB = 1344, QS = 320;
static int PF_DIST = PB;   // software prefetch distance in bytes: the next block (0 = off; q2k16_set_prefetch)

// what the kernels need of a block's activations: the 16-weight sums ts as int16 pairs ts_2p | ts_2p+1 << 16
static constexpr void (*sums)(const int8_t*, int32_t*) = pair_sums<16>;

// the scale byte (sc | m << 4) of sub-block j, column c
static inline uint8_t scale_byte(const uint8_t* pb, int j, int c) { return pb[64 + 32 * (j / 2) + 2 * c + (j & 1)]; }

// ---------------- the scalar reference (and the scalar build's path): v of column c for one row and block -------
static float reference_block(const uint8_t* pb, int c, const int8_t* a, const int32_t* mp) {
    int32_t I = 0, M = 0;
    for (int j = 0; j < 16; ++j) {
        int32_t S = 0;
        for (int t = 0; t < 4; ++t)
            for (int e = 0; e < 4; ++e) S += ((pb[QS + 64 * j + 4 * c + e] >> (2 * t)) & 3) * a[16 * j + 4 * t + e];
        const uint8_t s = scale_byte(pb, j, c);
        I += (int32_t)(s & 15) * S;
        const uint32_t w = (uint32_t)mp[j / 2];
        M += (int32_t)(s >> 4) * (int32_t)(int16_t)(j & 1 ? w >> 16 : w);
    }
    const float v = (float)I * h2f(pb + 2 * c);
    return fmaf(-(float)M, h2f(pb + 32 + 2 * c), v);
}

#if !defined(KQ_SCALAR)
// vpshufb indices (per 128-bit lane): both words of dword c <- word 0 (IDX 0) or word 1 (IDX 1) of dword c
static const int8_t* word_index(int w) {
    alignas(64) static int8_t idx[2][64];
    static const bool done = [] {
        for (int k = 0; k < 64; ++k) for (int w = 0; w < 2; ++w) idx[w][k] = (int8_t)(4 * ((k & 15) / 4) + 2 * w + (k & 1));
        return true;
    }();
    (void)done;
    return idx[w];
}
#endif

#if defined(KQ_AVX512)
// bits 2t..2t+1 of every byte of z (the codes u of weights 4t + e): one gf2p8affineqb where compiled with GFNI
static inline __m512i codes(__m512i z, int t) {
    if (t == 0) return _mm512_and_si512(z, _mm512_set1_epi8(3));
#if defined(__GFNI__)
    // affine matrix (row i of the output bit = byte 7 - i of the qword): output bits 0, 1 <- input bits 2t, 2t + 1
    return _mm512_gf2p8affine_epi64_epi8(z, _mm512_set1_epi64((long long)((1ull << (2 * t)) << 56 | (1ull << (2 * t + 1)) << 48)), 0);
#else
    return _mm512_and_si512(_mm512_srli_epi16(z, 2 * t), _mm512_set1_epi8(3));
#endif
}

// ---------------- AVX-512 VNNI: R rows x the 16 columns of one panel ----------------
template <int R>
static void panel_rows(const uint8_t* P, int nb, int K, const int8_t* A, const float* DX, const int32_t* MP, float* y,
                       int N) {
    constexpr int NA = R == 1 ? 4 : R == 2 ? 2 : 1;   // integer accumulators a row (dpbusd chains; exact in any order)
    const __m512i m15 = _mm512_set1_epi16(15);
    const __m512i IX0 = _mm512_load_si512(word_index(0)), IX1 = _mm512_load_si512(word_index(1));
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pb = P + (size_t)b * PB;
        __m512i I[R][NA];
        for (int r = 0; r < R; ++r) for (int n = 0; n < NA; ++n) I[r][n] = _mm512_setzero_si512();
        for (int p = 0; p < 8; ++p) {
            if (p < 7) prefetch_block<3>(pb + 192 * p, PF_DIST, 0);   // the panel's next block (21 lines)
            const __m512i Y = _mm512_and_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(pb + 64 + 32 * p))), m15);
            const __m512i SC[2] = {_mm512_shuffle_epi8(Y, IX0), _mm512_shuffle_epi8(Y, IX1)};
            for (int h = 0; h < 2; ++h) {
                const int j = 2 * p + h;
                const __m512i z = _mm512_loadu_si512(pb + QS + 64 * j);
                __m512i W[4];
                for (int t = 0; t < 4; ++t) W[t] = _mm512_mullo_epi16(codes(z, t), SC[h]);
#pragma GCC unroll 16
                for (int r = 0; r < R; ++r) {
                    const int8_t* a = A + (size_t)r * K + (size_t)b * QK + 16 * j;
#pragma GCC unroll 4
                    for (int t = 0; t < 4; ++t)
                        I[r][t % NA] = _mm512_dpbusd_epi32(I[r][t % NA], W[t], _mm512_set1_epi32(*(const int*)(a + 4 * t)));
                }
            }
        }
        __m512i MV[8];   // per column: m_2p | m_2p+1 << 16, the int16 pairs of vpdpwssd
        for (int p = 0; p < 8; ++p)
            MV[p] = _mm512_srli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(pb + 64 + 32 * p))), 4);
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)pb));
        const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(pb + 32)));
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const int32_t* mp = MP + ((size_t)r * nb + b) * 8;
            __m512i M = _mm512_dpwssd_epi32(_mm512_setzero_si512(), MV[0], _mm512_set1_epi32(mp[0]));
            for (int p = 1; p < 8; ++p) M = _mm512_dpwssd_epi32(M, MV[p], _mm512_set1_epi32(mp[p]));
            __m512i Ir = I[r][0];
            for (int n = 1; n < NA; ++n) Ir = _mm512_add_epi32(Ir, I[r][n]);
            const __m512 v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), mv, _mm512_mul_ps(_mm512_cvtepi32_ps(Ir), dv));
            acc[r] = _mm512_fmadd_ps(v, _mm512_set1_ps(DX[(size_t)r * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (size_t)r * N, acc[r]);
}
static const int ROWS = 16;   // rows a group
#elif defined(KQ_AVX2)
// ---------------- AVX2: the same with 8 columns a ymm (half h = columns 8h..8h+7) ----------------
template <int R>
static void panel_rows(const uint8_t* P, int nb, int K, const int8_t* A, const float* DX, const int32_t* MP, float* y,
                       int N) {
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi16(15);
    const __m256i IX0 = _mm256_load_si256((const __m256i*)word_index(0)), IX1 = _mm256_load_si256((const __m256i*)word_index(1));
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pb = P + (size_t)b * PB;
        for (int h = 0; h < 2; ++h) {
            __m256i I[R];
            for (int r = 0; r < R; ++r) I[r] = _mm256_setzero_si256();
            for (int p = 0; p < 8; ++p) {
                if (h == 0 && p < 7) prefetch_block<3>(pb + 192 * p, PF_DIST, 0);   // the panel's next block
                const __m256i Y = _mm256_and_si256(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(pb + 64 + 32 * p + 16 * h))), m15);
                const __m256i SC[2] = {_mm256_shuffle_epi8(Y, IX0), _mm256_shuffle_epi8(Y, IX1)};
                for (int s = 0; s < 2; ++s) {
                    const int j = 2 * p + s;
                    const __m256i z = _mm256_loadu_si256((const __m256i*)(pb + QS + 64 * j + 32 * h));
                    __m256i W[4];
                    W[0] = _mm256_and_si256(z, m3);
                    for (int t = 1; t < 4; ++t) W[t] = _mm256_and_si256(_mm256_srli_epi16(z, 2 * t), m3);
#if defined(__AVXVNNI__)
                    for (int t = 0; t < 4; ++t) W[t] = _mm256_mullo_epi16(W[t], SC[s]);   // u * sc_j <= 45
#endif
                    for (int r = 0; r < R; ++r) {
                        const int8_t* a = A + (size_t)r * K + (size_t)b * QK + 16 * j;
#if defined(__AVXVNNI__)
                        for (int t = 0; t < 4; ++t) I[r] = _mm256_dpbusd_avx_epi32(I[r], W[t], prompt::bcast4(a + 4 * t));
#else   // int16 words of 2 products (<= 2*3*127), 4 of them added: <= 3048, exact; then sc_j * the pairs
                        __m256i q = _mm256_maddubs_epi16(W[0], prompt::bcast4(a));
                        for (int t = 1; t < 4; ++t) q = _mm256_add_epi16(q, _mm256_maddubs_epi16(W[t], prompt::bcast4(a + 4 * t)));
                        I[r] = _mm256_add_epi32(I[r], _mm256_madd_epi16(q, SC[s]));
#endif
                    }
                }
            }
            __m256i MV[8];
            for (int p = 0; p < 8; ++p)
                MV[p] = _mm256_srli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(pb + 64 + 32 * p + 16 * h))), 4);
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(pb + 16 * h)));
            const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(pb + 32 + 16 * h)));
            for (int r = 0; r < R; ++r) {
                const int32_t* mp = MP + ((size_t)r * nb + b) * 8;
                __m256i M = _mm256_madd_epi16(MV[0], _mm256_set1_epi32(mp[0]));
                for (int p = 1; p < 8; ++p) M = _mm256_add_epi32(M, _mm256_madd_epi16(MV[p], _mm256_set1_epi32(mp[p])));
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
static const panel_fn PANEL_ROWS[17] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>,
                                        panel_rows<5>, panel_rows<6>, panel_rows<7>, panel_rows<8>, panel_rows<9>,
                                        panel_rows<10>, panel_rows<11>, panel_rows<12>, panel_rows<13>, panel_rows<14>,
                                        panel_rows<15>, panel_rows<16>};
#else
static const panel_fn PANEL_ROWS[5] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>};
#endif

// ---------------- AMX (where compiled with AMX-INT8 and the kernel grants the tile state: panels.h) ----------------
#if defined(KP_AMX)
struct Q2KPanelAMX {   // what prompt.h's Panel, finish and panel_amx read of the format (kgroups.h's Prompt<Q2K>)
    static const int NSUB = 16, EXTRA = 8 * 64 + 64;
    static inline __m512 tail(const uint8_t* X, const int32_t* e, __m512 v) {   // as kgroups.h's Prompt::tail
        __m512i m = _mm512_setzero_si512();
        for (int i = 0; i < 8; ++i) m = _mm512_dpwssd_epi32(m, _mm512_load_si512(X + 64 * i), _mm512_set1_epi32(e[i]));
        return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_load_ps((const float*)(X + 512)), v);
    }
};

// panel g's nb blocks -> prompt.h's AMX panel blocks (Panel<Q2KPanelAMX>::AMX bytes each): w = u * sc (<= 45) is
// its low byte (row 4j + t of the lo plane = W_t of sub-block j), the high plane 0; d, the m pairs, dmin
static void amx_panel(const uint8_t* P, int nb, uint8_t* out) {
    const __m512i m3 = _mm512_set1_epi8(3), m15 = _mm512_set1_epi16(15);
    const __m512i IX0 = _mm512_load_si512(word_index(0)), IX1 = _mm512_load_si512(word_index(1));
    for (int b = 0; b < nb; ++b) {
        const uint8_t* pb = P + (size_t)b * PB;
        uint8_t* o = out + (size_t)b * prompt::Panel<Q2KPanelAMX>::AMX;
        for (int p = 0; p < 8; ++p) {
            const __m512i Y = _mm512_and_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(pb + 64 + 32 * p))), m15);
            const __m512i SC[2] = {_mm512_shuffle_epi8(Y, IX0), _mm512_shuffle_epi8(Y, IX1)};
            for (int h = 0; h < 2; ++h) {
                const int j = 2 * p + h;
                const __m512i z = _mm512_loadu_si512(pb + QS + 64 * j);
                for (int t = 0; t < 4; ++t) {
                    _mm512_store_si512(o + 64 * (4 * j + t),
                                       _mm512_mullo_epi16(_mm512_and_si512(_mm512_srli_epi16(z, 2 * t), m3), SC[h]));
                    _mm512_store_si512(o + prompt::WQ + 64 * (4 * j + t), _mm512_setzero_si512());
                }
            }
        }
        uint8_t* X = o + prompt::Panel<Q2KPanelAMX>::AMX_D;
        _mm512_store_ps((float*)X, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)pb)));
        for (int p = 0; p < 8; ++p)
            _mm512_store_si512(X + 64 + 64 * p,
                               _mm512_srli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(pb + 64 + 32 * p))), 4));
        _mm512_store_ps((float*)(X + 64 + 512), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(pb + 32))));
    }
}
#define Q2K16_WIDE amx_gemm<Q2KPanelAMX, PB, 8, sums, amx_panel>
#else
#define Q2K16_WIDE nullptr
#endif

// column c of a panel block from its block_q2_K (scales[16], qs[64], d, dmin): weight 128h + 32cc + i has the code
// (qs[32h + i] >> 2cc) & 3
static void pack_column(const uint8_t* blk, uint8_t* pb, int c) {
    memcpy(pb + 2 * c, blk + 80, 2);
    memcpy(pb + 32 + 2 * c, blk + 82, 2);
    uint8_t u[QK];
    for (int h = 0; h < 2; ++h)
        for (int cc = 0; cc < 4; ++cc)
            for (int i = 0; i < 32; ++i) u[128 * h + 32 * cc + i] = (blk[16 + 32 * h + i] >> (2 * cc)) & 3;
    for (int j = 0; j < 16; ++j) pb[64 + 32 * (j / 2) + 2 * c + (j & 1)] = blk[j];
    for (int s = 0; s < 8; ++s) {
        const Codes32 codes(u + 32 * s);   // sub-blocks 2s (A) and 2s + 1 (B)
        for (int t = 0; t < 2; ++t) {
            const uint32_t z = codes.two_bits(t, 0);
            memcpy(pb + QS + 64 * (2 * s + t) + 4 * c, &z, 4);
        }
    }
}

// column c's 256 weights of a panel block, as gguf.quants.dequantize: (d*sc)*u - dmin*m, each op rounded
static void decode_column(const uint8_t* pb, int c, float* o) {
    const float d = h2f(pb + 2 * c), dmin = h2f(pb + 32 + 2 * c);
    for (int j = 0; j < 16; ++j) {
        const uint8_t s = scale_byte(pb, j, c);
        const float ds = d * (float)(s & 15), dm = dmin * (float)(s >> 4);
        for (int t = 0; t < 4; ++t)
            for (int e = 0; e < 4; ++e)
                o[16 * j + 4 * t + e] = ds * (float)((pb[QS + 64 * j + 4 * c + e] >> (2 * t)) & 3) - dm;
    }
}

static const int E = 8;   // int32s a block of what the kernels need of the activations (sums)
PANEL_ENTRY_POINTS(q2k16, Q2K16_WIDE)
