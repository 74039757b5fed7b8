// What q4_0.cpp, q4_1.cpp, q5_0.cpp, q5_1.cpp, q8_0.cpp and iq4_nl.cpp share: the 32-weight block formats with one
// fp16 scale d at the start of a block (and, for the formats with a min, an fp16 m right after it).
// The activation quantizer (one portable scalar rule, vectorized with the same IEEE operations), the 256-byte
// records of 4 blocks per (group, row), the scalar reference kernel, the kernel skeleton of each path (partial
// last group, prefetch, per-row lanes, fixed-tree horizontal sum), the dispatch table over 1..16 rows and the
// exported entry points, all parametrized by a format struct B (see q5_0.cpp / q8_0.cpp):
//   B::BB        bytes per block;   B::BIAS   C_j = -BIAS * (sum of lane j's 8 activations)
//   B::MIN       false: w = d * code; true: w = d * code + m (fp16 m at byte 2; BIAS 0), and the record's C slot
//                holds s_j = float(sum of lane j's 8 activations) instead, for the extra term fma(s_j, m * dx, acc_j)
//   B::ref_weights(blk, w)          w[32] = weight codes (w = d * code [+ m]), natural order (reference, dequant)
//   B::Unpack512 / B::Half2         the AVX-512 / AVX2 unpacking of the weights and the integer dot D per row
//   B::codes32(blk)                 the block's 32 unsigned codes u = code + BIAS, natural order (prompt32.h)
// The format-specific arithmetic (how D_j is obtained) stays in the .cpp files; see their header comments.
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#include <omp.h>
#include "hsum.h"   // hsum16_ref, AVX2 hsum16

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__)
#define Q32_PATH_512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define Q32_PATH_AVX2 1
#endif

namespace {
namespace q32 {
const int QK = 32;
const int REC = 256;        // record bytes per (group, row)
int PF_DIST = 4096;         // software prefetch distance in bytes (0 = off)

// portable, exact fp16 -> fp32 (same bits as F16C / numpy for every finite value, inf, and NaN payloads)
inline float h2f(const uint8_t* p) {
    const uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    const uint32_t sign = (h & 0x8000u) << 16, ex = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ffu, bits;
    if (ex == 0x1f) bits = sign | 0x7f800000u | (mant << 13);
    else if (ex != 0) bits = sign | ((ex + 112) << 23) | (mant << 13);
    else if (mant == 0) bits = sign;
    else {  // subnormal: normalize
        int e = 113;
        while (!(mant & 0x400u)) { mant <<= 1; --e; }
        bits = sign | ((uint32_t)e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// one 32-block of x (finite values): q = roundf(x * id) (half away from zero) written as trunc + exact fraction
// test (v - trunc(v) is exact for |v| < 2^23), clamped to [-127,127]; returns dx = amax/127. The vector
// versions do the same IEEE operations on the same operands, so every build gives the same bits.
inline float quantize_block(const float* xs, int8_t* q) {
#if defined(Q32_PATH_512)
    const __m512 x0 = _mm512_loadu_ps(xs), x1 = _mm512_loadu_ps(xs + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
#elif defined(Q32_PATH_AVX2)
    const __m256 sgn = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xs), sgn), _mm256_and_ps(_mm256_loadu_ps(xs + 8), sgn));
    m = _mm256_max_ps(m, _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xs + 16), sgn),
                                       _mm256_and_ps(_mm256_loadu_ps(xs + 24), sgn)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
#else
    float amax = 0.f;
    for (int j = 0; j < QK; ++j) { const float v = fabsf(xs[j]); amax = amax > v ? amax : v; }
#endif
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
#if defined(Q32_PATH_512)
    const __m512 vid = _mm512_set1_ps(id), h = _mm512_set1_ps(0.5f), mh = _mm512_set1_ps(-0.5f);
    const __m512i one = _mm512_set1_epi32(1), lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int c = 0; c < 2; ++c) {
        const __m512 v = _mm512_mul_ps(c ? x1 : x0, vid);
        __m512i t = _mm512_cvttps_epi32(v);
        const __m512 f = _mm512_sub_ps(v, _mm512_cvtepi32_ps(t));
        t = _mm512_mask_add_epi32(t, _mm512_cmp_ps_mask(f, h, _CMP_GE_OQ), t, one);
        t = _mm512_mask_sub_epi32(t, _mm512_cmp_ps_mask(f, mh, _CMP_LE_OQ), t, one);
        t = _mm512_min_epi32(_mm512_max_epi32(t, lo), hi);
        _mm_storeu_si128((__m128i*)(q + 16 * c), _mm512_cvtepi32_epi8(t));
    }
#elif defined(Q32_PATH_AVX2)
    const __m256 vid = _mm256_set1_ps(id), h = _mm256_set1_ps(0.5f), mh = _mm256_set1_ps(-0.5f);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    alignas(32) int32_t t32[QK];
    for (int c = 0; c < 4; ++c) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xs + 8 * c), vid);
        __m256i t = _mm256_cvttps_epi32(v);
        const __m256 f = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
        // compare masks are all-ones (-1): subtracting the >= 0.5 mask adds 1, adding the <= -0.5 mask subtracts 1
        t = _mm256_sub_epi32(t, _mm256_castps_si256(_mm256_cmp_ps(f, h, _CMP_GE_OQ)));
        t = _mm256_add_epi32(t, _mm256_castps_si256(_mm256_cmp_ps(f, mh, _CMP_LE_OQ)));
        _mm256_store_si256((__m256i*)(t32 + 8 * c), _mm256_min_epi32(_mm256_max_epi32(t, lo), hi));
    }
    for (int j = 0; j < QK; ++j) q[j] = (int8_t)t32[j];
