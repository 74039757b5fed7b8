// Batch-invariant Q4_K x Q8_K-like GEMM, y[k,N] = x[k,K] . W[N,K]^T (any k; groups of <= 12 rows).
// W: raw GGUF block_q4_K bytes, row n = K/256 blocks of 144 bytes.
// x: float32 [k,K], quantized per row per 256-block to int8 (scale = amax/127).
//
// Three compiled paths, chosen by the preprocessor (build.py's isa: native / avx2 / scalar), giving the same
// bits; mode 0 runs the compiled one (named by q4k_isa()), mode 1 the scalar reference:
//   "avx512-vnni": __AVX512F/BW/VL/DQ/VNNI/VBMI__ (+ F16C, FMA) all defined: 16-lane zmm kernel;
//   "avx2":        __AVX2__ && __FMA__ && __F16C__: the 16 float lanes as two ymm halves (lanes 0..7, 8..15)
//                  with the same per-lane op sequence; integer dots vpmaddubsw + vpmaddwd(1), or AVX-VNNI
//                  vpdpbusd when __AVXVNNI__ (both exact, so both give the same bits);
//   "scalar":      plain C++ (x86-64 baseline, no F16C: portable exact fp16 -> fp32); mode 0 = the reference.
//
// Per output element (r, n) the arithmetic is fixed (independent of k, threads and path):
//   for each block b (in order):
//     DA    = dpbusd(dpbusd(0, Z0, A0), Z1, A1)     (int32, exact; each dword lane = one sub-block)
//     DB    = dpbusd(dpbusd(0, Z2, A2), Z3, A3)
//     I     = dpwssd(0, packs(DA,DB), S)            (int32, exact; each lane = one sub-block x its scale)
//     F     = float(I) * d_b                        (16 lanes, rounded)
//     acc   = fma(F, dx_rb, acc)
//     acc   = fnmadd(Mv_b, XB_rb, acc)              Mv = dmin*[sc_0..7, m_0..7], XB = [0 x8, dx*bsum_j]
//   y = fixed-tree horizontal sum of acc (16 lanes)
//   Z0..Z3: nibbles of qs[0:64] / qs[64:128] selected per dword (lo/hi) and dword-pair swapped so that
//   every dword lane holds the same sub-block in Z0,Z1 (and Z2,Z3); activations are stored in the same
//   permuted order (KPOS), so each block is unpacked once and reused for all rows of the group.
//   |DA|,|DB| <= 2*4*15*127 = 15240 so packs never saturates. Integer parts are exact; the float ops are
//   identical for every k (one template per row count, same per-row code), -ffp-contract=off, no
//   reassociation, so row results are bitwise independent of k, of the row position and of threads.
// AVX2 path: half h (lanes 8h..8h+7) = the 256-bit half h of the zmm lanes above. Lane (l, ii) of half h holds the
//   16 weights qs[32c + 16l + 0..15], nibble ii&1, c = h + 2(ii>>1) (sub-block 2c + (ii&1)). Per block and half,
//   once for all rows: X_ii = lo/hi nibbles of qs[32h:+32], qs[64+32h:+32] (lane (l, ii) in every dword),
//   V_k = 4x4 dword transpose (dword ii of V_k = dword k of X_ii); the AVX2 records hold the activations in the
//   matching order (APERM4, applied to the KPOS-order records before the kernel; the reference reads those).
//   Per row and half: I = madd(maddubs(V0,A0) + maddubs(V1,A1) + maddubs(V2,A2) + maddubs(V3,A3), S) (int16 words
//   = 8 products <= 8*15*127 = 15240: exact), or with AVX-VNNI D = 4 chained vpdpbusd (|D| <= 30480 < 2^15) and
//   I = madd(D, [sc, 0]): the same exact integers I as above, then F, fma, fnmadd as above. Lanes 0..7 have XB = 0:
//   fnmadd(dmin*sc, 0, acc) is exactly acc when dmin is finite, so it is only done (literally, after the fma as in
//   the reference) for blocks whose dmin is inf/NaN.
// Activations containing NaN are outside the contract (their int8 quantization may differ between paths).
// Also: software prefetch PF_DIST bytes ahead (q4k_set_prefetch). Rows go in groups of at most Q4K_G = 12 (kquant.h's
// run_tiles: every group over a tile of up to 64 outputs before the next tile, so the weights stream from memory
// once for all rows). Measured on a 2-core AVX-512 VNNI EPYC (benchmarks/results/kernel-rows.md): one 16-row
// instance costs more than two of 8; at most 8 a group costs ~10% more at 9..12 rows than one group of 12.
// AVX-512 path uses vpermb (AVX512_VBMI) for the scale broadcast; no AMX anywhere.
#include "kquant.h"   // shared with q6k.cpp: paths, fp16, horizontal sums, quantizer, prefetch, dispatch, driver

