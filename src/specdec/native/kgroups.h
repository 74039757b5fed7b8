// What q5k.cpp, q3k.cpp and q2k.cpp share: the scoring kernel of the 256-weight K-quant formats whose codes unpack
// into four 64-byte vectors U_0..U_3, each 16-byte lane ("group" g = 4c + m: vector c, lane m) holding 16 codes of
// one sub-block (one scale, one min). Over kquant.h (paths, fp16, quantizer, prefetch, dispatch, driver).
//
// A format F states: BB (bytes per block), OFF (the codes' offset: w = d * sc * (u - OFF) [- dmin * mn]), HAS_MIN,
// SUBW (16 or 32 weights per sub-block), PF_DIST (prefetch distance, <name>_set_prefetch),
// SB[16] (group -> index of its sub-block's scale and min in F's natural order), base(c, h) (the natural index of
// byte 32h of U_c: bytes 32h..32h+31 of U_c are the 32 natural weights base(c, h) + 0..31), and its decoders:
// scalar codes(blk, u[256]) (natural order), scales(blk, sc[16], mn[16]), d(blk), dmin(blk); vector scale_bytes(blk,
// &mn) (the natural scales / mins as int8 bytes 0..15), AVX-512 unpack512(blk, U[4]), AVX2 unpack256(blk, h, U[4])
// (the 256-bit halves h of U_c).
//
// Record per (block, row), REC = 384 bytes: [0,256) int8 a in U's byte order (byte p = natural weight POS[p],
// POS[64c + 32h + i] = base(c, h) + i), [256,320) int16 T[32], [320,324) dx. Lane L = 4m + t (0..15) covers, for
// p = 0, 1, the 8 bytes 64c + 16m + 8(t&1) + 0..7 with c = 2p + (t>>1) (its "pair p", of group 4c + m); T[2L + p] =
// the sum of the 8 activations of pair p of lane L (|T| <= 1016).
//
// Per output element (r, n), blocks b in order (acc = 16 zero lanes first):
//   I_L = sum over p of sc_g * (sum over the pair's 8 weights of u * a  -  OFF * T[2L + p])    (exact int32,
//         |I_L| <= 16 * 63 * 31 * 127 for Q5_K)
//   M_L = sum over p of mn_g * T[2L + p]                                                       (exact; HAS_MIN only)
//   v_L = float(I_L) * d_b;  HAS_MIN: v_L = fma(-float(M_L), dmin_b, v_L);  acc_L = fma(v_L, dx_rb, acc_L)
//   y = the fixed-tree horizontal sum of acc (hsum.h).
// AVX-512: D_c = dpbusd(0, U_c, A_c) (dword = 4 products, |.| <= 4 * 31 * 127: packs never saturates),
//   I = dpwssd(dpwssd(0, packs(D_0, D_1), S01), packs(D_2, D_3), S23) [+ dpwssd(-OFF * ST, T)], M = dpwssd(0, MT, T)
//   (S01, S23, ST, MT: the scales / mins per int16 word, vpermw of the natural ones).
// AVX2: half h = lanes 8h..8h+7 (m = 2h, 2h + 1): X_c = madd(maddubs(U_ch, A_ch), S_ch) (word = 2 products <= 7874;
//   S_ch = group 4c + m's scale in 128-bit lane m - 2h), I = hadd(X_0 + X_2, X_1 + X_3) [+ madd(T_h, -OFF * ST_h)],
//   M = madd(T_h, MT_h): the same exact integers. Records in the same order on both paths (no permutation).
// Integer parts exact, float ops the same per lane on every path, in the same order, -ffp-contract=off: a row's bits
// do not depend on k, its position, the threads or the path. NaN activations are outside the contract.
#pragma once
#include "kquant.h"

