// 16 float lanes shared by ops.cpp and f32.cpp: a GCC vector type (one zmm, two ymm or scalar code: the same
// IEEE operations per lane on every instruction set, since -ffp-contract=off keeps every a * b + c two steps).
#pragma once
#include <stdint.h>
#include <string.h>

static const int LANES = 16;
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16f load16(const float* p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store16(float* p, v16f v) { memcpy(p, &v, sizeof v); }

// fixed tree over the 16 lanes
static inline float tree16(v16f v) {
    float a[16], b[8], c[4];
    memcpy(a, &v, sizeof a);
    for (int i = 0; i < 8; ++i) b[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; ++i) c[i] = b[i] + b[i + 4];
    return (c[0] + c[2]) + (c[1] + c[3]);
}

// sum of a[i] * b[i], n a multiple of 16: lane l sums the products i = l mod 16 in order, then the tree
static inline float dot16(const float* a, const float* b, int n) {
    v16f acc = {0};
    for (int i = 0; i < n; i += LANES) acc += load16(a + i) * load16(b + i);
    return tree16(acc);
}

// e^x lane by lane (Cephes' expf polynomial, about 1 ulp); x below -87.3 gives e^-87.3 (about 1e-38), not 0.
// F: a GCC vector of floats (v16f, or 8 floats: one ymm), I: the int32 vector of its width.
template <typename F, typename I>
static inline F exp_lanes(F x) {
    const F lo = F{} - 87.3365447504f, hi = F{} + 88.3762626647949f;
    x = x < lo ? lo : x;
    x = x > hi ? hi : x;
    const F magic = F{} + 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
    F n = (x * 1.44269504088896341f + magic) - magic;
    F r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    F p = F{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    I bits = (__builtin_convertvector(n, I) + 127) << 23;
    F scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline v16f exp16(v16f x) { return exp_lanes<v16f, v16i>(x); }

// tree16 of 16 vectors at once: lane m of the result = tree16(a[m]), by the same adds in the same order
// (b_i = x_i + x_{i+8}, c_i = b_i + b_{i+4}, (c_0 + c_2) + (c_1 + c_3)), two keys' halves per shuffle
static inline v16f tree16x16(const v16f a[16]) {
    typedef int32_t v16m __attribute__((vector_size(64)));
    // stage 1: vector p holds [b(2p) 0..7, b(2p+1) 0..7]
    const v16m lo1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const v16m hi1 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    v16f b[8];
    for (int p = 0; p < 8; ++p)
        b[p] = __builtin_shuffle(a[2 * p], a[2 * p + 1], lo1) + __builtin_shuffle(a[2 * p], a[2 * p + 1], hi1);
    // stage 2: vector q holds [c(4q) 0..3, c(4q+1) 0..3, c(4q+2) 0..3, c(4q+3) 0..3]
    const v16m lo2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const v16m hi2 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    v16f c[4];
    for (int q = 0; q < 4; ++q)
        c[q] = __builtin_shuffle(b[2 * q], b[2 * q + 1], lo2) + __builtin_shuffle(b[2 * q], b[2 * q + 1], hi2);
    // stage 3: vector t holds [d0, d1] of keys 8t..8t+7 (d0 = c_0 + c_2, d1 = c_1 + c_3)
    const v16m lo3 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const v16m hi3 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
    v16f d[2];
    for (int t = 0; t < 2; ++t)
        d[t] = __builtin_shuffle(c[2 * t], c[2 * t + 1], lo3) + __builtin_shuffle(c[2 * t], c[2 * t + 1], hi3);
    // stage 4: d0 + d1 of all 16 keys
    const v16m ev = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const v16m od = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    return __builtin_shuffle(d[0], d[1], ev) + __builtin_shuffle(d[0], d[1], od);
}
