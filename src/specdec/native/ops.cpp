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
//   ops_attend:    causal attention; row r (position start + r) sees keys 0..start + r; grouped heads
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

#ifdef OPS_YMM
// Scores of the n (1..8) keys at kp[0..n-1] for query qv, times scale, into out[0..7] (0 for the missing keys):
// the same adds in the same order as dot16 + tree16 of each key. Lane l of a key's accumulator is lane l % 8 of
// lo (l < 8) or hi; tree16: b_i = x_i + x_{i+8} = lo + hi, c_i = b_i + b_{i+4}, (c_0 + c_2) + (c_1 + c_3).
static inline void scores8_ymm(const float* qv, const float* const kp[8], int n, int d, float scale, float* out) {
    __m256 b[8];
    for (int m0 = 0; m0 < 8; m0 += 4) {  // 4 keys at a time: 8 accumulators, 2 query halves
        __m256 lo[4], hi[4];
        const float* k4[4];
        for (int m = 0; m < 4; ++m) {
            lo[m] = hi[m] = _mm256_setzero_ps();
            k4[m] = kp[m0 + m < n ? m0 + m : 0];
        }
        if (m0 < n) {
            for (int i = 0; i < d; i += LANES) {
                const __m256 qa = _mm256_loadu_ps(qv + i), qb = _mm256_loadu_ps(qv + i + 8);
                for (int m = 0; m < 4; ++m) {
                    lo[m] = _mm256_add_ps(lo[m], _mm256_mul_ps(qa, _mm256_loadu_ps(k4[m] + i)));
                    hi[m] = _mm256_add_ps(hi[m], _mm256_mul_ps(qb, _mm256_loadu_ps(k4[m] + i + 8)));
                }
            }
        }
        for (int m = 0; m < 4; ++m) b[m0 + m] = m0 + m < n ? _mm256_add_ps(lo[m], hi[m]) : _mm256_setzero_ps();
    }
    __m256 c[4];  // c[m] = [c_0..3 of key m | c_0..3 of key m + 4]
    for (int m = 0; m < 4; ++m)
        c[m] = _mm256_add_ps(_mm256_permute2f128_ps(b[m], b[m + 4], 0x20), _mm256_permute2f128_ps(b[m], b[m + 4], 0x31));
    // e[t] = [d0, d1 of key 2t, d0, d1 of key 2t + 1 | the same of keys 2t + 4, 2t + 5]
    __m256 e[2];
    for (int t = 0; t < 2; ++t)
        e[t] = _mm256_add_ps(_mm256_shuffle_ps(c[2 * t], c[2 * t + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(c[2 * t], c[2 * t + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 s = _mm256_add_ps(_mm256_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));  // keys 0..7
    _mm256_storeu_ps(out, _mm256_mul_ps(s, _mm256_set1_ps(scale)));
}

typedef int32_t v8i __attribute__((vector_size(32)));
static inline __m256 exp8(__m256 x) { return exp_lanes<__m256, v8i>(x); }  // exp16's operations on 8 lanes

// The generic path's softmax of scores[0..length), in place: top = the largest score (the scalar loop's), e^(s - top)
// over 16-lane groups (the padding: -inf, then 0), their sum in 16 lanes (lo: lanes 0..7, hi: 8..15) and tree16.
// Returns 1 / the sum; scores[length..padded) end 0.
static inline float softmax_ymm(float* scores, int length) {
    const int padded = (length + LANES - 1) / LANES * LANES;
    __m256 t8 = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= length; j += 8) t8 = _mm256_max_ps(_mm256_loadu_ps(scores + j), t8);  // s > t ? s : t
    float t[8];
    _mm256_storeu_ps(t, t8);
    float top = -INFINITY;
    for (int l = 0; l < 8; ++l) top = t[l] > top ? t[l] : top;
    for (; j < length; ++j) top = scores[j] > top ? scores[j] : top;
    if (top == 0.0f) {  // the same value in any order, but a zero's sign is the first zero's: the loop's order
        top = -INFINITY;
        for (j = 0; j < length; ++j) top = scores[j] > top ? scores[j] : top;
    }
    for (j = length; j < padded; ++j) scores[j] = -INFINITY;  // e^-inf: clamped, then zeroed
    const __m256 tv = _mm256_set1_ps(top);
    for (j = 0; j < padded; j += 8) _mm256_storeu_ps(scores + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), tv)));
    for (j = length; j < padded; ++j) scores[j] = 0.0f;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (j = 0; j < padded; j += LANES) {
        lo = _mm256_add_ps(lo, _mm256_loadu_ps(scores + j));
        hi = _mm256_add_ps(hi, _mm256_loadu_ps(scores + j + 8));
    }
    float total[LANES];
    _mm256_storeu_ps(total, lo);
    _mm256_storeu_ps(total + 8, hi);
    return 1.0f / tree16(load16(total));
}

