// The float32 pieces of a transformer layer besides its matrix products, one activation row at a time.
//
// Every function computes each row (and in attention each (row, head)) by itself, with a fixed order of
// operations that depends only on that row's length: never on how many rows are in the call, nor on the
// thread count. Sums run in 16 independent lanes (vectorised by the compiler without reassociation:
// -ffp-contract=off, no -ffast-math) and end in a fixed tree, so a row's result is bit for bit the same
// alone or inside a block, on every CPU that runs this file (the lanes are plain IEEE float operations).
//
//   ops_rms_norm:  out[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * w
//   ops_rope_neox: rotary embedding of Qwen2/NEOX style, position start + r for row r, in place
//   ops_attend:    causal attention; row r (position start + r) sees keys 0..start + r; grouped heads
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

static const int LANES = 16;

static inline float tree16(const float* a) {
    float b[8], c[4];
    for (int i = 0; i < 8; ++i) b[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; ++i) c[i] = b[i] + b[i + 4];
    return (c[0] + c[2]) + (c[1] + c[3]);
}

// 16 float lanes (GCC vector extension: one zmm, two ymm or scalar code, the same IEEE operations per lane)
typedef float v16f __attribute__((vector_size(64)));

// sum of a[i] * b[i], n a multiple of 16: lane l sums the products i = l mod 16 in order, then a fixed tree
static inline float dot16(const float* a, const float* b, int n) {
    v16f acc = {0};
    for (int i = 0; i < n; i += LANES) {
        v16f x, y;
        memcpy(&x, a + i, sizeof x);
        memcpy(&y, b + i, sizeof y);
        acc += x * y;
    }
    float lanes[LANES];
    memcpy(lanes, &acc, sizeof lanes);
    return tree16(lanes);
}

extern "C" {

// x, out: [k, n] (may alias); w: [n]; n a multiple of 16
void ops_rms_norm(const float* x, const float* w, int k, int n, float eps, float* out) {
    for (int r = 0; r < k; ++r) {
        const float* xr = x + (size_t)r * n;
        const float scale = 1.0f / sqrtf(dot16(xr, xr, n) / (float)n + eps);
        float* o = out + (size_t)r * n;
        for (int i = 0; i < n; ++i) o[i] = xr[i] * scale * w[i];
    }
}

// x: [k, heads, d] in place; inv_freq: [d / 2]
void ops_rope_neox(float* x, int k, int heads, int d, int start, const float* inv_freq) {
    const int half = d / 2;
    float* c = (float*)malloc(sizeof(float) * half);
    float* s = (float*)malloc(sizeof(float) * half);
    for (int r = 0; r < k; ++r) {
        const float pos = (float)(start + r);
        for (int i = 0; i < half; ++i) {
            const float angle = pos * inv_freq[i];
            c[i] = cosf(angle);
            s[i] = sinf(angle);
        }
        for (int h = 0; h < heads; ++h) {
            float* v = x + ((size_t)r * heads + h) * d;
            for (int i = 0; i < half; ++i) {
                const float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        }
    }
    free(c);
    free(s);
}

// q: [k, heads, d]; keys, values: [>= start + k, kv_heads, d] (positions contiguous); out: [k, heads, d].
// d a multiple of 16. One (row, head) per task; its scores, softmax and weighted sum in a fixed order.
int ops_attend(const float* q, const float* keys, const float* values, int k, int start, int heads, int kv_heads,
               int d, float* out, int nthreads) {
    if (d % LANES || heads % kv_heads) return -1;
    const int group = heads / kv_heads;
    const float scale = 1.0f / sqrtf((float)d);
    const size_t pos_stride = (size_t)kv_heads * d;
    const int longest = start + k;
    int status = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float* scores = (float*)malloc(sizeof(float) * (size_t)longest);
        float* acc = (float*)malloc(sizeof(float) * (size_t)d);
        if (!scores || !acc) {
#pragma omp atomic write
            status = -2;
        } else {
#pragma omp for schedule(static)
            for (int task = 0; task < k * heads; ++task) {
                const int r = task / heads, h = task % heads, g = h / group;
                const int length = start + r + 1;
                const float* qv = q + ((size_t)r * heads + h) * d;
                float top = -INFINITY;
                for (int j = 0; j < length; ++j) {
                    scores[j] = dot16(qv, keys + j * pos_stride + (size_t)g * d, d) * scale;
                    top = scores[j] > top ? scores[j] : top;
                }
                float part[LANES] = {0};
                for (int j = 0; j < length; ++j) {
                    scores[j] = expf(scores[j] - top);
                    part[j % LANES] += scores[j];
                }
                const float inv = 1.0f / tree16(part);
                for (int i = 0; i < d; ++i) acc[i] = 0.0f;
                for (int j = 0; j < length; ++j) {
                    const float* vv = values + j * pos_stride + (size_t)g * d;
                    const float p = scores[j];
                    for (int i = 0; i < d; ++i) acc[i] += p * vv[i];
                }
                float* o = out + ((size_t)r * heads + h) * d;
                for (int i = 0; i < d; ++i) o[i] = acc[i] * inv;
            }
        }
        free(scores);
        free(acc);
    }
    return status;
}

}  // extern "C"