namespace {
namespace kg {

// int16 word -> group: [0] packs(D_0, D_1) word 8m + e -> group 4(e >= 4) + m; [1] packs(D_2, D_3): + 8;
// [2] T word 2L + p, L = 4m + t -> group 4(2p + (t >= 2)) + m
inline int word_group(int s, int w) {
    if (s < 2) return 8 * s + 4 * ((w & 7) >= 4) + (w >> 3);
    const int L = w >> 1, p = w & 1;
    return 4 * (2 * p + ((L & 3) >= 2)) + (L >> 2);
}

// POS: the natural index of each record byte
template <class F> struct PosTable {
    int v[256];
    PosTable() { for (int c = 0; c < 4; ++c) for (int i = 0; i < 64; ++i) v[64 * c + i] = F::base(c, i >> 5) + (i & 31); }
};
template <class F> const int* pos() { static const PosTable<F> t; return t.v; }

// the record of one block from its natural-order int8 activations q and d
template <class F> void finish(const int8_t* q, float d, uint8_t* rec) {
    const int* P = pos<F>();
    int8_t* a = (int8_t*)rec;
    for (int p = 0; p < QK; ++p) a[p] = q[P[p]];
    int16_t* T = (int16_t*)(rec + 256);
    for (int L = 0; L < 16; ++L)
        for (int p = 0; p < 2; ++p) {
            const int base = 64 * (2 * p + ((L & 3) >> 1)) + 16 * (L >> 2) + 8 * (L & 1);
            int s = 0;
            for (int e = 0; e < 8; ++e) s += a[base + e];
            T[2 * L + p] = (int16_t)s;
        }
    *(float*)(rec + DXO) = d;
}

template <class F> void quantize_row(const float* x, int K, uint8_t* rec0, size_t bstride) {
    const int nb = K / QK;
    for (int b = 0; b < nb; ++b) {
        const float* xs = x + (size_t)b * QK;
        alignas(64) int8_t q[QK];
        float d;
#if defined(KQ_AVX512)   // the same IEEE ops as quantize_block_qi (q6k.cpp's quantizer)
        const float amax = block_amax(xs);
        d = amax / 127.f;
        if (amax == 0.f) { memset(q, 0, QK); d = 0.f; }
        else {
            const __m512 is = _mm512_set1_ps(127.f / amax);
            const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
            for (int j = 0; j < 16; ++j) {
                __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + 16 * j), is));
                v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
                _mm_store_si128((__m128i*)(q + 16 * j), _mm512_cvtepi32_epi8(v));
            }
        }
#else
        alignas(32) int32_t qi[QK];
        d = quantize_block_qi(xs, qi);
        for (int i = 0; i < QK; ++i) q[i] = (int8_t)qi[i];
#endif
        finish<F>(q, d, rec0 + (size_t)b * bstride);
    }
}

