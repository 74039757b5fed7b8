// The fixed horizontal sum tree over 16 float lanes of the quantized kernels (q4k, q6k, q5_0, q8_0):
// v[i] + v[i+8], then + 4, then (0+2) + (1+3); the vector versions (AVX2 here, AVX-512 in kquant.h / q32.h)
// add in the same tree, so every path gives the same bits.
#pragma once
#if defined(__AVX2__)
#include <immintrin.h>
#endif

static inline float hsum16_ref(const float* v) {
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i) a[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; ++i) b[i] = a[i] + a[i + 4];
    c[0] = b[0] + b[2]; c[1] = b[1] + b[3];
    return c[0] + c[1];
}

#if defined(__AVX2__)
static inline float hsum16(__m256 lo, __m256 hi) {   // lo = lanes 0..7, hi = lanes 8..15
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 e = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(e);
}
#endif
