// A study of the scoring kernels' shape (issue 27, "rows at the machine's rate"): Q4_K weights repacked at load
// into groups of 16 output rows ("columns" below: the 16 lanes of a zmm are 16 output elements), against the
// shipped layout (src/specdec/native/q4k.cpp: the 16 lanes of a zmm are the 8 sub-blocks' scale and min terms of
// ONE output element, summed by a horizontal add at the end).
//
// Why: in the shipped shape every (activation row, weight block) pair costs 4 vpdpbusd plus ~10 other vector
// ops (packs, vpdpwssd, convert, multiply, 2 loads, fma, fnmadd): the float work per block is done per output
// element. Here one zmm holds 16 output elements, so that work is shared by 16 of them, and the integer dot of
// a sub-block is 8 vpdpbusd with the activations broadcast from memory ({1to16}), 4 weights x 16 columns each.
//
// Layout of one group-block (16 rows g*16..g*16+15, one 256-weight block b), GB = 2368 bytes:
//   [0, 32)     d    fp16[16]           [32, 64)  dmin fp16[16]
//   [64, 192)   sc   u8[8 sub-blocks][16 columns]
//   [192, 320)  m    u8[8][16]
//   [320, 2368) qs   32 zmm: zmm 4s+i, column c, byte 4c+e: low nibble = q[s][4i+e], high nibble = q[s][16+4i+e]
// Per output element (r, n), fixed whatever the rows in the call and the threads:
//   for each block b in order:
//     I   = sum over s of sc_s * S_s, S_s = sum_i dpbusd(q[s][4i..4i+3], a[32s+4i..]) (int32, exact)
//     M   = sum over s of m_s * bsum_s                                                  (int32, exact)
//     acc = fma(float(I), d * dx, acc);  acc = fnmadd(float(M), dmin * dx, acc)
//   y = acc (no horizontal sum)
// With -DR16_PROMPT_STEPS the float steps are the prompt product's (src/specdec/native/prompt.h):
//     v = float(I) * d;  v = fnmadd(float(M), dmin, v);  acc = fma(v, dx, acc)
// and the result is bit for bit the prompt product's (study.py --prompt-steps checks it): the few-row shape and
// the panel product can then be one arithmetic.
// Activations: per row per 256-block int8 a (natural order), dx = amax/127 (float), bsum_s int16 per sub-block.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

namespace {
const int QK = 256, BB = 144, GB = 2368;

inline void scales(const uint8_t* q, uint8_t sc[8], uint8_t m[8]) {  // ggml's get_scale_min_k4
    for (int j = 0; j < 8; ++j) {
        if (j < 4) { sc[j] = q[j] & 63; m[j] = q[j + 4] & 63; }
        else {
            sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
}

template <int R>
void rows(const uint8_t* P, int N, int K, const int8_t* A, const float* DX, const int16_t* BS, int r0, float* y,
          int nthreads) {
    const int nb = K / QK, groups = N / 16;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int g = 0; g < groups; ++g) {
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            const uint8_t* gb = P + ((size_t)g * nb + b) * GB;
            __m512i I[R];
            for (int r = 0; r < R; ++r) I[r] = _mm512_setzero_si512();
            for (int s = 0; s < 8; ++s) {
                const __m512i SC = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(gb + 64 + 16 * s)));
                __m512i W[8];
                for (int i = 0; i < 4; ++i) {
                    const __m512i z = _mm512_loadu_si512(gb + 320 + 64 * (4 * s + i));
                    W[i] = _mm512_and_si512(z, m4);
                    W[4 + i] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
                }
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    const int8_t* a = A + (size_t)(r0 + r) * K + b * QK + 32 * s;
                    __m512i S = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[0], _mm512_set1_epi32(*(const int*)a));
                    S = _mm512_dpbusd_epi32(S, W[1], _mm512_set1_epi32(*(const int*)(a + 4)));
                    S = _mm512_dpbusd_epi32(S, W[2], _mm512_set1_epi32(*(const int*)(a + 8)));
                    S = _mm512_dpbusd_epi32(S, W[3], _mm512_set1_epi32(*(const int*)(a + 12)));
                    S = _mm512_dpbusd_epi32(S, W[4], _mm512_set1_epi32(*(const int*)(a + 16)));
                    S = _mm512_dpbusd_epi32(S, W[5], _mm512_set1_epi32(*(const int*)(a + 20)));
                    S = _mm512_dpbusd_epi32(S, W[6], _mm512_set1_epi32(*(const int*)(a + 24)));
                    S = _mm512_dpbusd_epi32(S, W[7], _mm512_set1_epi32(*(const int*)(a + 28)));
                    I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(S, SC));
                }
            }
            __m512i MP[4];  // per column: m_{2p} | m_{2p+1} << 16, the int16 pairs of vpdpwssd
            for (int p = 0; p < 4; ++p)
                MP[p] = _mm512_or_si512(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(gb + 192 + 32 * p))),
                    _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(gb + 208 + 32 * p))), 16));
            const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)gb));
            const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(gb + 32)));
            for (int r = 0; r < R; ++r) {
                const int16_t* bs = BS + ((size_t)(r0 + r) * nb + b) * 8;
                __m512i M = _mm512_dpwssd_epi32(_mm512_setzero_si512(), MP[0], _mm512_set1_epi32(*(const int*)bs));
                M = _mm512_dpwssd_epi32(M, MP[1], _mm512_set1_epi32(*(const int*)(bs + 2)));
                M = _mm512_dpwssd_epi32(M, MP[2], _mm512_set1_epi32(*(const int*)(bs + 4)));
                M = _mm512_dpwssd_epi32(M, MP[3], _mm512_set1_epi32(*(const int*)(bs + 6)));
                const __m512 x = _mm512_set1_ps(DX[(size_t)(r0 + r) * nb + b]);
#if defined(R16_PROMPT_STEPS)
                const __m512 v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), mv, _mm512_mul_ps(_mm512_cvtepi32_ps(I[r]), dv));
                acc[r] = _mm512_fmadd_ps(v, x, acc[r]);
