// One transformer layer (Qwen2) over k activation rows in one call, and its float32 pieces.
//
// Every piece computes each row (and in attention each (row, head)) by itself, with a fixed order of
// operations that depends only on that row's length: never on how many rows are in the call, nor on the
// thread count. Sums run in 16 lanes (lanes.h) and end in a fixed tree; the matrix products are the
// kernels' own (q4k.cpp, q6k.cpp, q5_0.cpp, q8_0.cpp, f32.cpp: rows independent too), called through the
// function pointers the caller hands in. So a row's result is bit for bit the same alone or in a block.
//
//   ops_rms_norm:  out[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * w
//   ops_rope_neox: rotary embedding of Qwen2/NEOX style, position start + r for row r, in place
//   ops_attend:    causal attention (attend.h); row r (position start + r) sees keys 0..start + r, or the last
//                  `window` of them; grouped heads; by tiles of queries that share their keys
//   ops_layer:     x += attention(norm(x)); x += down(silu(gate(norm(x))) * up(norm(x))), KV cache written
//   ops_layer_many: ops_layer over the rows of several sequences at once (each its own KV cache and positions):
//                  the matrix products over all rows in one pass over the weights, rotary and attention per sequence
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "lanes.h"
#if defined(__AVX__) && !defined(__AVX512F__)
#include <immintrin.h>
#define OPS_YMM 1  // 16 lanes as two ymm halves, written out: GCC's v16f code spills and goes scalar here
#endif

typedef int (*gemm_fn)(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode);

struct Matrix {          // one weight matrix [rows, cols] in its kernel's format, and an optional bias [rows]
    gemm_fn gemm;
    const uint8_t* blocks;
    int rows, cols;
    const float* bias;
};

struct LayerWeights {
    Matrix q, k, v, o, gate, up, down;
    const float* attn_norm;
    const float* ffn_norm;
};

struct Shape {
    int hidden, heads, kv_heads, head_dim, ffn;
    float eps;
};

#include "attend.h"  // ops_attend and the attention of ops_layer / ops_layer_many

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

}  // extern "C"

static int matmul(const Matrix& m, const float* x, int k, float* y, int nthreads, int mode) {
    const int status = m.gemm(m.blocks, m.rows, m.cols, x, k, y, nthreads, mode);
    if (status == 0 && m.bias)
        for (int r = 0; r < k; ++r)
            for (int i = 0; i < m.rows; ++i) y[(size_t)r * m.rows + i] += m.bias[i];
    return status;
}

// A layer over k rows of x [k, hidden] in place. The k and v products are written to new_keys, new_values
// [k, kv_heads, head_dim]; attention(q, att) then does the rest of attention: rotary of q [k, heads, head_dim] and
// of the new keys, the KV cache, att [k, hidden]; returns 0 or its status. Returns 0, or the first failing step's.
template <class Attention>
static int layer_rows(const LayerWeights* L, const Shape* S, float* x, int k, float* new_keys, float* new_values,
                      int nthreads, int mode, Attention attention) {
    const int H = S->hidden, F = S->ffn;
    float* buf = (float*)malloc(sizeof(float) * (size_t)k * (4 * (size_t)H + 2 * (size_t)F));
    if (!buf) return -2;
    float *h = buf, *q = h + (size_t)k * H, *att = q + (size_t)k * H, *tmp = att + (size_t)k * H;
    float *g = tmp + (size_t)k * H, *u = g + (size_t)k * F;
    int status = 0;
    ops_rms_norm(x, L->attn_norm, k, H, S->eps, h);
    status = status ? status : matmul(L->q, h, k, q, nthreads, mode);
    status = status ? status : matmul(L->k, h, k, new_keys, nthreads, mode);
    status = status ? status : matmul(L->v, h, k, new_values, nthreads, mode);
    status = status ? status : attention(q, att);
    status = status ? status : matmul(L->o, att, k, tmp, nthreads, mode);
    if (status == 0) {
        for (size_t i = 0; i < (size_t)k * H; ++i) x[i] += tmp[i];
        ops_rms_norm(x, L->ffn_norm, k, H, S->eps, h);
    }
    status = status ? status : matmul(L->gate, h, k, g, nthreads, mode);
    status = status ? status : matmul(L->up, h, k, u, nthreads, mode);
    if (status == 0) {  // g = silu(g) * u, 16 lanes at a time (F a multiple of 16)
#ifdef OPS_YMM
        for (size_t i = 0; i < (size_t)k * F; i += 8) {  // the same operations, 8 lanes at a time
            const __m256 a = _mm256_loadu_ps(g + i);
            _mm256_storeu_ps(g + i, a / (exp8(__m256{} - a) + 1.0f) * _mm256_loadu_ps(u + i));
        }
#else
        for (size_t i = 0; i < (size_t)k * F; i += LANES) {
            const v16f a = load16(g + i);
            store16(g + i, a / (exp16(v16f{} - a) + 1.0f) * load16(u + i));
        }
#endif
    }
    status = status ? status : matmul(L->down, g, k, tmp, nthreads, mode);
    if (status == 0)
        for (size_t i = 0; i < (size_t)k * H; ++i) x[i] += tmp[i];
    free(buf);
    return status;
}