static const int BB = 144;  // bytes per block_q4_K
static int PF_DIST = 4096;  // software prefetch distance in bytes (0 = off)
static int PF_HINT = 0;     // 0: T0, 1: T1

// ---------------- activation quantization (per row, independent of k) ----------------
// Per row and 256-block: a[256] int8 in kernel order, dx (float), xb[16] float (lanes 0..7: 0, lanes 8..15: dx*bsum_j)
// kernel order of a block: byte pos = 64c + 16l + 4i + e (zmm c, xmm-lane l, dword i, byte e) holds
// natural weight index KPOS[pos] (see init_kpos); weights Z_c are built the same way from the nibbles.
static int KPOS[256];
static int SB_OF_DW[16];   // sub-block of dword (l,i) in DA (c=0,1); DB: +4
static int init_kpos() {
    for (int c = 0; c < 4; ++c) {
        const int t = c >> 1;          // L0 = qs[0:64] for c=0,1; L1 = qs[64:128] for c=2,3
        const bool sw = c & 1;         // Z1/Z3: dword pairs swapped (pshufd 0x4E) of the complementary select
        for (int l = 0; l < 4; ++l)
            for (int i = 0; i < 4; ++i)
                for (int e = 0; e < 4; ++e) {
                    const int chunk = 2 * t + (l >> 1), o = 16 * (l & 1);
                    int byte, hi;
                    if (!sw) { byte = o + 4 * i + e; hi = i >= 2; }
                    else { byte = i < 2 ? o + 4 * (i + 2) + e : o + 4 * (i - 2) + e; hi = i >= 2; }
                    const int sb = 2 * chunk + hi;
                    KPOS[64 * c + 16 * l + 4 * i + e] = 32 * sb + byte;
                }
    }
    for (int l = 0; l < 4; ++l) for (int i = 0; i < 4; ++i) SB_OF_DW[4 * l + i] = 2 * (l >> 1) + (i >= 2);
    return 0;
}
static int kpos_init_dummy = init_kpos();

// record per (block b, row r): [0,256) int8 a (kernel order), [256,320) xb[16] floats, [320,324) dx; REC = 384 bytes.
// Records are stored block-major ([nb][k]) so a kernel group of rows uses one pointer + constant offsets.

// the record of one block from its natural-order qi (AVX2 and scalar quantizers)
[[maybe_unused]] static void finish_block(const int32_t* qi, float d, uint8_t* rec) {
    int8_t* a = (int8_t*)rec; float* xb = (float*)(rec + 256);
    int bs[8];
    for (int j = 0; j < 8; ++j) { int s = 0; for (int i = 0; i < 32; ++i) s += qi[32 * j + i]; bs[j] = s; }
    *(float*)(rec + 320) = d;
    for (int p = 0; p < QK; ++p) a[p] = (int8_t)qi[KPOS[p]];
    for (int j = 0; j < 8; ++j) { xb[j] = 0.f; xb[8 + j] = d * (float)bs[j]; }
}
#if defined(KQ_AVX512)
static void quantize_row(const float* x, int K, uint8_t* rec0, size_t bstride) {
    // AVX-512 version; same IEEE ops as a scalar loop: amax = max|x|, d = amax/127,
    // q = round-half-even(x * (127/amax)) clamped to [-127,127]; per-row only (k-independent).
    const int nb = K / QK;
    for (int b = 0; b < nb; ++b) {
        const float* xs = x + (size_t)b * QK;
        const float amax = block_amax(xs);
        alignas(64) int8_t q[QK];
        float d = amax / 127.f;
        int bs[8];
        if (amax == 0.f) { memset(q, 0, QK); d = 0.f; for (int j = 0; j < 8; ++j) bs[j] = 0; }
        else {
            const __m512 is = _mm512_set1_ps(127.f / amax);
            const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
            for (int j = 0; j < 8; ++j) {
                __m512i v0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + 32 * j), is));
                __m512i v1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + 32 * j + 16), is));
                v0 = _mm512_min_epi32(_mm512_max_epi32(v0, lo), hi);
                v1 = _mm512_min_epi32(_mm512_max_epi32(v1, lo), hi);
                _mm_store_si128((__m128i*)(q + 32 * j), _mm512_cvtepi32_epi8(v0));
                _mm_store_si128((__m128i*)(q + 32 * j + 16), _mm512_cvtepi32_epi8(v1));
                bs[j] = _mm512_reduce_add_epi32(_mm512_add_epi32(v0, v1));
            }
        }
        uint8_t* rec = rec0 + (size_t)b * bstride;
        int8_t* a = (int8_t*)rec; float* xb = (float*)(rec + 256);
        *(float*)(rec + 320) = d;
        for (int p = 0; p < QK; ++p) a[p] = q[KPOS[p]];
        for (int j = 0; j < 8; ++j) { xb[j] = 0.f; xb[8 + j] = d * (float)bs[j]; }
    }
}
#else
static void quantize_row(const float* x, int K, uint8_t* rec0, size_t bstride) {
    quantize_row_qi<finish_block>(x, K, rec0, bstride);
}
#endif

