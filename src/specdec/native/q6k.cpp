// Batch-invariant Q6_K x int8 GEMM, y[k,N] = x[k,K] . W[N,K]^T (any k; groups of <= 16 rows).
// W: raw GGUF block_q6_K bytes (ql[128], qh[64], int8 scales[16], fp16 d; 210 bytes / 256 weights).
// x: float32 [k,K], quantized per row per 256-block to int8 exactly as in q4k_kernel.cpp (d = amax/127, RNE).
//
// ggml layout (dequantize_row_q6_K): half h = 0,1 (128 weights), l = 0..31, ql' = ql+64h, qh' = qh+32h:
//   w[128h +  0 + l] = (ql'[l]    & 15) | ((qh'[l] >> 0) & 3) << 4      (-32)
//   w[128h + 32 + l] = (ql'[l+32] & 15) | ((qh'[l] >> 2) & 3) << 4
//   w[128h + 64 + l] = (ql'[l]    >> 4) | ((qh'[l] >> 4) & 3) << 4
//   w[128h + 96 + l] = (ql'[l+32] >> 4) | ((qh'[l] >> 6) & 3) << 4
//   sub-block j = w / 16 uses scales[j];  weight = d * scales[j] * (q - 32).
// Unpack (once per block, shared by all rows of the group), L = ql'[0:64], H = [qh', qh'] (256-bit broadcast):
//   Hs = srlv_epi64(H, [0 x4, 2 x4])         (upper half holds qh >> 2)
//   U_{2h}   = (L & 15)        | ((Hs << 4) & 0x30)   = unsigned q+32 of natural weights 128h + 0..63
//   U_{2h+1} = ((L >> 4) & 15) | (Hs & 0x30)          = unsigned q+32 of natural weights 128h + 64..127
//   so xmm-lane m of U_c holds sub-block 4c + m, in natural order: activations need no permutation.
// Per output element (r, n), per block b in order:
//   D_c = dpbusd(0, U_c, A_c), c = 0..3           unsigned codes u = q+32 in 0..63: |D_c| <= 4*63*127 = 32004,
//                                                  so packs never saturates
//   I   = dpwssd(0, S16, C)                        the -32 correction: C[2L] = -32*(sum of the 8 a's of lane L's
//                                                  dword pair in D_{L%4>=2}), C[2L+1] the same in D_{2+(L%4>=2)},
//                                                  |C| <= 32*8*127 = 32512 (int16); S16 = matching scales
//   I   = dpwssd(I, packs(D0,D1), S01);  I = dpwssd(I, packs(D2,D3), S23)     (S = int16 scales)
//         => lane L = exact sum of sc_j*(q-32)*a over its 16 weights (two half sub-blocks), |I| <= 8.4e6 < 2^24
//   F   = float(I) * d_b  (exact convert; the mul rounds)   acc = fma(F, dx_rb, acc)   (16 lanes)
// (v1, q6k_kernel_v1.cpp: per-dword bias -32*sum(a) as dpbusd accumulator init: 576-byte records, slower at k=16.)
//   y = fixed-tree horizontal sum of acc.
// One template per row count 1..16, OpenMP static over N, -ffp-contract=off: nothing depends on k or threads.
// Build: see build.sh (libq6k.so). No AMX.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#include <omp.h>

