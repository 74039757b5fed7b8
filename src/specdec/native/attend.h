// Causal attention of the native backend (included by ops.cpp), by tiles of queries that share their keys.
//
// One query q (a row's head) at position p sees the keys and values of its kv head at positions lo..p
// (lo = 0, or p + 1 - window for a sliding-window layer); with j = position - lo and length = p - lo + 1:
//   scores:  s_j = (q · k_j) * scale, each one dot product in 16 lanes (lane l sums i = l mod 16 in order of i)
//            ended by tree16: a function of q and k_j alone;
//   softmax: top = the largest s_j, e_j = e^(s_j - top), their sum in 16 lanes (lane l: j = l mod 16, in order)
//            and tree16, inv = 1 / sum;
//   output:  o = (sum over j of v_j * e_j, from 0 in order of j) * inv.
// Every step's order depends only on length, so a query's result is bit for bit the same whichever other rows
// share the call, however the work is split, and on any thread count.
//
// A tile is the queries of several consecutive rows and all heads of one kv group that share lo: it reads each
// key and value from memory once for all its queries (8 keys, then 32 values at a time, held in L1 while every
// query of the tile uses them) instead of once per query; that per-query stream of the whole cache is what made
// attention half of reading a 3,000-token prompt. Inside a tile the AVX-512 path scores two queries against the
// same keys in registers. None of this changes any query's arithmetic above.
#pragma once
#include <math.h>
#include <stdlib.h>
#include <omp.h>
#include "lanes.h"

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

