// Batch-invariant Q5_0 x int8 GEMM, y[k,N] = x[k,K] . W[N,K]^T (any k; rows in groups of <= 16).
// W: raw GGUF block_q5_0 bytes (fp16 d, uint32 qh (little-endian), qs[16]; 22 bytes / 32 weights), row n = K/32
// blocks. ggml dequantize_row_q5_0: for j < 16: q_j = (qs[j] & 15) | ((qh >> j) & 1) << 4,
// q_{j+16} = (qs[j] >> 4) | ((qh >> (j+16)) & 1) << 4; w = d * (q - 16), q in 0..31.
// x: float32 [k,K], quantized per row per 32-block as ggml's quantize_row_q5_0_ref does:
//    amax = max|x|, dx = amax/127 (float32, kept as float32), id = dx ? 1/dx : 0, a = roundf(x*id) (half away
//    from zero; clamped to [-127,127], never hit). One portable scalar quantizer for every path.
//
// Lane layout: blocks go in groups of 4 (group g = blocks 4g..4g+3; a last partial group is padded with
// zero blocks: d = 0, q = 0, a = 0, dx = 0). 16 lanes j = 4l + i: block b = 4g + l, dword i.
// Per output element (r, n), per group g in order, per lane j:
//   D_j = sum_{e<4} (q[4i+e]-16)*a[4i+e] + (q[16+4i+e]-16)*a[16+4i+e]   (exact int32, |D| <= 8*16*127 = 16256)
//   S_j = d_b * dx_{r,b}                                                 (float32 mul, rounded)
//   acc_j = fma(float(D_j), S_j, acc_j)                                  (float(D) exact; one rounding)
// y = fixed-tree horizontal sum of the 16 lanes (v[i]+v[i+8], +4, then (0+2)+(1+3)).
// How D_j is obtained differs per path but it is the same integer: unsigned codes u = q (0..31), unpacked once
// per group and shared by all rows; C_j = -16 * (sum of lane j's 8 activations), stored in the row's record;
//   AVX-512 VNNI / AVX-VNNI: D = dpbusd(dpbusd(C_j, UX, AX), UY, AY)
//   AVX2: D = madd(maddubs(UX, AX) + maddubs(UY, AY), 1) + C_j   (|int16| <= 2*2*31*127 = 15748: no saturation)
//   scalar (also the reference, mode 1): the formula above, lane by lane.
// Records per (group, row), 256 bytes, group-major ([ng][k]): [0,64) AX (lane l = a[b][0:16]),
// [64,128) AY (a[b][16:32]), [128,192) C int32[16], [192,256) dx float[16] (lane j: dx of its block).
// One template per row count 1..16 (weights unpacked once per group of rows), OpenMP static over N,
// -ffp-contract=off: nothing depends on k, on the row's position or on the thread count.
// Paths: AVX-512 (F, BW, VL, VNNI, VBMI: vpermt2b gathers 4 blocks, vptestmb for the 5th bits), else
// AVX2 + FMA + F16C (+ AVX-VNNI), else scalar; all bit-identical. Software prefetch PF_DIST bytes ahead. No AMX.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#include <omp.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__)
#define Q5_PATH_512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define Q5_PATH_AVX2 1
#endif

namespace {
const int QK = 32;
const int BB = 22;          // bytes per block_q5_0
const int GB = 4 * BB;      // bytes per group of 4 blocks
const int REC = 256;        // record bytes per (group, row)
const int BIAS = 16;        // C_j = -BIAS * sum(a)
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

// codes q (0..31) of one block, straight from ggml's dequantize_row_q5_0
inline void decode_codes(const uint8_t* blk, int q[QK]) {
    const uint32_t qh = (uint32_t)blk[2] | ((uint32_t)blk[3] << 8) | ((uint32_t)blk[4] << 16) | ((uint32_t)blk[5] << 24);
    const uint8_t* qs = blk + 6;
    for (int j = 0; j < QK / 2; ++j) {
        q[j] = (qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4);
        q[j + QK / 2] = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
    }
}

inline float hsum16_ref(const float* v) {
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i) a[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; ++i) b[i] = a[i] + a[i + 4];
    c[0] = b[0] + b[2]; c[1] = b[1] + b[3];
    return c[0] + c[1];
}