namespace {
const int QK = 256;
const int BB = 210;  // bytes per block_q6_K
int PF_DIST = 4096;  // prefetch distance in bytes (0 = off)

// record per (block b, row r): [0,256) int8 a (natural order), [256,320) int16 C[32] (correction, see header),
// [320,324) dx float; REC = 384 bytes. Records block-major ([nb][k]).
const int REC = 384;
const int DXO = 320;

void quantize_row(const float* x, int K, uint8_t* rec0, size_t bstride) {
    const int nb = K / QK;
    const __m512 sgn = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int b = 0; b < nb; ++b) {
        const float* xs = x + (size_t)b * QK;
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < QK; i += 16) m = _mm512_max_ps(m, _mm512_and_ps(_mm512_loadu_ps(xs + i), sgn));
        const float amax = _mm512_reduce_max_ps(m);
        uint8_t* rec = rec0 + (size_t)b * bstride;
        int8_t* a = (int8_t*)rec;
        int16_t* corr = (int16_t*)(rec + 256);
        float d = amax / 127.f;
        if (amax == 0.f) { memset(a, 0, QK); d = 0.f; }
        else {
            const __m512 is = _mm512_set1_ps(127.f / amax);
            const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
            for (int j = 0; j < 16; ++j) {
                __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + 16 * j), is));
                v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
                _mm_storeu_si128((__m128i*)(a + 16 * j), _mm512_cvtepi32_epi8(v));
            }
        }
        for (int L = 0; L < 16; ++L) {        // lane L = (m, t): dword pair 4m + 2(t&1) of D_{(t>=2)} and D_{2+(t>=2)}
            const int m = L >> 2, t = L & 3;
            for (int p = 0; p < 2; ++p) {
                const int base = 64 * (2 * p + (t >= 2)) + 16 * m + 8 * (t & 1);
                int s = 0;
                for (int e = 0; e < 8; ++e) s += a[base + e];
                corr[2 * L + p] = (int16_t)(-32 * s);
            }
        }
        *(float*)(rec + DXO) = d;
    }
}

inline float h2f(const uint8_t* p) { uint16_t h; memcpy(&h, p, 2); return _cvtsh_ss(h); }

inline float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 e = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(e);
}
inline float hsum16_ref(const float* v) {
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i) a[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; ++i) b[i] = a[i] + a[i + 4];
    c[0] = b[0] + b[2]; c[1] = b[1] + b[3];
    return c[0] + c[1];
}

// int16 element (xmm-lane m, e) of packs(D_{2p}, D_{2p+1}) multiplies scale of sub-block 8p + 4*(e>=4) + m
alignas(64) int16_t SIDX[3][32];   // [2]: S16 (correction) element (2L + p) -> scale of sub-block 8p + 4(t>=2) + m
int init_sidx() {
    for (int p = 0; p < 2; ++p)
        for (int m = 0; m < 4; ++m)
            for (int e = 0; e < 8; ++e) SIDX[p][8 * m + e] = (int16_t)(8 * p + 4 * (e >= 4) + m);
    for (int L = 0; L < 16; ++L)
        for (int p = 0; p < 2; ++p) SIDX[2][2 * L + p] = (int16_t)(8 * p + 4 * ((L & 3) >= 2) + (L >> 2));
    return 0;
}
int sidx_dummy = init_sidx();

