// The AVX2 path of the prompt-reading product (prompt.h), same bits as its reference: the AVX-512 path's design
// with 8 output columns per ymm. Each thread packs a panel of 16 output columns (all blocks, F::decode) once and
// runs every row through it, R rows at a time, so each packed weight vector is loaded once per R rows.
//
// Panel layout, per block F::PB bytes (that of the AVX-512 path; columns past N repeat column N-1):
//   [0, 4096)              64 rows g of 64 bytes: bytes 4c..4c+3 = column c's codes of weights 4g..4g+3
//                          (ymm half h = bytes 32h..32h+31 = columns 8h..8h+7)
//   [4096, +NSUB*64)       dsc[NSUB][16] float (d * sc_j, as F::decode computes it)
//   Q4_K, then:            M2[4][16] int32 (m_2i | m_2i+1 << 16), dmin[16] float
// Integer bounds (|a| <= 127): maddubs(u8 codes, s8 a) leaves int16 words of 2 products each; a word accumulates
// in int16 at most Q4_K (codes <= 15): a whole 32-weight sub-block, 16 products <= 30480; Q6_K (codes <= 63): 2
// groups of 4 weights, 4 products <= 32004; then madd(., 1) widens to int32. Nothing saturates or wraps, so
// isum_j = that sum - ext_j (Q6_K: ext_j = 32 * t_j) is exact; with AVX-VNNI, dpbusd gives the same integers.
// Q4_K tail: M = sum_i madd(M2[i], ext[i]), ext[i] = t_2i | t_2i+1 << 16 (|t| <= 32*127, m <= 63: exact).
// Float ops per (row, column) are those of the reference, in its order; rows never mix, so a row's bits do not
// depend on R, k, the row's position or the threads.
#pragma once
namespace prompt {

// groups of 4 weights whose maddubs products one int16 word may sum: Q4_K 8 (16 * 15 * 127), Q6_K 2 (4 * 63 * 127)
template <class F>
constexpr int int16_groups() { return F::OFF ? 2 : 8; }

// 8 x 8 dword transpose: r[d] dword c <- r[c] dword d
inline void transpose8(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {   // u[4i + m]: dword m of rows 4i..4i+3 | dword m + 4 of them
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int m = 0; m < 4; ++m) {
        r[m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x20);
        r[m + 4] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x31);
    }
}

// panel of output columns n0..n0+15, all nb blocks (layout above)
template <class F>
void pack_panel_avx2(const uint8_t* W, int N, int nb, int n0, uint8_t* panel) {
    static_assert(F::PB >= WQ + F::NSUB * 64 + (F::HAS_MIN ? 320 : 0), "panel block too small");
    alignas(32) uint8_t U[16][QK];
    float dsc[16][F::NSUB], dmin[16];
    int mn[16][8];
    for (int b = 0; b < nb; ++b) {
        uint8_t* P = panel + (size_t)b * F::PB;
        for (int c = 0; c < 16; ++c) {
            const int n = n0 + c < N ? n0 + c : N - 1;
            F::decode(W + ((size_t)n * nb + b) * F::BB, U[c], dsc[c], mn[c], &dmin[c]);
        }
        for (int h = 0; h < 2; ++h)          // columns 8h..8h+7
            for (int t = 0; t < 8; ++t) {    // weights 32t..32t+31 = rows g = 8t..8t+7
                __m256i r[8];
                for (int c = 0; c < 8; ++c) r[c] = _mm256_load_si256((const __m256i*)(U[8 * h + c] + 32 * t));
                transpose8(r);
                for (int g = 0; g < 8; ++g) _mm256_store_si256((__m256i*)(P + 64 * (8 * t + g) + 32 * h), r[g]);
            }
        float* D = (float*)(P + WQ);
        for (int j = 0; j < F::NSUB; ++j)
            for (int c = 0; c < 16; ++c) D[16 * j + c] = dsc[c][j];
        if (F::HAS_MIN) {
            int32_t* M2 = (int32_t*)(D + 16 * F::NSUB);
            for (int i = 0; i < 4; ++i)
                for (int c = 0; c < 16; ++c) M2[16 * i + c] = mn[c][2 * i] | (mn[c][2 * i + 1] << 16);
            for (int c = 0; c < 16; ++c) ((float*)(M2 + 64))[c] = dmin[c];
        }
    }
}

inline __m256i bcast4(const int8_t* p) { int32_t v; memcpy(&v, p, 4); return _mm256_set1_epi32(v); }

// s[r][h] = isum_j of rows r (activations a + r*K, ext e + r*es) and columns 8h..8h+7; w = the sub-block's rows
template <class F, int R>
inline void subblock_sums(const uint8_t* w, const int8_t* a, int K, const int32_t* e, size_t es, __m256i s[R][2]) {
    const int G = F::SUB / 4;   // groups of 4 weights
    for (int r = 0; r < R; ++r)
        s[r][0] = s[r][1] = F::OFF ? _mm256_set1_epi32(-e[r * es]) : _mm256_setzero_si256();
#if defined(__AVXVNNI__)
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
        const __m256i w0 = _mm256_load_si256((const __m256i*)(w + 64 * g));
        const __m256i w1 = _mm256_load_si256((const __m256i*)(w + 64 * g + 32));
        for (int r = 0; r < R; ++r) {
            const __m256i A = bcast4(a + (size_t)r * K + 4 * g);
            s[r][0] = _mm256_dpbusd_avx_epi32(s[r][0], w0, A);
            s[r][1] = _mm256_dpbusd_avx_epi32(s[r][1], w1, A);
        }
    }
