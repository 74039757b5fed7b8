// Batch-invariant Q8_0 x int8 GEMM, y[k,N] = x[k,K] . W[N,K]^T (any k; rows in groups of <= 16).
// W: raw GGUF block_q8_0 bytes (fp16 d, int8 qs[32]; 34 bytes / 32 weights), row n = K/32 blocks; w = d * q.
// x: float32 [k,K], quantized per row per 32-block as ggml's quantize_row_q8_0_ref does:
//    amax = max|x|, dx = amax/127 (float32, kept as float32), id = dx ? 1/dx : 0, a = roundf(x*id) (half away
//    from zero; clamped to [-127,127], never hit). One portable scalar quantizer for every path.
//
// Lane layout: blocks go in groups of 4 (group g = blocks 4g..4g+3; a last partial group is padded with
// zero blocks: d = 0, q = 0, a = 0, dx = 0). 16 lanes j = 4l + i: block b = 4g + l, dword i.
// Per output element (r, n), per group g in order, per lane j:
//   D_j = sum_{e<4} q[4i+e]*a[4i+e] + q[16+4i+e]*a[16+4i+e]    (exact int32, |D| <= 8*128*127 = 130048 < 2^24)
//   S_j = d_b * dx_{r,b}                                       (float32 mul, rounded)
//   acc_j = fma(float(D_j), S_j, acc_j)                        (float(D) exact; one rounding)
// y = fixed-tree horizontal sum of the 16 lanes (v[i]+v[i+8], +4, then (0+2)+(1+3)).
// How D_j is obtained differs per path but it is the same integer:
//   AVX-512 VNNI / AVX-VNNI: weights biased to unsigned u = q + 128 (xor 0x80, once per group, shared by all
//     rows); D = dpbusd(dpbusd(C_j, UX, AX), UY, AY) with C_j = -128 * (sum of lane j's 8 activations), stored
//     in the row's record (|intermediate| <= 130048 + 8*255*127: no overflow; dpbusd does not saturate).
//   AVX2: ggml's sign trick, maddubs(|q|, sign(a, q)): |pair| <= 2*128*127 = 32512 < 32767 (no saturation),
//     madd with ones, add.
//   scalar (also the reference, mode 1): the formula above, lane by lane.
// Records per (group, row), 256 bytes, group-major ([ng][k]): [0,64) AX (lane l = a[b][0:16]),
// [64,128) AY (a[b][16:32]), [128,192) C int32[16], [192,256) dx float[16] (lane j: dx of its block).
// One template per row count 1..16 (weights unpacked once per group of rows), OpenMP static over N,
// -ffp-contract=off: nothing depends on k, on the row's position or on the thread count.
// Paths: AVX-512 (F, BW, VL, VNNI, VBMI: vpermt2b gathers 4 blocks), else AVX2 + FMA + F16C (+ AVX-VNNI),
// else scalar; all bit-identical. Software prefetch PF_DIST bytes ahead. No AMX.
// The quantizer, records, reference kernel, kernel skeletons and entry points are q32.h's (shared with q5_0.cpp).
#include "q32_parts.h"  // q32.h, and the AVX2 dots and entry points the types share

namespace {
// block_q8_0: fp16 d, int8 qs[32]
struct Q8_0 {
    static const int BB = 34;       // bytes per block_q8_0
    static const int BIAS = 128;    // C_j = -BIAS * sum(a)
    static const bool MIN = false;  // w = d * q: no min

    // signed weights q (w = d * q)
    static void ref_weights(const uint8_t* blk, int w[q32::QK]) {
        const int8_t* q = (const int8_t*)(blk + 2);
        for (int j = 0; j < q32::QK; ++j) w[j] = q[j];
    }

#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)
    // the 32 unsigned codes u = q + 128 of one block, natural order (prompt32.h)
    static inline __m256i codes32(const uint8_t* blk) {
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(blk + 2)), _mm256_set1_epi8((char)0x80));
    }
#endif

#if defined(Q32_PATH_512)
    // vpermt2b gathers of the 4 blocks of a group (136 bytes: R0 = 0..63, R1 = 64..127, R2 = 72..135)
    struct Unpack512 {
        __m512i ix, iy, id;
        Unpack512() {
            alignas(64) uint8_t IX[64], IY[64], ID[64];
            for (int l = 0; l < 4; ++l)
                for (int e = 0; e < 16; ++e) {
                    IX[16 * l + e] = (uint8_t)(BB * l + 2 + e);
                    IY[16 * l + e] = l < 3 ? (uint8_t)(BB * l + 18 + e) : 0;  // block 3's second half: blended from R2
                }
            for (int j = 0; j < 16; ++j) { ID[2 * j] = (uint8_t)(BB * (j / 4)); ID[2 * j + 1] = (uint8_t)(BB * (j / 4) + 1); }
            for (int j = 32; j < 64; ++j) ID[j] = 0;
            ix = _mm512_load_si512(IX); iy = _mm512_load_si512(IY); id = _mm512_load_si512(ID);
        }
        // weights biased to unsigned u = q + 128 (xor 0x80)
        __attribute__((always_inline)) inline void operator()(const uint8_t* p, __m512i& UX, __m512i& UY, __m512& dw) const {
            const __m512i x80 = _mm512_set1_epi8((char)0x80);
            const __m512i R0 = _mm512_loadu_si512(p), R1 = _mm512_loadu_si512(p + 64), R2 = _mm512_loadu_si512(p + 72);
            UX = _mm512_xor_si512(_mm512_permutex2var_epi8(R0, ix, R1), x80);
            UY = _mm512_xor_si512(_mm512_mask_blend_epi64(0xC0, _mm512_permutex2var_epi8(R0, iy, R1), R2), x80);
            dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(R0, id, R1)));
        }
    };
#elif defined(Q32_PATH_AVX2)
    // weights of blocks b0, b1 (128-bit lane 0: b0, lane 1: b1)
    struct Half2 {
#if defined(__AVXVNNI__)
        __m256i UX, UY;                    // biased to unsigned u = q + 128 (xor 0x80)
#else
        __m256i WX, WY, AWX, AWY;          // q and |q| (ggml's sign trick)
#endif
        __attribute__((always_inline)) inline Half2(const uint8_t* b0, const uint8_t* b1) {
            const __m256i X = _mm256_set_m128i(q32::ld128(b1 + 2), q32::ld128(b0 + 2));
            const __m256i Y = _mm256_set_m128i(q32::ld128(b1 + 18), q32::ld128(b0 + 18));
#if defined(__AVXVNNI__)
            const __m256i x80 = _mm256_set1_epi8((char)0x80);
            UX = _mm256_xor_si256(X, x80); UY = _mm256_xor_si256(Y, x80);
#else
            WX = X; WY = Y;
            AWX = _mm256_abs_epi8(X); AWY = _mm256_abs_epi8(Y);
#endif
        }
        __attribute__((always_inline)) inline __m256i dot(__m256i AX, __m256i AY, const uint8_t* c) const {
#if defined(__AVXVNNI__)
            return q32::dot_vnni(UX, UY, AX, AY, c);
#else
            (void)c;
            return q32::dot_signed(WX, WY, AWX, AWY, AX, AY);
#endif
        }
    };
#endif
};
}  // namespace

// float32 weights d * q, bit for bit gguf.quants.dequantize
Q32_ENTRY_POINTS(q8_0, Q8_0)
