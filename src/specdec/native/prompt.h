// The prompt-reading product of the K-quant formats (included by q4k.cpp and q6k.cpp): y[k,N] = x[k,K] . W^T
// for the many rows of a prompt, with its own fixed arithmetic (gemm mode bit 2). The scoring kernels (mode 0)
// keep 16 partial sums per output element, which suits a few rows; here one output element is one float, the
// SIMD lanes run over 16 output columns, and on CPUs with AMX the integer products run on 16 x 16 tiles. A model
// reads every prompt this way and scores every token (decoding, verification) with mode 0, in plain and
// speculative decoding alike, so both see the same numbers.
//
// Definition, per output element (r, n), blocks b in order (acc = 0 first; y = acc):
//   a   = row r's int8 quantization per 256-block (the scoring kernels' quantizer: d = amax/127, RNE, clamp)
//   I   = sum over sub-blocks j of sc_j * (sum over j's weights of u_i * a_i  -  OFF * sum of j's a_i)
//         (exact int32: u = the stored unsigned code, sc_j its sub-block scale, OFF = 0 for Q4_K, 32 for Q6_K;
//         |I| <= 256 * 15 * 63 * 127 (Q4_K), 256 * 32 * 128 * 127 (Q6_K) < 2^31)
//   v   = float(I) * d_b                                 (the conversion rounds to nearest even above 2^24)
//   Q4_K: v = fma(-float(M), dmin_b, v),  M = sum_j m_j * (sum of sub-block j's a_i)   (exact int32)
//   acc = fma(v, dx_rb, acc)
// Every op is a single IEEE float32 operation on one (r, n): a row's result does not depend on the other rows,
// the row count, the thread count or the path. Paths (same bits, tested): AMX (tdpbsud/tdpbssd on 16 x 16 int32
// tiles over the weights times their scales, w = (u - OFF) * sc = lo + 256 hi, when compiled with AMX-INT8 and
// the kernel grants the tile state), AVX-512 VNNI (vpdpbusd, one zmm = 16 output columns, 8 rows per register
// block), AVX2 (prompt_avx2.h) and the scalar reference. Mode bits: 1 reference, 2 this product, 4 no AMX.
// AMX runs for more than 32 rows (below that, packing for the tiles costs more than they save).
//
// Layout: activation rows padded to a multiple of 16 (zero rows); per row a[K] int8 (natural order), dx[nb],
// ext[nb][16] int32 (F::extra: what the format needs of the 16-weight sums of a). Weights are packed per thread
// into panels of 16 output columns; per block, as 64-byte rows whose lane c holds column c: the VNNI panel has
// the codes (row g = weights 4g..4g+3), the sub-block scales sc [NSUB] and d; the AMX panel has the lo and hi
// bytes of w (rows g as above), and d; both end with the format's extra (Q4_K: m pairs and dmin).
#pragma once
#include "transpose.h"
#if defined(KQ_AVX512) && defined(__AMX_INT8__) && defined(__AMX_TILE__)
#define KP_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace prompt {

const int WQ = 4096;  // packed codes per block and panel (256 weights x 16 columns)

// one row's activations: a (natural order), dx per block, s16[nb*16] = sums of each 16 a's
inline void quant_row(const float* x, int K, int8_t* a, float* dx, int32_t* s16) {
    const int nb = K / QK;
    for (int b = 0; b < nb; ++b) {
        const float* xs = x + (size_t)b * QK;
        int8_t* q = a + (size_t)b * QK;
#if defined(KQ_AVX512)
        const float amax = block_amax(xs);
        float d = amax / 127.f;
        if (amax == 0.f) { memset(q, 0, QK); d = 0.f; }
        else {
            const __m512 is = _mm512_set1_ps(127.f / amax);
            const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
            for (int i = 0; i < QK; i += 16) {
                __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + i), is));
                _mm_storeu_si128((__m128i*)(q + i), _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(v, lo), hi)));
            }
        }
#else
        alignas(32) int32_t qi[QK];
        const float d = quantize_block_qi(xs, qi);
        for (int i = 0; i < QK; ++i) q[i] = (int8_t)qi[i];
#endif
        dx[b] = d;
        for (int g = 0; g < 16; ++g) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += q[16 * g + i];
            s16[16 * b + g] = s;
        }
    }
}