// The softmax of scores[0..length), in place: top = the largest score (the scalar loop's), e^(s - top) over 16-lane
// groups (the padding: -inf, then 0), their sum in 16 lanes (lo: lanes 0..7, hi: 8..15) and tree16.
// Returns 1 / the sum; scores[length..padded) end 0.
static inline float softmax_lanes(float* scores, int length) {
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

// acc[0..8 NV) += v_j[0..8 NV) * p[j] for j = j0..j1-1 in order, v_j = values + j * stride
template <int NV>
static inline void weighted_ymm(const float* values, size_t stride, const float* p, int j0, int j1, float* acc) {
    __m256 a[NV];
    for (int v = 0; v < NV; ++v) a[v] = _mm256_loadu_ps(acc + 8 * v);
    for (int j = j0; j < j1; ++j) {
        const float* vv = values + (size_t)j * stride;
        const __m256 pj = _mm256_set1_ps(p[j]);
        for (int v = 0; v < NV; ++v) a[v] = _mm256_add_ps(a[v], _mm256_mul_ps(_mm256_loadu_ps(vv + 8 * v), pj));
    }
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(acc + 8 * v, a[v]);
}
#else
// The same softmax in v16f lanes (one zmm with AVX-512).
static inline float softmax_lanes(float* scores, int length) {
    const int padded = (length + LANES - 1) / LANES * LANES;
    float top = -INFINITY;
    for (int j = 0; j < length; ++j) top = scores[j] > top ? scores[j] : top;
    for (int j = length; j < padded; ++j) scores[j] = -INFINITY;  // e^-inf: clamped, then zeroed
    for (int j = 0; j < padded; j += LANES) store16(scores + j, exp16(load16(scores + j) - top));
    for (int j = length; j < padded; ++j) scores[j] = 0.0f;
    v16f total = {0};
    for (int j = 0; j < padded; j += LANES) total += load16(scores + j);
    return 1.0f / tree16(total);
}

// Scores of the n (1..8) keys key, key + stride, ... for queries q0 and q1 (q1 may be q0), times scale, into
// out0[0..7] and out1[0..7] (lanes of missing keys: garbage, the caller's padding). Each key loaded once for both.
static inline void scores_2x8(const float* q0, const float* q1, const float* key, size_t stride, int n, int d,
                              float scale, float* out0, float* out1) {
    v16f a[16];  // a[m]: q0 and key m; a[8 + m]: q1 and key m
    const float* kp[8];
    for (int m = 0; m < 8; ++m) kp[m] = key + (size_t)(m < n ? m : 0) * stride;
    for (int m = 0; m < 16; ++m) a[m] = v16f{};
    for (int i = 0; i < d; i += LANES) {
        const v16f x0 = load16(q0 + i), x1 = load16(q1 + i);
        for (int m = 0; m < 8; ++m) {
            const v16f kv = load16(kp[m] + i);
            a[m] += x0 * kv;
            a[8 + m] += x1 * kv;
        }
    }
    float s[16];
    store16(s, tree16x16(a) * scale);  // lane m: tree16(a[m]) * scale
    memcpy(out0, s, 8 * sizeof(float));
    memcpy(out1, s + 8, 8 * sizeof(float));
}

// acc0[0..16 W) += v_j[0..16 W) * p0[j] for j0 <= j < j1 in order of j, and the same into acc1 with p1 when TWO:
// the sums in registers, each value loaded once for both queries.
template <int W, bool TWO>
static inline void weighted_w(const float* values, size_t stride, const float* p0, const float* p1, int j0, int j1,
                              float* acc0, float* acc1) {
    v16f a[W], b[W];
    for (int v = 0; v < W; ++v) {
        a[v] = load16(acc0 + LANES * v);
        if (TWO) b[v] = load16(acc1 + LANES * v);
    }
    for (int j = j0; j < j1; ++j) {
        const float* vv = values + (size_t)j * stride;
        const float x = p0[j], y = TWO ? p1[j] : 0.0f;
        for (int v = 0; v < W; ++v) {
            const v16f val = load16(vv + LANES * v);
            a[v] += val * x;
            if (TWO) b[v] += val * y;
        }
    }
    for (int v = 0; v < W; ++v) {
        store16(acc0 + LANES * v, a[v]);
        if (TWO) store16(acc1 + LANES * v, b[v]);
    }
}

// weighted_w over d floats (acc1 null: one query): 128 outputs at a time, then 16.
static inline void weighted_2(const float* values, size_t stride, const float* p0, const float* p1, int j0, int j1,
                              int d, float* acc0, float* acc1) {
    int i0 = 0;
    for (; i0 + 8 * LANES <= d; i0 += 8 * LANES)
        acc1 ? weighted_w<8, true>(values + i0, stride, p0, p1, j0, j1, acc0 + i0, acc1 + i0)
             : weighted_w<8, false>(values + i0, stride, p0, p1, j0, j1, acc0 + i0, nullptr);
    for (; i0 < d; i0 += LANES)
        acc1 ? weighted_w<1, true>(values + i0, stride, p0, p1, j0, j1, acc0 + i0, acc1 + i0)
             : weighted_w<1, false>(values + i0, stride, p0, p1, j0, j1, acc0 + i0, nullptr);
}
#endif

static const int KEY_BLOCK = 8, VALUE_BLOCK = 32;

// Attention of nq queries qv[t] [d] (t in order of length: length[t] non-decreasing) against keys/values (key j at
// keys + j * stride: the kv head's first position lo), outputs o[t] [d]. scores: nq rows of `room` floats (room >=
// the longest length + 16); acc: nq * d floats.
static void attend_tile(const float* const* qv, const int* length, int nq, const float* keys, const float* values,
                        size_t stride, int d, float scale, float* scores, size_t room, float* acc, float* const* o) {
    const int longest = length[nq - 1];
    for (int j0 = 0; j0 < longest; j0 += KEY_BLOCK) {  // 8 keys, used by every query that sees them
#ifdef OPS_YMM
        const float* kp[8];
        const int n = longest - j0 < 8 ? longest - j0 : 8;
        for (int m = 0; m < n; ++m) kp[m] = keys + (size_t)(j0 + m) * stride;
        for (int t = 0; t < nq; ++t)
            if (j0 < length[t]) {
                const int nt = length[t] - j0 < 8 ? length[t] - j0 : 8;
                scores8_ymm(qv[t], kp, nt, d, scale, scores + t * room + j0);
            }
#else
        for (int t = 0; t < nq; t += 2) {
            const int u = t + 1 < nq ? t + 1 : t;  // the pair's longer query (lengths in order)
            if (j0 >= length[u]) continue;
            const int n = length[u] - j0 < 8 ? length[u] - j0 : 8;
            float* s0 = scores + t * room + j0;
            scores_2x8(qv[t], qv[u], keys + (size_t)j0 * stride, stride, n, d, scale, s0, scores + u * room + j0);
        }
#endif
    }
    float inv[nq];
    for (int t = 0; t < nq; ++t) inv[t] = softmax_lanes(scores + t * room, length[t]);
    for (size_t i = 0; i < (size_t)nq * d; ++i) acc[i] = 0.0f;
    for (int j0 = 0; j0 < longest; j0 += VALUE_BLOCK) {  // 32 values, used by every query that sees them
        const int j1 = j0 + VALUE_BLOCK;
#ifdef OPS_YMM
        for (int t = 0; t < nq; ++t) {
            const int end = length[t] < j1 ? length[t] : j1;
            const float* p = scores + t * room;
            int i0 = 0;  // 64 outputs at a time in registers, then 16
            if (end <= j0) continue;
            for (; i0 + 64 <= d; i0 += 64) weighted_ymm<8>(values + i0, stride, p, j0, end, acc + t * d + i0);
            for (; i0 < d; i0 += LANES) weighted_ymm<2>(values + i0, stride, p, j0, end, acc + t * d + i0);
        }
#else
        for (int t = 0; t < nq; t += 2) {
            const int u = t + 1 < nq ? t + 1 : -1;
            const int end0 = length[t] < j1 ? length[t] : j1;
            const int end1 = u < 0 ? end0 : (length[u] < j1 ? length[u] : j1);
            if (end0 > j0)  // both queries over [j0, end0), then the longer one alone
                weighted_2(values, stride, scores + t * room, u < 0 ? nullptr : scores + u * room, j0, end0, d,
                           acc + t * d, u < 0 ? nullptr : acc + u * d);
            if (u >= 0 && end1 > (end0 > j0 ? end0 : j0))
                weighted_2(values, stride, scores + u * room, nullptr, end0 > j0 ? end0 : j0, end1, d, acc + u * d,
                           nullptr);
        }
#endif
    }
    for (int t = 0; t < nq; ++t)
        for (int i = 0; i < d; ++i) o[t][i] = acc[t * d + i] * inv[t];
}

struct Segment {  // rows of one sequence in attention: q, out [rows, heads, d]; keys, values its cache (positions 0..)
    const float* q;
    const float* keys;
    const float* values;
    float* out;
    int rows, start;  // row r at position start + r sees positions lo..start + r
    int window;       // lo = start + r + 1 - window (at least 0); 0: lo = 0 (every earlier position)
};

static const int MAX_TILE_ROWS = 4;

static inline int first_seen(const Segment& s, int r) {
    const int lo = s.window > 0 ? s.start + r + 1 - s.window : 0;
    return lo > 0 ? lo : 0;
}

// Attention of every segment's rows. A task: up to `tile` consecutive rows of one segment and one kv group
// (split further where rows' first positions differ); tasks interleaved over the threads (later rows see more keys).
static int attend_segments(const Segment* seg, int n_seg, int heads, int kv_heads, int d, float scale, int nthreads) {
    if (d % LANES || kv_heads < 1 || heads % kv_heads || heads / kv_heads > 64 || n_seg < 0) return -1;
    const int group = heads / kv_heads;
    const size_t pos_stride = (size_t)kv_heads * d;
    int longest = 0, total_rows = 0;
    for (int s = 0; s < n_seg; ++s) {
        longest = seg[s].start + seg[s].rows > longest ? seg[s].start + seg[s].rows : longest;
        total_rows += seg[s].rows;
    }
    // rows per tile: more shares each key between more queries; fewer gives the threads enough tasks
    int tile = total_rows * kv_heads / (nthreads > 0 ? nthreads * 8 : 8);
    tile = tile < 1 ? 1 : (tile > MAX_TILE_ROWS ? MAX_TILE_ROWS : tile);
    int tasks = 0;
    for (int s = 0; s < n_seg; ++s) tasks += (seg[s].rows + tile - 1) / tile * kv_heads;
    const size_t room = (size_t)longest + 2 * LANES;  // scores padded to whole 16-lane groups, 8-key stores
    const int max_q = tile * group;
    int status = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float* scores = (float*)malloc(sizeof(float) * room * (size_t)max_q);
        float* acc = (float*)malloc(sizeof(float) * (size_t)d * (size_t)max_q);
        if (!scores || !acc) {
#pragma omp atomic write
            status = -2;
        } else {
            const float* qv[MAX_TILE_ROWS * 64];
            float* o[MAX_TILE_ROWS * 64];
            int length[MAX_TILE_ROWS * 64];
#pragma omp for schedule(static, 1)
            for (int task = 0; task < tasks; ++task) {
                int s = 0, t = task;
                while (t >= (seg[s].rows + tile - 1) / tile * kv_heads) t -= (seg[s++].rows + tile - 1) / tile * kv_heads;
                const Segment& S = seg[s];
                const int g = t % kv_heads, r0 = t / kv_heads * tile;
                const int r1 = r0 + tile < S.rows ? r0 + tile : S.rows;
                for (int a = r0; a < r1;) {  // rows a..b-1 share their first position
                    const int lo = first_seen(S, a);
                    int b = a + 1;
                    while (b < r1 && first_seen(S, b) == lo) ++b;
                    int nq = 0;
                    for (int r = a; r < b; ++r)
                        for (int h = g * group; h < (g + 1) * group; ++h) {
                            const size_t at = ((size_t)r * heads + h) * d;
                            qv[nq] = S.q + at;
                            o[nq] = S.out + at;
                            length[nq++] = S.start + r + 1 - lo;
                        }
                    attend_tile(qv, length, nq, S.keys + (size_t)lo * pos_stride + (size_t)g * d,
                                S.values + (size_t)lo * pos_stride + (size_t)g * d, pos_stride, d, scale, scores, room,
                                acc, o);
                    a = b;
                }
            }
        }
        free(scores);
        free(acc);
    }
    return status;
}

extern "C" {

// q: [k, heads, d]; keys, values: [>= start + k, kv_heads, d] (positions contiguous); out: [k, heads, d].
// d a multiple of 16, heads / kv_heads <= 64. window: 0, or the positions a row sees (itself included). scale: the
// scores' factor (1 / sqrt(d) for most models).
int ops_attend(const float* q, const float* keys, const float* values, int k, int start, int heads, int kv_heads,
               int d, int window, float scale, float* out, int nthreads) {
    if (heads / (kv_heads > 0 ? kv_heads : 1) > 64 || window < 0) return -1;
    const Segment seg = {q, keys, values, out, k, start, window};
    return attend_segments(&seg, 1, heads, kv_heads, d, scale, nthreads);
}

}  // extern "C"