#if defined(KQ_AVX512)
// ---------------- AVX-512 VNNI kernel, R rows at compile time ----------------
template <int R>
static void kernel_rows(const uint8_t* W, int n0, int n1, int N, int K, const uint8_t* rec, int r0, int kall, float* y) {
    const int nb = K / QK;
    const size_t rowbytes = (size_t)nb * BB;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    // vpermb index: int16 element (xmm-lane l, e) of packs(DA,DB) -> byte sc[sb] (odd bytes zeroed by mask)
    alignas(64) int8_t pidx[64];
    for (int l = 0; l < 4; ++l)
        for (int e = 0; e < 8; ++e) {
            const int ii = e >> 1;  // int32 lane (l, ii) of I: ii 0,1 from DA dwords (2ii, 2ii+1), ii 2,3 from DB
            const int sb = (ii < 2 ? SB_OF_DW[4 * l + 2 * ii] : SB_OF_DW[4 * l + 2 * (ii - 2)] + 4);
            pidx[16 * l + 2 * e] = (int8_t)sb; pidx[16 * l + 2 * e + 1] = 0;
        }
    const __m512i PIDX = _mm512_load_si512(pidx);
    const __mmask16 KHI = 0xCCCC;  // dwords i = 2,3 of each xmm-lane take the high nibble in Z0/Z2
    const __m128i k1v = _mm_set1_epi32(0x3f3f3f3f), k2v = _mm_set1_epi32(0x0f0f0f0f), k3v = _mm_set1_epi32(0x03030303);
    const __m128i sh04 = _mm_setr_epi32(0, 4, 0, 0);
    const uint8_t* RB = rec + (size_t)r0 * REC;      // record (b, r0 + r) = RB + b*bst + r*REC
    const size_t bst = (size_t)kall * REC;
    const int pfd = PF_DIST;

    for (int n = n0; n < n1; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = wr + (size_t)b * BB;
            prefetch_block<3>(blk, pfd, PF_HINT);
            // d, dmin
            const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(*(const int32_t*)blk));
            // vector decode of the 12 scale bytes: scm bytes 0..7 = sc[0..7], 8..15 = m[0..7]
            const __m128i v = _mm_loadu_si128((const __m128i*)(blk + 4));          // [u0,u1,u2,*]
            const __m128i lo = _mm_and_si128(v, k1v);                              // [sc0-3, m0-3]
            const __m128i u2 = _mm_shuffle_epi32(v, 0xAA);
            const __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(u2, sh04), k2v),
                                            _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(v, 6), k3v), 4));  // [sc4-7, m4-7]
            const __m128i scm = _mm_unpacklo_epi32(lo, hi);                        // [sc0-3, sc4-7, m0-3, m4-7]
            const __m512i scz = _mm512_castsi128_si512(scm);
            const __m512i S = _mm512_maskz_permutexvar_epi8(0x5555555555555555ULL, PIDX, scz);
            // lanes 0..7: dmin*sc (multiplied by xb zeros), lanes 8..15: dmin*m_j
            const __m512 Mvz = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(scm)),
                                             _mm512_broadcastss_ps(_mm_movehdup_ps(dd)));
            const __m512 dv = _mm512_broadcastss_ps(dd);
            const __m512i q01 = _mm512_loadu_si512(blk + 16);
            const __m512i q23 = _mm512_loadu_si512(blk + 80);
            const __m512i h01 = _mm512_srli_epi16(q01, 4), l01 = _mm512_and_si512(q01, m4);
            const __m512i h23 = _mm512_srli_epi16(q23, 4), l23 = _mm512_and_si512(q23, m4);
            const __m512i Z0 = _mm512_mask_and_epi32(l01, KHI, h01, m4);
            const __m512i Z1 = _mm512_shuffle_epi32(_mm512_mask_and_epi32(l01, (__mmask16)~KHI, h01, m4), (_MM_PERM_ENUM)0x4E);
            const __m512i Z2 = _mm512_mask_and_epi32(l23, KHI, h23, m4);
            const __m512i Z3 = _mm512_shuffle_epi32(_mm512_mask_and_epi32(l23, (__mmask16)~KHI, h23, m4), (_MM_PERM_ENUM)0x4E);
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                const uint8_t* rr = RB + b * bst + r * REC;
                const int8_t* ar = (const int8_t*)rr;
                const __m512i z = _mm512_setzero_si512();
                __m512i DA = _mm512_dpbusd_epi32(z, Z0, _mm512_loadu_si512(ar));
                __m512i DB = _mm512_dpbusd_epi32(z, Z2, _mm512_loadu_si512(ar + 128));
                DA = _mm512_dpbusd_epi32(DA, Z1, _mm512_loadu_si512(ar + 64));
                DB = _mm512_dpbusd_epi32(DB, Z3, _mm512_loadu_si512(ar + 192));
                __m512i I = _mm512_dpwssd_epi32(z, _mm512_packs_epi32(DA, DB), S);
                __m512 F = _mm512_mul_ps(_mm512_cvtepi32_ps(I), dv);
                acc[r] = _mm512_fmadd_ps(F, _mm512_set1_ps(*(const float*)(rr + 320)), acc[r]);
                acc[r] = _mm512_fnmadd_ps(Mvz, _mm512_loadu_ps((const float*)(rr + 256)), acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) y[(size_t)(r0 + r) * N + n] = hsum16(acc[r]);
    }
}

