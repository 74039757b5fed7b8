// Batch-invariant Q5_K x int8 GEMM, y[k,N] = x[k,K] . W[N,K]^T (any k; groups of <= 16 rows): kgroups.h's kernel.
// W: raw GGUF block_q5_K bytes (fp16 d, fp16 dmin, scales[12]: 8 6-bit scales and mins as Q4_K's, qh[32], qs[128];
// 176 bytes / 256 weights). x: float32 [k,K], quantized per row per 256-block to int8 (kquant.h: d = amax/127, RNE).
//
// ggml layout (dequantize_row_q5_K): weight 64t + 32e + i (t = 0..3, e = 0,1, i = 0..31) has the 5-bit code
//   u = (qs[32t + i] >> 4e) & 15 | ((qh[i] >> (2t + e)) & 1) << 4, of sub-block j = 2t + e (32 weights):
//   w = (d * sc_j) * u - dmin * m_j.
// U_c (c = 2s + e) = nibble e of qs[64s:64s+64] | qh bit (4s + 2h + e) << 4: bytes 32h + i = weight 64(2s + h) + 32e + i
//   (chunk t = 2s + h); group 4c + m = sub-block 2(2s + (m >> 1)) + e. OFF = 0, with mins.
// Per output element (r, n), blocks b in order, lanes L = 0..15 (kgroups.h: pairs p of 8 weights, T = their
// activation sums): I_L = sum_p sc_g * sum(u * a) (exact), M_L = sum_p m_g * T, v = float(I_L) * d_b,
//   v = fma(-float(M_L), dmin_b, v), acc_L = fma(v, dx_rb, acc_L); y = the fixed-tree sum of the 16 lanes.
// Three compiled paths (build.py's isa: native AVX-512 VNNI / avx2 / scalar) give the same bits; mode 0 runs the
// compiled one (q5k_isa()), mode 1 the scalar reference, mode bit 2 the prompt product (prompt.h's definition, each
// 32-weight sub-block as two of 16 with its scale and min). -ffp-contract=off; nothing depends on k, rows or threads.
#include "kgroups.h"

namespace {
struct Q5K {
    static const int BB = 176, OFF = 0, HAS_MIN = 1, SUBW = 32;
    static inline int PF_DIST = 4096;
    static constexpr int SB[16] = {0, 0, 2, 2, 1, 1, 3, 3, 4, 4, 6, 6, 5, 5, 7, 7};   // group 4c + m
    static int base(int c, int h) { return 64 * (2 * (c >> 1) + h) + 32 * (c & 1); }
    static float d(const uint8_t* blk) { return h2f(blk); }
    static float dmin(const uint8_t* blk) { return h2f(blk + 2); }
    static void codes(const uint8_t* blk, uint8_t u[256]) {
        const uint8_t* qh = blk + 16;
        const uint8_t* qs = blk + 48;
        for (int t = 0; t < 4; ++t)
            for (int i = 0; i < 32; ++i) {
                u[64 * t + i] = (qs[32 * t + i] & 15) | (((qh[i] >> (2 * t)) & 1) << 4);
                u[64 * t + 32 + i] = (qs[32 * t + i] >> 4) | (((qh[i] >> (2 * t + 1)) & 1) << 4);
            }
    }
    static void scales(const uint8_t* blk, int sc[16], int mn[16]) {
        uint8_t s8[8], m8[8];
        decode_scales(blk + 4, s8, m8);
        for (int j = 0; j < 8; ++j) { sc[j] = s8[j]; mn[j] = m8[j]; }
        for (int j = 8; j < 16; ++j) sc[j] = mn[j] = 0;
    }
#if !defined(KQ_SCALAR)
    static __m128i scale_bytes(const uint8_t* blk, __m128i* mn) {
        // decode_scales in a register (q4k.cpp's vector decode): bytes 0..7 the scales, 8..15 the mins
        const __m128i k1v = _mm_set1_epi32(0x3f3f3f3f), k2v = _mm_set1_epi32(0x0f0f0f0f), k3v = _mm_set1_epi32(0x03030303);
        const __m128i u = _mm_loadu_si128((const __m128i*)(blk + 4));              // [u0, u1, u2, *]
        const __m128i lo = _mm_and_si128(u, k1v);                                   // [sc0-3, m0-3]
        const __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(u, 0xAA), _mm_setr_epi32(0, 4, 0, 0)), k2v),
                                        _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(u, 6), k3v), 4));   // [sc4-7, m4-7]
        const __m128i v = _mm_unpacklo_epi32(lo, hi);
        *mn = _mm_srli_si128(v, 8);
        return v;
    }
#endif
#if defined(KQ_AVX512)
    static void unpack512(const uint8_t* blk, __m512i U[4]) {
        const __m512i m4 = _mm512_set1_epi8(15), m10 = _mm512_set1_epi8(0x10);
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(blk + 16)));
        for (int c = 0; c < 4; ++c) {
            const __m512i q = _mm512_loadu_si512(blk + 48 + 64 * (c >> 1));
            const __m512i nib = _mm512_and_si512(c & 1 ? _mm512_srli_epi16(q, 4) : q, m4);
            const int s = 4 * (c >> 1) + (c & 1);   // qh bit s (bytes 0..31), s + 2 (bytes 32..63): + 16
            const __mmask64 hb = _mm512_test_epi8_mask(H, _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << s)),
                                                                               _mm256_set1_epi8((char)(1 << (s + 2))), 1));
            U[c] = _mm512_mask_add_epi8(nib, hb, nib, m10);
        }
    }
#elif defined(KQ_AVX2)
    static void unpack256(const uint8_t* blk, int h, __m256i U[4]) {
        const __m256i m4 = _mm256_set1_epi8(15), m10 = _mm256_set1_epi8(0x10);
        const __m256i H = _mm256_loadu_si256((const __m256i*)(blk + 16));
        for (int c = 0; c < 4; ++c) {
            const __m256i q = _mm256_loadu_si256((const __m256i*)(blk + 48 + 32 * (2 * (c >> 1) + h)));
            const __m256i nib = _mm256_and_si256(c & 1 ? _mm256_srli_epi16(q, 4) : q, m4);
            const __m256i hb = _mm256_and_si256(_mm256_slli_epi16(_mm256_srl_epi64(
                H, _mm_cvtsi32_si128(4 * (c >> 1) + 2 * h + (c & 1))), 4), m10);
            U[c] = _mm256_or_si256(nib, hb);
        }
    }
#endif
};
}  // namespace

KG_ENTRY_POINTS(q5k, Q5K)

extern "C" {
// float32 decoding of N rows, as gguf.quants.dequantize: (d * sc) * u - dmin * m, each op rounded to float32
void q5k_dequant(const uint8_t* W, int N, int K, float* out) {
    const int nb = K / QK;
    for (size_t n = 0; n < (size_t)N; ++n)
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = W + (n * nb + b) * Q5K::BB;
            uint8_t u[256];
            int sc[16], mn[16];
            Q5K::codes(blk, u);
            Q5K::scales(blk, sc, mn);
            const float d = Q5K::d(blk), dmin = Q5K::dmin(blk);
            float* o = out + n * K + (size_t)b * QK;
            for (int j = 0; j < 8; ++j) {
                const float dl = d * (float)sc[j], ml = dmin * (float)mn[j];
                for (int i = 0; i < 32; ++i) o[32 * j + i] = dl * (float)u[32 * j + i] - ml;
            }
        }
}
}
