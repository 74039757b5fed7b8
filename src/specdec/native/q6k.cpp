// Batch-invariant Q6_K x int8 GEMM, y[k,N] = x[k,K] . W[N,K]^T (any k; groups of <= 16 rows).
// W: raw GGUF block_q6_K bytes (ql[128], qh[64], int8 scales[16], fp16 d; 210 bytes / 256 weights).
// x: float32 [k,K], quantized per row per 256-block to int8 exactly as in q4k.cpp (d = amax/127, RNE).
//
// Three compiled paths, chosen by the preprocessor (build.py's isa: native / avx2 / scalar), giving the same
// bits; mode 0 runs the compiled one (named by q6k_isa()), mode 1 the scalar reference:
//   "avx512-vnni": __AVX512F/BW/VL/DQ/VNNI/VBMI__ (+ F16C, FMA) all defined: 16-lane zmm kernel;
//   "avx2":        __AVX2__ && __FMA__ && __F16C__: the 16 float lanes as two ymm halves (lanes 0..7, 8..15)
//                  with the same per-lane op sequence; integer dots vpmaddubsw + vpmaddwd(1), or AVX-VNNI
//                  vpdpbusd when __AVXVNNI__ (both exact, so both give the same bits);
//   "scalar":      plain C++ (x86-64 baseline, no F16C: portable exact fp16 -> fp32); mode 0 = the reference.
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
//   y = fixed-tree horizontal sum of acc.
// AVX2 path: half h (lanes 8h..8h+7) = the 256-bit half h of every zmm above. U_{c,h} = codes of natural weights
//   64c + 32h + 0..31 (from ql'[32h:+32] and qh' >> 2h); per block and half, once for all rows, a 4x4 dword
//   transpose of unpack_epi16(U_c, U_{c+2}) gives V_0..V_3 whose dword t holds [2 codes of lane t's first
//   sub-block, 2 of its second] (transpose_half); the AVX2 records hold the activations in that order (APERM,
//   applied to the natural records before the kernel; the reference reads the natural ones). Per row and half:
//   Q01 = maddubs(V0,A0) + maddubs(V1,A1), Q23 likewise (int16 words = 4 products <= 4*63*127 = 32004: exact),
//   I = madd(Q01 + C + Q23, S) (wrapping int16 adds; each word's total = its 8 products (u-32)*a, |.| <= 32512, so
//   exact), or with AVX-VNNI I = madd(S,C) + 2 vpdpwssd; S = S16 of half h (vpshufb of the scale bytes into each
//   int16's high byte, >> 8): the same exact integers I as above, then F and acc as above. Output columns go in
//   tiles of NT (8 for >= 12 rows, 4 for >= 6) with blocks outer, so a block's records stay in L1 across the tile.
// Activations containing NaN are outside the contract (their int8 quantization may differ between paths).
// One template per row count 1..16, -ffp-contract=off: nothing depends on k or threads. OpenMP static over tiles of
// up to 64 outputs (kquant.h's run_tiles), every group of <= 16 rows over a tile before the next tile.
// (A first version put the per-dword bias in the dpbusd init: same bits, slower at k=16; benchmarks/results/kernel-study-cpu.md.)
// No AMX.
#include "kquant.h"   // shared with q4k.cpp: paths, fp16, horizontal sums, quantizer, prefetch, dispatch, driver