// o[0..8 NV) = (sum over j < length of v_j[0..8 NV) * p[j], from 0, in order of j) * inv, v_j = values + j * stride
template <int NV>
static inline void weighted_ymm(const float* values, size_t stride, const float* p, int length, float inv, float* o) {
    __m256 a[NV];
    for (int v = 0; v < NV; ++v) a[v] = _mm256_setzero_ps();
    for (int j = 0; j < length; ++j) {
        const float* vv = values + (size_t)j * stride;
        const __m256 pj = _mm256_set1_ps(p[j]);
        for (int v = 0; v < NV; ++v) a[v] = _mm256_add_ps(a[v], _mm256_mul_ps(_mm256_loadu_ps(vv + 8 * v), pj));
    }
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(o + 8 * v, _mm256_mul_ps(a[v], _mm256_set1_ps(inv)));
}
#endif

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

// One (row, head) of attention: the query qv [d] against the first `length` positions of kv head g of keys/values
// (positions pos_stride floats apart), into o [d]. scores: room for length + 16 floats; acc: d floats (generic path).
// Its scores, softmax and weighted sum in a fixed order that depends only on length.
static inline void attend_one(const float* qv, const float* keys, const float* values, int length, int g, int d,
                              size_t pos_stride, float scale, float* scores, float* acc, float* o) {
#ifdef OPS_YMM
    for (int j0 = 0; j0 < length; j0 += 8) {  // 8 keys at a time, by the same operations
        const float* kp[8];
        const int n = length - j0 < 8 ? length - j0 : 8;
        for (int m = 0; m < n; ++m) kp[m] = keys + (size_t)(j0 + m) * pos_stride + (size_t)g * d;
        scores8_ymm(qv, kp, n, d, scale, scores + j0);
    }
    const float inv = softmax_ymm(scores, length);
    const float* vg = values + (size_t)g * d;  // 64 outputs at a time in registers, then 16
    int i0 = 0;
    for (; i0 + 64 <= d; i0 += 64) weighted_ymm<8>(vg + i0, pos_stride, scores, length, inv, o + i0);
    for (; i0 < d; i0 += LANES) weighted_ymm<2>(vg + i0, pos_stride, scores, length, inv, o + i0);
#else
    const int padded = (length + LANES - 1) / LANES * LANES;
    float top = -INFINITY;
    for (int j0 = 0; j0 < length; j0 += LANES) {  // 16 keys at a time: dot16 of each, as one vector
        v16f acc16[LANES];
        for (int m = 0; m < LANES; ++m) {
            acc16[m] = v16f{};
            if (j0 + m < length) {
                const float* kv = keys + (size_t)(j0 + m) * pos_stride + (size_t)g * d;
                for (int i = 0; i < d; i += LANES) acc16[m] += load16(qv + i) * load16(kv + i);
            }
        }
        store16(scores + j0, tree16x16(acc16) * scale);
    }
    for (int j = 0; j < length; ++j) top = scores[j] > top ? scores[j] : top;
    for (int j = length; j < padded; ++j) scores[j] = -INFINITY;  // e^-inf: clamped, then zeroed
    v16f total = {0};
    for (int j = 0; j < padded; j += LANES) {
        v16f e = exp16(load16(scores + j) - top);
        store16(scores + j, e);
    }
    for (int j = length; j < padded; ++j) scores[j] = 0.0f;
    for (int j = 0; j < padded; j += LANES) total += load16(scores + j);
    const float inv = 1.0f / tree16(total);
    for (int i = 0; i < d; ++i) acc[i] = 0.0f;
    for (int j = 0; j < length; ++j) {
        const float* vv = values + j * pos_stride + (size_t)g * d;
        const float p = scores[j];
        for (int i = 0; i < d; i += LANES) store16(acc + i, load16(acc + i) + load16(vv + i) * p);
    }
    for (int i = 0; i < d; ++i) o[i] = acc[i] * inv;
#endif
}