#else
    for (int j = 0; j < QK; ++j) {
        const float v = xs[j] * id;
        int t = (int)v;
        const float f = v - (float)t;
        t += (f >= 0.5f) - (f <= -0.5f);
        q[j] = (int8_t)(t > 127 ? 127 : t < -127 ? -127 : t);
    }
#endif
    return d;
}

// one row: records at rec0 + g * gstride; optionally the natural-order int8 a and dx per block
template <int BIAS, bool MIN>
void quantize_row(const float* x, int K, uint8_t* rec0, size_t gstride, int8_t* a_out, float* dx_out) {
    const int nb = K / QK, ng = (nb + 3) / 4;
    for (int g = 0; g < ng; ++g) {
        uint8_t* rec = rec0 + (size_t)g * gstride;
        memset(rec, 0, REC);
        int8_t* AX = (int8_t*)rec;
        int8_t* AY = (int8_t*)(rec + 64);
        int32_t C[16];
        float DX[16];
        for (int l = 0; l < 4; ++l) {
            const int b = 4 * g + l;
            int8_t q[QK] = {0};
            float d = 0.f;
            if (b < nb) {
                d = quantize_block(x + (size_t)b * QK, q);
                if (a_out) memcpy(a_out + (size_t)b * QK, q, QK);
                if (dx_out) dx_out[b] = d;
            }
            memcpy(AX + 16 * l, q, 16);
            memcpy(AY + 16 * l, q + 16, 16);
            for (int i = 0; i < 4; ++i) {
                int s = 0;
                for (int e = 0; e < 4; ++e) s += q[4 * i + e] + q[16 + 4 * i + e];
                if (MIN) { const float f = (float)s; memcpy(&C[4 * l + i], &f, 4); }  // |s| <= 1016: exact
                else C[4 * l + i] = -BIAS * s;
                DX[4 * l + i] = d;
            }
        }
        memcpy(rec + 128, C, 64);
        memcpy(rec + 192, DX, 64);
    }
}

