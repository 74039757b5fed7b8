"""Checks for src/specdec/native/q4k.cpp: decoding, accuracy, batch invariance, timing.
usage: python check.py [acc] [inv] [time] [torch]"""
import ctypes, os, sys, time, subprocess
import numpy as np
import torch
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF = "/root/.cache/specdec/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
from specdec.native import build  # the package's kernel (src/specdec/native/q4k.cpp), built for this CPU

lib = build.load("q4k")
P = ctypes.c_void_p
lib.q4k_gemm.argtypes = [P, ctypes.c_int, ctypes.c_int, P, ctypes.c_int, P, ctypes.c_int, ctypes.c_int]
lib.q4k_quant_x.argtypes = [P, ctypes.c_int, ctypes.c_int, P, P]


def gemm(Wraw, K, x, nthreads=2, mode=0):
    """Wraw: uint8 array [N, K/256*144] (C-contiguous); x float32 [k, K] -> float32 [k, N]"""
    N = Wraw.shape[0]
    x = np.ascontiguousarray(x, dtype=np.float32)
    k = x.shape[0]
    y = np.empty((k, N), np.float32)
    rc = lib.q4k_gemm(Wraw.ctypes.data, N, K, x.ctypes.data, k, y.ctypes.data, nthreads, mode)
    assert rc == 0
    return y


