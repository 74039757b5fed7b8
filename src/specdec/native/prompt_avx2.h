// The AVX2 path of the prompt-reading product (prompt.h), same bits as its reference: the AVX-512 path's design
// with 8 output columns per ymm. Threads share out panels of 16 output columns; per panel, block by block, the
// block's 16 columns are packed (F::decode, into one L1-resident buffer) and every row runs through it, R = 4 rows
// at a time (each packed weight vector loaded once per 4 rows), into acc [k][16] floats; then acc -> y. The rows are
// copied block-major first, so that a block's rows are one stream.
//
// Packed block, Panel<F>::VNNI bytes (the AVX-512 VNNI panel's layout; columns past N repeat column N-1):
//   [0, 4096)              64 rows g of 64 bytes: bytes 4c..4c+3 = column c's codes of weights 4g..4g+3
//                          (ymm half h = bytes 32h..32h+31 = columns 8h..8h+7)
//   [4096, +NSUB*64)       sc[NSUB][16] int32 (the sub-block scales), then d[16] float
//   with mins, then:       M2[NSUB/2][16] int32 (m_2i | m_2i+1 << 16), dmin[16] float (Q4_K 8 mins; Q5_K, Q2_K 16)
// Integer sums (|a| <= 127), exact: nothing saturates or wraps.
//   maddubs(u8 codes, s8 a): int16 words of 2 products. A sub-block's words add up in int16, then madd(., sc_j
//   in both words) gives sc_j * isum_j per column in int32 (|.| <= 30480 * 2 * 127). Q4_K (codes <= 15, 32 weights): a word sums 16 products, |.| <= 30480.
//   Q6_K (codes <= 63, 16 weights): a word starts at its offset -32 * (its 8 activations) and each product
//   u * a replaces a term -32 * a by (u - 32) * a: 8 terms of |.| <= 32 * 127, so |.| <= 32512 throughout.
//   AVX-VNNI (where compiled with it): dpbusd sums 4 products into int32 from -ext_j (Q6_K: 32 * t_j) or 0,
//   then mullo by sc_j. I = the sum over sub-blocks (exact, bounds in prompt.h).
//   The mins' tail: M = sum_i madd(M2[i], ext[i]), ext[i] = t_2i | t_2i+1 << 16 (|t| <= 32*127, m <= 63).
// Float ops per (row, column) are those of the reference, in its order (per block: float(I) * d, the tail, fma); rows never mix, so a row's bits do not
// depend on R, k, the row's position or the threads.
#pragma once
namespace prompt {


// 8 rows of 8 dwords (row i at src + i * ss bytes) -> their transpose (row d at dst + d * ds bytes)
inline void transpose8_copy(const void* src, size_t ss, void* dst, size_t ds) {
    __m256i r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256((const __m256i*)((const uint8_t*)src + i * ss));
    transpose::transpose8(r);
    for (int d = 0; d < 8; ++d) _mm256_storeu_si256((__m256i*)((uint8_t*)dst + d * ds), r[d]);
}

// block b of output columns n0..n0+15 -> P (layout above)
template <class F>
void pack_block(const uint8_t* W, int N, int nb, int n0, int b, uint8_t* P) {
    alignas(32) uint8_t U[16][QK];                          // [column][weight]
    alignas(32) int32_t sc[16][F::NSUB], mn[16][F::NSUB], T[F::NSUB][8];
    alignas(32) float d[16], dmin[16];
    for (int c = 0; c < 16; ++c) {
        const int n = n0 + c < N ? n0 + c : N - 1;
        F::decode(W + ((size_t)n * nb + b) * F::BB, U[c], sc[c], mn[c], &d[c], &dmin[c]);
    }
    int32_t* S = (int32_t*)(P + WQ);
    int32_t* M2 = (int32_t*)(P + Panel<F>::VNNI_D + 64);
    for (int h = 0; h < 2; ++h) {                            // columns 8h..8h+7
        for (int t = 0; t < 8; ++t)                          // weights 32t..32t+31 = rows g = 8t..8t+7
            transpose8_copy(U[8 * h] + 32 * t, QK, P + 64 * 8 * t + 32 * h, 64);
        for (int t = 0; t < F::NSUB / 8; ++t) transpose8_copy(&sc[8 * h][8 * t], 4 * F::NSUB, S + 16 * 8 * t + 8 * h, 64);
        if (F::HAS_MIN) {
            for (int t = 0; t < F::NSUB / 8; ++t)          // T[j][c] = m_j of column 8h + c
                transpose8_copy(&mn[8 * h][8 * t], 4 * F::NSUB, T[8 * t], 32);
            for (int i = 0; i < F::NSUB / 2; ++i)
                _mm256_store_si256((__m256i*)(M2 + 16 * i + 8 * h),
                                   _mm256_or_si256(_mm256_load_si256((const __m256i*)T[2 * i]),
                                                   _mm256_slli_epi32(_mm256_load_si256((const __m256i*)T[2 * i + 1]), 16)));
        }
    }
    memcpy(P + Panel<F>::VNNI_D, d, sizeof d);
    if (F::HAS_MIN) memcpy(M2 + 16 * (F::NSUB / 2), dmin, sizeof dmin);
}

inline __m256i bcast4(const int8_t* p) { int32_t v; memcpy(&v, p, 4); return _mm256_set1_epi32(v); }

// Q6_K without AVX-VNNI, the word offsets of one row's block: o[j] = the int16 pair -OFF * (sum of sub-block j's
// activations at weights 4g + {0,1}) | the same at 4g + {2,3} << 16, g = 0..3 (words 0 and 1 of each dword lane)
inline void word_offsets(int off, const int8_t* a, int32_t* o) {
    for (int j = 0; j < 16; ++j, a += 16) {
        int w0 = 0, w1 = 0;
        for (int g = 0; g < 4; ++g) { w0 += a[4 * g] + a[4 * g + 1]; w1 += a[4 * g + 2] + a[4 * g + 3]; }
        o[j] = (int32_t)((uint32_t)(uint16_t)(-off * w0) | (uint32_t)(uint16_t)(-off * w1) << 16);
    }
}

// s[r][h] = sc_j * isum_j of rows r (activations a + r*QK, e[16r]: ext_j or the word offsets) and columns
// 8h..8h+7; w = the sub-block's SUB/4 rows of the packed block, S = its scales [16] int32
template <class F, int R>
inline void subblock_sums(const uint8_t* w, const int32_t* S, const int8_t* a, const int32_t* e, __m256i s[R][2]) {
    const int G = F::SUB / 4;   // groups of 4 weights
#if defined(__AVXVNNI__)
    for (int r = 0; r < R; ++r)
        s[r][0] = s[r][1] = F::OFF ? _mm256_set1_epi32(-e[16 * r]) : _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
        const __m256i w0 = _mm256_load_si256((const __m256i*)(w + 64 * g));
        const __m256i w1 = _mm256_load_si256((const __m256i*)(w + 64 * g + 32));
        for (int r = 0; r < R; ++r) {
            const __m256i A = bcast4(a + QK * r + 4 * g);
            s[r][0] = _mm256_dpbusd_avx_epi32(s[r][0], w0, A);
            s[r][1] = _mm256_dpbusd_avx_epi32(s[r][1], w1, A);
        }
    }
    for (int h = 0; h < 2; ++h) {
        const __m256i Sh = _mm256_load_si256((const __m256i*)(S + 8 * h));
        for (int r = 0; r < R; ++r) s[r][h] = _mm256_mullo_epi32(s[r][h], Sh);
    }
#else
    __m256i p[R][2];   // int16 words (bounds above): Q4_K from 0, Q6_K from e = its word offsets
    for (int r = 0; r < R; ++r) p[r][0] = p[r][1] = F::OFF ? _mm256_set1_epi32(e[16 * r]) : _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
        __m256i w0 = _mm256_load_si256((const __m256i*)(w + 64 * g));
        __m256i w1 = _mm256_load_si256((const __m256i*)(w + 64 * g + 32));
        asm("" : "+x"(w0), "+x"(w1));   // loaded once for the R rows (GCC would load them again for each row)
        for (int r = 0; r < R; ++r) {
            const __m256i A = bcast4(a + QK * r + 4 * g);
            p[r][0] = _mm256_add_epi16(p[r][0], _mm256_maddubs_epi16(w0, A));
            p[r][1] = _mm256_add_epi16(p[r][1], _mm256_maddubs_epi16(w1, A));
            asm("" : "+x"(p[r][0]), "+x"(p[r][1]));   // keep the adds in this order: GCC would tree them and spill
        }
    }
    for (int h = 0; h < 2; ++h) {   // sc_j in both int16 words of each column's dword
        const __m256i Sh = _mm256_load_si256((const __m256i*)(S + 8 * h));
        const __m256i pair = _mm256_blend_epi16(Sh, _mm256_slli_epi32(Sh, 16), 0xAA);
        for (int r = 0; r < R; ++r) s[r][h] = _mm256_madd_epi16(p[r][h], pair);
    }
