// The prompt-reading product of the K-quant formats (included by q4k.cpp and q6k.cpp): y[k,N] = x[k,K] . W^T
// for the many rows of a prompt, with its own fixed arithmetic (gemm mode bit 2). The scoring kernels (mode 0)
// keep 16 partial sums per output element, which suits a few rows; here one output element is one float and the
// 16 SIMD lanes run over 16 output columns, so the float work per weight block is spread over 16 columns and the
// integer dot products broadcast one activation word over 16 columns. A model reads every prompt this way and scores every token
// (decoding, verification) with mode 0, in plain and speculative decoding alike, so both see the same numbers.
//
// Definition, per output element (r, n), blocks b in order (acc = 0 first; y = acc):
//   a    = row r's int8 quantization per 256-block (the scoring kernels' quantizer: d = amax/127, RNE, clamp)
//   v    = 0;  for each sub-block j in order:  v = fma(float(isum_j), dsc_j, v)
//          isum_j = sum over j's weights of u_i * a_i  -  OFF * sum of its a_i     (exact int32; u = the stored
//          unsigned code, OFF = F::OFF: 0 for Q4_K, 32 for Q6_K);  dsc_j = d_b * sc_j  (float32 product)
//   Q4_K: v = fma(-float(M), dmin_b, v),  M = sum_j m_j * (sum of sub-block j's a_i)   (exact int32)
//   acc  = fma(v, dx_rb, acc)
// Every op is a single IEEE float32 operation on one (r, n): a row's result does not depend on the other rows,
// the row count, the thread count or the path. Paths (same bits, tested): AVX-512 VNNI (vpdpbusd, one zmm = 16
// output columns, 8 rows per register block), AVX2 (prompt_avx2.h) and the scalar reference (mode bit 1).
// Mode bits: 1 reference, 2 this product.
// (AMX was tried: tdpbsud itself is ~10x the VNNI rate here, but every sub-block's 16 x 16 sums must leave the
// tile for their float scale, and that made it slower than the VNNI path; scales folded into the weights would
// avoid it, at the price of another arithmetic.)
//
// Layout: activation rows padded to a multiple of 16 (zero rows); per row a[K] int8 (natural order), dx[nb],
// ext[nb][16] int32 (F::extra: what the format's tail needs from the 16-weight sums of a). Weights are packed per
// thread into panels of 16 output columns, per block: 64 rows of 64 bytes (row g, lane c = column c's codes of
// weights 4g..4g+3: the dpbusd / tdpbsud operand), then dsc[NSUB][16] floats, then the format's extra.
#pragma once

namespace prompt {

const int WQ = 4096;  // packed codes per block and panel (256 weights x 16 columns)

// one row's activations: a (natural order), dx per block, s16[nb*16] = sums of each 16 a's
inline void quant_row(const float* x, int K, int8_t* a, float* dx, int32_t* s16) {
    const int nb = K / QK;
    for (int b = 0; b < nb; ++b) {
        const float* xs = x + (size_t)b * QK;
        int8_t* q = a + (size_t)b * QK;
#if defined(KQ_AVX512)
        const float amax = block_amax(xs);
        float d = amax / 127.f;
        if (amax == 0.f) { memset(q, 0, QK); d = 0.f; }
        else {
            const __m512 is = _mm512_set1_ps(127.f / amax);
            const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
            for (int i = 0; i < QK; i += 16) {
                __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + i), is));
                _mm_storeu_si128((__m128i*)(q + i), _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(v, lo), hi)));
            }
        }
#else
        alignas(32) int32_t qi[QK];
        const float d = quantize_block_qi(xs, qi);
        for (int i = 0; i < QK; ++i) q[i] = (int8_t)qi[i];
#endif
        dx[b] = d;
        for (int g = 0; g < 16; ++g) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += q[16 * g + i];
            s16[16 * b + g] = s;
        }
    }
}

// the scalar reference, straight from the blocks (F::decode gives codes, scales and the block's d / dmin)
template <class F>
void reference(const uint8_t* W, int N, int K, const int8_t* a, const float* dx, float* y, int k) {
    const int nb = K / QK;
    for (int n = 0; n < N; ++n)
        for (int b = 0; b < nb; ++b) {
            uint8_t u[QK]; float dsc[F::NSUB]; int mn[8]; float dmin;
            F::decode(W + ((size_t)n * nb + b) * F::BB, u, dsc, mn, &dmin);
            for (int r = 0; r < k; ++r) {
                const int8_t* ar = a + (size_t)r * K + (size_t)b * QK;
                float v = 0.f;
                int m = 0;
                for (int j = 0; j < F::NSUB; ++j) {
                    int s = 0, t = 0;
                    for (int i = 0; i < F::SUB; ++i) { s += u[F::SUB * j + i] * ar[F::SUB * j + i]; t += ar[F::SUB * j + i]; }
                    v = fmaf((float)(s - F::OFF * t), dsc[j], v);
                    if (F::HAS_MIN) m += mn[j] * t;
                }
                if (F::HAS_MIN) v = fmaf(-(float)m, dmin, v);
                float& out = y[(size_t)r * N + n];
                out = fmaf(v, dx[(size_t)r * nb + b], b ? out : 0.f);
            }
        }
}

#if defined(KQ_AVX512)
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