#elif defined(KQ_AVX2)
// ---------------- AVX2 kernel (two 8-lane halves), R rows at compile time ----------------
// weights of half h: nibble vectors X_ii (ii = 0..3: lo/hi of qs[32h:+32], lo/hi of qs[64+32h:+32]) hold lane
// (l, ii) in every dword of 128-bit lane l; V = their 4x4 dword transpose: dword ii of V_k = dword k of X_ii.
static inline void unpack_half(const uint8_t* blk, int h, __m256i V[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i qa = _mm256_loadu_si256((const __m256i*)(blk + 16 + 32 * h));
    const __m256i qb = _mm256_loadu_si256((const __m256i*)(blk + 80 + 32 * h));
    const __m256i X0 = _mm256_and_si256(qa, m4), X1 = _mm256_and_si256(_mm256_srli_epi16(qa, 4), m4);
    const __m256i X2 = _mm256_and_si256(qb, m4), X3 = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
    const __m256i T0 = _mm256_unpacklo_epi32(X0, X1), T1 = _mm256_unpackhi_epi32(X0, X1);
    const __m256i T2 = _mm256_unpacklo_epi32(X2, X3), T3 = _mm256_unpackhi_epi32(X2, X3);
    V[0] = _mm256_unpacklo_epi64(T0, T2); V[1] = _mm256_unpackhi_epi64(T0, T2);
    V[2] = _mm256_unpacklo_epi64(T1, T3); V[3] = _mm256_unpackhi_epi64(T1, T3);
}
// int32 lane (l, ii) of half h = exact sum over its 16 weights of code * a (before the scale)
// maddubs path: int16 word = 8 products (<= 8*15*127 = 15240), madd with S (both words sc) = sc * 16 products;
// AVX-VNNI path: dword = 16 products (|.| <= 30480 < 2^15, so it is its own low int16 word), madd with (sc, 0).
static inline __m256i lane_dots(const __m256i V[4], const int8_t* a, __m256i S, __m256i Slo) {
#if defined(__AVXVNNI__)
    (void)S;
    __m256i D = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), V[0], _mm256_load_si256((const __m256i*)a));
    D = _mm256_dpbusd_avx_epi32(D, V[1], _mm256_load_si256((const __m256i*)(a + 64)));
    D = _mm256_dpbusd_avx_epi32(D, V[2], _mm256_load_si256((const __m256i*)(a + 128)));
    D = _mm256_dpbusd_avx_epi32(D, V[3], _mm256_load_si256((const __m256i*)(a + 192)));
    return _mm256_madd_epi16(D, Slo);