namespace {
const int BB = 210;  // bytes per block_q6_K
int PF_DIST = 4096;  // prefetch distance in bytes (0 = off)

// record per (block b, row r): [0,256) int8 a (natural order), [256,320) int16 C[32] (correction, see header),
// [320,324) dx float (DXO); REC = 384 bytes. Records block-major ([nb][k]).

// the correction C of a record from its int8 a (natural order)
[[maybe_unused]] void write_corr(const int8_t* a, int16_t* corr) {
    for (int L = 0; L < 16; ++L) {        // lane L = (m, t): dword pair 4m + 2(t&1) of D_{(t>=2)} and D_{2+(t>=2)}
        const int m = L >> 2, t = L & 3;
        for (int p = 0; p < 2; ++p) {
            const int base = 64 * (2 * p + (t >= 2)) + 16 * m + 8 * (t & 1);
            int s = 0;
            for (int e = 0; e < 8; ++e) s += a[base + e];
            corr[2 * L + p] = (int16_t)(-32 * s);
        }
    }
}
// the record of one block from its natural-order qi (AVX2 and scalar quantizers)
[[maybe_unused]] void finish_block(const int32_t* qi, float d, uint8_t* rec) {
    int8_t* a = (int8_t*)rec;
    for (int i = 0; i < QK; ++i) a[i] = (int8_t)qi[i];
    write_corr(a, (int16_t*)(rec + 256));
    *(float*)(rec + DXO) = d;
}

#if defined(KQ_AVX512)
void quantize_row(const float* x, int K, uint8_t* rec0, size_t bstride) {
    const int nb = K / QK;
    for (int b = 0; b < nb; ++b) {
        const float* xs = x + (size_t)b * QK;
        const float amax = block_amax(xs);
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
        write_corr(a, corr);
        *(float*)(rec + DXO) = d;
    }
}
#else
void quantize_row(const float* x, int K, uint8_t* rec0, size_t bstride) {
    quantize_row_qi<finish_block>(x, K, rec0, bstride);
}
#endif

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

#if defined(KQ_AVX512)
template <int R>
void kernel_rows(const uint8_t* W, int n0, int n1, int N, int K, const uint8_t* rec, int r0, int kall, float* y) {
    const int nb = K / QK;
    const size_t rowbytes = (size_t)nb * BB;
    const __m512i I01 = _mm512_load_si512(SIDX[0]), I23 = _mm512_load_si512(SIDX[1]), IC = _mm512_load_si512(SIDX[2]);
    const uint8_t* RB = rec + (size_t)r0 * REC;
    const size_t bst = (size_t)kall * REC;
    const int pfd = PF_DIST;

    for (int n = n0; n < n1; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
        const __m512i shq = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = wr + (size_t)b * BB;
            prefetch_block<4>(blk, pfd, 0);
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

#elif defined(KQ_AVX2)
// U_{c,h}, c = 0..3: unsigned codes of natural weights 64c + 32h + 0..31
inline void unpack_half(const uint8_t* blk, int h, __m256i U[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    for (int hp = 0; hp < 2; ++hp) {
        const __m256i L = _mm256_loadu_si256((const __m256i*)(blk + 64 * hp + 32 * h));
        __m256i Hs = _mm256_loadu_si256((const __m256i*)(blk + 128 + 32 * hp));
        if (h) Hs = _mm256_srli_epi16(Hs, 2);
        U[2 * hp] = _mm256_or_si256(_mm256_and_si256(L, m4), _mm256_and_si256(_mm256_slli_epi16(Hs, 4), m30));
        U[2 * hp + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L, 4), m4), _mm256_and_si256(Hs, m30));
    }
}
// V_k (k = 0..3): dword t (of each 128-bit lane) = [2 codes of lane t's first sub-block, 2 of its second]:
// A_t = unpack{lo,hi}_epi16(U_{t>>1}, U_{2+(t>>1)}) holds lane t in every dword; V = 4x4 dword transpose of A.
inline void transpose_half(const __m256i U[4], __m256i V[4]) {
    const __m256i A0 = _mm256_unpacklo_epi16(U[0], U[2]), A1 = _mm256_unpackhi_epi16(U[0], U[2]);
    const __m256i A2 = _mm256_unpacklo_epi16(U[1], U[3]), A3 = _mm256_unpackhi_epi16(U[1], U[3]);
    const __m256i T0 = _mm256_unpacklo_epi32(A0, A1), T1 = _mm256_unpackhi_epi32(A0, A1);
    const __m256i T2 = _mm256_unpacklo_epi32(A2, A3), T3 = _mm256_unpackhi_epi32(A2, A3);
    V[0] = _mm256_unpacklo_epi64(T0, T2); V[1] = _mm256_unpackhi_epi64(T0, T2);
    V[2] = _mm256_unpacklo_epi64(T1, T3); V[3] = _mm256_unpackhi_epi64(T1, T3);
}
// AVX2 record order of the 256 activations: position 64k + 32h + 16l + 4t + 2w + e (V_k of half h, 128-bit lane l,
// dword t, word w, byte e) holds natural index 64c + 32h + 16l + 2k + 8(t&1) + e, c = 2w + (t>>1)
int APERM[256];
int init_aperm() {
    for (int k = 0; k < 4; ++k) for (int h = 0; h < 2; ++h) for (int l = 0; l < 2; ++l)
        for (int t = 0; t < 4; ++t) for (int w = 0; w < 2; ++w) for (int e = 0; e < 2; ++e)
            APERM[64 * k + 32 * h + 16 * l + 4 * t + 2 * w + e] = 64 * (2 * w + (t >> 1)) + 32 * h + 16 * l + 2 * k + 8 * (t & 1) + e;
    return 0;
}
int aperm_dummy = init_aperm();
// vpshufb indices: [s][h] int16 element w of half h -> scale byte SIDX[s][16h + w] into the high byte (low byte 0)
alignas(32) int8_t SPIDX[3][2][32];
int init_spidx() {
    for (int s = 0; s < 3; ++s)
        for (int h = 0; h < 2; ++h)
            for (int w = 0; w < 16; ++w) { SPIDX[s][h][2 * w] = (int8_t)0x80; SPIDX[s][h][2 * w + 1] = (int8_t)SIDX[s][16 * h + w]; }
    return 0;
}
int spidx_dummy = init_spidx();

template <int R>
void kernel_rows(const uint8_t* W, int n0, int n1, int N, int K, const uint8_t* rec, int r0, int kall, float* y) {
    const int nb = K / QK;
    const size_t rowbytes = (size_t)nb * BB;
    const uint8_t* RB = rec + (size_t)r0 * REC;
    const size_t bst = (size_t)kall * REC;
    const int pfd = PF_DIST;

    // NT output columns per task, blocks outer: the records of block b (R * 384 bytes) are read from L1 by all NT
    // columns instead of streaming all K/256 records of the group from L2 per column (per-element ops unchanged)
    constexpr int NT = R >= 12 ? 8 : R >= 6 ? 4 : 1;   // measured: no gain below 6 rows
    for (int t0 = n0; t0 < n1; t0 += NT) {
        const int nt = n1 - t0 < NT ? n1 - t0 : NT;
        __m256 acc[NT][2][R];
        for (int j = 0; j < NT; ++j)
            for (int r = 0; r < R; ++r) { acc[j][0][r] = _mm256_setzero_ps(); acc[j][1][r] = _mm256_setzero_ps(); }
        for (int b = 0; b < nb; ++b)
        for (int j = 0; j < nt; ++j) {
            const uint8_t* blk = W + (size_t)(t0 + j) * rowbytes + (size_t)b * BB;
            prefetch_block<4>(blk, pfd, 0);
            const __m256 dv = _mm256_set1_ps(h2f(blk + 208));
            const __m256i scb = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(blk + 192)));
            const uint8_t* RBb = RB + b * bst;
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                const __m256i S = _mm256_srai_epi16(_mm256_shuffle_epi8(scb, _mm256_load_si256((const __m256i*)SPIDX[2][h])), 8);
                __m256i U[4], V[4];
                unpack_half(blk, h, U);
                transpose_half(U, V);
#pragma GCC unroll 16
                for (int r = 0; r < R; ++r) {
                    const uint8_t* rr = RBb + r * REC;
                    const uint8_t* a = rr + 32 * h;
                    // int16 word (t, w) = exact sum of 4 products of lane t's sub-block part w (<= 4*63*127 = 32004)
                    const __m256i Q01 = _mm256_add_epi16(_mm256_maddubs_epi16(V[0], _mm256_load_si256((const __m256i*)a)),
                                                         _mm256_maddubs_epi16(V[1], _mm256_load_si256((const __m256i*)(a + 64))));
                    const __m256i Q23 = _mm256_add_epi16(_mm256_maddubs_epi16(V[2], _mm256_load_si256((const __m256i*)(a + 128))),
                                                         _mm256_maddubs_epi16(V[3], _mm256_load_si256((const __m256i*)(a + 192))));
                    const __m256i C = _mm256_load_si256((const __m256i*)(rr + 256 + 32 * h));
#if defined(__AVXVNNI__)
                    __m256i I = _mm256_madd_epi16(S, C);
                    I = _mm256_dpwssd_avx_epi32(I, Q01, S);
                    I = _mm256_dpwssd_avx_epi32(I, Q23, S);
#else
                    // word w of Q01 + Q23 + C = sum of its 8 products (u - 32) * a, |.| <= 8*32*127 = 32512: the
                    // wrapping int16 adds give that exact value (partial sums may wrap), so one madd with S gives I
                    const __m256i I = _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(Q01, C), Q23), S);
#endif
                    const __m256 F = _mm256_mul_ps(_mm256_cvtepi32_ps(I), dv);
                    acc[j][h][r] = _mm256_fmadd_ps(F, _mm256_broadcast_ss((const float*)(rr + DXO)), acc[j][h][r]);
                }
            }
        }
        for (int j = 0; j < nt; ++j)
            for (int r = 0; r < R; ++r) y[(size_t)(r0 + r) * N + t0 + j] = hsum16(acc[j][0][r], acc[j][1][r]);
    }
}
#endif