// ---------------- scalar path and reference (mode 1): the lane formula, lane by lane ----------------
template <class B>
void kernel_ref(const uint8_t* W, int N, int K, const uint8_t* rec, int k, float* y, int nthreads) {
    const int nb = K / QK, ng = (nb + 3) / 4;
    const size_t rowbytes = (size_t)nb * B::BB;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n)
        for (int r = 0; r < k; ++r) {
            const uint8_t* wr = W + (size_t)n * rowbytes;
            float acc[16] = {0};
            for (int g = 0; g < ng; ++g) {
                const uint8_t* rr = rec + ((size_t)g * k + r) * REC;
                const int8_t* AX = (const int8_t*)rr;
                const int8_t* AY = (const int8_t*)(rr + 64);
                const float* DX = (const float*)(rr + 192);
                for (int l = 0; l < 4; ++l) {     // lanes j = 4l + i
                    const int b = 4 * g + l;
                    const uint8_t* blk = wr + (size_t)b * B::BB;
                    float dw = 0.f, dm = 0.f;              // padded block: d = m = 0, D = s = 0
                    int w[QK];
                    if (b < nb) {
                        B::ref_weights(blk, w);
                        dw = h2f(blk);
                        if (B::MIN) dm = h2f(blk + 2);
                    }
                    for (int i = 0; i < 4; ++i) {
                        int32_t D = 0, s = 0;
                        if (b < nb)
                            for (int e = 0; e < 4; ++e) {
                                D += w[4 * i + e] * AX[16 * l + 4 * i + e] + w[16 + 4 * i + e] * AY[16 * l + 4 * i + e];
                                s += AX[16 * l + 4 * i + e] + AY[16 * l + 4 * i + e];
                            }
                        const float S = dw * DX[4 * l + i];
                        acc[4 * l + i] = fmaf((float)D, S, acc[4 * l + i]);
                        if (B::MIN) acc[4 * l + i] = fmaf((float)s, dm * DX[4 * l + i], acc[4 * l + i]);
                    }
                }
            }
            y[(size_t)r * N + n] = hsum16_ref(acc);
        }
}

// the group g of a weight row (4 blocks), or for the partial last group a zero-padded copy in buf; prefetches
// PF_DIST bytes ahead (one line per 64 bytes of the group)
template <int GB>
__attribute__((always_inline)) inline const uint8_t* group_ptr(const uint8_t* wr, int g, int ngf, int tail, int pfd,
                                                               uint8_t* buf) {
    const uint8_t* p = wr + (size_t)g * GB;
    if (g == ngf) {  // partial last group: zero-padded copy
        memset(buf, 0, GB);
        memcpy(buf, p, (size_t)tail * (GB / 4));
        p = buf;
    } else if (pfd) {
        const char* pp = (const char*)p + pfd;
        _mm_prefetch(pp, _MM_HINT_T0); _mm_prefetch(pp + 64, _MM_HINT_T0);
        if (GB > 128) _mm_prefetch(pp + 128, _MM_HINT_T0);
    }
    return p;
}

#if defined(Q32_PATH_512)
inline float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 e = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(e);
}

// B::Unpack512: constructed once per call (index vectors); u(p, UX, UY, dw) unpacks the group at p into the
// unsigned codes UX (lane l = block 4g+l weights 0..15), UY (16..31) and the 16 lane scales dw (B::MIN:
// u(p, UX, UY, dw, dm), dm the 16 lane mins)
template <class B, int R>
void kernel_rows(const uint8_t* W, int N, int K, const uint8_t* rec, int r0, int kall, float* y, int nthreads) {
    const int GB = 4 * B::BB;
    const int nb = K / QK, ngf = nb / 4, tail = nb % 4;
    const size_t rowbytes = (size_t)nb * B::BB;
    const uint8_t* RB = rec + (size_t)r0 * REC;
    const size_t gst = (size_t)kall * REC;
    const int pfd = PF_DIST;
    const typename B::Unpack512 unpack;

#pragma omp parallel for schedule(static) num_threads(nthreads) firstprivate(unpack)
    for (int n = 0; n < N; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        alignas(64) uint8_t buf[GB];
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        const int ng = ngf + (tail > 0);
        for (int g = 0; g < ng; ++g) {
            const uint8_t* p = group_ptr<GB>(wr, g, ngf, tail, pfd, buf);
            __m512i UX, UY;
            __m512 dw, dm = _mm512_setzero_ps();
            if constexpr (B::MIN) unpack(p, UX, UY, dw, dm);
            else unpack(p, UX, UY, dw);
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                const uint8_t* rr = RB + g * gst + r * REC;
                __m512i D = B::MIN ? _mm512_setzero_si512() : _mm512_load_si512(rr + 128);
                D = _mm512_dpbusd_epi32(D, UX, _mm512_load_si512(rr));
                D = _mm512_dpbusd_epi32(D, UY, _mm512_load_si512(rr + 64));
                const __m512 DX = _mm512_load_ps((const float*)(rr + 192));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D), _mm512_mul_ps(dw, DX), acc[r]);
                if constexpr (B::MIN)  // s_j (a float in the C slot) * (m * dx)
                    acc[r] = _mm512_fmadd_ps(_mm512_load_ps((const float*)(rr + 128)), _mm512_mul_ps(dm, DX), acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) y[(size_t)(r0 + r) * N + n] = hsum16(acc[r]);
    }
}
const char* ISA_NAME = "avx512-vnni";

