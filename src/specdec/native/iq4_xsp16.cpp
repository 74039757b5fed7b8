// IQ4_XS in panels of 16 output rows: the scoring and prompt-reading product of an IQ4_XS matrix whose rows are a
// multiple of 16, over a copy of its blocks re-laid out once at load (iq4_xsp16_pack), y[k,N] = x[k,K] . W[N,K]^T.
//
// Why: iq4_xs.cpp's scoring kernel (q32.h's shape) keeps 16 partial sums per output element and ends each with a
// horizontal sum, so its cost grows fast with the rows of a call (T(8) = 2.6 T(1) on the default target re-quantized
// to IQ4_XS, against 1.4 for Q4_K in panels): the γ planner then drafts short. Here, as in q4_0p16.cpp (whose code
// layout this is), a zmm holds 16 output elements (columns), every op is shared by the 16, and the rows of a call
// (at most 8; 4 on AVX2) run inside each panel, which comes from memory once for all of them.
//
// The file's block_iq4_xs (136 bytes / 256 weights; iq4_xs.cpp): fp16 d, scales_h, scales_l[4], qs[128]; sub-block
// j (32 weights) has the 6-bit scale ls_j and the codes c_i = qs[16j + i] & 15, c_{i+16} = qs[16j + i] >> 4 (i < 16);
// its weight is dl_j * v, dl_j = d * (ls_j - 32) (exact in float32), v = kvalues_iq4nl[c] (-127..113).
//
// Panel g (output rows 16g..16g+15), per superblock s (PSB = 2240 bytes, the file's 16 x 136 plus 3%):
//   [0, 32)        d     fp16[16] (column c at 2c)
//   [32, 160)      sc    int8[8 sub-blocks][16 columns]: ls_j - 32 (-32..31)
//   [160, 192)     zero
//   [192, 2240)    codes, sub-block j's 256 bytes at 192 + 256 j: row i (64 bytes), column c, byte 4c + e: low
//                  nibble = c_{4i+e}, high nibble = c_{16+4i+e} (q4_0p16's layout)
// Activations, per row and 32-block (q32.h's quantizer, the one of iq4_xs.cpp's scoring and prompt products):
// a int8 [K], dx [K/32], off [K/32] = -128 * (sum of the block's a).
//
// Per output element (r, n), sub-blocks b = 8s + j in order (acc = 0 first; y = acc):
//   isum = sum_i v_i * a_i                          (exact int32, |isum| <= 32*127*127)
//   dl   = float(d_s) * float(ls_b - 32)            (exact)
//   acc  = fma(float(isum), dl * dx_rb, acc)        (dl * dx_rb one float32 multiply; float(isum) exact)
// which is prompt32.h's IQ4_XS prompt product (iq4_xs_gemm mode 2, and its reference, mode 3) step for step: the
// same bits (tested), so a model reading its prompt and scoring its tokens sees the same numbers. isum per path
// (the same integer): AVX-512 VNNI and AVX2 + AVX-VNNI: u = v + 128 looked up (vpshufb) from the nibbles, off + 8
// vpdpbusd; AVX2: v looked up, ggml's sign trick maddubs(|v|, sign(a, v)) (|pair| <= 2*127*127, no saturation),
// each madd by ones to int32; scalar (also the reference, mode bit 1): the formula. Mode bit 2 (a prompt) runs the
// same product; no AMX path; in the AVX2 build from AVX2_ROWS32 (16) rows on, panels32.h's wide_gemm over panels
// converted on the fly (u = v + 128 looked up, dl as float32), the same bits. Software prefetch PF_DIST bytes ahead.
// -ffp-contract=off.
#include "panels32.h"