#if defined(KQ_AVX512)
template <class F, int R>
void kernel_rows(const uint8_t* W, int N, int K, const uint8_t* rec, int r0, int kall, float* y, int nthreads) {
    const int nb = K / QK;
    const size_t rowbytes = (size_t)nb * F::BB;
    alignas(64) int16_t ix[3][32];
    for (int s = 0; s < 3; ++s)
        for (int w = 0; w < 32; ++w) ix[s][w] = (int16_t)F::SB[word_group(s, w)];
    const __m512i I01 = _mm512_load_si512(ix[0]), I23 = _mm512_load_si512(ix[1]), IT = _mm512_load_si512(ix[2]);
    const uint8_t* RB = rec + (size_t)r0 * REC;
    const size_t bst = (size_t)kall * REC;
    const int pfd = F::PF_DIST;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = wr + (size_t)b * F::BB;
            prefetch_block<3>(blk, pfd, 0);
            __m128i mn8;
            const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(F::scale_bytes(blk, &mn8)));
            const __m512i mn = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(mn8));
            const __m512i S01 = _mm512_permutexvar_epi16(I01, sc), S23 = _mm512_permutexvar_epi16(I23, sc);
            const __m512i ST = F::OFF ? _mm512_mullo_epi16(_mm512_permutexvar_epi16(IT, sc), _mm512_set1_epi16(-F::OFF))
                                      : _mm512_setzero_si512();
            const __m512i MT = F::HAS_MIN ? _mm512_permutexvar_epi16(IT, mn) : _mm512_setzero_si512();
            const __m512 dv = _mm512_set1_ps(F::d(blk));
            const __m512 dmv = _mm512_set1_ps(F::HAS_MIN ? F::dmin(blk) : 0.f);
            __m512i U[4];
            F::unpack512(blk, U);
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                const uint8_t* rr = RB + b * bst + r * REC;
                const __m512i z = _mm512_setzero_si512();
                const __m512i D0 = _mm512_dpbusd_epi32(z, U[0], _mm512_load_si512(rr));
                const __m512i D1 = _mm512_dpbusd_epi32(z, U[1], _mm512_load_si512(rr + 64));
                const __m512i D2 = _mm512_dpbusd_epi32(z, U[2], _mm512_load_si512(rr + 128));
                const __m512i D3 = _mm512_dpbusd_epi32(z, U[3], _mm512_load_si512(rr + 192));
                const __m512i T = _mm512_load_si512(rr + 256);
                __m512i I = _mm512_dpwssd_epi32(z, _mm512_packs_epi32(D0, D1), S01);
                I = _mm512_dpwssd_epi32(I, _mm512_packs_epi32(D2, D3), S23);
                if (F::OFF) I = _mm512_dpwssd_epi32(I, ST, T);
                __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(I), dv);
                if (F::HAS_MIN) v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_dpwssd_epi32(z, MT, T)), dmv, v);
                acc[r] = _mm512_fmadd_ps(v, _mm512_set1_ps(*(const float*)(rr + DXO)), acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) y[(size_t)(r0 + r) * N + n] = hsum16(acc[r]);
    }
}

#elif defined(KQ_AVX2)
// vpshufb indices into a 128-bit copy of one half's 8 group values (int16 gh[j], j = 2c + l for group 4c + 2h + l):
// [c] every word of 128-bit lane l = gh[2c + l]; [4] T word (l, t, p) = gh[2(2p + (t >> 1)) + l]
struct ShufTable {
    alignas(32) int8_t ix[5][32];
    ShufTable() {
        for (int l = 0; l < 2; ++l)
            for (int w = 0; w < 8; ++w) {
                for (int c = 0; c < 4; ++c) { ix[c][16 * l + 2 * w] = (int8_t)(2 * (2 * c + l)); ix[c][16 * l + 2 * w + 1] = (int8_t)(2 * (2 * c + l) + 1); }
                const int t = w >> 1, p = w & 1, j = 2 * (2 * p + (t >> 1)) + l;
                ix[4][16 * l + 2 * w] = (int8_t)(2 * j); ix[4][16 * l + 2 * w + 1] = (int8_t)(2 * j + 1);
            }
    }
};
inline const int8_t* shuf_idx() { static const ShufTable t; return &t.ix[0][0]; }