#elif defined(Q32_PATH_AVX2)
inline __m128i ld128(const uint8_t* p) { return _mm_loadu_si128((const __m128i*)p); }
#if defined(__AVXVNNI__)
// AVX-VNNI: D = dpbusd(dpbusd(C_j, UX, AX), UY, AY) with unsigned codes UX, UY and C at c
__attribute__((always_inline)) inline __m256i dot_vnni(__m256i UX, __m256i UY, __m256i AX, __m256i AY, const uint8_t* c) {
    __m256i D = _mm256_load_si256((const __m256i*)c);
    D = _mm256_dpbusd_avx_epi32(D, UX, AX);
    return _mm256_dpbusd_avx_epi32(D, UY, AY);
}
#endif

// B::Half2 w(b0, b1): the weights of blocks b0, b1 (lanes 8h..8h+7 of the zmm layout), unpacked once for all
// rows; w.dot(AX, AY, c) = the exact int32 D of the 8 lanes for activations AX, AY and C at c (B::MIN: c unused)
template <class B, int R>
void kernel_rows(const uint8_t* W, int N, int K, const uint8_t* rec, int r0, int kall, float* y, int nthreads) {
    const int GB = 4 * B::BB;
    const int nb = K / QK, ngf = nb / 4, tail = nb % 4;
    const size_t rowbytes = (size_t)nb * B::BB;
    const uint8_t* RB = rec + (size_t)r0 * REC;
    const size_t gst = (size_t)kall * REC;
    const int pfd = PF_DIST;

#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        alignas(64) uint8_t buf[GB];
        __m256 acc[R][2];
        for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        const int ng = ngf + (tail > 0);
        for (int g = 0; g < ng; ++g) {
            const uint8_t* p = group_ptr<GB>(wr, g, ngf, tail, pfd, buf);
            for (int h = 0; h < 2; ++h) {     // lanes 8h..8h+7 = blocks 2h, 2h+1 of the group
                const uint8_t* b0 = p + (2 * h) * B::BB;
                const uint8_t* b1 = b0 + B::BB;
                const typename B::Half2 w(b0, b1);
                uint16_t h0, h1;
                memcpy(&h0, b0, 2); memcpy(&h1, b1, 2);
                const __m256 dw = _mm256_set_m128(_mm_set1_ps(_cvtsh_ss(h1)), _mm_set1_ps(_cvtsh_ss(h0)));
                __m256 dm = _mm256_setzero_ps();
                if constexpr (B::MIN) {
                    memcpy(&h0, b0 + 2, 2); memcpy(&h1, b1 + 2, 2);
                    dm = _mm256_set_m128(_mm_set1_ps(_cvtsh_ss(h1)), _mm_set1_ps(_cvtsh_ss(h0)));
                }
                for (int r = 0; r < R; ++r) {
                    const uint8_t* rr = RB + g * gst + r * REC;
                    const __m256i AX = _mm256_load_si256((const __m256i*)(rr + 32 * h));
                    const __m256i AY = _mm256_load_si256((const __m256i*)(rr + 64 + 32 * h));
                    const __m256i D = w.dot(AX, AY, rr + 128 + 32 * h);
                    const __m256 DX = _mm256_load_ps((const float*)(rr + 192 + 32 * h));
                    acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D), _mm256_mul_ps(dw, DX), acc[r][h]);
                    if constexpr (B::MIN)  // s_j (a float in the C slot) * (m * dx)
                        acc[r][h] = _mm256_fmadd_ps(_mm256_load_ps((const float*)(rr + 128 + 32 * h)),
                                                    _mm256_mul_ps(dm, DX), acc[r][h]);
                }
            }
        }
        for (int r = 0; r < R; ++r) y[(size_t)(r0 + r) * N + n] = hsum16(acc[r][0], acc[r][1]);
    }
}
const char* ISA_NAME = "avx2";  // with AVX-VNNI dot products where __AVXVNNI__
#else
const char* ISA_NAME = "scalar";
#endif

