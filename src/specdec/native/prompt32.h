// The prompt-reading product of the 32-weight block formats (q32.h's: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL; gemm
// mode bit 2; included by q32.h):
// y[k,N] = x[k,K] . W^T for the many rows of a prompt, with its own fixed arithmetic. The scoring kernels (mode 0)
// run their lanes over K (16 partial sums per output element, weights unpacked per call), which suits a few
// rows; here one output element is one float, the SIMD lanes run over output columns, and the weights are
// unpacked once per thread into column panels that every row reuses. Mode 3 (2 | 1) is the scalar reference.
//
// Definition, per output element (r, n), blocks b in order (acc = 0 first; y = acc):
//   a     = row r's int8 activations per 32-block, dx_rb their scale (q32::quantize_block: the scoring kernels'
//           quantizer, unchanged)
//   isum  = sum_i w_i * a_i over the block's 32 weights (w = B::ref_weights: Q8_0 q, Q5_0 code - 16, Q4_0 code - 8,
//           IQ4_NL its table value, Q4_1 / Q5_1 the code), exact int32: |isum| <= 32 * 128 * 127 = 520192 < 2^24,
//           so float(isum) is exact
//   S     = d_b * dx_rb                   (d_b: the block's fp16 scale as float32; one float32 multiply)
//   acc   = fma(float(isum), S, acc)      (one rounding)
//   B::MIN (Q4_1, Q5_1: w = d * code + m), then: sa = sum_i a_i (exact), M = m_b * dx_rb (one multiply),
//   acc   = fma(float(sa), M, acc)        (one rounding)
// Every op is one IEEE float32 operation on one (r, n): a row's result does not depend on the other rows, the row
// count, the thread count or the path. Paths (same bits, tested): AVX-512 VNNI, AVX2 (+ AVX-VNNI), scalar.
//
// How isum is obtained (same integer everywhere). u = w + BIAS is the block's unsigned code (B::codes32; Q8_0:
// q ^ 0x80 in 0..255 and IQ4_NL: value + 128 in 1..241, BIAS 128; Q5_0: the 5-bit code, BIAS 16; Q4_0: the 4-bit
// code, BIAS 8; Q4_1, Q5_1: the code, BIAS 0), so isum = sum u*a + off, off = -BIAS * sum a (per row and block,
// computed with the activations):
//   AVX-512 VNNI / AVX-VNNI: isum = off + dpbusd over the 8 dwords of 4 codes (u unsigned, a signed bytes; the
//     int32 sum never exceeds 32*255*127 + 128*32*127 in magnitude, dpbusd does not saturate).
//   AVX2, BIAS < 128 (codes <= 31): maddubs(u, a) pairs <= 2*31*127 = 7874; 4 of them added in int16 (<= 31496 <
//     32767), madd by ones to int32, plus off.
//   AVX2, BIAS 128 (Q8_0, IQ4_NL): the sign trick on q = u ^ 0x80 = w: maddubs(|q|, sign(a, q)), pairs <= 2*128*127
//     = 32512 (no saturation), madd by ones; no off.
//
// Layout. Activations: rows padded to a multiple of RB with zero rows (a = 0, dx = 0, off = 0: results dropped);
// a[kp][K/4] int32 (4 int8 codes each, natural order), dx[kp][nb], off[kp][nb], sa[kp][nb] (float). Weights:
// packed per thread into panels of 16 output columns n0..n0+15 (columns past N repeat N-1), per block PB<B> =
// 576 bytes: 8 rows of 64 bytes (row g, dword lane c = column c's codes u of weights 4g..4g+3: the dpbusd
// operand; an AVX2 ymm takes lanes 0..7 or 8..15), then d[16] float32 (B::MIN: then m[16] float32, 640 bytes).
// OpenMP static over panels; each panel is packed once and meets all rows. The rows' layout (Rows, quantize_rows)
// and the product of one packed panel (panel_product) serve panels32.h's wide product too (its panels converted
// into this packed layout).
#pragma once
#include "transpose.h"

