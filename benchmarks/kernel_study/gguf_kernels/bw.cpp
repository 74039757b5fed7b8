#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <stdio.h>
// read-bandwidth test: xor-reduce a buffer with nt threads
extern "C" long long readbw(const uint8_t* p, size_t n, int nt) {
    long long tot = 0;
#pragma omp parallel for num_threads(nt) reduction(^:tot) schedule(static)
    for (size_t i = 0; i < n / 256; ++i) {
        __m512i a = _mm512_loadu_si512(p + i*256), b = _mm512_loadu_si512(p + i*256+64);
        __m512i c = _mm512_loadu_si512(p + i*256+128), d = _mm512_loadu_si512(p + i*256+192);
        a = _mm512_xor_si512(_mm512_xor_si512(a,b), _mm512_xor_si512(c,d));
        tot ^= _mm_cvtsi128_si64(_mm512_castsi512_si128(a));
    }
    return tot;
}
