// The AVX2 path of the prompt-reading product (prompt.h), same bits as its reference.
#pragma once
namespace prompt {
// y[k,N] from the quantized rows: a [kp][K] int8 natural order, dx [kp][nb], ext [kp][nb][16] (F::extra);
// rows k..kp-1 are zero padding (kp = k rounded up to 16). PLACEHOLDER until the AVX2 kernel lands: the reference.
template <class F>
void product_avx2(const uint8_t* W, int N, int K, const int8_t* a, const float* dx, const int32_t* ext, float* y, int k,
                  int nthreads) {
    (void)ext; (void)nthreads;
    reference<F>(W, N, K, a, dx, y, k);
}
}  // namespace prompt