// one 32-block of x (finite values): q = roundf(x * id) (half away from zero) written as trunc + exact fraction
// test (v - trunc(v) is exact for |v| < 2^23), clamped to [-127,127]; returns dx = amax/127. The vector
// versions do the same IEEE operations on the same operands, so every build gives the same bits.
inline float quantize_block(const float* xs, int8_t* q) {
#if defined(Q5_PATH_512)
    const __m512 x0 = _mm512_loadu_ps(xs), x1 = _mm512_loadu_ps(xs + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
#elif defined(Q5_PATH_AVX2)
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
#if defined(Q5_PATH_512)
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
#elif defined(Q5_PATH_AVX2)
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
                C[4 * l + i] = -BIAS * s;
                DX[4 * l + i] = d;
            }
        }
        memcpy(rec + 128, C, 64);
        memcpy(rec + 192, DX, 64);
    }
}

// ---------------- scalar path and reference (mode 1): the lane formula, lane by lane ----------------
void kernel_ref(const uint8_t* W, int N, int K, const uint8_t* rec, int k, float* y, int nthreads) {
    const int nb = K / QK, ng = (nb + 3) / 4;
    const size_t rowbytes = (size_t)nb * BB;
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
                    const uint8_t* blk = wr + (size_t)b * BB;
                    float dw = 0.f;                        // padded block: d = 0, D = 0
                    int q[QK];
                    if (b < nb) {
                        decode_codes(blk, q);
                        dw = h2f(blk);
                    }
                    for (int i = 0; i < 4; ++i) {
                        int32_t D = 0;
                        if (b < nb)
                            for (int e = 0; e < 4; ++e)
                                D += (q[4 * i + e] - 16) * AX[16 * l + 4 * i + e] + (q[16 + 4 * i + e] - 16) * AY[16 * l + 4 * i + e];
                        const float S = dw * DX[4 * l + i];
                        acc[4 * l + i] = fmaf((float)D, S, acc[4 * l + i]);
                    }
                }
            }
            y[(size_t)r * N + n] = hsum16_ref(acc);
        }
}

#if defined(Q5_PATH_512)
alignas(64) uint8_t IQ[64], IHX[64], IHY[64], ID[64], BITS[64];
int init_idx() {
    for (int l = 0; l < 4; ++l)
        for (int e = 0; e < 16; ++e) {
            IQ[16 * l + e] = (uint8_t)(BB * l + 6 + e);       // qs
            IHX[16 * l + e] = (uint8_t)(BB * l + 2 + e / 8);  // qh byte holding bit e
            IHY[16 * l + e] = (uint8_t)(BB * l + 4 + e / 8);  // qh byte holding bit 16 + e
            BITS[16 * l + e] = (uint8_t)(1u << (e % 8));
        }
    for (int j = 0; j < 16; ++j) { ID[2 * j] = (uint8_t)(BB * (j / 4)); ID[2 * j + 1] = (uint8_t)(BB * (j / 4) + 1); }
    for (int j = 32; j < 64; ++j) ID[j] = 0;
    return 0;
}
int idx_dummy = init_idx();

inline float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 e = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(e);
}