#else
    const int C = int16_groups<F>();
    const __m256i one = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int g0 = 0; g0 < G; g0 += C) {
        __m256i p[R][2];   // int16 words: sums of 2C products (bounds above)
#pragma GCC unroll 8
        for (int g = g0; g < g0 + C; ++g) {
            const __m256i w0 = _mm256_load_si256((const __m256i*)(w + 64 * g));
            const __m256i w1 = _mm256_load_si256((const __m256i*)(w + 64 * g + 32));
            for (int r = 0; r < R; ++r) {
                const __m256i A = bcast4(a + (size_t)r * K + 4 * g);
                const __m256i q0 = _mm256_maddubs_epi16(w0, A), q1 = _mm256_maddubs_epi16(w1, A);
                p[r][0] = g == g0 ? q0 : _mm256_add_epi16(p[r][0], q0);
                p[r][1] = g == g0 ? q1 : _mm256_add_epi16(p[r][1], q1);
            }
        }
        for (int r = 0; r < R; ++r)
            for (int h = 0; h < 2; ++h) s[r][h] = _mm256_add_epi32(s[r][h], _mm256_madd_epi16(p[r][h], one));
    }
#endif
}

// Q4_K: v - float(M) * dmin for columns 8h..8h+7 (X = the block's M2, then dmin); e = the row's ext of the block
template <class F>
inline __m256 tail(const uint8_t* X, int h, const int32_t* e, __m256 v) {
    if (!F::HAS_MIN) return v;
    __m256i m = _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(X + 32 * h)), _mm256_set1_epi32(e[0]));
    for (int i = 1; i < 4; ++i)
        m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_load_si256((const __m256i*)(X + 64 * i + 32 * h)),
                                                  _mm256_set1_epi32(e[i])));
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_load_ps((const float*)(X + 256 + 32 * h)), v);
}

// R rows (a [R][K], dx [R][nb], ext [R][nb][16]) x the 16 columns of one panel -> out [R][16]
template <class F, int R>
void rows_avx2(const uint8_t* panel, int nb, int K, const int8_t* a, const float* dx, const int32_t* ext,
               float* out) {
    const size_t es = (size_t)16 * nb;   // ext row stride
    for (int i = 0; i < 16 * R; ++i) out[i] = 0.f;
    for (int b = 0; b < nb; ++b) {
        const uint8_t* P = panel + (size_t)b * F::PB;
        const float* D = (const float*)(P + WQ);
        const int32_t* eb = ext + 16 * b;
        __m256 v[R][2];
        for (int r = 0; r < R; ++r) v[r][0] = v[r][1] = _mm256_setzero_ps();
        for (int j = 0; j < F::NSUB; ++j) {
            __m256i s[R][2];
            subblock_sums<F, R>(P + 16 * F::SUB * j, a + (size_t)b * QK + F::SUB * j, K, eb + j, es, s);
            for (int h = 0; h < 2; ++h) {
                const __m256 Dh = _mm256_load_ps(D + 16 * j + 8 * h);
                for (int r = 0; r < R; ++r) v[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r][h]), Dh, v[r][h]);
            }
        }
        for (int r = 0; r < R; ++r) {
            const __m256 d = _mm256_set1_ps(dx[(size_t)r * nb + b]);
            for (int h = 0; h < 2; ++h) {
                float* o = out + 16 * r + 8 * h;
                const __m256 vt = tail<F>((const uint8_t*)(D + 16 * F::NSUB), h, eb + r * es, v[r][h]);
                _mm256_store_ps(o, _mm256_fmadd_ps(vt, d, _mm256_load_ps(o)));
            }
        }
    }
}

// y[k,N] from the quantized rows: a [kp][K] int8 natural order, dx [kp][nb], ext [kp][nb][16] (F::extra);
// rows k..kp-1 are zero padding (kp = k rounded up to 16, a multiple of R)
template <class F>
void product_avx2(const uint8_t* W, int N, int K, const int8_t* a, const float* dx, const int32_t* ext, float* y, int k,
                  int nthreads) {
    const int R = 4;
    const int nb = K / QK, np = (N + 15) / 16;
#pragma omp parallel num_threads(nthreads)
    {
        uint8_t* panel = (uint8_t*)aligned_alloc(64, ((size_t)nb * F::PB + 63) / 64 * 64);
        alignas(32) float out[R * 16];
#pragma omp for schedule(static)
        for (int p = 0; p < np; ++p) {
            pack_panel_avx2<F>(W, N, nb, 16 * p, panel);
            const int cols = N - 16 * p < 16 ? N - 16 * p : 16;
            for (int r0 = 0; r0 < k; r0 += R) {
                rows_avx2<F, R>(panel, nb, K, a + (size_t)r0 * K, dx + (size_t)r0 * nb, ext + (size_t)r0 * nb * 16, out);
                const int rows = k - r0 < R ? k - r0 : R;
                for (int r = 0; r < rows; ++r) memcpy(y + (size_t)(r0 + r) * N + 16 * p, out + 16 * r, sizeof(float) * cols);
            }
        }
        free(panel);
    }
}
}  // namespace prompt