struct Segment {  // rows of one sequence in attention: q, out [rows, heads, d]; keys, values its cache (positions 0..)
    const float* q;
    const float* keys;
    const float* values;
    float* out;
    int rows, start;  // row r at position start + r sees positions 0..start + r
};

// Attention of every segment's rows: one (segment, row, head) per task, interleaved over the threads.
static int attend_segments(const Segment* seg, int n_seg, int heads, int kv_heads, int d, int nthreads) {
    if (d % LANES || heads % kv_heads) return -1;
    const int group = heads / kv_heads;
    const float scale = 1.0f / sqrtf((float)d);
    const size_t pos_stride = (size_t)kv_heads * d;
    int longest = 0, tasks = 0;
    for (int s = 0; s < n_seg; ++s) {
        longest = seg[s].start + seg[s].rows > longest ? seg[s].start + seg[s].rows : longest;
        tasks += seg[s].rows * heads;
    }
    longest += LANES;  // scores padded to whole 16-lane groups
    int status = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float* scores = (float*)malloc(sizeof(float) * (size_t)longest);
#ifdef OPS_YMM
        const bool ymm = true;   // its weighted sums stay in registers
#else
        const bool ymm = false;
#endif
        float* acc = ymm ? nullptr : (float*)malloc(sizeof(float) * (size_t)d);
        if (!scores || (!ymm && !acc)) {
#pragma omp atomic write
            status = -2;
        } else {
#pragma omp for schedule(static, 1)  // interleaved: later rows see more keys
            for (int task = 0; task < tasks; ++task) {
                int s = 0, t = task;
                while (t >= seg[s].rows * heads) t -= seg[s++].rows * heads;
                const int r = t / heads, h = t % heads;
                const size_t at = ((size_t)r * heads + h) * d;
                attend_one(seg[s].q + at, seg[s].keys, seg[s].values, seg[s].start + r + 1, h / group, d, pos_stride,
                           scale, scores, acc, seg[s].out + at);
            }
        }
        free(scores);
        free(acc);
    }
    return status;
}

extern "C" {

// q: [k, heads, d]; keys, values: [>= start + k, kv_heads, d] (positions contiguous); out: [k, heads, d].
// d a multiple of 16. One (row, head) per task (attend_one).
int ops_attend(const float* q, const float* keys, const float* values, int k, int start, int heads, int kv_heads,
               int d, float* out, int nthreads) {
    const Segment seg = {q, keys, values, out, k, start};
    return attend_segments(&seg, 1, heads, kv_heads, d, nthreads);
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
        return ops_attend(q, keys, values, k, start, S->heads, S->kv_heads, S->head_dim, att, nthreads);
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
            seg[s] = Segment{qs, keys[s], values[s], att + at * H, r, start};
            at += (size_t)r;
        }
        return attend_segments(seg, n_seq, S->heads, S->kv_heads, S->head_dim, nthreads);
    });
    free(new_kv);
    free(seg);
    return status;
}

}  // extern "C"