#else
    (void)Slo;
    const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(V[0], _mm256_load_si256((const __m256i*)a)),
                                         _mm256_maddubs_epi16(V[1], _mm256_load_si256((const __m256i*)(a + 64))));
    const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(V[2], _mm256_load_si256((const __m256i*)(a + 128))),
                                         _mm256_maddubs_epi16(V[3], _mm256_load_si256((const __m256i*)(a + 192))));
    return _mm256_madd_epi16(_mm256_add_epi16(p01, p23), S);
#endif
}
// AVX2 record order of the 256 activations: position 64k + 32h + 16l + 4ii + e holds natural index
// 32*(2c + (ii&1)) + 16l + 4k + e, c = h + 2(ii>>1); APERM4[pos] = its position in the KPOS (AVX-512) order.
static int APERM4[256];
static int init_aperm4() {
    int kinv[256];
    for (int p = 0; p < 256; ++p) kinv[KPOS[p]] = p;
    for (int k = 0; k < 4; ++k) for (int h = 0; h < 2; ++h) for (int l = 0; l < 2; ++l)
        for (int ii = 0; ii < 4; ++ii) for (int e = 0; e < 4; ++e) {
            const int c = h + 2 * (ii >> 1);
            APERM4[64 * k + 32 * h + 16 * l + 4 * ii + e] = kinv[32 * (2 * c + (ii & 1)) + 16 * l + 4 * k + e];
        }
    return 0;
}
static int aperm4_dummy = init_aperm4();