template <class F, int R>
void kernel_rows(const uint8_t* W, int N, int K, const uint8_t* rec, int r0, int kall, float* y, int nthreads) {
    const int nb = K / QK;
    const size_t rowbytes = (size_t)nb * F::BB;
    const int8_t* ixp = shuf_idx();
    __m256i IX[5];
    for (int i = 0; i < 5; ++i) IX[i] = _mm256_load_si256((const __m256i*)(ixp + 32 * i));
    alignas(16) int8_t gi[2][16];   // natural scale bytes -> the half's 8 group values (2c + l: group 4c + 2h + l)
    for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 16; ++j) gi[h][j] = j < 8 ? (int8_t)F::SB[4 * (j >> 1) + 2 * h + (j & 1)] : (int8_t)0x80;
    const __m128i GI[2] = {_mm_load_si128((const __m128i*)gi[0]), _mm_load_si128((const __m128i*)gi[1])};
    const uint8_t* RB = rec + (size_t)r0 * REC;
    const size_t bst = (size_t)kall * REC;
    const int pfd = F::PF_DIST;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        __m256 acc0[R], acc1[R];
        for (int r = 0; r < R; ++r) { acc0[r] = _mm256_setzero_ps(); acc1[r] = _mm256_setzero_ps(); }
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = wr + (size_t)b * F::BB;
            prefetch_block<3>(blk, pfd, 0);
            __m128i mn8;
            const __m128i sc8 = F::scale_bytes(blk, &mn8);
            const __m256 dv = _mm256_set1_ps(F::d(blk));
            const __m256 dmv = _mm256_set1_ps(F::HAS_MIN ? F::dmin(blk) : 0.f);
            const uint8_t* RBb = RB + b * bst;
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                const __m256i G = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_shuffle_epi8(sc8, GI[h])));
                __m256i S[4];
                for (int c = 0; c < 4; ++c) S[c] = _mm256_shuffle_epi8(G, IX[c]);
                const __m256i ST = F::OFF ? _mm256_mullo_epi16(_mm256_shuffle_epi8(G, IX[4]), _mm256_set1_epi16(-F::OFF))
                                          : _mm256_setzero_si256();
                const __m256i MT = F::HAS_MIN ? _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(
                    _mm_cvtepi8_epi16(_mm_shuffle_epi8(mn8, GI[h]))), IX[4]) : _mm256_setzero_si256();
                __m256i U[4];
                F::unpack256(blk, h, U);
#pragma GCC unroll 16
                for (int r = 0; r < R; ++r) {
                    const uint8_t* rr = RBb + r * REC;
                    const uint8_t* a = rr + 32 * h;
                    __m256i X[4];
                    for (int c = 0; c < 4; ++c)
                        X[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(U[c], _mm256_load_si256((const __m256i*)(a + 64 * c))), S[c]);
                    __m256i I = _mm256_hadd_epi32(_mm256_add_epi32(X[0], X[2]), _mm256_add_epi32(X[1], X[3]));
                    const __m256i T = _mm256_load_si256((const __m256i*)(rr + 256 + 32 * h));
                    if (F::OFF) I = _mm256_add_epi32(I, _mm256_madd_epi16(T, ST));
                    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(I), dv);
                    if (F::HAS_MIN) v = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(T, MT)), dmv, v);
                    __m256& acc = h ? acc1[r] : acc0[r];
                    acc = _mm256_fmadd_ps(v, _mm256_broadcast_ss((const float*)(rr + DXO)), acc);
                }
            }
        }
        for (int r = 0; r < R; ++r) y[(size_t)(r0 + r) * N + n] = hsum16(acc0[r], acc1[r]);
    }
}
#endif

#if !defined(KQ_SCALAR)
template <class F> const kfn* ktab() {
    static const kfn t[17] = {nullptr, kernel_rows<F, 1>, kernel_rows<F, 2>, kernel_rows<F, 3>, kernel_rows<F, 4>,
                              kernel_rows<F, 5>, kernel_rows<F, 6>, kernel_rows<F, 7>, kernel_rows<F, 8>,
                              kernel_rows<F, 9>, kernel_rows<F, 10>, kernel_rows<F, 11>, kernel_rows<F, 12>,
                              kernel_rows<F, 13>, kernel_rows<F, 14>, kernel_rows<F, 15>, kernel_rows<F, 16>};
    return t;
}
#else
template <class F> const kfn* ktab() { return nullptr; }
#endif