#endif
}

// Q4_K: v - float(M) * dmin for columns 8h..8h+7 (X = the block's M2, then dmin); e = the row's ext of the block
template <class F>
inline __m256 tail(const uint8_t* X, int h, const int32_t* e, __m256 v) {
    if (!F::HAS_MIN) return v;
    __m256i m = _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(X + 32 * h)), _mm256_set1_epi32(e[0]));
    for (int i = 1; i < F::NSUB / 2; ++i)
        m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(X + 64 * i + 32 * h)),
                                                  _mm256_set1_epi32(e[i])));
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_load_ps((const float*)(X + 32 * F::NSUB + 32 * h)), v);
}

// one block of R rows (a [R][QK], dx [R], e [R][16]: ext or the word offsets) x the 16 columns of its packed
// block P, into acc [R][16]
template <class F, int R>
inline void block_rows(const uint8_t* P, const int8_t* a, const float* dx, const int32_t* e, float* acc) {
    const int32_t* S = (const int32_t*)(P + WQ);
    const float* D = (const float*)(P + Panel<F>::VNNI_D);
    __m256i I[R][2];
    for (int r = 0; r < R; ++r) I[r][0] = I[r][1] = _mm256_setzero_si256();
    for (int j = 0; j < F::NSUB; ++j) {
        __m256i s[R][2];
        subblock_sums<F, R>(P + 16 * F::SUB * j, S + 16 * j, a + F::SUB * j, e + j, s);
        for (int r = 0; r < R; ++r)
            for (int h = 0; h < 2; ++h) I[r][h] = _mm256_add_epi32(I[r][h], s[r][h]);
    }
    for (int r = 0; r < R; ++r) {
        const __m256 d = _mm256_set1_ps(dx[r]);
        for (int h = 0; h < 2; ++h) {
            float* o = acc + 16 * r + 8 * h;
            const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(I[r][h]), _mm256_load_ps(D + 8 * h));
            const __m256 vt = tail<F>((const uint8_t*)(D + 16), h, e + 16 * r, v);
            _mm256_store_ps(o, _mm256_fmadd_ps(vt, d, _mm256_load_ps(o)));
        }
    }
}

