// Batch-invariant IQ4_XS x int8 GEMM, y[k,N] = x[k,K] . W[N,K]^T (any k; rows in groups of <= 16; K a multiple of 256).
// W: raw GGUF block_iq4_xs bytes, row n = K/256 superblocks of 136 bytes: fp16 d, uint16 scales_h, scales_l[4],
// qs[128]. ggml dequantize_row_iq4_xs: sub-block ib (0..7, 32 weights) has the 6-bit scale
//   ls_ib = ((scales_l[ib/2] >> 4*(ib%2)) & 15) | (((scales_h >> 2*ib) & 3) << 4),   dl_ib = d * (ls_ib - 32)
// and, with q = qs + 16*ib, for j < 16: c_j = q[j] & 15, c_{j+16} = q[j] >> 4; w = dl_ib * v, v = kvalues_iq4nl[c]
// (IQ4_NL's signed table, -127..113). dl = d * (ls - 32) is exact in float32 (11-bit mantissa times |ls - 32| <= 32),
// so a sub-block is an IQ4_NL block whose scale dl is a float32 instead of an fp16.
//
// Hence IQ4_NL's arithmetic, q32.h's shape (not kquant.h's): x is quantized per row per 32 weights by q32.h's one
// quantizer (ggml's quantize_row_q8_0_ref; finer than ggml's per-256 q8_K for IQ4_XS), and per output element
// (r, n), per group g of 4 sub-blocks b = 4g..4g+3 in order, per lane j = 4l + i (sub-block b = 4g + l, dword i):
//   D_j   = sum_{e<4} v[4i+e]*a[4i+e] + v[16+4i+e]*a[16+4i+e]    (exact int32, |D| <= 8*127*127 = 129032 < 2^24)
//   S_j   = dl_b * dx_{r,b}                                       (float32 mul, rounded; dl_b exact)
//   acc_j = fma(float(D_j), S_j, acc_j)                           (float(D) exact; one rounding)
// y = fixed-tree horizontal sum of the 16 lanes (v[i]+v[i+8], +4, then (0+2)+(1+3)).
// Why not kquant.h's shape (activations per 256, I = dpwssd(packs(DA, DB), scales)): its int16 packs needs the
// 8-weight dots below 2^15 (Q4_K: 15240), and with IQ4_NL's values they reach 129032.
// D_j per path (the same integer): AVX-512 VNNI / AVX-VNNI: u = v + 128 looked up (vpshufb), D = dpbusd(dpbusd(C_j,
// UX, AX), UY, AY), C_j = -128 * (sum of lane j's 8 activations) from the row's record; AVX2: ggml's sign trick,
// maddubs(|v|, sign(a, v)) (|pair| <= 32258, no saturation), madd with ones; scalar (also mode 1): the formula.
// Prompt product (mode bit 2): prompt32.h's, per block b: isum = sum_i v_i * a_i (exact), acc = fma(float(isum),
// dl_b * dx_rb, acc), over panels holding u = v + 128 and dl_b as float32 (mode 3: its scalar reference).
// Everything but the block addressing is q32.h's / prompt32.h's: the quantizer, the 256-byte records, the AVX2 dots,
// the panels' product (rows / rows_half), the drivers. A 32-weight block there is BB bytes at row + b * BB with its
// fp16 scale first, which IQ4_XS's sub-blocks are not (17 bytes each on average, their scale in the superblock's
// header), so this file specializes the pieces that address blocks: the scoring kernels (KTab), the scalar
// reference, the prompt panel's packing and reference, and the decoder. -ffp-contract=off; OpenMP static over N;
// nothing depends on k, the row's position or the thread count. Software prefetch PF_DIST bytes ahead. No AMX.
#include "q32_parts.h"  // q32.h (quantizer, records, skeletons, prompt32.h), the AVX2 dots

