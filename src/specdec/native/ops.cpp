// One transformer layer over k activation rows in one call, and its float32 pieces; one function for every
// architecture the native backend runs (specdec/models/archs), told apart by data: optional q/k and post norms,
// the rotary layout and width, the activation, a q width heads * head_dim of its own, the residual scale, each layer's
// window, scale, frequencies.
//
// Every piece computes each row (and in attention each (row, head)) by itself, with a fixed order of
// operations that depends only on that row's length: never on how many rows are in the call, nor on the
// thread count. Sums run in 16 lanes (lanes.h) and end in a fixed tree; the matrix products are the
// kernels' own (q4k.cpp, q6k.cpp, q5_0.cpp, q8_0.cpp, f32.cpp: rows independent too), called through the
// function pointers the caller hands in. So a row's result is bit for bit the same alone or in a block.
// Element-wise functions (SiLU, tanh-GELU) are the same IEEE operations on every instruction set (exp_lanes).
//
//   ops_rms_norm:  out[r] = x[r] * (1 / sqrt(mean(x[r]^2) + eps)) * w
//   ops_rope_neox: rotary embedding of NEOX style (pairs i, i + d/2), position start + r for row r, in place
//   ops_rope_norm: rotary embedding of llama.cpp's "norm" style (pairs 2i, 2i + 1: its converter permutes Llama's
//                  q/k rows so), in place
//   ops_rope_ext:  either layout as a layer does it (Shape): over the first rope_dims of each head (partial rotary,
//                  the rest passed through), a second set of frequencies from position rope_long_from on
//                  (LongRoPE's long factors), cos and sin times rope_mscale (its attention factor)
//   ops_attend:    causal attention (attend.h); row r (position start + r) sees keys 0..start + r, or the last
//                  `window` of them; grouped heads; by tiles of queries that share their keys
//   ops_layer:     x += r * post(attention(norm(x))); x += r * post(down(act(gate(norm(x))) * up(norm(x)))), KV cache
//                  written (post: the optional post norms; q and k heads RMS-normed before rotary where the layer has
//                  q/k norms; r: Shape's residual_scale, Granite's, the product skipped at 1)
//   ops_layers:    ops_layer over every layer in turn (one call a forward pass)
//   ops_layer_many: ops_layer over the rows of several sequences at once (each its own KV cache and positions):
//                  the matrix products over all rows in one pass over the weights, rotary and attention per sequence
//   ops_layers_many: ops_layer_many over every layer in turn (one call a batched forward pass)
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
    Matrix q, k, v, o, gate, up, down;  // each matrix's own product (unused where qkv / gate_up stands for them)
    const float* attn_norm;       // [hidden]
    const float* ffn_norm;        // [hidden]
    const float* q_norm;          // [head_dim]: RMS norm of every q head before rotary (Qwen3, Gemma 3), or null
    const float* k_norm;          // [head_dim]: the same of every k head, or null
    const float* post_attn_norm;  // [hidden]: RMS norm of the attention output before its residual add, or null
    const float* post_ffn_norm;   // [hidden]: the same of the feed-forward output, or null
    int window;                   // 0: a row sees every earlier position; w > 0: itself and the w - 1 before it
    float scale;                  // the attention scores' factor (1 / sqrt(head_dim) for most models)
    // q, k and v's rows stacked into one matrix [q + 2 kv rows, hidden] (gemm null: three products), and the gate's
    // rows then up's [2 ffn, hidden] (gemm null: two): one product call, one pass of the threads, instead of three or
    // two. The kernels compute each output row by itself, so a stacked matrix gives each row's bits unchanged.
    Matrix qkv, gate_up;
};

enum { ROPE_NEOX = 0, ROPE_NORM = 1 };     // rotary layouts: pairs (i, i + d/2), or (2i, 2i + 1)
enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };  // gate activations: SwiGLU, GeGLU (GELU's tanh form)

