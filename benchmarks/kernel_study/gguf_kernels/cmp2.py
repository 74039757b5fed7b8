import ctypes, time, numpy as np, sys, subprocess
import check
from check import load, tinfo, gguf
T = load()
mats = [tinfo(t) for n, t in T.items() if t.tensor_type == gguf.GGMLQuantizationType.Q4_K and "blk." in n]
xs = {K: np.random.default_rng(2).standard_normal((16, K)).astype(np.float32) for K in set(m[2] for m in mats)}
vs = sys.argv[2:]; KS = [int(v) for v in sys.argv[1].split(',')]
libs = {v: ctypes.CDLL(f'./libq4k_{v}.so') for v in vs}
for l in libs.values(): l.q4k_gemm.argtypes = check.lib.q4k_gemm.argtypes
for k in KS:
    res = {v: [] for v in vs}
    for rep in range(15):
        for v in vs:
            check.lib = libs[v]; t0 = time.perf_counter()
            for raw, N, K in mats: check.gemm(raw, K, xs[K][:k])
            res[v].append(time.perf_counter() - t0)
    print(k, '  '.join('%s min %.1f med %.1f' % (v, min(r)*1e3, np.median(r)*1e3) for v, r in res.items()), flush=True)