namespace {
const int8_t KVALUES_XS[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int SB = 136;  // bytes per block_iq4_xs (256 weights)

struct IQ4_XS {
    static const int BB = 17;       // bytes per 32 weights (136 / 8): row bytes = K / 32 * BB
    static const int BIAS = 128;    // C_j = -BIAS * sum(a)
    static const bool MIN = false;  // w = dl * v: no min

    // superblock of sub-block b of a row, and the sub-block's scale dl = d * (ls - 32) (exact) and codes
    static inline const uint8_t* super(const uint8_t* row, int b) { return row + (size_t)(b >> 3) * SB; }
    static inline int ls(const uint8_t* sb, int ib) {
        const int h = (sb[2] | (sb[3] << 8)) >> (2 * ib) & 3;
        return ((sb[4 + ib / 2] >> (4 * (ib & 1))) & 15) | (h << 4);
    }
    static inline float scale(const uint8_t* row, int b) {
        const uint8_t* sb = super(row, b);
        return q32::h2f(sb) * (float)(ls(sb, b & 7) - 32);
    }
    static inline const uint8_t* qs(const uint8_t* row, int b) { return super(row, b) + 8 + 16 * (b & 7); }
    // signed weights v = kvalues_iq4nl[c] of sub-block b (w = dl * v)
    static void ref_weights(const uint8_t* row, int b, int w[q32::QK]) {
        const uint8_t* q = qs(row, b);
        for (int j = 0; j < q32::QK / 2; ++j) {
            w[j] = KVALUES_XS[q[j] & 0x0F];
            w[j + q32::QK / 2] = KVALUES_XS[q[j] >> 4];
        }
    }

#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)
    static inline __m128i table128(bool biased) {  // KVALUES_XS as bytes: v, or u = v + 128 (= v ^ 0x80)
        const __m128i v = _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
        return biased ? _mm_xor_si128(v, _mm_set1_epi8((char)0x80)) : v;
    }
    // the 32 unsigned codes u = v + 128 of sub-block b, natural order (the prompt panels)
    static inline __m256i codes32(const uint8_t* row, int b) {
        const __m128i q = _mm_loadu_si128((const __m128i*)qs(row, b)), m4 = _mm_set1_epi8(0x0F);
        const __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table128(true)), c);
    }
#endif
};
}  // namespace

namespace {
namespace q32 {
// ---------------- scalar reference (mode 1, and the scalar build): q32.h's lane formula ----------------
template <>
void kernel_ref<IQ4_XS>(const uint8_t* W, int N, int K, const uint8_t* rec, int k, float* y, int nthreads) {
    const int nb = K / QK, ng = nb / 4;
    const size_t rowbytes = (size_t)nb * IQ4_XS::BB;
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
                for (int l = 0; l < 4; ++l) {  // lanes j = 4l + i
                    const int b = 4 * g + l;
                    int w[QK];
                    IQ4_XS::ref_weights(wr, b, w);
                    const float dw = IQ4_XS::scale(wr, b);
                    for (int i = 0; i < 4; ++i) {
                        int32_t D = 0;
                        for (int e = 0; e < 4; ++e)
                            D += w[4 * i + e] * AX[16 * l + 4 * i + e] + w[16 + 4 * i + e] * AY[16 * l + 4 * i + e];
                        acc[4 * l + i] = fmaf((float)D, dw * DX[4 * l + i], acc[4 * l + i]);
                    }
                }
            }
            y[(size_t)r * N + n] = hsum16_ref(acc);
        }
}