// the scalar reference, straight from the blocks (F::decode: codes, sub-block scales and mins, d, dmin)
template <class F>
void reference(const uint8_t* W, int N, int K, const int8_t* a, const float* dx, float* y, int k) {
    const int nb = K / QK;
    for (int n = 0; n < N; ++n)
        for (int b = 0; b < nb; ++b) {
            uint8_t u[QK]; int sc[F::NSUB], mn[F::NSUB]; float d, dmin;
            F::decode(W + ((size_t)n * nb + b) * F::BB, u, sc, mn, &d, &dmin);
            for (int r = 0; r < k; ++r) {
                const int8_t* ar = a + (size_t)r * K + (size_t)b * QK;
                int32_t I = 0, M = 0;
                for (int j = 0; j < F::NSUB; ++j) {
                    int32_t s = 0, t = 0;
                    for (int i = 0; i < F::SUB; ++i) { s += u[F::SUB * j + i] * ar[F::SUB * j + i]; t += ar[F::SUB * j + i]; }
                    I += sc[j] * (s - F::OFF * t);
                    if (F::HAS_MIN) M += mn[j] * t;
                }
                float v = (float)I * d;
                if (F::HAS_MIN) v = fmaf(-(float)M, dmin, v);
                float& out = y[(size_t)r * N + n];
                out = fmaf(v, dx[(size_t)r * nb + b], b ? out : 0.f);
            }
        }
}

// Panel offsets per block: VNNI panel codes [64][64] | sc int32 [NSUB][16] | d [16] | extra;
// AMX panel lo [64][64] | hi [64][64] | d [16] | extra.
template <class F> struct Panel {
    static const int VNNI_D = WQ + F::NSUB * 64, VNNI = VNNI_D + 64 + F::EXTRA;
    static const int AMX_D = 2 * WQ, AMX = AMX_D + 64 + F::EXTRA;
    static const int BYTES = VNNI > AMX ? VNNI : AMX;   // per block, whichever path (the allocation)
    static constexpr int stride(bool amx) { return amx ? AMX : VNNI; }
};

#if defined(KQ_AVX512)


// 16 rows of 64 bytes (row c = column c's 256 bytes, as 4 x 64) -> 64 rows whose lane c is column c's dword
inline void store_transposed(const uint8_t (*U)[QK], uint8_t* P) {
    for (int z = 0; z < 4; ++z) {
        __m512i r[16];
        for (int c = 0; c < 16; ++c) r[c] = _mm512_load_si512(U[c] + 64 * z);
        transpose::transpose16(r);
        for (int d = 0; d < 16; ++d) _mm512_store_si512(P + 64 * (16 * z + d), r[d]);
    }
}

// panel of output columns n0..n0+15 (columns past N repeat column N-1), all blocks; AMX: the lo/hi planes of w
template <class F, bool AMX>
void pack_panel(const uint8_t* W, int N, int nb, int n0, uint8_t* panel) {
    alignas(64) uint8_t U[16][QK], H[AMX ? 16 : 1][QK];
    alignas(64) int32_t sc[F::NSUB][16];
    alignas(64) float d[16];
    alignas(64) int32_t extra[F::EXTRA / 4 + 1];
    for (int b = 0; b < nb; ++b) {
        uint8_t* P = panel + (size_t)b * Panel<F>::stride(AMX);
        for (int c = 0; c < 16; ++c) {
            const int n = n0 + c < N ? n0 + c : N - 1;
            const uint8_t* blk = W + ((size_t)n * nb + b) * F::BB;
            int scc[F::NSUB];
            F::unpack(blk, U[c]);
            F::scales(blk, c, scc, &d[c], extra);
            for (int j = 0; j < F::NSUB; ++j) sc[j][c] = scc[j];
            if (AMX) {  // w = (u - OFF) * sc as int16, split into its low byte (unsigned) and high byte (signed)
                for (int h = 0; h < QK; h += 32) {
                    const int j = h / F::SUB;
                    const __m512i scv = F::SUB == 32 ? _mm512_set1_epi16((short)scc[j])
                        : _mm512_inserti64x4(_mm512_set1_epi16((short)scc[j]), _mm256_set1_epi16((short)scc[j + 1]), 1);
                    const __m512i w = _mm512_mullo_epi16(_mm512_sub_epi16(
                        _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i*)(U[c] + h))), _mm512_set1_epi16(F::OFF)), scv);
                    _mm256_store_si256((__m256i*)(U[c] + h), _mm512_cvtepi16_epi8(w));
                    _mm256_store_si256((__m256i*)(H[c] + h), _mm512_cvtepi16_epi8(_mm512_srai_epi16(w, 8)));
                }
            }
        }
        store_transposed(U, P);
        if (AMX) {
            store_transposed(H, P + WQ);
            memcpy(P + Panel<F>::AMX_D, d, 64);
            if (F::EXTRA) memcpy(P + Panel<F>::AMX_D + 64, extra, F::EXTRA);
        } else {
            memcpy(P + WQ, sc, sizeof sc);
            memcpy(P + Panel<F>::VNNI_D, d, 64);
            if (F::EXTRA) memcpy(P + Panel<F>::VNNI_D + 64, extra, F::EXTRA);
        }
    }
}