// y[k,N] from the quantized rows: a [kp][K] int8 natural order, dx [kp][nb], ext [kp][nb][16] (F::extra);
// rows k..kp-1 are zero padding (kp = k rounded up to 16, so rows up to kr = k rounded up to R exist), copied
// block-major: ab [nb][kr][QK], db [nb][kr], eb [nb][kr][16] (ext, or the word offsets)
template <class F>
void product_avx2(const uint8_t* W, int N, int K, const int8_t* a, const float* dx, const int32_t* ext, float* y, int k,
                  int nthreads) {
#ifndef PROMPT_AVX2_R  // rows a step (2, 4 or 8: kr <= kp; -DPROMPT_AVX2_R=.. to measure)
#define PROMPT_AVX2_R 4
#endif
    const int R = PROMPT_AVX2_R;
    static_assert(16 % R == 0, "rows a step must divide 16: the padded rows kr stay within the kp rows of a");
    const int nb = K / QK, np = (N + 15) / 16, kr = (k + R - 1) / R * R;
#if defined(__AVXVNNI__)
    const bool words = false;
#else
    const bool words = F::OFF;
#endif
    static_assert(!F::OFF || F::SUB == 16, "word offsets: 16-weight sub-blocks");
    int8_t* ab = (int8_t*)aligned_alloc(64, (size_t)nb * kr * QK);
    float* db = (float*)aligned_alloc(64, ((size_t)nb * kr * 4 + 63) / 64 * 64);
    int32_t* eb = (int32_t*)aligned_alloc(64, (size_t)nb * kr * 64);
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < kr; ++r)
            for (int b = 0; b < nb; ++b) {
                const size_t i = (size_t)b * kr + r, o = (size_t)r * nb + b;
                memcpy(ab + i * QK, a + o * QK, QK);
                db[i] = dx[o];
                if (words) word_offsets(F::OFF, a + o * QK, eb + 16 * i);
                else memcpy(eb + 16 * i, ext + 16 * o, 64);
            }
        uint8_t* P = (uint8_t*)aligned_alloc(64, (Panel<F>::VNNI + 63) / 64 * 64);
        float* acc = (float*)aligned_alloc(64, sizeof(float) * 16 * kr);
#pragma omp for schedule(static)
        for (int p = 0; p < np; ++p) {
            memset(acc, 0, sizeof(float) * 16 * kr);
            for (int b = 0; b < nb; ++b) {
                pack_block<F>(W, N, nb, 16 * p, b, P);
                const size_t i = (size_t)b * kr;
                for (int r0 = 0; r0 < k; r0 += R)
                    block_rows<F, R>(P, ab + (i + r0) * QK, db + i + r0, eb + (i + r0) * 16, acc + 16 * r0);
            }
            const int cols = N - 16 * p < 16 ? N - 16 * p : 16;
            for (int r = 0; r < k; ++r) memcpy(y + (size_t)r * N + 16 * p, acc + 16 * r, sizeof(float) * cols);
        }
        free(P); free(acc);
    }
    free(ab); free(db); free(eb);
}
}  // namespace prompt
