"""Checks for src/specdec/native/q6k.cpp: decoding exactness, SIMD vs scalar, accuracy, batch invariance, timing.
usage: python check_q6k.py [dec] [acc] [inv] [time]"""
import ctypes, os, sys, time, subprocess
import numpy as np
import torch
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF = "/root/.cache/specdec/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
from specdec.native import build  # the package's kernel (src/specdec/native/q6k.cpp), built for this CPU

lib = build.load("q6k")
P = ctypes.c_void_p
lib.q6k_gemm.argtypes = [P, ctypes.c_int, ctypes.c_int, P, ctypes.c_int, P, ctypes.c_int, ctypes.c_int]
lib.q6k_quant_x.argtypes = [P, ctypes.c_int, ctypes.c_int, P, P]
lib.q6k_dequant.argtypes = [P, ctypes.c_int, ctypes.c_int, P]
lib.q6k_unpack_simd.argtypes = [P, P]
BB = 210
Q6K = gguf.GGMLQuantizationType.Q6_K


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def gemm(Wraw, K, x, nthreads=2, mode=0):
    N = Wraw.shape[0]
    x = np.ascontiguousarray(x, dtype=np.float32)
    k = x.shape[0]
    y = np.empty((k, N), np.float32)
    assert lib.q6k_gemm(Wraw.ctypes.data, N, K, x.ctypes.data, k, y.ctypes.data, nthreads, mode) == 0
    return y