#ifndef Q6K_G   // rows a group (-D for a study of the shape)
#define Q6K_G 16
#endif
KQ_TILES(kernel_rows, Q6K_G, 64);   // kquant.h's run_tiles: k > 16 rows read the weights from memory once

// scalar reference: same arithmetic, emulating the vector lanes; each block decoded once per (n, b) for the k rows
void kernel_ref(const uint8_t* W, int N, int K, const uint8_t* rec, int k, float* y, int nthreads) {
    const int nb = K / QK;
    const size_t rowbytes = (size_t)nb * BB;
#pragma omp parallel num_threads(nthreads)
    {
        float* accs = (float*)malloc(sizeof(float) * 16 * (size_t)k);
#pragma omp for schedule(static)
        for (int n = 0; n < N; ++n) {
            for (int i = 0; i < 16 * k; ++i) accs[i] = 0.f;
            for (int b = 0; b < nb; ++b) {
                const uint8_t* blk = W + (size_t)n * rowbytes + (size_t)b * BB;
                const float d = h2f(blk + 208);
                const int8_t* sc = (const int8_t*)(blk + 192);
                uint8_t u[256];
                decode_codes(blk, u);
                for (int r = 0; r < k; ++r) {
                    float* acc = accs + 16 * r;
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
            }
            for (int r = 0; r < k; ++r) y[(size_t)r * N + n] = hsum16_ref(accs + 16 * r);
        }
        free(accs);
    }
}

// ---------------- the prompt-reading product (prompt.h): this format's pieces ----------------
}  // namespace
#include "prompt.h"
namespace {
#if defined(KQ_AVX512)
// natural-order codes of one block, vectorized (the prompt path's unpack; = decode_codes, tested)
inline void q6k_unpack_block(const uint8_t* blk, uint8_t* u) {
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
#endif
struct Q6KPrompt {
    static const int BB = 210, SUB = 16, NSUB = 16, OFF = 32, HAS_MIN = 0;
    static const int EXTRA = 0;
    static void decode(const uint8_t* blk, uint8_t u[256], int sc[16], int mn[8], float* d, float* dmin) {
        decode_codes(blk, u);
        *d = h2f(blk + 208);
        for (int j = 0; j < 16; ++j) sc[j] = ((const int8_t*)(blk + 192))[j];
        (void)mn; *dmin = 0.f;
    }
    // the 16-weight sums -> 32 * sum (the -32 offset of the codes, subtracted from each sub-block's dot)
    static void extra(int32_t* e) { for (int j = 0; j < 16; ++j) e[j] *= 32; }
#if defined(KQ_AVX512)
    static void unpack(const uint8_t* blk, uint8_t* u) { q6k_unpack_block(blk, u); }
    static void scales(const uint8_t* blk, int c, int sc[16], float* d, int32_t* extra) {
        *d = h2f(blk + 208);
        for (int j = 0; j < 16; ++j) sc[j] = ((const int8_t*)(blk + 192))[j];
        (void)c; (void)extra;
    }
    static inline __m512 tail(const uint8_t*, const int32_t*, __m512 v) { return v; }
#endif
};
}  // namespace

extern "C" {
void q6k_set_prefetch(int dist) { PF_DIST = dist; }
// the path that mode 0 runs in this build: "avx512-vnni", "avx2" or "scalar"
const char* q6k_isa(void) { return KQ_ISA_NAME; }
// y[k,N] = x[k,K] . W^T ; mode 0 = the compiled fast path (q6k_isa()), 1 = scalar reference (same bits);
// mode bit 2: the prompt-reading product (prompt.h; bit 1 its reference, bit 4 no AMX)
int q6k_gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    if (mode & 2) return prompt::gemm<Q6KPrompt>(W, N, K, x, k, y, nthreads, mode);
    // AVX2: the kernel's activation order (APERM)
    return gemm<quantize_row, kernel_ref>(W, N, K, x, k, y, nthreads, mode, nullptr, KQ_AVX2_PERM(APERM), &TILES);
}
// dequantize rows with the kernel's decoder ((d * scales[j]) * (u - 32), float32) = gguf.quants.dequantize
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
// the vector unpack of one block (U_0..U_3 = natural order, 256 bytes) for checking against decode_codes
void q6k_unpack_simd(const uint8_t* blk, uint8_t* u) {
#if defined(KQ_AVX512)
    q6k_unpack_block(blk, u);
#elif defined(KQ_AVX2)
    for (int h = 0; h < 2; ++h) {
        __m256i U[4];
        unpack_half(blk, h, U);
        for (int c = 0; c < 4; ++c) _mm256_storeu_si256((__m256i*)(u + 64 * c + 32 * h), U[c]);
    }
#else
    decode_codes(blk, u);
#endif
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