#if defined(Q32_PATH_512)
// R rows: per group (4 sub-blocks = half a superblock: its 64 qs bytes, 128-bit lane l = sub-block 4t + l), unpacked
// once for all rows: UX / UY = u of the low / high nibbles, dw lane 4l + i = dl of sub-block 4t + l
template <int R>
void xs_rows(const uint8_t* W, int N, int K, const uint8_t* rec, int r0, int kall, float* y, int nthreads) {
    const int nb = K / QK, ng = nb / 4;
    const size_t rowbytes = (size_t)nb * IQ4_XS::BB;
    const uint8_t* RB = rec + (size_t)r0 * REC;
    const size_t gst = (size_t)kall * REC;
    const int pfd = PF_DIST;
    const __m512i tu = _mm512_broadcast_i32x4(IQ4_XS::table128(true)), m4 = _mm512_set1_epi8(0x0F);
    // lane ib < 8 of a superblock's scale vector: shifts of scales_l (4 ib) and scales_h (2 ib); per half t, lane j
    // of a group's dw takes sub-block 4t + j/4
    alignas(64) int32_t sl[16], sh[16], ix[2][16];
    for (int j = 0; j < 16; ++j) {
        sl[j] = 4 * (j & 7); sh[j] = 2 * (j & 7);
        for (int t = 0; t < 2; ++t) ix[t][j] = 4 * t + j / 4;
    }
    const __m512i SL = _mm512_load_si512(sl), SH = _mm512_load_si512(sh);
    const __m512i IX[2] = {_mm512_load_si512(ix[0]), _mm512_load_si512(ix[1])};
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        __m512 dl = _mm512_setzero_ps();  // lane ib < 8: the superblock's dl_ib = d * (ls_ib - 32) (exact)
        for (int g = 0; g < ng; ++g) {
            const uint8_t* sb = wr + (size_t)(g >> 1) * SB;
            const int t = g & 1;
            const uint8_t* q = sb + 8 + 64 * t;
            if (pfd) { _mm_prefetch((const char*)q + pfd, _MM_HINT_T0); _mm_prefetch((const char*)q + pfd + 64, _MM_HINT_T0); }
            const __m512i Q = _mm512_loadu_si512(q);
            const __m512i UX = _mm512_shuffle_epi8(tu, _mm512_and_si512(Q, m4));
            const __m512i UY = _mm512_shuffle_epi8(tu, _mm512_and_si512(_mm512_srli_epi16(Q, 4), m4));
            if (!t) {
                uint16_t hd, shb;
                uint32_t slb;
                memcpy(&hd, sb, 2); memcpy(&shb, sb + 2, 2); memcpy(&slb, sb + 4, 4);
                const __m512i lsv = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)slb), SL), _mm512_set1_epi32(15)),
                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(shb), SH), _mm512_set1_epi32(3)), 4));
                dl = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(hd)), _mm512_cvtepi32_ps(_mm512_sub_epi32(lsv, _mm512_set1_epi32(32))));
            }
            const __m512 dw = _mm512_permutexvar_ps(IX[t], dl);
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
                const uint8_t* rr = RB + g * gst + r * REC;
                __m512i D = _mm512_load_si512(rr + 128);
                D = _mm512_dpbusd_epi32(D, UX, _mm512_load_si512(rr));
                D = _mm512_dpbusd_epi32(D, UY, _mm512_load_si512(rr + 64));
                const __m512 DX = _mm512_load_ps((const float*)(rr + 192));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D), _mm512_mul_ps(dw, DX), acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) y[(size_t)(r0 + r) * N + n] = hsum16(acc[r]);
    }
}