// Q4_K's tail: v - M * dmin, M = sum_j m_j * (sum of sub-block j's a) (exact, 4 x vpdpwssd); X: the panel's extra
// (m pairs [4][16] int32, dmin [16]), e: the row's ext of the block (the sums as int16 pairs)
inline __m512 mins_tail(const uint8_t* X, const int32_t* e, __m512 v) {
    __m512i m = _mm512_setzero_si512();
    for (int i = 0; i < 4; ++i) m = _mm512_dpwssd_epi32(m, _mm512_load_si512(X + 64 * i), _mm512_set1_epi32(e[i]));
    return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_load_ps((const float*)(X + 256)), v);
}

// the float steps of one block for one row: v = float(I) * d, the format's tail, acc += v * dx
template <class F>
__attribute__((always_inline)) inline __m512 finish(__m512i I, const uint8_t* Dp, const int32_t* e, float dxv, __m512 acc) {
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(I), _mm512_load_ps((const float*)Dp));
    v = F::tail(Dp + 64, e, v);
    return _mm512_fmadd_ps(v, _mm512_set1_ps(dxv), acc);
}

// AVX-512 VNNI: R rows (of a, dx, ext with the given row strides) x the 16 columns of one panel
template <class F, int R>
void rows_avx512(const uint8_t* panel, int nb, int K, const int8_t* a, const float* dx, const int32_t* ext,
                 float* out /* [R][16] */) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t* P = panel + (size_t)b * Panel<F>::VNNI;
        const int32_t* eb = ext + 16 * b;
        __m512i I[R];
        for (int r = 0; r < R; ++r) I[r] = _mm512_setzero_si512();
        for (int j = 0; j < F::NSUB; ++j) {
            __m512i s[R];
            for (int r = 0; r < R; ++r) s[r] = F::OFF ? _mm512_set1_epi32(-eb[(size_t)r * 16 * nb + j]) : _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int g = 0; g < F::SUB / 4; ++g) {
                const __m512i w = _mm512_load_si512(P + 64 * (F::SUB / 4 * j + g));
                const int off = b * QK + F::SUB * j + 4 * g;
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r)
                    s[r] = _mm512_dpbusd_epi32(s[r], w, _mm512_set1_epi32(*(const int32_t*)(a + (size_t)r * K + off)));
            }
            const __m512i S = _mm512_load_si512(P + WQ + 64 * j);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(s[r], S));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
            acc[r] = finish<F>(I[r], P + Panel<F>::VNNI_D, eb + (size_t)r * 16 * nb, dx[(size_t)r * nb + b], acc[r]);
    }
    for (int r = 0; r < R; ++r) _mm512_store_ps(out + 16 * r, acc[r]);
}

#if defined(KP_AMX)
struct TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed));

// this thread's tile configuration: tiles 0..7 of 16 rows x 64 bytes
inline void tile_config() {
    TileConfig cfg = {};
    cfg.palette = 1;
    for (int i = 0; i < 8; ++i) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
    _tile_loadconfig(&cfg);
}

// the tile state for this process (asked once; false where the kernel does not grant it)
inline bool amx_granted() {
    static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return ok;
}

