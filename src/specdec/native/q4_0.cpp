// Batch-invariant Q4_0 x int8 GEMM, y[k,N] = x[k,K] . W[N,K]^T (any k; rows in groups of <= 16).
// W: raw GGUF block_q4_0 bytes (fp16 d, qs[16]; 18 bytes / 32 weights), row n = K/32 blocks. ggml
// dequantize_row_q4_0: for j < 16: q_j = qs[j] & 15, q_{j+16} = qs[j] >> 4; w = d * (q - 8), q in 0..15.
// x: float32 [k,K], quantized per row per 32-block as ggml's quantize_row_q8_0_ref does (ggml pairs Q4_0 with
//    block_q8_0): amax = max|x|, dx = amax/127 (float32, kept as float32), id = dx ? 1/dx : 0, a = roundf(x*id)
//    (half away from zero; clamped to [-127,127], never hit). One portable scalar quantizer for every path.
//
// Lane layout: blocks go in groups of 4 (group g = blocks 4g..4g+3; a last partial group is padded with
// zero blocks: d = 0, q = 0, a = 0, dx = 0). 16 lanes j = 4l + i: block b = 4g + l, dword i.
// Per output element (r, n), per group g in order, per lane j:
//   D_j = sum_{e<4} (q[4i+e]-8)*a[4i+e] + (q[16+4i+e]-8)*a[16+4i+e]     (exact int32, |D| <= 8*8*127 = 8128)
//   S_j = d_b * dx_{r,b}                                                 (float32 mul, rounded)
//   acc_j = fma(float(D_j), S_j, acc_j)                                  (float(D) exact; one rounding)
// y = fixed-tree horizontal sum of the 16 lanes (v[i]+v[i+8], +4, then (0+2)+(1+3)).
// How D_j is obtained differs per path but it is the same integer: unsigned codes u = q (0..15), unpacked once
// per group and shared by all rows; C_j = -8 * (sum of lane j's 8 activations), stored in the row's record;
//   AVX-512 VNNI / AVX-VNNI: D = dpbusd(dpbusd(C_j, UX, AX), UY, AY)
//   AVX2: D = madd(maddubs(UX, AX) + maddubs(UY, AY), 1) + C_j   (|int16| <= 2*2*15*127 = 7620: no saturation)
//   scalar (also the reference, mode 1): the formula above, lane by lane.
// Records per (group, row), 256 bytes, group-major ([ng][k]): [0,64) AX (lane l = a[b][0:16]),
// [64,128) AY (a[b][16:32]), [128,192) C int32[16], [192,256) dx float[16] (lane j: dx of its block).
// One template per row count 1..16 (weights unpacked once per group of rows), OpenMP static over N,
// -ffp-contract=off: nothing depends on k, on the row's position or on the thread count.
// Paths: AVX-512 (F, BW, VL, VNNI, VBMI: vpermt2b gathers 4 blocks), else AVX2 + FMA + F16C (+ AVX-VNNI), else
// scalar; all bit-identical. Software prefetch PF_DIST bytes ahead. No AMX.
// The prompt product (mode bit 2) is prompt32.h's: isum = sum (q - 8) * a per block, acc = fma(isum, d * dx, acc).
// The quantizer, records, reference kernel, kernel skeletons and entry points are q32.h's.
#include "q32_parts.h"  // q32.h, and the AVX2 dots and entry points the types share

namespace {
// block_q4_0: fp16 d, qs[16]
struct Q4_0 {
    static const int BB = 18;       // bytes per block_q4_0
    static const int BIAS = 8;      // C_j = -BIAS * sum(a)
    static const bool MIN = false;  // w = d * (q - 8): no min

    // signed weights q - 8 (w = d * (q - 8)), straight from ggml's dequantize_row_q4_0
    static void ref_weights(const uint8_t* blk, int w[q32::QK]) {
        const uint8_t* qs = blk + 2;
        for (int j = 0; j < q32::QK / 2; ++j) {
            w[j] = (qs[j] & 0x0F) - 8;
            w[j + q32::QK / 2] = (qs[j] >> 4) - 8;
        }
    }

#if defined(Q32_PATH_512) || defined(Q32_PATH_AVX2)
    // the 32 unsigned codes u = q of one block, natural order (prompt32.h): low nibbles codes 0..15, high 16..31
    static inline __m256i codes32(const uint8_t* blk) {
        const __m128i qs = _mm_loadu_si128((const __m128i*)(blk + 2)), m4 = _mm_set1_epi8(0x0F);
        return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
    }
#endif

#if defined(Q32_PATH_512)
    // vpermt2b gathers of the 4 blocks of a group (72 bytes: R0 = bytes 0..63, R1 = 64..71)
    struct Unpack512 {
        __m512i iq, id;
        Unpack512() {
            alignas(64) uint8_t IQ[64], ID[64];
            for (int l = 0; l < 4; ++l)
                for (int e = 0; e < 16; ++e) IQ[16 * l + e] = (uint8_t)(BB * l + 2 + e);  // qs
            for (int j = 0; j < 16; ++j) { ID[2 * j] = (uint8_t)(BB * (j / 4)); ID[2 * j + 1] = (uint8_t)(BB * (j / 4) + 1); }
            for (int j = 32; j < 64; ++j) ID[j] = 0;
            iq = _mm512_load_si512(IQ); id = _mm512_load_si512(ID);
        }
        __attribute__((always_inline)) inline void operator()(const uint8_t* p, __m512i& UX, __m512i& UY, __m512& dw) const {
            const __m512i m4 = _mm512_set1_epi8(0x0F);
            const __m512i R0 = _mm512_loadu_si512(p), R1 = _mm512_maskz_loadu_epi8(0xFFull, p + 64);  // 72 bytes
            const __m512i Q = _mm512_permutex2var_epi8(R0, iq, R1);
            UX = _mm512_and_si512(Q, m4);
            UY = _mm512_and_si512(_mm512_srli_epi16(Q, 4), m4);
            dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(R0, id, R1)));
        }
    };
#elif defined(Q32_PATH_AVX2)
    // unsigned codes UX, UY of blocks b0, b1 (128-bit lane 0: b0, lane 1: b1)
    struct Half2 {
        __m256i UX, UY;
        __attribute__((always_inline)) inline Half2(const uint8_t* b0, const uint8_t* b1) {
            const __m256i Q = _mm256_set_m128i(q32::ld128(b1 + 2), q32::ld128(b0 + 2));
            const __m256i m4 = _mm256_set1_epi8(0x0F);
            UX = _mm256_and_si256(Q, m4);
            UY = _mm256_and_si256(_mm256_srli_epi16(Q, 4), m4);
        }
        __attribute__((always_inline)) inline __m256i dot(__m256i AX, __m256i AY, const uint8_t* c) const {
            return q32::dot_biased(UX, UY, AX, AY, c);
        }
    };
#endif
};
}  // namespace

// float32 weights d * (q - 8), bit for bit gguf.quants.dequantize
Q32_ENTRY_POINTS(q4_0, Q4_0)