template <int R>
void kernel_rows(const uint8_t* W, int N, int K, const uint8_t* rec, int r0, int kall, float* y, int nthreads) {
    const int nb = K / QK;
    const size_t rowbytes = (size_t)nb * BB;
    const __m512i I01 = _mm512_load_si512(SIDX[0]), I23 = _mm512_load_si512(SIDX[1]), IC = _mm512_load_si512(SIDX[2]);
    const uint8_t* RB = rec + (size_t)r0 * REC;
    const size_t bst = (size_t)kall * REC;
    const int pfd = PF_DIST;

#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
        const __m512i shq = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = wr + (size_t)b * BB;
            if (pfd) {
                const char* pp = (const char*)blk + pfd;
                _mm_prefetch(pp, _MM_HINT_T0); _mm_prefetch(pp + 64, _MM_HINT_T0);
                _mm_prefetch(pp + 128, _MM_HINT_T0); _mm_prefetch(pp + 192, _MM_HINT_T0);
            }
            const __m512 dv = _mm512_set1_ps(h2f(blk + 208));
            const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(blk + 192))));
            const __m512i S01 = _mm512_permutexvar_epi16(I01, s16);
            const __m512i S23 = _mm512_permutexvar_epi16(I23, s16);
            const __m512i S16 = _mm512_permutexvar_epi16(IC, s16);
            __m512i U[4];
            for (int h = 0; h < 2; ++h) {
                const __m512i L = _mm512_loadu_si512(blk + 64 * h);
                const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(blk + 128 + 32 * h)));
                const __m512i Hs = _mm512_srlv_epi64(H, shq);
                // ternlog 0xEA: (A & B) | C  with A = L / L>>4, B = 0x0F, C = high bits already masked
                U[2 * h] = _mm512_ternarylogic_epi32(L, m4, _mm512_and_si512(_mm512_slli_epi64(Hs, 4), m30), 0xEA);
                U[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(L, 4), m4, _mm512_and_si512(Hs, m30), 0xEA);
            }
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                const uint8_t* rr = RB + b * bst + r * REC;
                const __m512i z = _mm512_setzero_si512();
                __m512i D0 = _mm512_dpbusd_epi32(z, U[0], _mm512_load_si512(rr));
                __m512i D1 = _mm512_dpbusd_epi32(z, U[1], _mm512_load_si512(rr + 64));
                __m512i D2 = _mm512_dpbusd_epi32(z, U[2], _mm512_load_si512(rr + 128));
                __m512i D3 = _mm512_dpbusd_epi32(z, U[3], _mm512_load_si512(rr + 192));
                __m512i I = _mm512_dpwssd_epi32(z, S16, _mm512_load_si512(rr + 256));
                I = _mm512_dpwssd_epi32(I, _mm512_packs_epi32(D0, D1), S01);
                I = _mm512_dpwssd_epi32(I, _mm512_packs_epi32(D2, D3), S23);
                const __m512 F = _mm512_mul_ps(_mm512_cvtepi32_ps(I), dv);
                acc[r] = _mm512_fmadd_ps(F, _mm512_set1_ps(*(const float*)(rr + DXO)), acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) y[(size_t)(r0 + r) * N + n] = hsum16(acc[r]);
    }
}

typedef void (*kfn)(const uint8_t*, int, int, const uint8_t*, int, int, float*, int);
kfn KTAB[17] = {nullptr,
    kernel_rows<1>, kernel_rows<2>, kernel_rows<3>, kernel_rows<4>, kernel_rows<5>, kernel_rows<6>,
    kernel_rows<7>, kernel_rows<8>, kernel_rows<9>, kernel_rows<10>, kernel_rows<11>, kernel_rows<12>,
    kernel_rows<13>, kernel_rows<14>, kernel_rows<15>, kernel_rows<16>};

