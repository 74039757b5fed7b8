// y[k,N] = x[k,K] . W[N,K]^T over BF16 weights (bfloat16, the file's bytes: 2 bytes a weight), batch-invariant.
// Per output element (r, n), w_i the exact float32 value of weight (n, i) (its 16 bits shifted up by 16):
//   lane j (0..15): acc_j = 0, then for i = j, j + 16, ... in order: acc_j = acc_j + x[r,i] * w_i (two roundings)
//   y = tree16(acc) ((acc_i + acc_{i+8}), + 4, then (c0 + c2) + (c1 + c3))
// = f32.cpp's result on the de-quantized weights, bit for bit. Modes: 0 the tiles (each prefetching the next), 1 the
// scalar reference (same bits), 2 the prompt product = mode 0's arithmetic. K a multiple of 16. Details: half.h.
// (No vdpbf16ps: it would need the activations in bfloat16 too, and only AVX-512 BF16 CPUs have it.)
#include "half.h"

HALF_ENTRY_POINTS(bf16, BF16)