static const int SB = 136, PSB = 2240, SC = 32, CODES = 192;
static int PF_DIST = 1024;   // software prefetch distance in bytes (0 = off; iq4_xsp16_set_prefetch)
static const int8_t KV[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static size_t panel_bytes(int nb) { return (size_t)(nb / 8) * PSB; }

// the 6-bit scale of sub-block j of a superblock
static inline int ls(const uint8_t* sb, int j) {
    return ((sb[4 + j / 2] >> (4 * (j & 1))) & 15) | ((((sb[2] | (sb[3] << 8)) >> (2 * j)) & 3) << 4);
}

// code i (0..31) of column c in a sub-block's 256 code bytes
static inline int code(const uint8_t* codes, int c, int i) {
    const uint8_t z = codes[64 * ((i & 15) >> 2) + 4 * c + (i & 3)];
    return i < 16 ? (z & 15) : (z >> 4);
}

// dl of column c, sub-block j of a panel's superblock ps
static inline float dl(const uint8_t* ps, int c, int j) {
    return q32::h2f(ps + 2 * c) * (float)((const int8_t*)ps)[SC + 16 * j + c];
}

// ---------------- the scalar reference (and the scalar build's path), straight from the panels ----------------
static void reference(const uint8_t* P, int N, int K, const int8_t* A, const float* DX, const int32_t*, int k,
                      float* y, int nthreads) {
    const int nb = K / p32::QK;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int g = 0; g < N / 16; ++g) {
        const uint8_t* Pg = P + (size_t)g * panel_bytes(nb);
        for (int r = 0; r < k; ++r) {
            float acc[16] = {0};
            for (int b = 0; b < nb; ++b) {
                const uint8_t* ps = Pg + (size_t)(b / 8) * PSB;
                const int8_t* a = A + (size_t)r * K + (size_t)b * p32::QK;
                for (int c = 0; c < 16; ++c) {
                    int32_t isum = 0;
                    for (int i = 0; i < 32; ++i) isum += KV[code(ps + CODES + 256 * (b % 8), c, i)] * a[i];
                    acc[c] = fmaf((float)isum, dl(ps, c, b % 8) * DX[(size_t)r * nb + b], acc[c]);
                }
            }
            memcpy(y + (size_t)r * N + 16 * g, acc, sizeof acc);
        }
    }
}

#if defined(Q32_PATH_512)
// ---------------- AVX-512 VNNI: R rows x the 16 columns of one panel ----------------
template <int R>
static void panel_rows(const uint8_t* P, int nb, int K, const int8_t* A, const float* DX, const int32_t* OFF, float* y,
                       int N) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i tu = _mm512_broadcast_i32x4(_mm_xor_si128(_mm_loadu_si128((const __m128i*)KV), _mm_set1_epi8((char)0x80)));
    const int pf = PF_DIST;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int s = 0; s < nb / 8; ++s) {
        const uint8_t* ps = P + (size_t)s * PSB;
        const __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)ps));
        for (int j = 0; j < 8; ++j) {
            const int b = 8 * s + j;
            const uint8_t* pc = ps + CODES + 256 * j;
            if (pf) for (int l = 0; l < 5; ++l) _mm_prefetch((const char*)pc + pf + 64 * l, _MM_HINT_T0);  // 4.4 lines a sub-block
            const __m512 dlv = _mm512_mul_ps(D, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                    _mm_loadu_si128((const __m128i*)(ps + SC + 16 * j)))));
            __m512i W[8];   // W[i]: u of codes 4i..4i+3 of each column (i < 4: low nibbles of row i; else high of i - 4)
            for (int i = 0; i < 4; ++i) {
                const __m512i z = _mm512_loadu_si512(pc + 64 * i);
                W[i] = _mm512_shuffle_epi8(tu, _mm512_and_si512(z, m4));
                W[4 + i] = _mm512_shuffle_epi8(tu, _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const int8_t* a = A + (size_t)r * K + (size_t)b * p32::QK;
                const __m512i t = p32::block_isum<R>(W, a, OFF[(size_t)r * nb + b]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dlv, _mm512_set1_ps(DX[(size_t)r * nb + b])),
                                         acc[r]);
            }
        }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (size_t)r * N, acc[r]);
}
static const int ROWS = 8;   // rows a group
static const p32::panel_fn PANEL_ROWS[9] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>,
                                            panel_rows<5>, panel_rows<6>, panel_rows<7>, panel_rows<8>};
