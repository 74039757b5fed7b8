// y[k,N] = x[k,K] . W[N,K]^T for float32 weights (tensors of a type without a kernel of its own, de-quantized
// once at load): every output is one dot16 (lanes.h) of its row and its weight row, so a row's result is the
// same whatever other rows are in the call and whatever the thread count. Same C ABI as q4k_gemm.
#include <omp.h>
#include "lanes.h"

extern "C" {
int f32_gemm(const uint8_t* W, int N, int K, const float* x, int k, float* y, int nthreads, int mode) {
    (void)mode;
    if (K % LANES) return -1;
    const float* w = (const float*)W;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n)
        for (int r = 0; r < k; ++r) y[(size_t)r * N + n] = dot16(x + (size_t)r * K, w + (size_t)n * K, K);
    return 0;
}
const char* f32_isa(void) { return "vector extension"; }
}