struct Shape {
    int hidden, heads, kv_heads, head_dim, ffn;  // q is heads * head_dim wide (not always hidden: Qwen3, Gemma 3)
    float eps;
    int rope, activation;  // ROPE_*, ACT_*
    // zero in each of these is the plain model's value (a Shape of the eight fields above is unchanged):
    int rope_dims;         // the first rope_dims of each head rotated, the rest passed through (0: head_dim)
    int rope_long_from;    // > 0: rows at this position and later rotate by the second rope_dims / 2 frequencies
    float rope_mscale;     // cos and sin times this (LongRoPE's attention factor; 0: 1, no product)
    float residual_scale;  // each branch times this before its residual add (Granite; 0: 1, no product)
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

}  // extern "C"

// Rotary embedding of x [k, heads, d] in place, row r at position start + r, over the first n_rot values of each
// head (the rest untouched); pair i of a head is (i, i + n_rot/2) (NEOX: Qwen2, Qwen3, Gemma 3, Phi-3) or
// (2i, 2i + 1) (adjacent: llama, Granite), rotated by the same arithmetic either way. inv_freq: [n_rot / 2], or
// [n_rot] when long_from > 0: rows at positions >= long_from take its second half. cos and sin times mscale unless
// it is 1 (then no product: the same bits as without).
static void rope_rows(float* x, int k, int heads, int d, int n_rot, int start, const float* inv_freq, int long_from,
                      float mscale, bool adjacent) {
    const int half = n_rot / 2;
    float* c = (float*)malloc(sizeof(float) * half);
    float* s = (float*)malloc(sizeof(float) * half);
    for (int r = 0; r < k; ++r) {
        const float pos = (float)(start + r);
        const float* freq = long_from > 0 && start + r >= long_from ? inv_freq + half : inv_freq;
        for (int i = 0; i < half; ++i) {
            const float angle = pos * freq[i];
            c[i] = cosf(angle);
            s[i] = sinf(angle);
            if (mscale != 1.0f) {
                c[i] *= mscale;
                s[i] *= mscale;
            }
        }
        for (int h = 0; h < heads; ++h) {
            float* v = x + ((size_t)r * heads + h) * d;
            for (int i = 0; i < half; ++i) {
                const int p = adjacent ? 2 * i : i, q = adjacent ? 2 * i + 1 : i + half;
                const float a = v[p], b = v[q];
                v[p] = a * c[i] - b * s[i];
                v[q] = b * c[i] + a * s[i];
            }
        }
    }
    free(c);
    free(s);
}

extern "C" {

// x: [k, heads, d] in place; inv_freq: [d / 2]
void ops_rope_neox(float* x, int k, int heads, int d, int start, const float* inv_freq) {
    rope_rows(x, k, heads, d, d, start, inv_freq, 0, 1.0f, false);
}

// x: [k, heads, d] in place; inv_freq: [d / 2]; pair i is (2i, 2i + 1), with the arithmetic of ops_rope_neox
void ops_rope_norm(float* x, int k, int heads, int d, int start, const float* inv_freq) {
    rope_rows(x, k, heads, d, d, start, inv_freq, 0, 1.0f, true);
}

// x: [k, heads, S->head_dim] in place, as a layer of shape S rotates its q and k heads (the header's ops_rope_ext)
void ops_rope_ext(const Shape* S, float* x, int k, int heads, int start, const float* inv_freq) {
    const int n_rot = S->rope_dims > 0 ? S->rope_dims : S->head_dim;
    const float mscale = S->rope_mscale != 0.0f ? S->rope_mscale : 1.0f;
    rope_rows(x, k, heads, S->head_dim, n_rot, start, inv_freq, S->rope_long_from, mscale, S->rope == ROPE_NORM);
}

}  // extern "C"