namespace {
namespace q32 {
namespace prompt {

template <class B>
constexpr int PB = 8 * 64 + (B::MIN ? 128 : 64);  // panel bytes per block
const int RB = 8;                                 // rows per register block

#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)
// the 32 unsigned codes u of one block, natural order
template <class B>
inline __m256i codes(const uint8_t* blk) { return B::codes32(blk); }

// the first weight row of each of the panel's 16 columns (columns past N repeat N-1)
template <class B>
inline void column_rows(const uint8_t* W, int N, int nb, int n0, const uint8_t* row[16]) {
    for (int c = 0; c < 16; ++c) row[c] = W + (size_t)(n0 + c < N ? n0 + c : N - 1) * nb * B::BB;
}
#endif

#if defined(Q32_PATH_512)

// panel of columns n0..n0+15, all blocks, two blocks per transpose (zmm c = column c's codes of blocks b, b+1)
template <class B>
void pack_panel(const uint8_t* W, int N, int nb, int n0, uint8_t* panel) {
    const uint8_t* row[16];
    column_rows<B>(W, N, nb, n0, row);
    for (int b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        alignas(32) uint16_t h[2][16] = {}, hm[2][16] = {};
        __m512i r[16];
        for (int c = 0; c < 16; ++c) {
            const uint8_t* blk = row[c] + (size_t)b * B::BB;
            memcpy(&h[0][c], blk, 2);
            if (B::MIN) memcpy(&hm[0][c], blk + 2, 2);
            __m256i hi = _mm256_setzero_si256();
            if (two) {
                memcpy(&h[1][c], blk + B::BB, 2);
                if (B::MIN) memcpy(&hm[1][c], blk + B::BB + 2, 2);
                hi = codes<B>(blk + B::BB);
            }
            r[c] = _mm512_inserti64x4(_mm512_castsi256_si512(codes<B>(blk)), hi, 1);
        }
        transpose::transpose16(r);
        for (int t = 0; t <= two; ++t) {
            uint8_t* P = panel + (size_t)(b + t) * PB<B>;
            for (int g = 0; g < 8; ++g) _mm512_store_si512(P + 64 * g, r[8 * t + g]);
            _mm512_store_ps(P + 512, _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)h[t])));  // = h2f
            if (B::MIN) _mm512_store_ps(P + 576, _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)hm[t])));
        }
    }
}

// R rows (a with row stride as int32, dx, off and sa with row stride nb) x the 16 columns of one panel
template <class B, int R>
void rows(const uint8_t* panel, int nb, const int32_t* a, size_t as, const float* dx, const int32_t* off,
          const float* sa, float* out /* [R][16] */) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* P = panel + (size_t)b * PB<B>;
        __m512i s[R];
        for (int r = 0; r < R; ++r) s[r] = _mm512_set1_epi32(off[(size_t)r * nb + b]);
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
            const __m512i w = _mm512_load_si512(P + 64 * g);
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) s[r] = _mm512_dpbusd_epi32(s[r], w, _mm512_set1_epi32(a[r * as + 8 * b + g]));
        }
        const __m512 D = _mm512_load_ps((const float*)(P + 512));
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const __m512 X = _mm512_set1_ps(dx[(size_t)r * nb + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r]), _mm512_mul_ps(D, X), acc[r]);
            if constexpr (B::MIN)
                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sa[(size_t)r * nb + b]),
                                         _mm512_mul_ps(_mm512_load_ps((const float*)(P + 576)), X), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) _mm512_store_ps(out + 16 * r, acc[r]);
}

#elif defined(Q32_PATH_AVX2)

// panel of columns n0..n0+15, all blocks: per block and half t, an 8 x 8 transpose of columns 8t..8t+7
template <class B>
void pack_panel(const uint8_t* W, int N, int nb, int n0, uint8_t* panel) {
    const uint8_t* row[16];
    column_rows<B>(W, N, nb, n0, row);
    for (int b = 0; b < nb; ++b) {
        uint8_t* P = panel + (size_t)b * PB<B>;
        alignas(16) uint16_t h[16], hm[16];
        for (int t = 0; t < 2; ++t) {
            __m256i r[8];
            for (int c = 0; c < 8; ++c) {
                const uint8_t* blk = row[8 * t + c] + (size_t)b * B::BB;
                memcpy(&h[8 * t + c], blk, 2);
                if (B::MIN) memcpy(&hm[8 * t + c], blk + 2, 2);
                r[c] = codes<B>(blk);
            }
            transpose::transpose8(r);
            for (int g = 0; g < 8; ++g) _mm256_store_si256((__m256i*)(P + 64 * g + 32 * t), r[g]);
            _mm256_store_ps((float*)(P + 512) + 8 * t, _mm256_cvtph_ps(_mm_load_si128((const __m128i*)(h + 8 * t))));  // = h2f
            if (B::MIN)
                _mm256_store_ps((float*)(P + 576) + 8 * t, _mm256_cvtph_ps(_mm_load_si128((const __m128i*)(hm + 8 * t))));
        }
    }
}

