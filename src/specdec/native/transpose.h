// Dword transposes shared by the prompt products (prompt.h, prompt_avx2.h, prompt32.h): their weight panels hold
// one output column per 32-bit lane.
#pragma once
#include <immintrin.h>

namespace transpose {
#if defined(__AVX512F__)
// 16 x 16 dword transpose: r[d] lane c <- r[c] lane d
inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 2; ++i)
        for (int m = 0; m < 4; ++m) {
            t[8 * i + m] = _mm512_shuffle_i32x4(u[8 * i + m], u[8 * i + 4 + m], 0x88);
            t[8 * i + 4 + m] = _mm512_shuffle_i32x4(u[8 * i + m], u[8 * i + 4 + m], 0xDD);
        }
    for (int m = 0; m < 8; ++m) {
        r[m] = _mm512_shuffle_i32x4(t[m], t[8 + m], 0x88);
        r[m + 8] = _mm512_shuffle_i32x4(t[m], t[8 + m], 0xDD);
    }
}
#endif

#if defined(__AVX2__)
// 8 x 8 dword transpose: r[d] lane c <- r[c] lane d
inline void transpose8(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int m = 0; m < 4; ++m) {
        r[m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x20);
        r[m + 4] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x31);
    }
}
#endif
}  // namespace transpose