#else
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(dv, x), acc[r]);
                acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(mv, x), acc[r]);
#endif
            }
        }
        for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (size_t)(r0 + r) * N + 16 * g, acc[r]);
    }
}

typedef void (*rows_fn)(const uint8_t*, int, int, const int8_t*, const float*, const int16_t*, int, float*, int);
const rows_fn TAB[9] = {nullptr, rows<1>, rows<2>, rows<3>, rows<4>, rows<5>, rows<6>, rows<7>, rows<8>};
}  // namespace

extern "C" {
// W: N rows of K/256 block_q4_K (N % 16 == 0) -> out: (N/16) * (K/256) group-blocks of GB bytes
void r16_pack(const uint8_t* W, int N, int K, uint8_t* out) {
    const int nb = K / QK;
    for (int g = 0; g < N / 16; ++g)
        for (int b = 0; b < nb; ++b) {
            uint8_t* gb = out + ((size_t)g * nb + b) * GB;
            for (int c = 0; c < 16; ++c) {
                const uint8_t* blk = W + ((size_t)(16 * g + c) * nb + b) * BB;
                memcpy(gb + 2 * c, blk, 2);
                memcpy(gb + 32 + 2 * c, blk + 2, 2);
                uint8_t sc[8], m[8];
                scales(blk + 4, sc, m);
                uint8_t q[256];
                for (int j = 0; j < 4; ++j)
                    for (int l = 0; l < 32; ++l) {
                        q[64 * j + l] = blk[16 + 32 * j + l] & 0xF;
                        q[64 * j + 32 + l] = blk[16 + 32 * j + l] >> 4;
                    }
                for (int s = 0; s < 8; ++s) {
                    gb[64 + 16 * s + c] = sc[s];
                    gb[192 + 16 * s + c] = m[s];
                    for (int i = 0; i < 4; ++i)
                        for (int e = 0; e < 4; ++e)
                            gb[320 + 64 * (4 * s + i) + 4 * c + e] =
                                (uint8_t)(q[32 * s + 4 * i + e] | (q[32 * s + 16 + 4 * i + e] << 4));
                }
            }
        }
}

// x float32 [k, K] -> A int8 [k, K], DX [k, nb], BS int16 [k, nb, 8] (the shipped quantizer's rule)
void r16_quantize(const float* x, int k, int K, int8_t* A, float* DX, int16_t* BS) {
    const int nb = K / QK;
    for (int r = 0; r < k; ++r)
        for (int b = 0; b < nb; ++b) {
            const float* xs = x + (size_t)r * K + b * QK;
            float amax = 0.f;
            for (int j = 0; j < QK; ++j) amax = fmaxf(amax, fabsf(xs[j]));
            const float d = amax / 127.f, is = amax == 0.f ? 0.f : 127.f / amax;
            int8_t* a = A + (size_t)r * K + b * QK;
            for (int s = 0; s < 8; ++s) {
                int sum = 0;
                for (int j = 0; j < 32; ++j) {
                    int v = (int)nearbyintf(xs[32 * s + j] * is);
                    v = v < -127 ? -127 : (v > 127 ? 127 : v);
                    a[32 * s + j] = (int8_t)v;
                    sum += v;
                }
                BS[((size_t)r * nb + b) * 8 + s] = (int16_t)sum;
            }
            DX[(size_t)r * nb + b] = d;
        }
}

// y [k, N] = the packed matrix times the quantized rows; rows in groups of at most 8
void r16_gemm(const uint8_t* P, int N, int K, const int8_t* A, const float* DX, const int16_t* BS, int k, float* y,
              int nthreads) {
    for (int r0 = 0; r0 < k; r0 += 8) {
        const int R = k - r0 < 8 ? k - r0 : 8;
        TAB[R](P, N, K, A, DX, BS, r0, y, nthreads);
    }
}
}