// the scalar reference: the definition above, lane by lane; each block decoded once per (n, b) for the k rows
template <class F>
void kernel_ref(const uint8_t* W, int N, int K, const uint8_t* rec, int k, float* y, int nthreads) {
    const int nb = K / QK;
    const size_t rowbytes = (size_t)nb * F::BB;
    const int* P = pos<F>();
#pragma omp parallel num_threads(nthreads)
    {
        float* accs = (float*)malloc(sizeof(float) * 16 * (size_t)k);
#pragma omp for schedule(static)
        for (int n = 0; n < N; ++n) {
            for (int i = 0; i < 16 * k; ++i) accs[i] = 0.f;
            for (int b = 0; b < nb; ++b) {
                const uint8_t* blk = W + (size_t)n * rowbytes + (size_t)b * F::BB;
                uint8_t un[256], u[256];
                F::codes(blk, un);
                for (int p = 0; p < 256; ++p) u[p] = un[P[p]];
                int sc[16], mn[16];
                F::scales(blk, sc, mn);
                const float d = F::d(blk), dmin = F::HAS_MIN ? F::dmin(blk) : 0.f;
                for (int r = 0; r < k; ++r) {
                    const uint8_t* rr = rec + ((size_t)b * k + r) * REC;
                    const int8_t* a = (const int8_t*)rr;
                    const int16_t* T = (const int16_t*)(rr + 256);
                    const float dxr = *(const float*)(rr + DXO);
                    float* acc = accs + 16 * r;
                    for (int L = 0; L < 16; ++L) {
                        int32_t I = 0, M = 0;
                        for (int p = 0; p < 2; ++p) {
                            const int c = 2 * p + ((L & 3) >> 1), g = 4 * c + (L >> 2);
                            const int base = 64 * c + 16 * (L >> 2) + 8 * (L & 1);
                            int32_t s = 0;
                            for (int e = 0; e < 8; ++e) s += (int)u[base + e] * (int)a[base + e];
                            I += sc[F::SB[g]] * (s - F::OFF * T[2 * L + p]);
                            if (F::HAS_MIN) M += mn[F::SB[g]] * T[2 * L + p];
                        }
                        float v = (float)I * d;
                        if (F::HAS_MIN) v = fmaf(-(float)M, dmin, v);
                        acc[L] = fmaf(v, dxr, acc[L]);
                    }
                }
            }
            for (int r = 0; r < k; ++r) y[(size_t)r * N + n] = hsum16_ref(accs + 16 * r);
        }
        free(accs);
    }
}

template <class F> int gemm_scoring(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    return gemm<quantize_row<F>, kernel_ref<F>>(W, N, K, x, k, y, nthreads, mode, ktab<F>(), nullptr);
}

// quantized activations in natural order + dx (for the float64 reference of the tests)
template <class F> void quant_x(const float* x, int k, int K, int8_t* a_nat, float* dx) {
    const int nb = K / QK;
    const int* P = pos<F>();
    uint8_t* rec = (uint8_t*)aligned_alloc(64, (size_t)nb * REC);
    for (int r = 0; r < k; ++r) {
        quantize_row<F>(x + (size_t)r * K, K, rec, REC);
        for (int b = 0; b < nb; ++b) {
            dx[(size_t)r * nb + b] = *(const float*)(rec + (size_t)b * REC + DXO);
            for (int p = 0; p < QK; ++p) a_nat[(size_t)r * K + b * QK + P[p]] = (int8_t)rec[(size_t)b * REC + p];
        }
    }
    free(rec);
}

}  // namespace kg
}  // namespace