// the products of one block for one 16-row tile into C tiles CL (a x lo) and CH (a x hi): A_ = the rows'
// activations of the block (row stride K), P_ = the panel's block; A in tmm4 / tmm7, lo in tmm5, hi in tmm6
#define KP_TILE(A_, P_, CL, CH)                                                                              \
    {                                                                                                        \
        _tile_zero(CL); _tile_zero(CH);                                                                      \
        _tile_loadd(4, (A_), K); _tile_loadd(5, (P_), 64); _tile_loadd(6, (P_) + WQ, 64);                    \
        _tile_dpbsud(CL, 4, 5); _tile_dpbssd(CH, 4, 6);                                                      \
        _tile_loadd(7, (A_) + 64, K); _tile_loadd(5, (P_) + 1024, 64); _tile_loadd(6, (P_) + WQ + 1024, 64);  \
        _tile_dpbsud(CL, 7, 5); _tile_dpbssd(CH, 7, 6);                                                      \
        _tile_loadd(4, (A_) + 128, K); _tile_loadd(5, (P_) + 2048, 64); _tile_loadd(6, (P_) + WQ + 2048, 64); \
        _tile_dpbsud(CL, 4, 5); _tile_dpbssd(CH, 4, 6);                                                      \
        _tile_loadd(7, (A_) + 192, K); _tile_loadd(5, (P_) + 3072, 64); _tile_loadd(6, (P_) + WQ + 3072, 64); \
        _tile_dpbsud(CL, 7, 5); _tile_dpbssd(CH, 7, 6);                                                      \
    }

// I = lo + 256 hi of block b for the 16 rows of tile t, then the float steps into acc (memory, [16][16])
template <class F>
__attribute__((always_inline)) inline void finish_tile(const uint8_t* Dp, int nb, int b, int t, const int32_t (*lo)[16],
                                                       const int32_t (*hi)[16], const float* dx, const int32_t* ext,
                                                       float* acc) {
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
        const size_t row = (size_t)16 * t + r;
        const __m512i I = _mm512_add_epi32(_mm512_load_si512(lo[r]), _mm512_slli_epi32(_mm512_load_si512(hi[r]), 8));
        const __m512 v = finish<F>(I, Dp, ext + row * 16 * nb + 16 * b, dx[row * nb + b], _mm512_load_ps(acc + 16 * r));
        _mm512_store_ps(acc + 16 * r, v);
    }
}

// AMX: all kp rows x the 16 columns of one panel into acc [kp][16]. Steps s = b * nt + t (block b, 16-row tile t;
// blocks outer, so the block's 8 KB of weights stay in L1): step s + 2's products run in one pair of C tiles while
// step s + 1's sums are stored from the other pair and step s's (stored one step earlier) become floats.
template <class F>
void panel_amx(const uint8_t* panel, int nb, int K, int kp, const int8_t* a, const float* dx, const int32_t* ext,
               float* acc /* [kp][16] */) {
    alignas(64) int32_t lo[2][16][16], hi[2][16][16];
    const int nt = kp / 16, ns = nb * nt;
    memset(acc, 0, sizeof(float) * 16 * (size_t)kp);
#define KP_STEP_TILE(S, CL, CH)                                                                   \
    if ((S) < ns) {                                                                               \
        const int b_ = (S) / nt, t_ = (S) % nt;                                                   \
        KP_TILE(a + (size_t)b_ * QK + (size_t)16 * t_ * K, panel + (size_t)b_ * Panel<F>::AMX, CL, CH) \
    }
#define KP_FINISH(S)                                                                              \
    {                                                                                             \
        const int b_ = (S) / nt, t_ = (S) % nt;                                                   \
        finish_tile<F>(panel + (size_t)b_ * Panel<F>::AMX + Panel<F>::AMX_D, nb, b_, t_, lo[(S) & 1], \
                       hi[(S) & 1], dx, ext, acc + (size_t)256 * t_);                             \
    }
    KP_STEP_TILE(0, 0, 1)
    KP_STEP_TILE(1, 2, 3)
    _tile_stored(0, lo[0], 64); _tile_stored(1, hi[0], 64);
    for (int s = 0; s < ns; s += 2) {
        KP_STEP_TILE(s + 2, 0, 1)
        if (s + 1 < ns) { _tile_stored(2, lo[1], 64); _tile_stored(3, hi[1], 64); }
        KP_FINISH(s)
        if (s + 1 < ns) {
            KP_STEP_TILE(s + 3, 2, 3)
            if (s + 2 < ns) { _tile_stored(0, lo[0], 64); _tile_stored(1, hi[0], 64); }
            KP_FINISH(s + 1)
        }
    }
#undef KP_STEP_TILE
#undef KP_FINISH
}
#undef KP_TILE
#endif
#endif  // KQ_AVX512