#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)
typedef void (*kfn)(const uint8_t*, int, int, const uint8_t*, int, int, float*, int);
template <class B>
struct KTab {
    static constexpr kfn T[17] = {nullptr,
        kernel_rows<B, 1>, kernel_rows<B, 2>, kernel_rows<B, 3>, kernel_rows<B, 4>, kernel_rows<B, 5>,
        kernel_rows<B, 6>, kernel_rows<B, 7>, kernel_rows<B, 8>, kernel_rows<B, 9>, kernel_rows<B, 10>,
        kernel_rows<B, 11>, kernel_rows<B, 12>, kernel_rows<B, 13>, kernel_rows<B, 14>, kernel_rows<B, 15>,
        kernel_rows<B, 16>};
};
#endif

template <class B>
uint8_t* make_records(const float* x, int k, int K) {
    const int ng = (K / QK + 3) / 4;
    uint8_t* rec = (uint8_t*)aligned_alloc(64, (size_t)k * ng * REC);
    for (int r = 0; r < k; ++r)
        quantize_row<B::BIAS, B::MIN>(x + (size_t)r * K, K, rec + (size_t)r * REC, (size_t)k * REC, nullptr, nullptr);
    return rec;
}

}  // namespace q32
}  // namespace
#include "prompt32.h"   // q32::prompt::gemm<B>: the prompt-reading product (mode bit 2)
namespace {
namespace q32 {

// y[k,N] = x[k,K] . W^T ; mode 0 = best compiled path, 1 = scalar reference (same bits), 2 = the prompt product
template <class B>
int gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    if (K <= 0 || K % QK) return -1;
    if (k <= 0 || N <= 0) return 0;
    if (nthreads < 1) nthreads = omp_get_max_threads();
    if (mode & 2) return prompt::gemm<B>(W, N, K, x, k, y, nthreads, mode);
    uint8_t* rec = make_records<B>(x, k, K);
#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)
    if (!(mode & 1)) {
        for (int r0 = 0; r0 < k; r0 += 16) {
            const int R = k - r0 < 16 ? k - r0 : 16;
            KTab<B>::T[R](W, N, K, rec, r0, k, y, nthreads);
        }
        free(rec);
        return 0;
    }
#endif
    (void)mode;
    kernel_ref<B>(W, N, K, rec, k, y, nthreads);
    free(rec);
    return 0;
}

// float32 weights d * w (B::MIN: d * w + m; w = B::ref_weights), bit for bit gguf.quants.dequantize
template <class B>
void dequant(const uint8_t* W, int N, int K, float* out) {
    const int nb = K / QK;
    for (size_t n = 0; n < (size_t)N; ++n)
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = W + (n * nb + b) * B::BB;
            const float d = h2f(blk), m = B::MIN ? h2f(blk + 2) : 0.f;
            int w[QK];
            B::ref_weights(blk, w);
            float* o = out + n * K + (size_t)b * QK;
            for (int j = 0; j < QK; ++j) o[j] = B::MIN ? d * (float)w[j] + m : d * (float)w[j];
        }
}

// the kernel's int8 activations a[k,K] (natural order) and scales dx[k, K/32]
template <class B>
void quant_x(const float* x, int k, int K, int8_t* a, float* dx) {
    const int nb = K / QK, ng = (nb + 3) / 4;
    uint8_t* rec = (uint8_t*)aligned_alloc(64, (size_t)(ng > 0 ? ng : 1) * REC);
    for (int r = 0; r < k; ++r)
        quantize_row<B::BIAS, B::MIN>(x + (size_t)r * K, K, rec, REC, a + (size_t)r * K, dx + (size_t)r * nb);
    free(rec);
}
}  // namespace q32
}  // namespace