// ---------------- the prompt-reading product (prompt.h) of a format F ----------------
// As prompt.h's sub-blocks: 16 of 16 weights (a 32-weight sub-block of F is two of them, same scale and min), so the
// AVX2 path's int16 words hold at most 8 products (<= 8 * 31 * 127). The mins: 8 pairs (m_2i | m_2i+1 << 16), dmin.
#include "prompt.h"
namespace {
namespace kg {
template <class F> struct Prompt {
    static const int BB = F::BB, SUB = 16, NSUB = 16, OFF = F::OFF, HAS_MIN = F::HAS_MIN;
    static const int EXTRA = HAS_MIN ? 8 * 64 + 64 : 0;
    static void scales16(const uint8_t* blk, int sc[16], int mn[16]) {
        int s[16], m[16];
        F::scales(blk, s, m);
        for (int j = 0; j < 16; ++j) { sc[j] = s[j * 16 / F::SUBW]; mn[j] = HAS_MIN ? m[j * 16 / F::SUBW] : 0; }
    }
    static void decode(const uint8_t* blk, uint8_t u[256], int* sc, int* mn, float* d, float* dmin) {
        F::codes(blk, u);
        scales16(blk, sc, mn);
        *d = F::d(blk);
        *dmin = HAS_MIN ? F::dmin(blk) : 0.f;
    }
    // the 16-weight sums of a block's activations -> with mins: their pairs; with an offset: OFF * each
    static void extra(int32_t* e) {
        if (HAS_MIN) {
            int32_t s[16];
            memcpy(s, e, sizeof s);
            for (int i = 0; i < 8; ++i) e[i] = (int32_t)((uint32_t)(uint16_t)s[2 * i] | ((uint32_t)(uint16_t)s[2 * i + 1] << 16));
        } else for (int j = 0; j < 16; ++j) e[j] *= OFF;
    }
#if defined(KQ_AVX512)
    static void unpack(const uint8_t* blk, uint8_t* u) {   // natural order (= F::codes, tested through the product)
        __m512i U[4];
        F::unpack512(blk, U);
        for (int c = 0; c < 4; ++c) {
            _mm256_store_si256((__m256i*)(u + F::base(c, 0)), _mm512_castsi512_si256(U[c]));
            _mm256_store_si256((__m256i*)(u + F::base(c, 1)), _mm512_extracti64x4_epi64(U[c], 1));
        }
    }
    static void scales(const uint8_t* blk, int c, int sc[16], float* d, int32_t* extra) {
        int mn[16];
        scales16(blk, sc, mn);
        *d = F::d(blk);
        if (HAS_MIN) {
            for (int i = 0; i < 8; ++i) extra[16 * i + c] = (int32_t)(mn[2 * i] | (mn[2 * i + 1] << 16));
            ((float*)extra)[128 + c] = F::dmin(blk);
        }
    }
    // v - float(M) * dmin, M = sum_j mn_j * (sum of sub-block j's a) (exact, 8 x vpdpwssd); X: the panel's extra
    static inline __m512 tail(const uint8_t* X, const int32_t* e, __m512 v) {
        if (!HAS_MIN) return v;
        __m512i m = _mm512_setzero_si512();
        for (int i = 0; i < 8; ++i) m = _mm512_dpwssd_epi32(m, _mm512_load_si512(X + 64 * i), _mm512_set1_epi32(e[i]));
        return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_load_ps((const float*)(X + 512)), v);
    }
#endif
};
}  // namespace kg
}  // namespace

// the C entry points of format F as <name>_isa, _gemm (mode 0 fast, 1 reference, bit 2 the prompt product), _quant_x,
// _set_prefetch; <name>_dequant stays in the format's file
#define KG_ENTRY_POINTS(name, F)                                                                                    \
    extern "C" {                                                                                                    \
    const char* name##_isa(void) { return KQ_ISA_NAME; }                                                            \
    int name##_gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {      \
        if (mode & 2) return prompt::gemm<kg::Prompt<F>>(W, N, K, x, k, y, nthreads, mode);                         \
        return kg::gemm_scoring<F>(W, N, K, x, k, y, nthreads, mode);                                               \
    }                                                                                                               \
    void name##_quant_x(const float* x, int k, int K, int8_t* a_nat, float* dx) { kg::quant_x<F>(x, k, K, a_nat, dx); } \
    void name##_set_prefetch(int dist) { F::PF_DIST = dist; }                                                       \
    }
