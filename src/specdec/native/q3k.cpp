// Batch-invariant Q3_K x int8 GEMM, y[k,N] = x[k,K] . W[N,K]^T (any k; groups of <= 16 rows): kgroups.h's kernel.
// W: raw GGUF block_q3_K bytes (hmask[32], qs[64], scales[12]: 16 6-bit scales, fp16 d; 110 bytes / 256 weights).
// x: float32 [k,K], quantized per row per 256-block to int8 (kquant.h: d = amax/127, RNE, clamp).
//
// ggml layout (dequantize_row_q3_K): weight 128h + 32c + i (h = 0,1, c = 0..3, i = 0..31) has the code
//   u = ((qs[32h + i] >> 2c) & 3) | ((hmask[i] >> (4h + c)) & 1) << 2  (0..7; q = u - 4), of sub-block
//   j = 8h + 2c + (i >= 16): w = (d * (s_j - 32)) * (u - 4), s_j the 6-bit scale (low 4 bits in scales[j % 8] >>
//   4(j >= 8), high 2 bits in scales[8 + j % 4] >> 2(j / 4)).
// U_c = ((qs[0:64] >> 2c) & 3) | hmask bit (4h + c) << 2 (bytes 32h + i = weight 128h + 32c + i): group 4c + m =
//   sub-block 2c + (m & 1) + 8(m >> 1), as Q2_K. OFF = 4, no mins.
// Per output element (r, n), blocks b in order, lanes L = 0..15 (kgroups.h: pairs p of 8 weights, T = their
// activation sums): I_L = sum_p sc_g * (sum(u * a) - 4 T) (exact int32, sc_g = s_j - 32), v = float(I_L) * d_b,
//   acc_L = fma(v, dx_rb, acc_L); y = the fixed-tree sum of the 16 lanes.
// Three compiled paths (build.py's isa: native AVX-512 VNNI / avx2 / scalar) give the same bits; mode 0 runs the
// compiled one (q3k_isa()), mode 1 the scalar reference, mode bit 2 the prompt product (prompt.h's definition with
// 16 sub-blocks of 16 weights, OFF = 4). -ffp-contract=off; nothing depends on k, the row position or threads.
#include "kgroups.h"

namespace {
struct Q3K {
    static const int BB = 110, OFF = 4, HAS_MIN = 0, SUBW = 16;
    static inline int PF_DIST = 4096;
    static constexpr int SB[16] = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15};   // group 4c + m
    static int base(int c, int h) { return 128 * h + 32 * c; }
    static float d(const uint8_t* blk) { return h2f(blk + 108); }
    static float dmin(const uint8_t*) { return 0.f; }
    static void codes(const uint8_t* blk, uint8_t u[256]) {
        for (int h = 0; h < 2; ++h)
            for (int c = 0; c < 4; ++c)
                for (int i = 0; i < 32; ++i)
                    u[128 * h + 32 * c + i] = ((blk[32 + 32 * h + i] >> (2 * c)) & 3) | (((blk[i] >> (4 * h + c)) & 1) << 2);
    }
    // the 16 unsigned 6-bit scales s_j (ggml's aux decode): byte j of aux[0..3]
    static void scale_words(const uint8_t* blk, uint32_t aux[4]) {
        const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
        memcpy(aux, blk + 96, 12);
        const uint32_t tmp = aux[2];
        aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
        aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
        aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4);
        aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
    }
    static void scales(const uint8_t* blk, int sc[16], int mn[16]) {
        uint32_t aux[4];
        scale_words(blk, aux);
        for (int j = 0; j < 16; ++j) { sc[j] = (int)((aux[j >> 2] >> (8 * (j & 3))) & 0xff) - 32; mn[j] = 0; }
    }
#if !defined(KQ_SCALAR)
    static __m128i scale_bytes(const uint8_t* blk, __m128i* mn) {
        uint32_t aux[4];
        scale_words(blk, aux);   // into a register, not through memory (a store-forwarding stall per block)
        *mn = _mm_setzero_si128();
        return _mm_sub_epi8(_mm_setr_epi32((int)aux[0], (int)aux[1], (int)aux[2], (int)aux[3]), _mm_set1_epi8(32));
    }
#endif
#if defined(KQ_AVX512)
    static void unpack512(const uint8_t* blk, __m512i U[4]) {
        const __m512i q = _mm512_loadu_si512(blk + 32), m3 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi8(4);
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)blk));
        for (int c = 0; c < 4; ++c) {   // hmask bit c (bytes 0..31), c + 4 (bytes 32..63): + 4
            const __mmask64 hb = _mm512_test_epi8_mask(H, _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << c)),
                                                                               _mm256_set1_epi8((char)(1 << (c + 4))), 1));
            const __m512i low = _mm512_and_si512(_mm512_srl_epi16(q, _mm_cvtsi32_si128(2 * c)), m3);
            U[c] = _mm512_mask_add_epi8(low, hb, low, m4);
        }
    }
#elif defined(KQ_AVX2)
    static void unpack256(const uint8_t* blk, int h, __m256i U[4]) {
        const __m256i q = _mm256_loadu_si256((const __m256i*)(blk + 32 + 32 * h)), m3 = _mm256_set1_epi8(3);
        const __m256i H = _mm256_loadu_si256((const __m256i*)blk), m4 = _mm256_set1_epi8(4);
        for (int c = 0; c < 4; ++c) {
            const __m256i hb = _mm256_and_si256(_mm256_slli_epi16(_mm256_srl_epi64(H, _mm_cvtsi32_si128(4 * h + c)), 2), m4);
            U[c] = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * c)), m3), hb);
        }
    }
#endif
};
}  // namespace

KG_ENTRY_POINTS(q3k, Q3K)

extern "C" {
// float32 decoding of N rows, as gguf.quants.dequantize: (d * (s - 32)) * (u - 4), each op rounded to float32
void q3k_dequant(const uint8_t* W, int N, int K, float* out) {
    const int nb = K / QK;
    for (size_t n = 0; n < (size_t)N; ++n)
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = W + (n * nb + b) * Q3K::BB;
            uint8_t u[256];
            int sc[16], mn[16];
            Q3K::codes(blk, u);
            Q3K::scales(blk, sc, mn);
            const float d = Q3K::d(blk);
            float* o = out + n * K + (size_t)b * QK;
            for (int j = 0; j < 16; ++j) {
                const float dl = d * (float)sc[j];
                for (int i = 0; i < 16; ++i) o[16 * j + i] = dl * (float)((int)u[16 * j + i] - 4);
            }
        }
}
}