// g = act(g) * u over n values (n a multiple of 16), 16 lanes at a time; the same operations on every ISA:
//   silu(a) = a / (e^-a + 1);  gelu_tanh(a) = a / (e^-2y + 1), y = sqrt(2 / pi) (a + 0.044715 a^3)
//   (0.5 a (1 + tanh y) = a * sigmoid(2y); e^z clamped by exp_lanes, so no inf / inf at either end)
template <int ACT>
static void gate_lanes(float* g, const float* u, size_t n) {
    const float c = -1.5957691216057308f;  // -2 sqrt(2 / pi)
#ifdef OPS_YMM
    for (size_t i = 0; i < n; i += 8) {  // the same operations, 8 lanes at a time
        const __m256 a = _mm256_loadu_ps(g + i);
        const __m256 z = ACT == ACT_GELU_TANH ? (a + a * a * a * 0.044715f) * c : __m256{} - a;
        _mm256_storeu_ps(g + i, a / (exp8(z) + 1.0f) * _mm256_loadu_ps(u + i));
    }
#else
    for (size_t i = 0; i < n; i += LANES) {
        const v16f a = load16(g + i);
        const v16f z = ACT == ACT_GELU_TANH ? (a + a * a * a * 0.044715f) * c : v16f{} - a;
        store16(g + i, a / (exp16(z) + 1.0f) * load16(u + i));
    }
#endif
}

static void gate_activation(int activation, float* g, const float* u, size_t n) {
    if (activation == ACT_GELU_TANH)
        gate_lanes<ACT_GELU_TANH>(g, u, n);
    else
        gate_lanes<ACT_SILU>(g, u, n);
}

static int matmul(const Matrix& m, const float* x, int k, float* y, int nthreads, int mode) {
    const int status = m.gemm(m.blocks, m.rows, m.cols, x, k, y, nthreads, mode);
    if (status == 0 && m.bias)
        for (int r = 0; r < k; ++r)
            for (int i = 0; i < m.rows; ++i) y[(size_t)r * m.rows + i] += m.bias[i];
    return status;
}

// x += branch, or x += branch * residual_scale where the shape has one (Granite), element by element
static void residual_add(const Shape* S, float* x, const float* branch, size_t n) {
    const float r = S->residual_scale;
    if (r == 0.0f || r == 1.0f) {
        for (size_t i = 0; i < n; ++i) x[i] += branch[i];
    } else {
        for (size_t i = 0; i < n; ++i) x[i] += branch[i] * r;
    }
}

// The layer's activations: one buffer per calling thread, kept from call to call and grown when a call needs more.
// A 400-token prompt block's is ~38 MB, past glibc's largest mmap threshold (32 MB): malloc'd and freed each layer,
// its pages were faulted in and zeroed by the kernel every call, 13% of a prompt read (AMD EPYC, docs/speed.md).
static float* layer_scratch(size_t n) {
    static thread_local float* buf = nullptr;
    static thread_local size_t have = 0;
    if (n > have) {
        free(buf);
        buf = (float*)malloc(sizeof(float) * n);
        have = buf ? n : 0;
    }
    return buf;
}