// R rows x the 8 columns 8h..8h+7 of one panel
template <class B, int R>
void rows_half(const uint8_t* panel, int h, int nb, const int32_t* a, size_t as, const float* dx, const int32_t* off,
               const float* sa, float* out /* [R][16] */) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* P = panel + (size_t)b * PB<B> + 32 * h;
        const int32_t* ab = a + 8 * b;
        __m256i s[R];
#if defined(__AVXVNNI__)
        for (int r = 0; r < R; ++r) s[r] = _mm256_set1_epi32(off[(size_t)r * nb + b]);
        for (int g = 0; g < 8; ++g) {
            const __m256i w = _mm256_load_si256((const __m256i*)(P + 64 * g));
            for (int r = 0; r < R; ++r) s[r] = _mm256_dpbusd_avx_epi32(s[r], w, _mm256_set1_epi32(ab[r * as + g]));
        }
#else
        const __m256i ones = _mm256_set1_epi16(1);
        if constexpr (B::BIAS == 128) {  // Q8_0, IQ4_NL: sign trick on q = u ^ 0x80, no off
            for (int r = 0; r < R; ++r) s[r] = _mm256_setzero_si256();
#pragma GCC unroll 1  // (unrolled, GCC sums the 8 products of a row as a tree: all live at once, spilled)
            for (int g = 0; g < 8; ++g) {
                const __m256i q = _mm256_xor_si256(_mm256_load_si256((const __m256i*)(P + 64 * g)), _mm256_set1_epi8((char)0x80));
                const __m256i aq = _mm256_abs_epi8(q);
                for (int r = 0; r < R; ++r) {
                    const __m256i p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(_mm256_set1_epi32(ab[r * as + g]), q));
                    s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(p, ones));
                }
            }
        } else {  // codes <= 31: 4 maddubs summed in int16, madd, plus off
            for (int r = 0; r < R; ++r) s[r] = _mm256_set1_epi32(off[(size_t)r * nb + b]);
            for (int g0 = 0; g0 < 8; g0 += 4) {
                __m256i w[4];
                for (int j = 0; j < 4; ++j) w[j] = _mm256_load_si256((const __m256i*)(P + 64 * (g0 + j)));
                for (int r = 0; r < R; ++r) {
                    const int32_t* ar = ab + r * as + g0;
                    __m256i p = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(ar[0]));
                    for (int j = 1; j < 4; ++j) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[j], _mm256_set1_epi32(ar[j])));
                    s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(p, ones));
                }
            }
        }
#endif
        const float* Pd = (const float*)(panel + (size_t)b * PB<B> + 512) + 8 * h;
        const __m256 D = _mm256_load_ps(Pd);
        for (int r = 0; r < R; ++r) {
            const __m256 X = _mm256_set1_ps(dx[(size_t)r * nb + b]);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), _mm256_mul_ps(D, X), acc[r]);
            if constexpr (B::MIN)
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(sa[(size_t)r * nb + b]), _mm256_mul_ps(_mm256_load_ps(Pd + 16), X),
                                         acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + 16 * r + 8 * h, acc[r]);
}
#endif

// the scalar reference, straight from the blocks
template <class B>
void reference(const uint8_t* W, int N, int K, const int32_t* a, const float* dx, float* y, int k, int nthreads) {
    const int nb = K / QK;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n)
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = W + ((size_t)n * nb + b) * B::BB;
            int w[QK];
            B::ref_weights(blk, w);
            const float d = h2f(blk), m = B::MIN ? h2f(blk + 2) : 0.f;
            for (int r = 0; r < k; ++r) {
                const int8_t* ar = (const int8_t*)(a + (size_t)r * (K / 4)) + (size_t)b * QK;
                int32_t isum = 0, sa = 0;
                for (int i = 0; i < QK; ++i) { isum += w[i] * ar[i]; sa += ar[i]; }
                float& out = y[(size_t)r * N + n];
                out = fmaf((float)isum, d * dx[(size_t)r * nb + b], b ? out : 0.f);
                if (B::MIN) out = fmaf((float)sa, m * dx[(size_t)r * nb + b], out);
            }
        }
}

// The rows' activations in the layout above: a [kp][K/4] int32 (row stride as), dx, off, sa [kp][nb]; rows k..kp-1
// zero (kp = k rounded up to RB)
struct Rows {
    int32_t* a = nullptr;
    float* dx = nullptr;
    int32_t* off = nullptr;
    float* sa = nullptr;
    int k = 0, kp = 0, nb = 0;
    size_t as = 0;
    Rows() = default;
    Rows(const Rows&) = delete;             // owns a and dx (off and sa point into dx)
    Rows& operator=(const Rows&) = delete;
    ~Rows() { free(a); free(dx); }
};