// panel of output columns n0..n0+15 (columns past N repeat column N-1), all blocks
template <class F>
void pack_panel(const uint8_t* W, int N, int nb, int n0, uint8_t* panel) {
    alignas(64) uint8_t U[16][QK];
    alignas(64) float dsc[F::NSUB][16];
    alignas(64) int32_t extra[F::EXTRA / 4];
    for (int b = 0; b < nb; ++b) {
        uint8_t* P = panel + (size_t)b * F::PB;
        for (int c = 0; c < 16; ++c) {
            const int n = n0 + c < N ? n0 + c : N - 1;
            const uint8_t* blk = W + ((size_t)n * nb + b) * F::BB;
            F::unpack(blk, U[c]);
            F::scales(blk, c, dsc, extra);
        }
        for (int z = 0; z < 4; ++z) {
            __m512i r[16];
            for (int c = 0; c < 16; ++c) r[c] = _mm512_load_si512(U[c] + 64 * z);
            transpose16(r);
            for (int d = 0; d < 16; ++d) _mm512_store_si512(P + 64 * (16 * z + d), r[d]);
        }
        memcpy(P + WQ, dsc, sizeof dsc);
        if (F::EXTRA) memcpy(P + WQ + sizeof dsc, extra, F::EXTRA);
    }
}

// AVX-512 VNNI: R rows (of a, dx, ext with the given row strides) x the 16 columns of one panel
template <class F, int R>
void rows_avx512(const uint8_t* panel, int nb, int K, const int8_t* a, const float* dx, const int32_t* ext,
                 float* out /* [R][16] */) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* P = panel + (size_t)b * F::PB;
        const int32_t* eb = ext + 16 * b;
        __m512 v[R];
        for (int r = 0; r < R; ++r) v[r] = _mm512_setzero_ps();
        for (int j = 0; j < F::NSUB; ++j) {
            __m512i s[R];
            for (int r = 0; r < R; ++r) s[r] = F::OFF ? _mm512_set1_epi32(-eb[(size_t)r * 16 * nb + j]) : _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int g = 0; g < F::SUB / 4; ++g) {
                const __m512i w = _mm512_load_si512(P + 64 * (F::SUB / 4 * j + g));
                const int off = b * QK + F::SUB * j + 4 * g;
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r)
                    s[r] = _mm512_dpbusd_epi32(s[r], w, _mm512_set1_epi32(*(const int32_t*)(a + (size_t)r * K + off)));
            }
            const __m512 D = _mm512_load_ps((const float*)(P + WQ) + 16 * j);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) v[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r]), D, v[r]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            v[r] = F::tail(P, eb + (size_t)r * 16 * nb, v[r]);
            acc[r] = _mm512_fmadd_ps(v[r], _mm512_set1_ps(dx[(size_t)r * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) _mm512_store_ps(out + 16 * r, acc[r]);
}

#endif  // KQ_AVX512

#if defined(KQ_AVX2)
}  // namespace prompt
#include "prompt_avx2.h"   // prompt::product_avx2<F>: the AVX2 path (same bits)
namespace prompt {
#endif

template <class F>
int gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    if (K % QK || k < 0 || N < 0) return -1;
    if (k == 0 || N == 0) return 0;
    const int nb = K / QK, kp = (k + 15) / 16 * 16;
    int8_t* a = (int8_t*)aligned_alloc(64, (size_t)kp * K);
    float* dx = (float*)aligned_alloc(64, ((size_t)kp * nb * 4 + 63) / 64 * 64);
    int32_t* ext = (int32_t*)aligned_alloc(64, (size_t)kp * nb * 64);
    if (!a || !dx || !ext) { free(a); free(dx); free(ext); return -2; }
    for (int r = 0; r < k; ++r) {
        int32_t* e = ext + (size_t)r * nb * 16;
        quant_row(x + (size_t)r * K, K, a + (size_t)r * K, dx + (size_t)r * nb, e);
        for (int b = 0; b < nb; ++b) F::extra(e + 16 * b);
    }
    memset(a + (size_t)k * K, 0, (size_t)(kp - k) * K);
    memset(dx + (size_t)k * nb, 0, sizeof(float) * (size_t)(kp - k) * nb);
    memset(ext + (size_t)k * nb * 16, 0, sizeof(int32_t) * (size_t)(kp - k) * nb * 16);
#if defined(KQ_AVX512)
    if (!(mode & 1)) {
        const int np = (N + 15) / 16;
#pragma omp parallel num_threads(nthreads)
        {
            uint8_t* panel = (uint8_t*)aligned_alloc(64, (size_t)nb * F::PB);
            alignas(64) float out[16 * 16];
#pragma omp for schedule(static)
            for (int p = 0; p < np; ++p) {
                pack_panel<F>(W, N, nb, 16 * p, panel);
                const int cols = N - 16 * p < 16 ? N - 16 * p : 16;
                for (int r0 = 0; r0 < k; r0 += 16) {
                    const int8_t* ar = a + (size_t)r0 * K;
                    const float* dr = dx + (size_t)r0 * nb;
                    const int32_t* er = ext + (size_t)r0 * nb * 16;
                    rows_avx512<F, 8>(panel, nb, K, ar, dr, er, out);
                    rows_avx512<F, 8>(panel, nb, K, ar + (size_t)8 * K, dr + 8 * nb, er + (size_t)8 * nb * 16, out + 128);
                    const int rows = k - r0 < 16 ? k - r0 : 16;
                    for (int r = 0; r < rows; ++r) memcpy(y + (size_t)(r0 + r) * N + 16 * p, out + 16 * r, sizeof(float) * cols);
                }
            }
            free(panel);
        }
    } else
#elif defined(KQ_AVX2)
    if (!(mode & 1)) product_avx2<F>(W, N, K, a, dx, ext, y, k, nthreads);
    else
#endif
    {
        (void)mode; (void)nthreads;
        reference<F>(W, N, K, a, dx, y, k);
    }
    free(a); free(dx); free(ext);
    return 0;
}

}  // namespace prompt