#elif defined(Q32_PATH_AVX2)
// R rows: per group and half h (sub-blocks 4t + 2h, 4t + 2h + 1: 32 qs bytes, one per 128-bit lane), the weights
// unpacked once for all rows; dw lanes 0..3 / 4..7 = their dl
template <int R>
void xs_rows(const uint8_t* W, int N, int K, const uint8_t* rec, int r0, int kall, float* y, int nthreads) {
    const int nb = K / QK, ng = nb / 4;
    const size_t rowbytes = (size_t)nb * IQ4_XS::BB;
    const uint8_t* RB = rec + (size_t)r0 * REC;
    const size_t gst = (size_t)kall * REC;
    const int pfd = PF_DIST;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        __m256 acc[R][2];
        for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int g = 0; g < ng; ++g) {
            const uint8_t* sb = wr + (size_t)(g >> 1) * SB;
            const int t = g & 1;
            const uint8_t* q = sb + 8 + 64 * t;
            if (pfd) { _mm_prefetch((const char*)q + pfd, _MM_HINT_T0); _mm_prefetch((const char*)q + pfd + 64, _MM_HINT_T0); }
            uint16_t hd;
            memcpy(&hd, sb, 2);
            const float d = _cvtsh_ss(hd);
            for (int h = 0; h < 2; ++h) {
                const int ib = 4 * t + 2 * h;
                const __m256i Q = _mm256_loadu_si256((const __m256i*)(q + 32 * h));
                const __m256i m4 = _mm256_set1_epi8(0x0F);
                const __m256i cx = _mm256_and_si256(Q, m4), cy = _mm256_and_si256(_mm256_srli_epi16(Q, 4), m4);
#if defined(__AVXVNNI__)
                const __m256i tb = _mm256_broadcastsi128_si256(IQ4_XS::table128(true));
                const __m256i UX = _mm256_shuffle_epi8(tb, cx), UY = _mm256_shuffle_epi8(tb, cy);
#else
                const __m256i tb = _mm256_broadcastsi128_si256(IQ4_XS::table128(false));
                const __m256i WX = _mm256_shuffle_epi8(tb, cx), WY = _mm256_shuffle_epi8(tb, cy);
                const __m256i AWX = _mm256_abs_epi8(WX), AWY = _mm256_abs_epi8(WY);
#endif
                const __m256 dw = _mm256_set_m128(_mm_set1_ps(d * (float)(IQ4_XS::ls(sb, ib + 1) - 32)),
                                                  _mm_set1_ps(d * (float)(IQ4_XS::ls(sb, ib) - 32)));
                for (int r = 0; r < R; ++r) {
                    const uint8_t* rr = RB + g * gst + r * REC;
                    const __m256i AX = _mm256_load_si256((const __m256i*)(rr + 32 * h));
                    const __m256i AY = _mm256_load_si256((const __m256i*)(rr + 64 + 32 * h));
#if defined(__AVXVNNI__)
                    const __m256i D = dot_vnni(UX, UY, AX, AY, rr + 128 + 32 * h);
#else
                    const __m256i D = dot_signed(WX, WY, AWX, AWY, AX, AY);
#endif
                    const __m256 DX = _mm256_load_ps((const float*)(rr + 192 + 32 * h));
                    acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D), _mm256_mul_ps(dw, DX), acc[r][h]);
                }
            }
        }
        for (int r = 0; r < R; ++r) y[(size_t)(r0 + r) * N + n] = hsum16(acc[r][0], acc[r][1]);
    }
}
#endif

#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)
template <>
struct KTab<IQ4_XS> {
    static constexpr kfn T[17] = {nullptr, xs_rows<1>, xs_rows<2>, xs_rows<3>, xs_rows<4>, xs_rows<5>, xs_rows<6>,
                                  xs_rows<7>, xs_rows<8>, xs_rows<9>, xs_rows<10>, xs_rows<11>, xs_rows<12>,
                                  xs_rows<13>, xs_rows<14>, xs_rows<15>, xs_rows<16>};
};
#endif

// float32 weights dl * v, bit for bit gguf.quants.dequantize ((d * (ls - 32)) * v, each product rounded to float32)
template <>
void dequant<IQ4_XS>(const uint8_t* W, int N, int K, float* out) {
    const int nb = K / QK;
    for (size_t n = 0; n < (size_t)N; ++n) {
        const uint8_t* wr = W + n * nb * IQ4_XS::BB;
        for (int b = 0; b < nb; ++b) {
            int w[QK];
            IQ4_XS::ref_weights(wr, b, w);
            const float dl = IQ4_XS::scale(wr, b);
            for (int j = 0; j < QK; ++j) out[n * K + (size_t)b * QK + j] = dl * (float)w[j];
        }
    }
}

