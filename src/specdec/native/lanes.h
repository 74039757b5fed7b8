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

// e^x lane by lane (Cephes' expf polynomial, about 1 ulp); x below -87.3 gives e^-87.3 (about 1e-38), not 0
static inline v16f exp16(v16f x) {
    const v16f lo = v16f{} - 87.3365447504f, hi = v16f{} + 88.3762626647949f;
    x = x < lo ? lo : x;
    x = x > hi ? hi : x;
    const v16f magic = v16f{} + 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
    v16f n = (x * 1.44269504088896341f + magic) - magic;
    v16f r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v16f p = v16f{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
    v16f scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}