// x [k][K] -> rows (off = -BIAS * the sum of a block's a); false when out of memory
template <int BIAS>
bool quantize_rows(const float* x, int k, int K, int nthreads, Rows& R) {
    const int nb = K / QK, kp = (k + RB - 1) / RB * RB;
    R.k = k; R.kp = kp; R.nb = nb; R.as = (size_t)K / 4;
    R.a = (int32_t*)aligned_alloc(64, ((size_t)kp * K + 63) / 64 * 64);
    R.dx = (float*)aligned_alloc(64, ((size_t)kp * nb * 12 + 63) / 64 * 64);  // dx, then off, then sa
    if (!R.a || !R.dx) return false;
    R.off = (int32_t*)(R.dx + (size_t)kp * nb);
    R.sa = R.dx + 2 * (size_t)kp * nb;
    memset(R.a + (size_t)k * R.as, 0, (size_t)(kp - k) * K);  // padding rows: a = 0, dx = 0, off = 0, sa = 0
    memset(R.dx + (size_t)k * nb, 0, 4 * (size_t)(kp - k) * nb);
    memset(R.off + (size_t)k * nb, 0, 4 * (size_t)(kp - k) * nb);
    memset(R.sa + (size_t)k * nb, 0, 4 * (size_t)(kp - k) * nb);
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int r = 0; r < k; ++r)
        for (int b = 0; b < nb; ++b) {
            int8_t* q = (int8_t*)(R.a + r * R.as + 8 * b);
            R.dx[(size_t)r * nb + b] = quantize_block(x + (size_t)r * K + (size_t)b * QK, q);
#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)  // sum of a = sum of the bytes a ^ 0x80 (sad) - 32 * 128
            const __m256i t = _mm256_sad_epu8(_mm256_xor_si256(_mm256_load_si256((const __m256i*)q),
                                                               _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
            const __m128i t2 = _mm_add_epi64(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            const int s = (int)(_mm_cvtsi128_si32(t2) + _mm_extract_epi32(t2, 2)) - QK * 128;
#else
            int s = 0;
            for (int i = 0; i < QK; ++i) s += q[i];
#endif
            R.off[(size_t)r * nb + b] = -BIAS * s;
            R.sa[(size_t)r * nb + b] = (float)s;  // |s| <= 32 * 127: exact
        }
    return true;
}

#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)
// every row x the packed panel of output columns 16p .. 16p + cols - 1 into y (row stride N)
template <class B>
void panel_product(const uint8_t* panel, const Rows& R, int p, int cols, float* y, int N) {
    alignas(64) float out[RB * 16];
    const int nb = R.nb;
    for (int r0 = 0; r0 < R.k; r0 += RB) {
        const int32_t* ar = R.a + r0 * R.as;
        const float* dr = R.dx + (size_t)r0 * nb;
        const int32_t* orr = R.off + (size_t)r0 * nb;
        const float* sr = R.sa + (size_t)r0 * nb;
        const int nr = R.k - r0 < RB ? R.k - r0 : RB;
#if defined(Q32_PATH_512)
        rows<B, RB>(panel, nb, ar, R.as, dr, orr, sr, out);
#else
        for (int h = 0; h < 2; ++h)
            for (int r = 0; r < nr; r += 4)   // (4 padding rows skipped)
                rows_half<B, 4>(panel, h, nb, ar + r * R.as, R.as, dr + (size_t)r * nb, orr + (size_t)r * nb,
                                sr + (size_t)r * nb, out + 16 * r);
#endif
        for (int r = 0; r < nr; ++r) memcpy(y + (size_t)(r0 + r) * N + 16 * p, out + 16 * r, sizeof(float) * cols);
    }
}
#endif

template <class B>
int gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    Rows R;
    if (!quantize_rows<B::BIAS>(x, k, K, nthreads, R)) return -2;
    const int nb = R.nb;
#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)
    if (!(mode & 1)) {
        const int np = (N + 15) / 16;
#pragma omp parallel num_threads(nthreads)
        {
            uint8_t* panel = (uint8_t*)aligned_alloc(64, (size_t)nb * PB<B>);
#pragma omp for schedule(static)
            for (int p = 0; p < np; ++p) {
                pack_panel<B>(W, N, nb, 16 * p, panel);
                panel_product<B>(panel, R, p, N - 16 * p < 16 ? N - 16 * p : 16, y, N);
            }
            free(panel);
        }
    } else
#endif
    {
        (void)mode;
        reference<B>(W, N, K, R.a, R.dx, y, k, nthreads);
    }
    return 0;
}

}  // namespace prompt
}  // namespace q32
}  // namespace