template <int R>
void kernel_rows(const uint8_t* W, int N, int K, const uint8_t* rec, int r0, int kall, float* y, int nthreads) {
    const int nb = K / QK, ngf = nb / 4, tail = nb % 4;
    const size_t rowbytes = (size_t)nb * BB;
    const uint8_t* RB = rec + (size_t)r0 * REC;
    const size_t gst = (size_t)kall * REC;
    const int pfd = PF_DIST;
    const __m512i iq = _mm512_load_si512(IQ), ihx = _mm512_load_si512(IHX), ihy = _mm512_load_si512(IHY);
    const __m512i id = _mm512_load_si512(ID), bits = _mm512_load_si512(BITS);

#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        const __m512i m4 = _mm512_set1_epi8(0x0F), b16 = _mm512_set1_epi8(0x10);
        alignas(64) uint8_t buf[GB];
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        const int ng = ngf + (tail > 0);
        for (int g = 0; g < ng; ++g) {
            const uint8_t* p = wr + (size_t)g * GB;
            if (g == ngf) {  // partial last group: zero-padded copy
                memset(buf, 0, GB);
                memcpy(buf, p, (size_t)tail * BB);
                p = buf;
            } else if (pfd) {
                const char* pp = (const char*)p + pfd;
                _mm_prefetch(pp, _MM_HINT_T0); _mm_prefetch(pp + 64, _MM_HINT_T0);
            }
            const __m512i R0 = _mm512_loadu_si512(p), R1 = _mm512_maskz_loadu_epi8(0xFFFFFFull, p + 64);  // 88 bytes
            const __m512i Q = _mm512_permutex2var_epi8(R0, iq, R1);
            const __mmask64 kx = _mm512_test_epi8_mask(_mm512_permutex2var_epi8(R0, ihx, R1), bits);
            const __mmask64 ky = _mm512_test_epi8_mask(_mm512_permutex2var_epi8(R0, ihy, R1), bits);
            const __m512i lo = _mm512_and_si512(Q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(Q, 4), m4);
            const __m512i UX = _mm512_mask_add_epi8(lo, kx, lo, b16);   // | bit 4 (lo < 16: add == or)
            const __m512i UY = _mm512_mask_add_epi8(hi, ky, hi, b16);
            const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(R0, id, R1)));
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                const uint8_t* rr = RB + g * gst + r * REC;
                __m512i D = _mm512_load_si512(rr + 128);
                D = _mm512_dpbusd_epi32(D, UX, _mm512_load_si512(rr));
                D = _mm512_dpbusd_epi32(D, UY, _mm512_load_si512(rr + 64));
                const __m512 S = _mm512_mul_ps(dw, _mm512_load_ps((const float*)(rr + 192)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D), S, acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) y[(size_t)(r0 + r) * N + n] = hsum16(acc[r]);
    }
}
const char* ISA_NAME = "avx512-vnni";

#elif defined(Q5_PATH_AVX2)
inline __m128i ld128(const uint8_t* p) { return _mm_loadu_si128((const __m128i*)p); }
// 32 bits -> 32 bytes 0xFF / 0x00 (byte e = bit e), as ggml's bytes_from_bits_32
inline __m256i bytes_from_bits_32(uint32_t x) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}
inline float hsum16(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 e = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(e);
}

template <int R>
void kernel_rows(const uint8_t* W, int N, int K, const uint8_t* rec, int r0, int kall, float* y, int nthreads) {
    const int nb = K / QK, ngf = nb / 4, tail = nb % 4;
    const size_t rowbytes = (size_t)nb * BB;
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
            const uint8_t* p = wr + (size_t)g * GB;
            if (g == ngf) {
                memset(buf, 0, GB);
                memcpy(buf, p, (size_t)tail * BB);
                p = buf;
            } else if (pfd) {
                const char* pp = (const char*)p + pfd;
                _mm_prefetch(pp, _MM_HINT_T0); _mm_prefetch(pp + 64, _MM_HINT_T0);
            }
            for (int h = 0; h < 2; ++h) {     // lanes 8h..8h+7 = blocks 2h, 2h+1 of the group
                const uint8_t* b0 = p + (2 * h) * BB;
                const uint8_t* b1 = b0 + BB;
                const __m256i Q = _mm256_set_m128i(ld128(b1 + 6), ld128(b0 + 6));
                uint32_t q0, q1;
                memcpy(&q0, b0 + 2, 4); memcpy(&q1, b1 + 2, 4);
                const __m256i m4 = _mm256_set1_epi8(0x0F), b16 = _mm256_set1_epi8(0x10);
                // byte e of XB: bit e of (qh0 low 16 | qh1 low 16 << 16) -> 0x10 (lanes: block 0, block 1)
                const __m256i HX = _mm256_and_si256(bytes_from_bits_32((q0 & 0xFFFFu) | (q1 << 16)), b16);
                const __m256i HY = _mm256_and_si256(bytes_from_bits_32((q0 >> 16) | (q1 & 0xFFFF0000u)), b16);
                const __m256i UX = _mm256_or_si256(_mm256_and_si256(Q, m4), HX);
                const __m256i UY = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(Q, 4), m4), HY);
                uint16_t h0, h1;
                memcpy(&h0, b0, 2); memcpy(&h1, b1, 2);
                const __m256 dw = _mm256_set_m128(_mm_set1_ps(_cvtsh_ss(h1)), _mm_set1_ps(_cvtsh_ss(h0)));
#if !defined(__AVXVNNI__)
                const __m256i ones = _mm256_set1_epi16(1);