namespace prompt {
// prompt32.h's panels (codes u of weights 4g..4g+3 in dword lane c = column c, then d[16] float32) with dl as d
#if defined(Q32_PATH_512)
template <>
void pack_panel<IQ4_XS>(const uint8_t* W, int N, int nb, int n0, uint8_t* panel) {
    const uint8_t* row[16];
    for (int c = 0; c < 16; ++c) row[c] = W + (size_t)(n0 + c < N ? n0 + c : N - 1) * nb * IQ4_XS::BB;
    for (int b = 0; b < nb; b += 2) {  // nb is a multiple of 8
        alignas(64) float d[2][16];
        __m512i r[16];
        for (int c = 0; c < 16; ++c) {
            d[0][c] = IQ4_XS::scale(row[c], b);
            d[1][c] = IQ4_XS::scale(row[c], b + 1);
            r[c] = _mm512_inserti64x4(_mm512_castsi256_si512(IQ4_XS::codes32(row[c], b)), IQ4_XS::codes32(row[c], b + 1), 1);
        }
        transpose::transpose16(r);
        for (int t = 0; t < 2; ++t) {
            uint8_t* P = panel + (size_t)(b + t) * PB<IQ4_XS>;
            for (int g = 0; g < 8; ++g) _mm512_store_si512(P + 64 * g, r[8 * t + g]);
            _mm512_store_ps(P + 512, _mm512_load_ps(d[t]));
        }
    }
}
#elif defined(Q32_PATH_AVX2)
template <>
void pack_panel<IQ4_XS>(const uint8_t* W, int N, int nb, int n0, uint8_t* panel) {
    const uint8_t* row[16];
    for (int c = 0; c < 16; ++c) row[c] = W + (size_t)(n0 + c < N ? n0 + c : N - 1) * nb * IQ4_XS::BB;
    for (int b = 0; b < nb; ++b) {
        uint8_t* P = panel + (size_t)b * PB<IQ4_XS>;
        for (int t = 0; t < 2; ++t) {
            __m256i r[8];
            for (int c = 0; c < 8; ++c) {
                ((float*)(P + 512))[8 * t + c] = IQ4_XS::scale(row[8 * t + c], b);
                r[c] = IQ4_XS::codes32(row[8 * t + c], b);
            }
            transpose::transpose8(r);
            for (int g = 0; g < 8; ++g) _mm256_store_si256((__m256i*)(P + 64 * g + 32 * t), r[g]);
        }
    }
}
#endif

// the scalar reference of the prompt product, straight from the blocks
template <>
void reference<IQ4_XS>(const uint8_t* W, int N, int K, const int32_t* a, const float* dx, float* y, int k,
                       int nthreads) {
    const int nb = K / QK;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n) {
        const uint8_t* wr = W + (size_t)n * nb * IQ4_XS::BB;
        for (int b = 0; b < nb; ++b) {
            int w[QK];
            IQ4_XS::ref_weights(wr, b, w);
            const float d = IQ4_XS::scale(wr, b);
            for (int r = 0; r < k; ++r) {
                const int8_t* ar = (const int8_t*)(a + (size_t)r * (K / 4)) + (size_t)b * QK;
                int32_t isum = 0;
                for (int i = 0; i < QK; ++i) isum += w[i] * ar[i];
                float& o = y[(size_t)r * N + n];
                o = fmaf((float)isum, d * dx[(size_t)r * nb + b], b ? o : 0.f);
            }
        }
    }
}
}  // namespace prompt
}  // namespace q32
}  // namespace

// the C entry points (q32_parts.h's, with IQ4_XS's K: whole superblocks of 256 weights)
extern "C" {
const char* iq4_xs_isa(void) { return q32::ISA_NAME; }
void iq4_xs_set_prefetch(int dist) { q32::PF_DIST = dist; }
int iq4_xs_gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    if (K <= 0 || K % 256) return -1;
    return q32::gemm<IQ4_XS>(W, N, K, x, k, y, nthreads, mode);
}
// float32 weights, bit for bit gguf.quants.dequantize
void iq4_xs_dequant(const uint8_t* W, int N, int K, float* out) { q32::dequant<IQ4_XS>(W, N, K, out); }
// the kernel's int8 activations a[k,K] (natural order) and their scales dx[k, K/32]
void iq4_xs_quant_x(const float* x, int k, int K, int8_t* a, float* dx) { q32::quant_x<IQ4_XS>(x, k, K, a, dx); }
}