// natural-order decode of one block to unsigned codes q+32 (0..63), straight from the ggml formula
void decode_codes(const uint8_t* blk, uint8_t u[256]) {
    for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = blk + 64 * h; const uint8_t* qh = blk + 128 + 32 * h;
        for (int l = 0; l < 32; ++l) {
            u[128 * h + l] = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
            u[128 * h + l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            u[128 * h + l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            u[128 * h + l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
}

// scalar reference: same arithmetic, emulating the vector lanes
void kernel_ref(const uint8_t* W, int N, int K, const uint8_t* rec, int k, float* y) {
    const int nb = K / QK;
    const size_t rowbytes = (size_t)nb * BB;
    for (int n = 0; n < N; ++n)
        for (int r = 0; r < k; ++r) {
            float acc[16] = {0};
            for (int b = 0; b < nb; ++b) {
                const uint8_t* blk = W + n * rowbytes + (size_t)b * BB;
                const float d = h2f(blk + 208);
                const int8_t* sc = (const int8_t*)(blk + 192);
                uint8_t u[256];
                decode_codes(blk, u);
                const uint8_t* rr = rec + ((size_t)b * k + r) * REC;
                const int8_t* a = (const int8_t*)rr;
                int32_t D[4][16];
                for (int c = 0; c < 4; ++c)
                    for (int i = 0; i < 16; ++i) {
                        int s = 0;
                        for (int e = 0; e < 4; ++e) s += (int)u[64 * c + 4 * i + e] * (int)a[64 * c + 4 * i + e];
                        s = s > 32767 ? 32767 : s < -32768 ? -32768 : s;   // packs saturation (never hit)
                        D[c][i] = s;
                    }
                const float dxr = *(const float*)(rr + DXO);
                const int16_t* corr = (const int16_t*)(rr + 256);
                for (int m = 0; m < 4; ++m)
                    for (int t = 0; t < 4; ++t) {   // dword lane (m, t): D[2p + (t>=2)] dwords 4m + 2(t&1) + {0,1}
                        int32_t I = 0;
                        for (int p = 0; p < 2; ++p) I += (int)corr[2 * (4 * m + t) + p] * sc[8 * p + 4 * (t >= 2) + m];
                        for (int p = 0; p < 2; ++p) {
                            const int c = 2 * p + (t >= 2), i0 = 4 * m + 2 * (t & 1);
                            const int s = sc[8 * p + 4 * (t >= 2) + m];
                            I += D[c][i0] * s + D[c][i0 + 1] * s;
                        }
                        const float F = (float)I * d;
                        acc[4 * m + t] = fmaf(F, dxr, acc[4 * m + t]);
                    }
            }
            y[(size_t)r * N + n] = hsum16_ref(acc);
        }
}

uint8_t* make_records(const float* x, int k, int K) {
    const int nb = K / QK;
    uint8_t* rec = (uint8_t*)aligned_alloc(64, (size_t)k * nb * REC);
    for (int r = 0; r < k; ++r) quantize_row(x + (size_t)r * K, K, rec + (size_t)r * REC, (size_t)k * REC);
    return rec;
}
}  // namespace

extern "C" {
void q6k_set_prefetch(int dist) { PF_DIST = dist; }
// y[k,N] = x[k,K] . W^T ; mode 0 = AVX-512 kernel, 1 = scalar reference
int q6k_gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    if (K % QK) return -1;
    uint8_t* rec = make_records(x, k, K);
    if (mode == 1) kernel_ref(W, N, K, rec, k, y);
    else
        for (int r0 = 0; r0 < k; r0 += 16) {
            const int R = k - r0 < 16 ? k - r0 : 16;
            KTAB[R](W, N, K, rec, r0, k, y, nthreads);
        }
    free(rec);
    return 0;
}
// dequantize rows with the kernel's decoder (d * scales[j] * (u - 32), float32) for the exactness check
void q6k_dequant(const uint8_t* W, int N, int K, float* out) {
    const int nb = K / QK;
    for (size_t n = 0; n < (size_t)N; ++n)
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = W + (n * nb + b) * BB;
            uint8_t u[256];
            decode_codes(blk, u);
            const float d = h2f(blk + 208);
            const int8_t* sc = (const int8_t*)(blk + 192);
            for (int i = 0; i < 256; ++i) out[n * K + b * QK + i] = d * (float)sc[i / 16] * (float)((int)u[i] - 32);
        }
}
// the vector unpack of one block (U_0..U_3 stored as 256 bytes) for checking against decode_codes
void q6k_unpack_simd(const uint8_t* blk, uint8_t* u) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i shq = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    for (int h = 0; h < 2; ++h) {
        const __m512i L = _mm512_loadu_si512(blk + 64 * h);
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(blk + 128 + 32 * h)));
        const __m512i Hs = _mm512_srlv_epi64(H, shq);
        _mm512_storeu_si512(u + 128 * h, _mm512_ternarylogic_epi32(L, m4, _mm512_and_si512(_mm512_slli_epi64(Hs, 4), m30), 0xEA));
        _mm512_storeu_si512(u + 128 * h + 64, _mm512_ternarylogic_epi32(_mm512_srli_epi16(L, 4), m4, _mm512_and_si512(Hs, m30), 0xEA));
    }
}
// quantized activations (natural order) + dx, for the float64 reference
void q6k_quant_x(const float* x, int k, int K, int8_t* a_nat, float* dx) {
    const int nb = K / QK;
    uint8_t* rec = (uint8_t*)aligned_alloc(64, (size_t)nb * REC);
    for (int r = 0; r < k; ++r) {
        quantize_row(x + (size_t)r * K, K, rec, REC);
        for (int b = 0; b < nb; ++b) {
            dx[(size_t)r * nb + b] = *(const float*)(rec + (size_t)b * REC + DXO);
            memcpy(a_nat + (size_t)r * K + b * QK, rec + (size_t)b * REC, QK);
        }
    }
    free(rec);
}
}