template <int R>
static void kernel_rows(const uint8_t* W, int n0, int n1, int N, int K, const uint8_t* rec, int r0, int kall, float* y) {
    const int nb = K / QK;
    const size_t rowbytes = (size_t)nb * BB;
    // vpshufb index of half h: int16 element (128-bit lane lp, e) of packs(DA,DB) -> byte sc[sb], high byte 0
    alignas(32) int8_t pidx[2][32], plo[2][32];   // plo: (sc, 0) int16 pairs for the AVX-VNNI madd
    for (int h = 0; h < 2; ++h)
        for (int lp = 0; lp < 2; ++lp)
            for (int e = 0; e < 8; ++e) {
                const int l = 2 * h + lp, ii = e >> 1;
                const int sb = (ii < 2 ? SB_OF_DW[4 * l + 2 * ii] : SB_OF_DW[4 * l + 2 * (ii - 2)] + 4);
                pidx[h][16 * lp + 2 * e] = (int8_t)sb; pidx[h][16 * lp + 2 * e + 1] = (int8_t)0x80;
                plo[h][16 * lp + 2 * e] = (e & 1) ? (int8_t)0x80 : (int8_t)sb; plo[h][16 * lp + 2 * e + 1] = (int8_t)0x80;
            }
    const __m256i PIDX0 = _mm256_load_si256((const __m256i*)pidx[0]), PIDX1 = _mm256_load_si256((const __m256i*)pidx[1]);
    const __m256i PLO0 = _mm256_load_si256((const __m256i*)plo[0]), PLO1 = _mm256_load_si256((const __m256i*)plo[1]);
    const __m128i k1v = _mm_set1_epi32(0x3f3f3f3f), k2v = _mm_set1_epi32(0x0f0f0f0f), k3v = _mm_set1_epi32(0x03030303);
    const __m128i sh04 = _mm_setr_epi32(0, 4, 0, 0);
    const uint8_t* RB = rec + (size_t)r0 * REC;      // record (b, r0 + r) = RB + b*bst + r*REC
    const size_t bst = (size_t)kall * REC;
    const int pfd = PF_DIST;

    for (int n = n0; n < n1; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        __m256 acc0[R], acc1[R];
        for (int r = 0; r < R; ++r) { acc0[r] = _mm256_setzero_ps(); acc1[r] = _mm256_setzero_ps(); }
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = wr + (size_t)b * BB;
            prefetch_block<3>(blk, pfd, PF_HINT);
            const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(*(const int32_t*)blk));   // [d, dmin, 0, 0]
            uint16_t hdmin; memcpy(&hdmin, blk + 2, 2);
            const bool dmin_nonfinite = (hdmin & 0x7c00) == 0x7c00;
            // vector decode of the 12 scale bytes: scm bytes 0..7 = sc[0..7], 8..15 = m[0..7]
            const __m128i v = _mm_loadu_si128((const __m128i*)(blk + 4));
            const __m128i lo = _mm_and_si128(v, k1v);
            const __m128i u2 = _mm_shuffle_epi32(v, 0xAA);
            const __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(u2, sh04), k2v),
                                            _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(v, 6), k3v), 4));
            const __m128i scm = _mm_unpacklo_epi32(lo, hi);
            const __m256i scm2 = _mm256_broadcastsi128_si256(scm);
            const __m256 dminv = _mm256_broadcastss_ps(_mm_movehdup_ps(dd));
            const __m256 dv = _mm256_broadcastss_ps(dd);
            const uint8_t* RBb = RB + b * bst;
            __m256i Z[4];
            // ---- half 0: lanes 0..7 (XB = 0)
            unpack_half(blk, 0, Z);
            {
                const __m256i S = _mm256_shuffle_epi8(scm2, PIDX0), Slo = _mm256_shuffle_epi8(scm2, PLO0);
#pragma GCC unroll 16
                for (int r = 0; r < R; ++r) {
                    const uint8_t* rr = RBb + r * REC;
                    const __m256i I = lane_dots(Z, (const int8_t*)rr, S, Slo);
                    const __m256 F = _mm256_mul_ps(_mm256_cvtepi32_ps(I), dv);
                    acc0[r] = _mm256_fmadd_ps(F, _mm256_broadcast_ss((const float*)(rr + 320)), acc0[r]);
                }
                if (__builtin_expect(dmin_nonfinite, 0)) {
                    const __m256 Mv0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(scm)), dminv);
                    for (int r = 0; r < R; ++r)
                        acc0[r] = _mm256_fnmadd_ps(Mv0, _mm256_loadu_ps((const float*)(RBb + r * REC + 256)), acc0[r]);
                }
            }
            // ---- half 1: lanes 8..15
            unpack_half(blk, 1, Z);
            {
                const __m256i S = _mm256_shuffle_epi8(scm2, PIDX1), Slo = _mm256_shuffle_epi8(scm2, PLO1);
                const __m256 Mv1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(scm, 8))), dminv);
#pragma GCC unroll 16
                for (int r = 0; r < R; ++r) {
                    const uint8_t* rr = RBb + r * REC;
                    const __m256i I = lane_dots(Z, (const int8_t*)rr + 32, S, Slo);
                    const __m256 F = _mm256_mul_ps(_mm256_cvtepi32_ps(I), dv);
                    acc1[r] = _mm256_fmadd_ps(F, _mm256_broadcast_ss((const float*)(rr + 320)), acc1[r]);
                    acc1[r] = _mm256_fnmadd_ps(Mv1, _mm256_loadu_ps((const float*)(rr + 288)), acc1[r]);
                }
            }
        }
        for (int r = 0; r < R; ++r) y[(size_t)(r0 + r) * N + n] = hsum16(acc0[r], acc1[r]);
    }
}
#endif

#ifndef Q4K_G   // rows a group (-D for a study of the shape)
#define Q4K_G 12
#endif
#ifndef Q4K_NT  // outputs a tile
#define Q4K_NT 64
#endif
KQ_TILES(kernel_rows, Q4K_G, Q4K_NT);