def quant_x(x):
    k, K = x.shape
    a = np.empty((k, K), np.int8); dx = np.empty((k, K // 256), np.float32)
    lib.q6k_quant_x(np.ascontiguousarray(x, np.float32).ctypes.data, k, K, a.ctypes.data, dx.ctypes.data)
    return a, dx


def load():
    return {t.name: t for t in gguf.GGUFReader(GGUF).tensors}


def tinfo(t):
    raw = np.asarray(t.data)
    assert raw.dtype == np.uint8 and raw.shape[1] % BB == 0
    return raw, raw.shape[0], raw.shape[1] // BB * 256


def decode_q6k_np(raw, N, K):
    """Independent numpy decode (ggml dequantize_row_q6_K formula)."""
    b = raw.reshape(N, K // 256, BB)
    d = b[..., 208:210].copy().view(np.float16).astype(np.float32)[..., 0]
    sc = b[..., 192:208].view(np.int8).astype(np.float32)
    q = np.empty(b.shape[:2] + (256,), np.int32)
    for h in range(2):
        ql = b[..., 64 * h:64 * h + 64].astype(np.int32); qh = b[..., 128 + 32 * h:160 + 32 * h].astype(np.int32)
        q[..., 128 * h + 0:128 * h + 32] = (ql[..., :32] & 15) | (((qh >> 0) & 3) << 4)
        q[..., 128 * h + 32:128 * h + 64] = (ql[..., 32:] & 15) | (((qh >> 2) & 3) << 4)
        q[..., 128 * h + 64:128 * h + 96] = (ql[..., :32] >> 4) | (((qh >> 4) & 3) << 4)
        q[..., 128 * h + 96:128 * h + 128] = (ql[..., 32:] >> 4) | (((qh >> 6) & 3) << 4)
    w = d[..., None] * np.repeat(sc, 16, axis=-1) * (q - 32).astype(np.float32)
    return w.reshape(N, K)


SEL = {"ffn_down 1536x8960": "blk.0.ffn_down.weight", "attn_v 256x1536": "blk.0.attn_v.weight",
       "output 151936x1536": "output.weight"}


def dec_check(T):
    print("== decoding exactness vs gguf.quants.dequantize ==")
    for label, name in SEL.items():
        t = T[name]; assert t.tensor_type == Q6K, name
        raw, N, K = tinfo(t)
        ok_all = True; maxd = 0.0; maxd2 = 0.0
        for s in range(0, N, 8192):                       # chunks (memory)
            sub = np.ascontiguousarray(raw[s:s + 8192]); n = sub.shape[0]
            Wg = gguf.quants.dequantize(sub, Q6K).reshape(n, K)
            Wc = np.empty((n, K), np.float32); lib.q6k_dequant(sub.ctypes.data, n, K, Wc.ctypes.data)
            Wn = decode_q6k_np(sub, n, K)
            maxd = max(maxd, float(np.abs(Wg - Wc).max())); maxd2 = max(maxd2, float(np.abs(Wg - Wn).max()))
            ok_all &= np.array_equal(Wg.view(np.uint32), Wc.view(np.uint32))
        # SIMD unpack of every block of the first 2048 rows == scalar codes (ggml formula) + 32
        sub = np.ascontiguousarray(raw[:2048]).reshape(-1, BB)
        u = np.empty(256, np.uint8); bad = 0
        Wn = decode_q6k_np(sub.reshape(-1, BB), sub.shape[0], 256)
        blk = np.zeros(BB + 64, np.uint8)  # padded copy (the unpack reads 64-byte vectors)
        for i in range(0, sub.shape[0], 7):
            blk[:BB] = sub[i]; lib.q6k_unpack_simd(blk.ctypes.data, u.ctypes.data)
            d = np.float32(blk[208:210].view(np.float16)[0]); sc = blk[192:208].view(np.int8).astype(np.float32)
            wu = d * np.repeat(sc, 16) * (u.astype(np.float32) - 32)
            bad += not np.array_equal(wu.view(np.uint32), Wn[i].view(np.uint32))
        print(f"{label:20s} C decoder vs gguf: bit-identical {ok_all} (max|diff| {maxd:.3g}); numpy decoder max|diff| {maxd2:.3g};"
              f" SIMD unpack vs formula: {bad} mismatching blocks of {len(range(0, sub.shape[0], 7))}")


def acc_check(T):
    print("== SIMD vs scalar reference, accuracy ==")
    rng = np.random.default_rng(0)
    for label, name in SEL.items():
        raw, N, K = tinfo(T[name])
        x = rng.standard_normal((5, K)).astype(np.float32); x[:, rng.integers(0, K, 8)] *= 20
        sub = np.ascontiguousarray(raw[:1024]); n = sub.shape[0]
        for k in (1, 5, 16):
            ys = gemm(sub, K, x[:k]); yr = gemm(sub, K, x[:k], nthreads=1, mode=1)
            print(f"{label:20s} k={k} SIMD vs scalar ref (first {n} rows): bit-identical "
                  f"{np.array_equal(ys.view(np.uint32), yr.view(np.uint32))}")
        Wg = gguf.quants.dequantize(sub, Q6K).reshape(n, K).astype(np.float64)
        y = gemm(sub, K, x)
        a, dx = quant_x(x)
        xq = (a.astype(np.float64).reshape(5, K // 256, 256) * dx[..., None]).reshape(5, K)
        y64q = xq @ Wg.T; y64 = x.astype(np.float64) @ Wg.T
        print(f"   rel err vs f64(int8 x, W): {np.linalg.norm(y - y64q) / np.linalg.norm(y64q):.2e}"
              f" (max abs {np.abs(y - y64q).max():.1e}) | vs f64(float x, W): {np.linalg.norm(y - y64) / np.linalg.norm(y64):.2e}")


def inv_check(T, out_rows=None):
    print("== batch invariance (bitwise), k = 1..16, several windows per k, 1 and 2 threads ==")
    rng = np.random.default_rng(1)
    for label, name in SEL.items():
        raw, N, K = tinfo(T[name])
        if out_rows and N > out_rows:
            raw = np.ascontiguousarray(raw[:out_rows]); N = out_rows; label += f" [first {N} rows]"
        X = rng.standard_normal((16, K)).astype(np.float32)
        res = []
        for nt in (1, 2):
            base = np.stack([gemm(raw, K, X[i:i + 1], nthreads=nt)[0] for i in range(16)])
            bad = set(); ncalls = 0
            for k in range(1, 17):
                for s in range(0, 16 - k + 1, max(1, k)):
                    yk = gemm(raw, K, X[s:s + k], nthreads=nt); ncalls += 1
                    if not np.array_equal(yk.view(np.uint32), base[s:s + k].view(np.uint32)):
                        bad.add(k)
            res.append((not bad, sorted(bad), base, ncalls))
        cross = np.array_equal(res[0][2].view(np.uint32), res[1][2].view(np.uint32))
        print(f"{label:38s} 1 thread: {'OK' if res[0][0] else 'FAIL ' + str(res[0][1])}  "
              f"2 threads: {'OK' if res[1][0] else 'FAIL ' + str(res[1][1])}  1t==2t: {cross}  ({res[0][3]} calls/thread count)")


def timing(T, ks=(1, 2, 4, 8, 16), reps=7):
    mats = [tinfo(t) for n, t in T.items() if t.tensor_type == Q6K]
    nbytes = sum(m[0].nbytes for m in mats)
    print(f"== timing: all {len(mats)} Q6_K tensors ({nbytes / 1e9:.3f} GB), 2 threads, {reps} repeats ==")
    print("uptime:", uptime())
    rng = np.random.default_rng(2)
    xs = {K: rng.standard_normal((16, K)).astype(np.float32) for K in set(m[2] for m in mats)}
    for raw, N, K in mats:
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
    bw = ctypes.CDLL(os.path.join(HERE, "libbw.so"))
    bw.readbw.argtypes = [P, ctypes.c_size_t, ctypes.c_int]; bw.readbw.restype = ctypes.c_longlong
    buf = np.ones(nbytes, np.uint8); tb = []
    for _ in range(reps):
        t0 = time.perf_counter(); bw.readbw(buf.ctypes.data, buf.nbytes, 2); tb.append(time.perf_counter() - t0)
    del buf
    print(f"pure AVX-512 read of {nbytes / 1e9:.3f} GB, 2 threads: min {min(tb) * 1e3:.1f} ms = {nbytes / min(tb) / 1e9:.1f} GB/s")
    print("uptime:", uptime())


if __name__ == "__main__":
    what = sys.argv[1:] or ["dec", "acc", "inv", "time"]
    T = load()
    if "dec" in what: dec_check(T)
    if "acc" in what: acc_check(T)
    if "inv" in what: inv_check(T, out_rows=None if "invfull" in what else 16384)
    if "time" in what: timing(T)