extern "C" {

// x: [k, hidden] in place. keys, values: this layer's cache [capacity, kv_heads, head_dim], rows start..start+k-1
// written here (the k and v products straight into it). inv_freq: [head_dim / 2]. mode: the kernels' mode (0 scoring,
// 2 reading a prompt: prompt.h). Returns 0, or the first failing step's status.
int ops_layer(const LayerWeights* L, const Shape* S, float* x, int k, int start, float* keys, float* values,
              const float* inv_freq, int nthreads, int mode) {
    const size_t kv = (size_t)S->kv_heads * S->head_dim;
    float* new_keys = keys + (size_t)start * kv;
    float* new_values = values + (size_t)start * kv;
    return layer_rows(L, S, x, k, new_keys, new_values, nthreads, mode, [&](float* q, float* att) {
        ops_rope_neox(q, k, S->heads, S->head_dim, start, inv_freq);
        ops_rope_neox(new_keys, k, S->kv_heads, S->head_dim, start, inv_freq);
        return ops_attend(q, keys, values, k, start, S->heads, S->kv_heads, S->head_dim, 0,
                          1.0f / sqrtf((float)S->head_dim), att, nthreads);
    });
}

// ops_layer over the rows of n_seq sequences at once. x: [rows[0] + ... + rows[n_seq - 1], hidden] in place, sequence
// s's rows[s] rows (positions starts[s]..) after those of sequence s - 1. keys[s], values[s]: sequence s's cache of
// this layer [capacity, kv_heads, head_dim], its rows starts[s]..starts[s] + rows[s] - 1 written here (distinct
// caches). The norms and matrix products run once over all rows (one pass over the weights: every row computed by
// itself); k and v go to a buffer, then each sequence's rows get their rotary at their own positions, are copied into
// their cache, and attend to it. So each row's result is bit for bit what ops_layer gives it with its sequence alone.
int ops_layer_many(const LayerWeights* L, const Shape* S, float* x, int n_seq, const int* rows, const int* starts,
                   float* const* keys, float* const* values, const float* inv_freq, int nthreads, int mode) {
    if (n_seq < 0) return -1;
    size_t total = 0;
    for (int s = 0; s < n_seq; ++s) {
        if (rows[s] < 0 || starts[s] < 0) return -1;
        total += (size_t)rows[s];
    }
    if (total == 0) return 0;
    const size_t H = S->hidden, kv = (size_t)S->kv_heads * S->head_dim;
    float* new_kv = (float*)malloc(sizeof(float) * 2 * total * kv);
    Segment* seg = (Segment*)malloc(sizeof(Segment) * (size_t)n_seq);
    int status = new_kv && seg ? 0 : -2;
    float *new_keys = new_kv, *new_values = new_kv + total * kv;
    status = status ? status : layer_rows(L, S, x, (int)total, new_keys, new_values, nthreads, mode,
                                          [&](float* q, float* att) {
        size_t at = 0;  // the sequence's first row
        for (int s = 0; s < n_seq; ++s) {
            const int r = rows[s], start = starts[s];
            float *qs = q + at * H, *ks = new_keys + at * kv, *vs = new_values + at * kv;
            ops_rope_neox(qs, r, S->heads, S->head_dim, start, inv_freq);
            ops_rope_neox(ks, r, S->kv_heads, S->head_dim, start, inv_freq);
            memcpy(keys[s] + (size_t)start * kv, ks, sizeof(float) * r * kv);
            memcpy(values[s] + (size_t)start * kv, vs, sizeof(float) * r * kv);
            seg[s] = Segment{qs, keys[s], values[s], att + at * H, r, start, 0};
            at += (size_t)r;
        }
        return attend_segments(seg, n_seq, S->heads, S->kv_heads, S->head_dim, 1.0f / sqrtf((float)S->head_dim),
                               nthreads);
    });
    free(new_kv);
    free(seg);
    return status;
}

}  // extern "C"