// ---------------- scalar reference: same arithmetic, emulating vector lanes ----------------
// Each weight block is decoded once per (n, b) and used for the k rows; per-lane op sequence as in the kernels.
static void kernel_ref(const uint8_t* W, int N, int K, const uint8_t* rec, int k, float* y, int nthreads) {
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
                const float d = h2f(blk), dmin = h2f(blk + 2);
                uint8_t sc[8], mn[8];
                decode_scales(blk + 4, sc, mn);
                uint8_t qn[256];  // natural-order nibbles: sub-block 2c lo / 2c+1 hi of qs[32c..32c+31]
                for (int c = 0; c < 4; ++c)
                    for (int i = 0; i < 32; ++i) { qn[64 * c + i] = blk[16 + 32 * c + i] & 15; qn[64 * c + 32 + i] = blk[16 + 32 * c + i] >> 4; }
                uint8_t qk[256];  // the same in kernel (record) order
                for (int p = 0; p < 256; ++p) qk[p] = qn[KPOS[p]];
                float mv[16];
                for (int l = 0; l < 16; ++l) mv[l] = (l < 8 ? (float)sc[l] : (float)mn[l - 8]) * dmin;
                for (int r = 0; r < k; ++r) {
                    float* acc = accs + 16 * r;
                    const uint8_t* rr = rec + ((size_t)b * k + r) * REC;
                    const int8_t* ar = (const int8_t*)rr;   // kernel order
                    int32_t DA[16], DB[16];
                    for (int l = 0; l < 16; ++l) {
                        int sa = 0, sbb = 0;
                        for (int c = 0; c < 2; ++c)
                            for (int e = 0; e < 4; ++e) {
                                const int pa = 64 * c + 4 * l + e, pb = 128 + 64 * c + 4 * l + e;
                                sa += (int)qk[pa] * (int)ar[pa];
                                sbb += (int)qk[pb] * (int)ar[pb];
                            }
                        DA[l] = sa; DB[l] = sbb;
                    }
                    int32_t I[16];
                    for (int l = 0; l < 4; ++l)
                        for (int ii = 0; ii < 4; ++ii) {
                            const int32_t* D = ii < 2 ? DA : DB;
                            const int dw = 4 * l + 2 * (ii & 1);
                            int v0 = D[dw], v1 = D[dw + 1];
                            v0 = v0 > 32767 ? 32767 : v0 < -32768 ? -32768 : v0;  // packs saturation (never hit)
                            v1 = v1 > 32767 ? 32767 : v1 < -32768 ? -32768 : v1;
                            const int sb = SB_OF_DW[dw] + (ii < 2 ? 0 : 4);
                            I[4 * l + ii] = v0 * (int)sc[sb] + v1 * (int)sc[sb];
                        }
                    const float dxr = *(const float*)(rr + 320);
                    const float* xb = (const float*)(rr + 256);
                    for (int l = 0; l < 16; ++l) {
                        const float F = (float)I[l] * d;
                        acc[l] = fmaf(F, dxr, acc[l]);
                        acc[l] = fmaf(-mv[l], xb[l], acc[l]);
                    }
                }
            }
            for (int r = 0; r < k; ++r) y[(size_t)r * N + n] = hsum16_ref(accs + 16 * r);
        }
        free(accs);
    }
}