#elif defined(Q32_PATH_AVX2)
// ---------------- AVX2: the same with 8 columns a ymm (half h = columns 8h..8h+7) ----------------
template <int R>
static void panel_rows(const uint8_t* P, int nb, int K, const int8_t* A, const float* DX, const int32_t* OFF, float* y,
                       int N) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
#if defined(__AVXVNNI__)
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_xor_si128(_mm_loadu_si128((const __m128i*)KV),
                                                                  _mm_set1_epi8((char)0x80)));   // u = v + 128
#else
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)KV)), ones = _mm256_set1_epi16(1);
#endif
    const int pf = PF_DIST;
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int s = 0; s < nb / 8; ++s) {
        const uint8_t* ps = P + (size_t)s * PSB;
        for (int j = 0; j < 8; ++j) {
            const int b = 8 * s + j;
            const uint8_t* pc = ps + CODES + 256 * j;
            if (pf) for (int l = 0; l < 5; ++l) _mm_prefetch((const char*)pc + pf + 64 * l, _MM_HINT_T0);  // 4.4 lines a sub-block
            for (int h = 0; h < 2; ++h) {
                __m256i t[R];
                for (int r = 0; r < R; ++r)
#if defined(__AVXVNNI__)
                    t[r] = _mm256_set1_epi32(OFF[(size_t)r * nb + b]);
#else
                    t[r] = _mm256_setzero_si256();
#endif
                for (int i = 0; i < 4; ++i) {
                    const __m256i z = _mm256_loadu_si256((const __m256i*)(pc + 64 * i + 32 * h));
                    const __m256i wl = _mm256_shuffle_epi8(tab, _mm256_and_si256(z, m4));
                    const __m256i wh = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(z, 4), m4));
                    for (int r = 0; r < R; ++r) {
                        const int8_t* a = A + (size_t)r * K + (size_t)b * p32::QK;
                        const __m256i al = _mm256_set1_epi32(p32::ld4(a + 4 * i)), ah = _mm256_set1_epi32(p32::ld4(a + 16 + 4 * i));
#if defined(__AVXVNNI__)
                        t[r] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(t[r], wl, al), wh, ah);
#else
                        const __m256i pl = _mm256_maddubs_epi16(_mm256_abs_epi8(wl), _mm256_sign_epi8(al, wl));
                        const __m256i ph = _mm256_maddubs_epi16(_mm256_abs_epi8(wh), _mm256_sign_epi8(ah, wh));
                        t[r] = _mm256_add_epi32(t[r], _mm256_add_epi32(_mm256_madd_epi16(pl, ones), _mm256_madd_epi16(ph, ones)));
                        asm("" : "+x"(t[r]));   // keep the adds in this order: GCC would tree a row's 8 and spill
#endif
                    }
                }
                const __m256 dlv = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(ps + 16 * h))),
                                                 _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                     _mm_loadl_epi64((const __m128i*)(ps + SC + 16 * j + 8 * h)))));
                for (int r = 0; r < R; ++r)
                    acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t[r]),
                                                _mm256_mul_ps(dlv, _mm256_set1_ps(DX[(size_t)r * nb + b])), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(y + (size_t)r * N, acc[r][0]);
        _mm256_storeu_ps(y + (size_t)r * N + 8, acc[r][1]);
    }
}
static const int ROWS = 4;
static const p32::panel_fn PANEL_ROWS[5] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>};
#else
static const p32::panel_fn* const PANEL_ROWS = nullptr;
static const int ROWS = 1;
#endif