def quant_x(x):
    k, K = x.shape
    a = np.empty((k, K), np.int8)
    dx = np.empty((k, K // 256), np.float32)
    lib.q4k_quant_x(np.ascontiguousarray(x, np.float32).ctypes.data, k, K, a.ctypes.data, dx.ctypes.data)
    return a, dx


def decode_q4k_np(raw, N, K):
    """Independent numpy decoding of block_q4_K following ggml's get_scale_min_k4."""
    b = raw.reshape(N, K // 256, 144)
    d = b[..., 0:2].copy().view(np.float16).astype(np.float32)[..., 0]
    dm = b[..., 2:4].copy().view(np.float16).astype(np.float32)[..., 0]
    s = b[..., 4:16].astype(np.int32)
    qs = b[..., 16:144]
    sc = np.empty(s.shape[:-1] + (8,), np.int32); mn = np.empty_like(sc)
    for j in range(8):
        if j < 4:
            sc[..., j] = s[..., j] & 63; mn[..., j] = s[..., j + 4] & 63
        else:
            sc[..., j] = (s[..., j + 4] & 0xF) | ((s[..., j - 4] >> 6) << 4)
            mn[..., j] = (s[..., j + 4] >> 4) | ((s[..., j] >> 6) << 4)
    q = np.empty(s.shape[:-1] + (8, 32), np.int32)
    for c in range(4):
        ch = qs[..., 32 * c:32 * c + 32].astype(np.int32)
        q[..., 2 * c, :] = ch & 15; q[..., 2 * c + 1, :] = ch >> 4
    w = d[..., None, None] * sc[..., None].astype(np.float32) * q - dm[..., None, None] * mn[..., None].astype(np.float32)
    return w.reshape(N, K).astype(np.float32)


def load():
    r = gguf.GGUFReader(GGUF)
    return {t.name: t for t in r.tensors}


def tinfo(t):
    raw = np.asarray(t.data)
    N = raw.shape[0]
    K = raw.shape[1] // 144 * 256
    return raw, N, K


def pick(T):
    sel = {"attn_q 1536x1536": "blk.0.attn_q.weight",
           "ffn_gate 8960x1536": "blk.0.ffn_gate.weight",
           "ffn_up 8960x1536": "blk.0.ffn_up.weight"}
    downs = [n for n, t in T.items() if "ffn_down" in n and t.tensor_type == gguf.GGMLQuantizationType.Q4_K]
    if downs:
        sel["ffn_down 1536x8960"] = sorted(downs)[0]
    return sel


def acc_check(T):
    print("== accuracy ==")
    rng = np.random.default_rng(0)
    for label, name in pick(T).items():
        t = T[name]; raw, N, K = tinfo(t)
        Wg = gguf.quants.dequantize(raw, t.tensor_type).reshape(N, K)
        Wn = decode_q4k_np(raw, N, K)
        print(f"{label} ({name}): my numpy decode vs gguf.dequantize max|diff| = {np.abs(Wg - Wn).max():.3g}")
        x = rng.standard_normal((4, K)).astype(np.float32)
        x[:, rng.integers(0, K, 8)] *= 20  # a few outlier channels
        y = gemm(raw, K, x)
        if N <= 1536 and K <= 1536:
            yr = gemm(raw, K, x, nthreads=1, mode=1)
            print(f"   SIMD vs scalar reference: bit-identical = {np.array_equal(y.view(np.uint32), yr.view(np.uint32))}"
                  f", max|diff| = {np.abs(y - yr).max():.3g}")
        else:  # scalar ref is slow: check a row subset via a sliced W
            sub = raw[:512].copy()
            yr = gemm(sub, K, x, nthreads=1, mode=1); ys = gemm(sub, K, x)
            print(f"   SIMD vs scalar reference (first 512 rows): bit-identical = "
                  f"{np.array_equal(ys.view(np.uint32), yr.view(np.uint32))}")
        x2 = rng.standard_normal((4, K)).astype(np.float32)  # plain gaussian, no outliers
        for tag, xx in (("gauss+outliers", x), ("gauss", x2)):
            y = gemm(raw, K, xx)
            a, dx = quant_x(xx)
            xq = (a.astype(np.float64).reshape(4, K // 256, 256) * dx[..., None]).reshape(4, K)
            y64q = xq @ Wg.astype(np.float64).T
            y64 = xx.astype(np.float64) @ Wg.astype(np.float64).T
            y32 = (torch.from_numpy(xx) @ torch.from_numpy(Wg).T).numpy()
            nrm = np.linalg.norm(y64q)
            print(f"   [{tag}] rel err vs f64(int8 x, W): {np.linalg.norm(y - y64q) / nrm:.2e} (max abs {np.abs(y - y64q).max():.1e})"
                  f" | vs f64(float x, W): {np.linalg.norm(y - y64) / np.linalg.norm(y64):.2e}"
                  f" | vs f32 torch x@W^T: {np.linalg.norm(y - y32) / np.linalg.norm(y32):.2e}")


def inv_check(T):
    print("== batch invariance (bitwise), k = 1..16, every row ==")
    rng = np.random.default_rng(1)
    for label, name in pick(T).items():
        raw, N, K = tinfo(T[name])
        X = rng.standard_normal((16, K)).astype(np.float32)
        res = []
        for nt in (1, 2):
            base = np.stack([gemm(raw, K, X[i:i + 1], nthreads=nt)[0] for i in range(16)])
            ok = True; bad = []
            for k in range(1, 17):
                for s in range(0, 16 - k + 1, max(1, k)):  # several windows per k
                    yk = gemm(raw, K, X[s:s + k], nthreads=nt)
                    if not np.array_equal(yk.view(np.uint32), base[s:s + k].view(np.uint32)):
                        ok = False; bad.append(k)
            res.append((nt, ok, sorted(set(bad)), base))
        cross = np.array_equal(res[0][3].view(np.uint32), res[1][3].view(np.uint32))
        print(f"{label:22s} 1 thread: {'OK' if res[0][1] else 'FAIL ' + str(res[0][2])}   "
              f"2 threads: {'OK' if res[1][1] else 'FAIL ' + str(res[1][2])}   1t==2t: {cross}")


def timing(T, ks=(1, 2, 3, 4, 5, 8, 12, 16), reps=7):
    print("== timing: all Q4_K linear tensors of the model (168), 2 threads ==")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    mats = [tinfo(t) for n, t in T.items() if t.tensor_type == gguf.GGMLQuantizationType.Q4_K and "blk." in n]
    nbytes = sum(m[0].nbytes for m in mats)
    rng = np.random.default_rng(2)
    xs = {K: rng.standard_normal((16, K)).astype(np.float32) for K in set(m[2] for m in mats)}
    for raw, N, K in mats:  # touch once (page in)
        gemm(raw, K, xs[K][:1])
    t1 = None
    print(f"{'k':>3} {'min ms':>8} {'med ms':>8} {'T/T1':>6} {'GB/s':>6}")
    for k in ks:
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for raw, N, K in mats:
                gemm(raw, K, xs[K][:k])
            ts.append(time.perf_counter() - t0)
        mn, md = min(ts) * 1e3, float(np.median(ts)) * 1e3
        t1 = t1 or mn
        print(f"{k:3d} {mn:8.1f} {md:8.1f} {mn / t1:6.2f} {nbytes / mn / 1e6:6.1f}")
    # plain streaming-read bandwidth of the same amount of memory, same threads (context for GB/s)
    bw = ctypes.CDLL(os.path.join(HERE, "libbw.so"))
    bw.readbw.argtypes = [P, ctypes.c_size_t, ctypes.c_int]; bw.readbw.restype = ctypes.c_longlong
    buf = np.ones(nbytes, np.uint8); tb = []
    for _ in range(reps):
        t0 = time.perf_counter(); bw.readbw(buf.ctypes.data, buf.nbytes, 2); tb.append(time.perf_counter() - t0)
    del buf
    print(f"pure AVX-512 read of {nbytes / 1e9:.3f} GB, 2 threads: min {min(tb) * 1e3:.1f} ms = {nbytes / min(tb) / 1e9:.1f} GB/s")
    print(f"weights: {nbytes / 1e9:.3f} GB;", "uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def torch_timing(T, ks=(1, 2, 3, 4, 5, 8, 12, 16), reps=7):
    """torch int4 (groupsize 32, bf16 scale+zero: exact re-parametrisation of Q4_K's d*sc, dmin*m) at the same shapes.
    Random 4-bit codes (timing only); bytes moved ~0.625 B/weight vs Q4_K's 0.5625."""
    torch.set_num_threads(2)
    print("== torch aten._weight_int4pack_mm_for_cpu (bf16 x, groupsize 32), same 168 shapes, 2 threads ==")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    shapes = [tinfo(t)[1:] for n, t in T.items() if t.tensor_type == gguf.GGMLQuantizationType.Q4_K and "blk." in n]
    g = torch.Generator().manual_seed(0)
    mats = []
    for N, K in shapes:
        w = torch.randint(0, 16, (N, K), dtype=torch.int32, generator=g)
        p = torch.ops.aten._convert_weight_to_int4pack_for_cpu(w, 1)
        sz = (torch.randn(K // 32, N, 2, generator=g) * 0.01).to(torch.bfloat16)
        mats.append((p, sz, K))
    nbytes = sum(p.numel() + sz.numel() * 2 for p, sz, K in mats)
    xs = {K: torch.randn(16, K, generator=g).to(torch.bfloat16) for K in set(m[2] for m in mats)}
    f = torch.ops.aten._weight_int4pack_mm_for_cpu
    for p, sz, K in mats: f(xs[K][:1], p, 32, sz)
    t1 = None
    print(f"{'k':>3} {'min ms':>8} {'med ms':>8} {'T/T1':>6} {'GB/s':>6}")
    for k in ks:
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for p, sz, K in mats: f(xs[K][:k], p, 32, sz)
            ts.append(time.perf_counter() - t0)
        mn, md = min(ts) * 1e3, float(np.median(ts)) * 1e3
        t1 = t1 or mn
        print(f"{k:3d} {mn:8.1f} {md:8.1f} {mn / t1:6.2f} {nbytes / mn / 1e6:6.1f}")
    print(f"int4pack bytes: {nbytes / 1e9:.3f} GB")


if __name__ == "__main__":
    what = sys.argv[1:] or ["acc", "inv", "time"]
    T = load()
    if "acc" in what: acc_check(T)
    if "inv" in what: inv_check(T)
    if "time" in what: timing(T)
    if "torch" in what: torch_timing(T)