// ---------------- the prompt-reading product (prompt.h): this format's pieces ----------------
#include "prompt.h"
struct Q4KPrompt {
    static const int BB = 144, SUB = 32, NSUB = 8, OFF = 0, HAS_MIN = 1;
    static const int EXTRA = 4 * 64 + 64;   // per panel block: m pairs [4][16] int32 (m_2i | m_2i+1 << 16), dmin[16]
    // codes (natural order), sub-block scales and mins, d, dmin of one block (scalar)
    static void decode(const uint8_t* blk, uint8_t u[256], int sc[8], int mn[8], float* d, float* dmin) {
        *d = h2f(blk);
        *dmin = h2f(blk + 2);
        uint8_t s8[8], m8[8];
        decode_scales(blk + 4, s8, m8);
        for (int j = 0; j < 8; ++j) { sc[j] = s8[j]; mn[j] = m8[j]; }
        for (int t = 0; t < 4; ++t)
            for (int i = 0; i < 32; ++i) {
                u[64 * t + i] = blk[16 + 32 * t + i] & 15;
                u[64 * t + 32 + i] = blk[16 + 32 * t + i] >> 4;
            }
    }
    // the 16-weight sums s16[16] of a block's activations -> what tail() reads: pairs of the 32-weight sums
    static void extra(int32_t* e) {
        int32_t s[8];
        for (int j = 0; j < 8; ++j) s[j] = e[2 * j] + e[2 * j + 1];
        for (int i = 0; i < 4; ++i) e[i] = (int32_t)((uint32_t)(uint16_t)s[2 * i] | ((uint32_t)(uint16_t)s[2 * i + 1] << 16));
    }
#if defined(KQ_AVX512)
    static void unpack(const uint8_t* blk, uint8_t* u) {
        const __m256i m4 = _mm256_set1_epi8(0x0F);
        for (int t = 0; t < 4; ++t) {
            const __m256i q = _mm256_loadu_si256((const __m256i*)(blk + 16 + 32 * t));
            _mm256_store_si256((__m256i*)(u + 64 * t), _mm256_and_si256(q, m4));
            _mm256_store_si256((__m256i*)(u + 64 * t + 32), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
        }
    }
    // column c's scales, d and extra (m pairs, dmin) of one block
    static void scales(const uint8_t* blk, int c, int sc[8], float* d, int32_t* extra) {
        *d = h2f(blk);
        uint8_t s8[8], m8[8];
        decode_scales(blk + 4, s8, m8);
        for (int j = 0; j < 8; ++j) sc[j] = s8[j];
        for (int i = 0; i < 4; ++i) extra[16 * i + c] = (int32_t)(m8[2 * i] | (m8[2 * i + 1] << 16));
        ((float*)extra)[64 + c] = h2f(blk + 2);
    }
    // v - M * dmin, M = sum_j m_j * (sum of sub-block j's a) (exact, 4 x vpdpwssd); X: the panel's extra
    static inline __m512 tail(const uint8_t* X, const int32_t* e, __m512 v) { return prompt::mins_tail(X, e, v); }
#endif
};

extern "C" {
void q4k_set_prefetch(int dist, int hint) { PF_DIST = dist; PF_HINT = hint; }
// the path that mode 0 runs in this build: "avx512-vnni", "avx2" or "scalar"
const char* q4k_isa(void) { return KQ_ISA_NAME; }
// y[k,N] = x[k,K] . W^T ; mode 0 = the compiled fast path (q4k_isa()), 1 = scalar reference (same bits);
// mode bit 2: the prompt-reading product (prompt.h; bit 1 its reference, bit 4 no AMX)
// rows are processed in groups of at most Q4K_G (one template instance per group, run_tiles)
int q4k_gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    if (mode & 2) return prompt::gemm<Q4KPrompt>(W, N, K, x, k, y, nthreads, mode);
    // AVX2: the kernel's activation order (APERM4)
    return gemm<quantize_row, kernel_ref>(W, N, K, x, k, y, nthreads, mode, nullptr, KQ_AVX2_PERM(APERM4), &TILES);
}
// export the quantized activations (for the float64 reference in check.py): a in natural order
void q4k_quant_x(const float* x, int k, int K, int8_t* a_nat, float* dx) {
    const int nb = K / QK;
    uint8_t* rec = (uint8_t*)aligned_alloc(64, (size_t)nb * REC);
    for (int r = 0; r < k; ++r) {
        quantize_row(x + (size_t)r * K, K, rec, REC);
        for (int b = 0; b < nb; ++b) {
            dx[(size_t)r * nb + b] = *(const float*)(rec + (size_t)b * REC + 320);
            for (int p = 0; p < QK; ++p) a_nat[(size_t)r * K + b * QK + KPOS[p]] = (int8_t)rec[(size_t)b * REC + p];
        }
    }
    free(rec);
}
// float32 decoding of N rows, as gguf.quants.dequantize: (d*sc)*q - dmin*m, each op rounded to float32
void q4k_dequant(const uint8_t* W, int N, int K, float* out) {
    const int nb = K / QK;
    for (size_t n = 0; n < (size_t)N; ++n)
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = W + (n * nb + b) * BB;
            const float d = h2f(blk), dmin = h2f(blk + 2);
            uint8_t sc[8], mn[8];
            decode_scales(blk + 4, sc, mn);
            float* o = out + n * K + (size_t)b * QK;
            for (int j = 0; j < 8; ++j) {
                const float ds = d * (float)sc[j], dm = dmin * (float)mn[j];
                const uint8_t* qs = blk + 16 + 32 * (j >> 1);
                const int sh = 4 * (j & 1);
                for (int i = 0; i < 32; ++i) o[32 * j + i] = ds * (float)((qs[i] >> sh) & 15) - dm;
            }
        }
}
}
