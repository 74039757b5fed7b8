// What the per-type files of the 32-weight block kernels (q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl) share beyond
// q32.h's skeleton: the three AVX2 forms of a type's D (the exact int32 of 8 lanes, as each file's header states
// it), the 5-bit codes of Q5_0 and Q5_1, and the C entry points. Included by each file after q32.h and its type struct's opening.
#pragma once
#include "q32.h"

namespace {  // as q32.h: internal to each library
namespace q32 {
#if defined(Q32_PATH_AVX2)
// Unsigned codes UX, UY (0..31) and a bias record C at c (C_j = -BIAS * sum of lane j's activations):
//   AVX-VNNI: dpbusd(dpbusd(C, UX, AX), UY, AY); AVX2: madd(maddubs(UX, AX) + maddubs(UY, AY), 1) + C.
__attribute__((always_inline)) inline __m256i dot_biased(__m256i UX, __m256i UY, __m256i AX, __m256i AY,
                                                         const uint8_t* c) {
#if defined(__AVXVNNI__)
    return dot_vnni(UX, UY, AX, AY, c);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i P = _mm256_add_epi16(_mm256_maddubs_epi16(UX, AX), _mm256_maddubs_epi16(UY, AY));
    return _mm256_add_epi32(_mm256_madd_epi16(P, ones), _mm256_load_si256((const __m256i*)c));
#endif
}
// Unsigned codes of a type with a min (B::MIN: no bias; the min's term is the skeleton's second fma).
__attribute__((always_inline)) inline __m256i dot_unbiased(__m256i UX, __m256i UY, __m256i AX, __m256i AY) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), UX, AX), UY, AY);
#else
    const __m256i P = _mm256_add_epi16(_mm256_maddubs_epi16(UX, AX), _mm256_maddubs_epi16(UY, AY));
    return _mm256_madd_epi16(P, _mm256_set1_epi16(1));
#endif
}
// Signed weights WX, WY and their magnitudes AWX, AWY (ggml's sign trick), plain AVX2 (an AVX-VNNI build takes
// unsigned codes u = w + 128 and dot_vnni instead): madd(maddubs(|W|, sign(A, W)), 1), X then Y, summed.
#if !defined(__AVXVNNI__)
__attribute__((always_inline)) inline __m256i dot_signed(__m256i WX, __m256i WY, __m256i AWX, __m256i AWY,
                                                         __m256i AX, __m256i AY) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i PX = _mm256_madd_epi16(_mm256_maddubs_epi16(AWX, _mm256_sign_epi8(AX, WX)), ones);
    const __m256i PY = _mm256_madd_epi16(_mm256_maddubs_epi16(AWY, _mm256_sign_epi8(AY, WY)), ones);
    return _mm256_add_epi32(PX, PY);
}
#endif
#endif

// The 5-bit codes of Q5_0 and Q5_1 (ggml's dequantize_row_q5_0/_1), whose blocks differ only in where qh and qs
// are (QH, QS bytes into the block): q_j = (qs[j] & 15) | bit j of qh << 4, q_{j+16} = (qs[j] >> 4) | bit
// j+16 of qh << 4, for j < 16.
template <int QH, int QS>
inline void five_bit_codes(const uint8_t* blk, int q[QK]) {
    const uint32_t qh = (uint32_t)blk[QH] | ((uint32_t)blk[QH + 1] << 8) | ((uint32_t)blk[QH + 2] << 16) |
                        ((uint32_t)blk[QH + 3] << 24);
    const uint8_t* qs = blk + QS;
    for (int j = 0; j < QK / 2; ++j) {
        q[j] = (qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4);
        q[j + QK / 2] = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
    }
}
#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)
// The 32 codes of one block in natural order (prompt32.h's codes32): low nibbles codes 0..15, high 16..31, | bit 4
template <int QH, int QS>
inline __m256i five_bit_codes32(const uint8_t* blk) {
    const __m128i qs = _mm_loadu_si128((const __m128i*)(blk + QS)), m4 = _mm_set1_epi8(0x0F);
    const __m256i lo = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
    uint32_t qh;
    memcpy(&qh, blk + QH, 4);
#if defined(Q32_PATH_512)
    return _mm256_mask_add_epi8(lo, qh, lo, _mm256_set1_epi8(0x10));  // + 16 where bit e of qh is set
#else   // byte e <- bit e of qh as 0x10: broadcast byte e/8 of qh to byte e, test bit e%8
    const __m256i sel = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel), bit);
    return _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10)));
#endif
}
#endif
#if defined(Q32_PATH_AVX2)
// 32 bits -> 32 bytes 0xFF / 0x00 (byte e = bit e), as ggml's bytes_from_bits_32
inline __m256i bytes_from_bits_32(uint32_t x) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}
// The 5-bit codes UX (0..15 of each block), UY (16..31) of blocks b0, b1 (128-bit lane 0: b0, lane 1: b1)
template <int QH, int QS>
__attribute__((always_inline)) inline void five_bit_codes2(const uint8_t* b0, const uint8_t* b1, __m256i& UX,
                                                           __m256i& UY) {
    const __m256i Q = _mm256_set_m128i(ld128(b1 + QS), ld128(b0 + QS));
    uint32_t q0, q1;
    memcpy(&q0, b0 + QH, 4); memcpy(&q1, b1 + QH, 4);
    const __m256i m4 = _mm256_set1_epi8(0x0F), b16 = _mm256_set1_epi8(0x10);
    // byte e of XB: bit e of (qh0 low 16 | qh1 low 16 << 16) -> 0x10 (lanes: block 0, block 1)
    const __m256i HX = _mm256_and_si256(bytes_from_bits_32((q0 & 0xFFFFu) | (q1 << 16)), b16);
    const __m256i HY = _mm256_and_si256(bytes_from_bits_32((q0 >> 16) | (q1 & 0xFFFF0000u)), b16);
    UX = _mm256_or_si256(_mm256_and_si256(Q, m4), HX);
    UY = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(Q, 4), m4), HY);
}
#endif
}  // namespace q32
}  // namespace

// The C entry points of the type T as NAME_isa, NAME_set_prefetch, NAME_gemm (y[k,N] = x[k,K] . W^T; mode 0 =
// the best compiled path, 1 = the scalar reference (same bits), bit 2 = the prompt product), NAME_dequant (the
// float32 weights, bit for bit gguf.quants.dequantize) and NAME_quant_x (the kernel's int8 activations a[k,K] in
// natural order and their scales dx[k, K/32]).
#define Q32_ENTRY_POINTS(NAME, T)                                                                              \
    extern "C" {                                                                                               \
    const char* NAME##_isa(void) { return q32::ISA_NAME; }                                                     \
    void NAME##_set_prefetch(int dist) { q32::PF_DIST = dist; }                                                \
    int NAME##_gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) { \
        return q32::gemm<T>(W, N, K, x, k, y, nthreads, mode);                                                 \
    }                                                                                                          \
    void NAME##_dequant(const uint8_t* W, int N, int K, float* out) { q32::dequant<T>(W, N, K, out); }         \
    void NAME##_quant_x(const float* x, int k, int K, int8_t* a, float* dx) {                                  \
        q32::quant_x<T>(x, k, K, a, dx);                                                                       \
    }                                                                                                          \
    }