// A layer over k rows of x [k, hidden] in place. The k and v products are written to new_keys, new_values
// [k, kv_heads, head_dim] (k heads RMS-normed there where the layer has k norms); attention(q, att) then does the rest
// of attention: rotary of q [k, heads, head_dim] and of the new keys, the KV cache, att [k, heads * head_dim]; returns
// 0 or its status. Returns 0, or the first failing step's.
template <class Attention>
static int layer_rows(const LayerWeights* L, const Shape* S, float* x, int k, float* new_keys, float* new_values,
                      int nthreads, int mode, Attention attention) {
    const int H = S->hidden, F = S->ffn, Q = S->heads * S->head_dim, KV = S->kv_heads * S->head_dim;
    const size_t wide = (size_t)(2 * F > Q + 2 * KV ? 2 * F : Q + 2 * KV);  // g and u, or a stacked qkv's rows
    float* buf = layer_scratch((size_t)k * (2 * (size_t)H + 2 * (size_t)Q + wide));
    if (!buf) return -2;
    float *h = buf, *q = h + (size_t)k * H, *att = q + (size_t)k * Q, *tmp = att + (size_t)k * Q;
    float *g = tmp + (size_t)k * H, *u = g + (size_t)k * F;
    int status = 0;
    ops_rms_norm(x, L->attn_norm, k, H, S->eps, h);
    if (L->qkv.gemm) {  // [k, Q + 2 KV] in g's room, then each row's three parts to their places
        const size_t W = (size_t)Q + 2 * (size_t)KV;
        status = matmul(L->qkv, h, k, g, nthreads, mode);
        for (int r = 0; status == 0 && r < k; ++r) {
            memcpy(q + (size_t)r * Q, g + r * W, sizeof(float) * Q);
            memcpy(new_keys + (size_t)r * KV, g + r * W + Q, sizeof(float) * KV);
            memcpy(new_values + (size_t)r * KV, g + r * W + Q + KV, sizeof(float) * KV);
        }
    } else {
        status = status ? status : matmul(L->q, h, k, q, nthreads, mode);
        status = status ? status : matmul(L->k, h, k, new_keys, nthreads, mode);
        status = status ? status : matmul(L->v, h, k, new_values, nthreads, mode);
    }
    if (status == 0 && L->q_norm) ops_rms_norm(q, L->q_norm, k * S->heads, S->head_dim, S->eps, q);
    if (status == 0 && L->k_norm) ops_rms_norm(new_keys, L->k_norm, k * S->kv_heads, S->head_dim, S->eps, new_keys);
    status = status ? status : attention(q, att);
    status = status ? status : matmul(L->o, att, k, tmp, nthreads, mode);
    if (status == 0) {
        if (L->post_attn_norm) ops_rms_norm(tmp, L->post_attn_norm, k, H, S->eps, tmp);
        residual_add(S, x, tmp, (size_t)k * H);
        ops_rms_norm(x, L->ffn_norm, k, H, S->eps, h);
    }
    if (L->gate_up.gemm) {  // [k, 2F]: each row's gate then up; the activation row by row, then the rows packed [k, F]
        status = status ? status : matmul(L->gate_up, h, k, g, nthreads, mode);
        for (int r = 0; status == 0 && r < k; ++r) {
            gate_activation(S->activation, g + (size_t)r * 2 * F, g + (size_t)r * 2 * F + F, (size_t)F);
            if (r) memmove(g + (size_t)r * F, g + (size_t)r * 2 * F, sizeof(float) * F);  // below every unmoved row
        }
    } else {
        status = status ? status : matmul(L->gate, h, k, g, nthreads, mode);
        status = status ? status : matmul(L->up, h, k, u, nthreads, mode);
        if (status == 0) gate_activation(S->activation, g, u, (size_t)k * F);  // F a multiple of 16
    }
    status = status ? status : matmul(L->down, g, k, tmp, nthreads, mode);
    if (status == 0) {
        if (L->post_ffn_norm) ops_rms_norm(tmp, L->post_ffn_norm, k, H, S->eps, tmp);
        residual_add(S, x, tmp, (size_t)k * H);
    }
    return status;
}