#endif
                for (int r = 0; r < R; ++r) {
                    const uint8_t* rr = RB + g * gst + r * REC;
                    const __m256i AX = _mm256_load_si256((const __m256i*)(rr + 32 * h));
                    const __m256i AY = _mm256_load_si256((const __m256i*)(rr + 64 + 32 * h));
#if defined(__AVXVNNI__)
                    __m256i D = _mm256_load_si256((const __m256i*)(rr + 128 + 32 * h));
                    D = _mm256_dpbusd_avx_epi32(D, UX, AX);
                    D = _mm256_dpbusd_avx_epi32(D, UY, AY);
#else
                    const __m256i P = _mm256_add_epi16(_mm256_maddubs_epi16(UX, AX), _mm256_maddubs_epi16(UY, AY));
                    const __m256i D = _mm256_add_epi32(_mm256_madd_epi16(P, ones),
                                                       _mm256_load_si256((const __m256i*)(rr + 128 + 32 * h)));
#endif
                    const __m256 S = _mm256_mul_ps(dw, _mm256_load_ps((const float*)(rr + 192 + 32 * h)));
                    acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D), S, acc[r][h]);
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

#if defined(Q5_PATH_512) || defined(Q5_PATH_AVX2)
typedef void (*kfn)(const uint8_t*, int, int, const uint8_t*, int, int, float*, int);
kfn KTAB[17] = {nullptr,
    kernel_rows<1>, kernel_rows<2>, kernel_rows<3>, kernel_rows<4>, kernel_rows<5>, kernel_rows<6>,
    kernel_rows<7>, kernel_rows<8>, kernel_rows<9>, kernel_rows<10>, kernel_rows<11>, kernel_rows<12>,
    kernel_rows<13>, kernel_rows<14>, kernel_rows<15>, kernel_rows<16>};
#endif

uint8_t* make_records(const float* x, int k, int K) {
    const int ng = (K / QK + 3) / 4;
    uint8_t* rec = (uint8_t*)aligned_alloc(64, (size_t)k * ng * REC);
    for (int r = 0; r < k; ++r)
        quantize_row(x + (size_t)r * K, K, rec + (size_t)r * REC, (size_t)k * REC, nullptr, nullptr);
    return rec;
}
}  // namespace

extern "C" {
const char* q5_0_isa(void) { return ISA_NAME; }
void q5_0_set_prefetch(int dist) { PF_DIST = dist; }
// y[k,N] = x[k,K] . W^T ; mode 0 = best compiled path, 1 = scalar reference (same bits)
int q5_0_gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    if (K <= 0 || K % QK) return -1;
    if (k <= 0 || N <= 0) return 0;
    if (nthreads < 1) nthreads = omp_get_max_threads();
    uint8_t* rec = make_records(x, k, K);
#if defined(Q5_PATH_512) || defined(Q5_PATH_AVX2)
    if (mode != 1) {
        for (int r0 = 0; r0 < k; r0 += 16) {
            const int R = k - r0 < 16 ? k - r0 : 16;
            KTAB[R](W, N, K, rec, r0, k, y, nthreads);
        }
        free(rec);
        return 0;
    }
#endif
    (void)mode;
    kernel_ref(W, N, K, rec, k, y, nthreads);
    free(rec);
    return 0;
}
// float32 weights d * (q - 16), bit for bit gguf.quants.dequantize
void q5_0_dequant(const uint8_t* W, int N, int K, float* out) {
    const int nb = K / QK;
    for (size_t n = 0; n < (size_t)N; ++n)
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = W + (n * nb + b) * BB;
            const float d = h2f(blk);
            int q[QK];
            decode_codes(blk, q);
            float* o = out + n * K + (size_t)b * QK;
            for (int j = 0; j < QK; ++j) o[j] = d * (float)(q[j] - 16);
        }
}
// the kernel's int8 activations a[k,K] (natural order) and scales dx[k, K/32]
void q5_0_quant_x(const float* x, int k, int K, int8_t* a, float* dx) {
    const int nb = K / QK, ng = (nb + 3) / 4;
    uint8_t* rec = (uint8_t*)aligned_alloc(64, (size_t)(ng > 0 ? ng : 1) * REC);
    for (int r = 0; r < k; ++r) quantize_row(x + (size_t)r * K, K, rec, REC, a + (size_t)r * K, dx + (size_t)r * nb);
    free(rec);
}
}