#if defined(Q32_PATH_AVX2)
// a panel's nb sub-blocks -> prompt32.h's packed panel: the codes looked up as u = v + 128 (row g < 4: the low
// nibbles of codes row g, weights 4g..4g+3; g >= 4: the high nibbles of row g - 4), dl = d * (ls - 32) as float32
static void wide_panel(const uint8_t* P, int nb, uint8_t* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_xor_si128(_mm_loadu_si128((const __m128i*)KV),
                                                                  _mm_set1_epi8((char)0x80)));
    for (int b = 0; b < nb; ++b) {
        const uint8_t* ps = P + (size_t)(b / 8) * PSB;
        const uint8_t* pc = ps + CODES + 256 * (b % 8);
        uint8_t* o = out + (size_t)b * q32::prompt::PB<p32::Wide<128>>;
        for (int i = 0; i < 4; ++i)
            for (int h = 0; h < 2; ++h) {
                const __m256i z = _mm256_loadu_si256((const __m256i*)(pc + 64 * i + 32 * h));
                _mm256_store_si256((__m256i*)(o + 64 * i + 32 * h), _mm256_shuffle_epi8(tab, _mm256_and_si256(z, m4)));
                _mm256_store_si256((__m256i*)(o + 64 * (4 + i) + 32 * h),
                                   _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(z, 4), m4)));
            }
        for (int h = 0; h < 2; ++h)
            _mm256_store_ps((float*)(o + 512) + 8 * h,
                            _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(ps + 16 * h))),
                                          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                              _mm_loadl_epi64((const __m128i*)(ps + SC + 16 * (b % 8) + 8 * h))))));
    }
}
static const p32::panel_wide_fn WIDE = p32::wide_gemm<128, panel_bytes, wide_panel>;
#else
static const p32::panel_wide_fn WIDE = nullptr;
#endif

extern "C" {
const char* iq4_xsp16_isa(void) { return q32::ISA_NAME; }
void iq4_xsp16_set_prefetch(int dist) { PF_DIST = dist; }
size_t iq4_xsp16_bytes(int N, int K) { return (size_t)(N / 16) * panel_bytes(K / p32::QK); }
// W: N rows of K/256 blocks of 136 bytes -> the panels; -1 when N % 16, K % 256 or K <= 0
int iq4_xsp16_pack(const uint8_t* W, int N, int K, uint8_t* out, int nthreads) {
    if (N % 16 || K % 256 || N < 0 || K <= 0) return -1;
    const int ns = K / 256;
    if (nthreads < 1) nthreads = omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int g = 0; g < N / 16; ++g)
        for (int s = 0; s < ns; ++s) {
            uint8_t* ps = out + ((size_t)g * ns + s) * PSB;
            memset(ps, 0, PSB);
            for (int c = 0; c < 16; ++c) {
                const uint8_t* sb = W + ((size_t)(16 * g + c) * ns + s) * SB;
                memcpy(ps + 2 * c, sb, 2);
                for (int j = 0; j < 8; ++j) {
                    ps[SC + 16 * j + c] = (uint8_t)(int8_t)(ls(sb, j) - 32);
                    for (int i = 0; i < 4; ++i)
                        for (int e = 0; e < 4; ++e) ps[CODES + 256 * j + 64 * i + 4 * c + e] = sb[8 + 16 * j + 4 * i + e];
                }
            }
        }
    return 0;
}
int iq4_xsp16_gemm(const uint8_t* P, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    if (K <= 0 || K % 256) return -1;
    return p32::panel_gemm<128, panel_bytes>(P, N, K, x, k, y, nthreads, mode, PANEL_ROWS, ROWS, reference, WIDE);
}
// the panels back to N rows of float32 weights dl * v (iq4_xs_dequant's, gguf.quants.dequantize's)
void iq4_xsp16_dequant(const uint8_t* P, int N, int K, float* out) {
    const int nb = K / p32::QK;
    for (int n = 0; n < N; ++n) {
        const uint8_t* Pg = P + (size_t)(n / 16) * panel_bytes(nb);
        for (int b = 0; b < nb; ++b) {
            const uint8_t* ps = Pg + (size_t)(b / 8) * PSB;
            const float d = dl(ps, n % 16, b % 8);
            for (int i = 0; i < 32; ++i)
                out[(size_t)n * K + (size_t)b * 32 + i] = d * (float)KV[code(ps + CODES + 256 * (b % 8), n % 16, i)];
        }
    }
}
}