extern "C" {

// x: [k, hidden] in place. keys, values: this layer's cache [capacity, kv_heads, head_dim], rows start..start+k-1
// written here (the k and v products straight into it). inv_freq: this layer's (ops_rope_ext's). mode: the kernels'
// mode (0 scoring, 2 reading a prompt: prompt.h). Returns 0, or the first failing step's status.
int ops_layer(const LayerWeights* L, const Shape* S, float* x, int k, int start, float* keys, float* values,
              const float* inv_freq, int nthreads, int mode) {
    const size_t kv = (size_t)S->kv_heads * S->head_dim;
    float* new_keys = keys + (size_t)start * kv;
    float* new_values = values + (size_t)start * kv;
    return layer_rows(L, S, x, k, new_keys, new_values, nthreads, mode, [&](float* q, float* att) {
        ops_rope_ext(S, q, k, S->heads, start, inv_freq);
        ops_rope_ext(S, new_keys, k, S->kv_heads, start, inv_freq);
        return ops_attend(q, keys, values, k, start, S->heads, S->kv_heads, S->head_dim, L->window, L->scale, att,
                          nthreads);
    });
}

// ops_layer over the layers 0..n_layers - 1 in turn: one call a forward pass. L[i]: layer i's weights; keys, values:
// the whole cache [n_layers, capacity, kv_heads, head_dim] (layer i's part after i * capacity * kv_heads * head_dim
// floats); inv_freq[i]: layer i's frequencies. Each layer is exactly ops_layer (the same bits). Returns 0, or the first
// failing layer's status.
int ops_layers(const LayerWeights* L, int n_layers, const Shape* S, float* x, int k, int start, float* keys,
               float* values, int capacity, const float* const* inv_freq, int nthreads, int mode) {
    const size_t stride = (size_t)capacity * S->kv_heads * S->head_dim;
    for (int i = 0; i < n_layers; ++i) {
        const int status = ops_layer(&L[i], S, x, k, start, keys + i * stride, values + i * stride, inv_freq[i],
                                     nthreads, mode);
        if (status != 0) return status;
    }
    return 0;
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
    const size_t Q = (size_t)S->heads * S->head_dim, kv = (size_t)S->kv_heads * S->head_dim;
    float* new_kv = (float*)malloc(sizeof(float) * 2 * total * kv);
    Segment* seg = (Segment*)malloc(sizeof(Segment) * (size_t)n_seq);
    int status = new_kv && seg ? 0 : -2;
    float *new_keys = new_kv, *new_values = new_kv + total * kv;
    status = status ? status : layer_rows(L, S, x, (int)total, new_keys, new_values, nthreads, mode,
                                          [&](float* q, float* att) {
        size_t at = 0;  // the sequence's first row
        for (int s = 0; s < n_seq; ++s) {
            const int r = rows[s], start = starts[s];
            float *qs = q + at * Q, *ks = new_keys + at * kv, *vs = new_values + at * kv;
            ops_rope_ext(S, qs, r, S->heads, start, inv_freq);
            ops_rope_ext(S, ks, r, S->kv_heads, start, inv_freq);
            memcpy(keys[s] + (size_t)start * kv, ks, sizeof(float) * r * kv);
            memcpy(values[s] + (size_t)start * kv, vs, sizeof(float) * r * kv);
            seg[s] = Segment{qs, keys[s], values[s], att + at * Q, r, start, L->window};
            at += (size_t)r;
        }
        return attend_segments(seg, n_seq, S->heads, S->kv_heads, S->head_dim, L->scale, nthreads);
    });
    free(new_kv);
    free(seg);
    return status;
}

// ops_layer_many over the layers 0..n_layers - 1 in turn: one call a batched forward pass. keys[s], values[s]: sequence
// s's whole cache [n_layers, capacity[s], kv_heads, head_dim] (layer i's part after i * capacity[s] * kv_heads *
// head_dim floats); L, inv_freq as ops_layers'. Each layer is exactly ops_layer_many (the same bits). Returns 0, or the
// first failing layer's status.
int ops_layers_many(const LayerWeights* L, int n_layers, const Shape* S, float* x, int n_seq, const int* rows,
                    const int* starts, float* const* keys, float* const* values, const int* capacity,
                    const float* const* inv_freq, int nthreads, int mode) {
    if (n_seq < 0) return -1;
    float** kl = (float**)malloc(sizeof(float*) * 2 * ((size_t)n_seq + 1));  // this layer's keys, then values
    if (!kl) return -2;
    float** vl = kl + n_seq + 1;
    const size_t kv = (size_t)S->kv_heads * S->head_dim;
    int status = 0;
    for (int i = 0; i < n_layers && status == 0; ++i) {
        for (int s = 0; s < n_seq; ++s) {
            kl[s] = keys[s] + (size_t)i * capacity[s] * kv;
            vl[s] = values[s] + (size_t)i * capacity[s] * kv;
        }
        status = ops_layer_many(&L[i], S, x, n_seq, rows, starts, kl, vl, inv_freq[i], nthreads, mode);
    }
    free(kl);
    return status;
}

}  // extern "C"
