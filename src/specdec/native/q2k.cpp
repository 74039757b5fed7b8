// Batch-invariant Q2_K x int8 GEMM, y[k,N] = x[k,K] . W[N,K]^T (any k; groups of <= 16 rows): kgroups.h's kernel.
// W: raw GGUF block_q2_K bytes (scales[16]: 4-bit scale | 4-bit min << 4, qs[64], fp16 d, fp16 dmin; 84 bytes /
// 256 weights). x: float32 [k,K], quantized per row per 256-block to int8 (kquant.h: d = amax/127, RNE, clamp).
//
// ggml layout (dequantize_row_q2_K): weight 128h + 32c + i (h = 0,1, c = 0..3, i = 0..31) has the 2-bit code
//   u = (qs[32h + i] >> 2c) & 3, of sub-block j = 8h + 2c + (i >= 16):  w = (d * (sc_j & 15)) * u - dmin * (sc_j >> 4).
// U_c = (qs[0:64] >> 2c) & 3 (bytes 32h + i = weight 128h + 32c + i): group 4c + m (16-byte lane m) = sub-block
//   2c + (m & 1) + 8(m >> 1). OFF = 0, with mins.
// Per output element (r, n), blocks b in order, lanes L = 0..15 (kgroups.h: pairs p of 8 weights, T = their
// activation sums): I_L = sum_p sc_g * sum(u * a) (exact), M_L = sum_p mn_g * T, v = float(I_L) * d_b,
//   v = fma(-float(M_L), dmin_b, v), acc_L = fma(v, dx_rb, acc_L); y = the fixed-tree sum of the 16 lanes.
// Three compiled paths (build.py's isa: native AVX-512 VNNI / avx2 / scalar) give the same bits; mode 0 runs the
// compiled one (q2k_isa()), mode 1 the scalar reference, mode bit 2 the prompt product (prompt.h's definition with
// 16 sub-blocks of 16 weights and 16 mins). -ffp-contract=off; nothing depends on k, the row position or threads.
#include "kgroups.h"

namespace {
struct Q2K {
    static const int BB = 84, OFF = 0, HAS_MIN = 1, SUBW = 16;
    static inline int PF_DIST = 4096;
    static constexpr int SB[16] = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15};   // group 4c + m
    static int base(int c, int h) { return 128 * h + 32 * c; }
    static float d(const uint8_t* blk) { return h2f(blk + 80); }
    static float dmin(const uint8_t* blk) { return h2f(blk + 82); }
    static void codes(const uint8_t* blk, uint8_t u[256]) {
        for (int h = 0; h < 2; ++h)
            for (int c = 0; c < 4; ++c)
                for (int i = 0; i < 32; ++i) u[128 * h + 32 * c + i] = (blk[16 + 32 * h + i] >> (2 * c)) & 3;
    }
    static void scales(const uint8_t* blk, int sc[16], int mn[16]) {
        for (int j = 0; j < 16; ++j) { sc[j] = blk[j] & 15; mn[j] = blk[j] >> 4; }
    }
#if !defined(KQ_SCALAR)
    static __m128i scale_bytes(const uint8_t* blk, __m128i* mn) {
        const __m128i v = _mm_loadu_si128((const __m128i*)blk), m15 = _mm_set1_epi8(15);
        *mn = _mm_and_si128(_mm_srli_epi16(v, 4), m15);
        return _mm_and_si128(v, m15);
    }
#endif
#if defined(KQ_AVX512)
    static void unpack512(const uint8_t* blk, __m512i U[4]) {
        const __m512i q = _mm512_loadu_si512(blk + 16), m3 = _mm512_set1_epi8(3);
        U[0] = _mm512_and_si512(q, m3);
        U[1] = _mm512_and_si512(_mm512_srli_epi16(q, 2), m3);
        U[2] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m3);
        U[3] = _mm512_and_si512(_mm512_srli_epi16(q, 6), m3);
    }
#elif defined(KQ_AVX2)
    static void unpack256(const uint8_t* blk, int h, __m256i U[4]) {
        const __m256i q = _mm256_loadu_si256((const __m256i*)(blk + 16 + 32 * h)), m3 = _mm256_set1_epi8(3);
        U[0] = _mm256_and_si256(q, m3);
        U[1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), m3);
        U[2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m3);
        U[3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), m3);
    }
#endif
};
}  // namespace

KG_ENTRY_POINTS(q2k, Q2K)

extern "C" {
// float32 decoding of N rows, as gguf.quants.dequantize: (d * sc) * u - dmin * m, each op rounded to float32
void q2k_dequant(const uint8_t* W, int N, int K, float* out) {
    const int nb = K / QK;
    for (size_t n = 0; n < (size_t)N; ++n)
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = W + (n * nb + b) * Q2K::BB;
            uint8_t u[256];
            int sc[16], mn[16];
            Q2K::codes(blk, u);
            Q2K::scales(blk, sc, mn);
            const float d = Q2K::d(blk), dmin = Q2K::dmin(blk);
            float* o = out + n * K + (size_t)b * QK;
            for (int j = 0; j < 16; ++j) {
                const float dl = d * (float)sc[j], ml = dmin * (float)mn[j];
                for (int i = 0; i < 16; ++i) o[16 * j + i] = dl * (float)u[16 * j + i] - ml;
            }
        }
}
}