#if defined(KQ_AVX2)
}  // namespace prompt
#include "prompt_avx2.h"   // prompt::product_avx2<F>: the AVX2 path (same bits)
namespace prompt {
#endif

template <class F>
int gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    if (K % QK || k < 0 || N < 0) return -1;
    if (k == 0 || N == 0) return 0;
    const int nb = K / QK, kp = (k + 15) / 16 * 16;
    int8_t* a = (int8_t*)aligned_alloc(64, (size_t)kp * K);
    float* dx = (float*)aligned_alloc(64, ((size_t)kp * nb * 4 + 63) / 64 * 64);
    int32_t* ext = (int32_t*)aligned_alloc(64, (size_t)kp * nb * 64);
    if (!a || !dx || !ext) { free(a); free(dx); free(ext); return -2; }
    for (int r = 0; r < k; ++r) {
        int32_t* e = ext + (size_t)r * nb * 16;
        quant_row(x + (size_t)r * K, K, a + (size_t)r * K, dx + (size_t)r * nb, e);
        for (int b = 0; b < nb; ++b) F::extra(e + 16 * b);
    }
    memset(a + (size_t)k * K, 0, (size_t)(kp - k) * K);
    memset(dx + (size_t)k * nb, 0, sizeof(float) * (size_t)(kp - k) * nb);
    memset(ext + (size_t)k * nb * 16, 0, sizeof(int32_t) * (size_t)(kp - k) * nb * 16);
#if defined(KQ_AVX512)
    if (!(mode & 1)) {
#if defined(KP_AMX)
        const bool amx = !(mode & 4) && k > 32 && amx_granted();  // few rows: packing for the tiles costs more
#else
        const bool amx = false;
#endif
        const int np = (N + 15) / 16;
#pragma omp parallel num_threads(nthreads)
        {
#if defined(KP_AMX)
            if (amx) tile_config();
#endif
            uint8_t* panel = (uint8_t*)aligned_alloc(64, (size_t)nb * Panel<F>::BYTES);
            float* acc = (float*)aligned_alloc(64, sizeof(float) * 16 * (size_t)kp);
            alignas(64) float out[16 * 16];
#pragma omp for schedule(static)
            for (int p = 0; p < np; ++p) {
                const int cols = N - 16 * p < 16 ? N - 16 * p : 16;
#if defined(KP_AMX)
                if (amx) {
                    pack_panel<F, true>(W, N, nb, 16 * p, panel);
                    panel_amx<F>(panel, nb, K, kp, a, dx, ext, acc);
                    for (int r = 0; r < k; ++r) memcpy(y + (size_t)r * N + 16 * p, acc + 16 * r, sizeof(float) * cols);
                    continue;
                }
#endif
                pack_panel<F, false>(W, N, nb, 16 * p, panel);
                for (int r0 = 0; r0 < k; r0 += 16) {
                    const int8_t* ar = a + (size_t)r0 * K;
                    const float* dr = dx + (size_t)r0 * nb;
                    const int32_t* er = ext + (size_t)r0 * nb * 16;
                    rows_avx512<F, 8>(panel, nb, K, ar, dr, er, out);
                    rows_avx512<F, 8>(panel, nb, K, ar + (size_t)8 * K, dr + 8 * nb, er + (size_t)8 * nb * 16, out + 128);
                    const int rows = k - r0 < 16 ? k - r0 : 16;
                    for (int r = 0; r < rows; ++r) memcpy(y + (size_t)(r0 + r) * N + 16 * p, out + 16 * r, sizeof(float) * cols);
                }
            }
            free(acc);
            free(panel);
#if defined(KP_AMX)
            if (amx) _tile_release();
#endif
        }
    } else
#elif defined(KQ_AVX2)
    if (!(mode & 1)) product_avx2<F>(W, N, K, a, dx, ext, y, k, nthreads);
    else
#endif
    {
        (void)mode; (void)nthreads;
        reference<F>(W, N, K, a, dx, y, k);
    }
    free(a); free(dx); free(ext);
    return 0;
}

}  // namespace prompt
