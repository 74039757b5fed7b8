// Batch-invariant Q4_K x Q8_K-like GEMM, y[k,N] = x[k,K] . W[N,K]^T, k <= 16.
// W: raw GGUF block_q4_K bytes, row n = K/256 blocks of 144 bytes.
// x: float32 [k,K], quantized per row per 256-block to int8 (scale = amax/127).
//
// Per output element (r, n) the arithmetic is fixed (independent of k and threads):
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
// Also: software prefetch PF_DIST bytes ahead (q4k_set_prefetch); rows > 16 go in groups of 16.
// Build (build.sh): g++ -O3 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512vbmi -mavx2 -mavx512dq
//        -mf16c -mfma -ffp-contract=off -fopenmp -shared -fPIC -o libq4k.so q4k_kernel.cpp
// Uses vpermb (AVX512_VBMI) for the scale broadcast; no AMX.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#include <omp.h>

static const int QK = 256;
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
struct QX {
    uint8_t* rec;  // [nb][k] records of REC bytes
};

// record per (block b, row r): [0,256) int8 a (kernel order), [256,320) xb[16] floats, [320,324) dx; 384 bytes.
// Records are stored block-major ([nb][k]) so a kernel group of rows uses one pointer + constant offsets.
static const int REC = 384;
static void quantize_row(const float* x, int K, uint8_t* rec0, size_t bstride) {
    // AVX-512 version; same IEEE ops as a scalar loop: amax = max|x|, d = amax/127,
    // q = round-half-even(x * (127/amax)) clamped to [-127,127]; per-row only (k-independent).
    const int nb = K / QK;
    const __m512 sgn = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int b = 0; b < nb; ++b) {
        const float* xs = x + (size_t)b * QK;
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < QK; i += 16) m = _mm512_max_ps(m, _mm512_and_ps(_mm512_loadu_ps(xs + i), sgn));
        const float amax = _mm512_reduce_max_ps(m);
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

// ---------------- scale decode (ggml get_scale_min_k4 via 32-bit tricks) ----------------
static inline void decode_scales(const uint8_t* s12, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[4];
    memcpy(u, s12, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    uint32_t ua = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = ua;
    u[0] &= k1;
    memcpy(sc, u, 8);
    memcpy(mn, u + 2, 8);
}

static inline float h2f(const uint8_t* p) { uint16_t h; memcpy(&h, p, 2); return _cvtsh_ss(h); }

// Fixed horizontal sum tree (identical in the scalar reference)
static inline float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 e = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(e);
}
static inline float hsum16_ref(const float* v) {
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i) a[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; ++i) b[i] = a[i] + a[i + 4];
    c[0] = b[0] + b[2]; c[1] = b[1] + b[3];
    return c[0] + c[1];
}

// ---------------- AVX-512 VNNI kernel, R rows at compile time ----------------
template <int R>
static void kernel_rows(const uint8_t* W, int N, int K, const QX& q, int r0, int kall, float* y, int nthreads) {
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
    const uint8_t* RB = q.rec + (size_t)r0 * REC;      // record (b, r0 + r) = RB + b*bst + r*REC
    const size_t bst = (size_t)kall * REC;
    const int pfd = PF_DIST;

#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n) {
        const uint8_t* wr = W + (size_t)n * rowbytes;
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = wr + (size_t)b * BB;
            if (pfd) {
                const char* pp = (const char*)blk + pfd;
                if (PF_HINT == 0) { _mm_prefetch(pp, _MM_HINT_T0); _mm_prefetch(pp + 64, _MM_HINT_T0); _mm_prefetch(pp + 128, _MM_HINT_T0); }
                else { _mm_prefetch(pp, _MM_HINT_T1); _mm_prefetch(pp + 64, _MM_HINT_T1); _mm_prefetch(pp + 128, _MM_HINT_T1); }
            }
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
    (void)kall;
}

typedef void (*kfn)(const uint8_t*, int, int, const QX&, int, int, float*, int);
static kfn KTAB[17] = {nullptr,
    kernel_rows<1>, kernel_rows<2>, kernel_rows<3>, kernel_rows<4>, kernel_rows<5>, kernel_rows<6>,
    kernel_rows<7>, kernel_rows<8>, kernel_rows<9>, kernel_rows<10>, kernel_rows<11>, kernel_rows<12>,
    kernel_rows<13>, kernel_rows<14>, kernel_rows<15>, kernel_rows<16>};

// ---------------- scalar reference: same arithmetic, emulating vector lanes ----------------
static void kernel_ref(const uint8_t* W, int N, int K, const QX& q, int k, float* y) {
    const int nb = K / QK;
    const size_t rowbytes = (size_t)nb * BB;
    for (int n = 0; n < N; ++n)
        for (int r = 0; r < k; ++r) {
            float acc[16] = {0};
            for (int b = 0; b < nb; ++b) {
                const uint8_t* blk = W + n * rowbytes + (size_t)b * BB;
                const float d = h2f(blk), dmin = h2f(blk + 2);
                uint8_t sc[8], mn[8];
                decode_scales(blk + 4, sc, mn);
                uint8_t qn[256];  // natural-order nibbles: sub-block 2c lo / 2c+1 hi of qs[32c..32c+31]
                for (int c = 0; c < 4; ++c)
                    for (int i = 0; i < 32; ++i) { qn[64 * c + i] = blk[16 + 32 * c + i] & 15; qn[64 * c + 32 + i] = blk[16 + 32 * c + i] >> 4; }
                const uint8_t* rr = q.rec + ((size_t)b * k + r) * REC;
                const int8_t* ar = (const int8_t*)rr;   // kernel order
                int32_t DA[16], DB[16];
                for (int l = 0; l < 16; ++l) {
                    int sa = 0, sbb = 0;
                    for (int c = 0; c < 2; ++c)
                        for (int e = 0; e < 4; ++e) {
                            const int pa = 64 * c + 4 * l + e, pb = 128 + 64 * c + 4 * l + e;
                            sa += (int)qn[KPOS[pa]] * (int)ar[pa];
                            sbb += (int)qn[KPOS[pb]] * (int)ar[pb];
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
                    float F = (float)I[l] * d;
                    acc[l] = fmaf(F, dxr, acc[l]);
                    float mv = (l < 8 ? (float)sc[l] : (float)mn[l - 8]) * dmin;
                    acc[l] = fmaf(-mv, xb[l], acc[l]);
                }
            }
            y[(size_t)r * N + n] = hsum16_ref(acc);
        }
}

extern "C" {
void q4k_set_prefetch(int dist, int hint) { PF_DIST = dist; PF_HINT = hint; }
// y[k,N] = x[k,K] . W^T ; mode 0 = AVX-512 kernel, 1 = scalar reference
// rows_per_call: rows are processed in groups of at most 16 (one template instance per group)
int q4k_gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    if (K % QK) return -1;
    const int nb = K / QK;
    QX q;
    q.rec = (uint8_t*)aligned_alloc(64, (size_t)k * nb * REC);
    for (int r = 0; r < k; ++r)
        quantize_row(x + (size_t)r * K, K, q.rec + (size_t)r * REC, (size_t)k * REC);
    if (mode == 1) kernel_ref(W, N, K, q, k, y);
    else
        for (int r0 = 0; r0 < k; r0 += 16) {
            int R = k - r0 < 16 ? k - r0 : 16;
            KTAB[R](W, N, K, q, r0, k, y, nthreads);
        }
    free(q.rec);
    return 0;
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
}
