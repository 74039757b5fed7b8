"""The scoring kernels' shape, measured: the shipped Q4_K kernel against r16_q4k.cpp (16 output rows a zmm).

    python benchmarks/kernel_shape/study.py [--threads 2] [--repeats 5] [--out benchmarks/results/kernel-shape.md]
    python benchmarks/kernel_shape/study.py --groups 8,12,16 [--rows ...]   # the shipped kernel's group shape
    python benchmarks/kernel_shape/study.py --prompt-steps [--rows ...]      # r16 in the prompt product's arithmetic

Both kernels run over every Q4_K matrix of the default target (the matrices one token's scoring reads, in file
order, so the weights stream from memory as in decoding) for k = 1..32 activation rows; T(k) is the best of
``--repeats`` passes. Also checked: the r16 result of each row is bit for bit the same alone or in any block, and
within float rounding of the shipped kernel (different summation order: not the same bits).

``--groups G,...``: instead, the shipped q4k.cpp compiled with ``-DQ4K_G=G`` (at most G rows a kernel instance),
timed round robin (each repeat times every k and every G once, so a burst of other load on a shared machine hits
different cells; T = the best), with a bitwise check that all G give the same rows.

``--prompt-steps``: r16 compiled with ``-DR16_PROMPT_STEPS`` (the prompt product's float steps), checked bit for bit
against the shipped prompt-reading product (``q4k_gemm`` modes 2 and 6, with and without AMX) on 1, 5, 8 and 40 rows
of the first 14 matrices, and timed beside both (the prompt product packs its panels on every call).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

from specdec.loading.defaults import default_paths
from specdec.machine import cpu_flags
from specdec.native import build

HERE = pathlib.Path(__file__).resolve().parent
P = ctypes.c_void_p


def compile_study(defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    out = pathlib.Path(tempfile.mkdtemp()) / "libr16.so"
    subprocess.run(["g++", "-O3", "-march=native", "-std=c++17", "-ffp-contract=off", "-fopenmp", "-shared",
                    "-fPIC", *(f"-D{d}" for d in defines), str(HERE / "r16_q4k.cpp"), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.r16_pack.argtypes = [P, ctypes.c_int, ctypes.c_int, P]
    lib.r16_quantize.argtypes = [P, ctypes.c_int, ctypes.c_int, P, P, P]
    lib.r16_gemm.argtypes = [P, ctypes.c_int, ctypes.c_int, P, P, P, ctypes.c_int, P, ctypes.c_int]
    return lib


def compile_groups(groups: list[int]) -> dict[int, ctypes.CDLL]:
    """q4k.cpp with -DQ4K_G=g for each g, as build.py compiles it for the native isa."""
    out = pathlib.Path(tempfile.mkdtemp())
    libs = {}
    for g in groups:
        so = out / f"libq4k_g{g}.so"
        subprocess.run([build.compiler(), *build.COMMON_FLAGS, *build.ISA_FLAGS["native"], f"-DQ4K_G={g}", "-I",
                        str(build.HERE), "-o", str(so), str(build.HERE / "q4k.cpp")], check=True)
        libs[g] = ctypes.CDLL(str(so))
        libs[g].q4k_gemm.argtypes = [P, ctypes.c_int, ctypes.c_int, P, ctypes.c_int, P, ctypes.c_int, ctypes.c_int]
    return libs


def study_groups(groups: list[int], mats, xs, ys, ks: list[int], args) -> None:
    fns = {g: lib.q4k_gemm for g, lib in compile_groups(groups).items()}
    _, rows, cols, blocks, _ = mats[0]
    outs = []
    for fn in fns.values():
        y = np.empty((max(ks), rows), np.float32)
        fn(blocks.ctypes.data, rows, cols, xs[cols].ctypes.data, max(ks), y.ctypes.data, args.threads, 0)
        outs.append(y)
    print(f"checks: every group size gives the same bits ({max(ks)} rows): "
          f"{all(np.array_equal(outs[0], o) for o in outs)}")
    best = {(k, g): float("inf") for k in ks for g in groups}
    for _ in range(args.repeats):
        for k in ks:
            for g, fn in fns.items():
                t = time.perf_counter()
                for _, rows, cols, blocks, _ in mats:
                    fn(blocks.ctypes.data, rows, cols, xs[cols].ctypes.data, k, ys[rows].ctypes.data, args.threads, 0)
                best[k, g] = min(best[k, g], time.perf_counter() - t)
    print("| k | " + " | ".join(f"G={g} T(k) ms" for g in groups) + " |\n|---" + "|---" * len(groups) + "|")
    for k in ks:
        print(f"| {k} | " + " | ".join(f"{1e3 * best[k, g]:.1f}" for g in groups) + " |")
    k8 = [k for k in ks if k >= 8]
    if len(k8) >= 2:
        lo, hi = k8[0], k8[-1]
        print(f"marginal cost of a row from {lo} to {hi} rows, ms: "
              + ", ".join(f"G={g} {1e3 * (best[hi, g] - best[lo, g]) / (hi - lo):.2f}" for g in groups))


def check_prompt_steps(lib, shipped, mats, xs, threads: int) -> None:
    """r16 with -DR16_PROMPT_STEPS against the prompt-reading product (modes 2 and 6), bit for bit."""
    for _, rows, cols, blocks, packed in mats[:14]:
        for k in (1, 5, 8, 40):
            x = np.ascontiguousarray(np.resize(xs[cols], (k, cols)))
            a, dx, bs = np.empty((k, cols), np.int8), np.empty((k, cols // 256), np.float32), np.empty(
                (k, cols // 256, 8), np.int16)
            lib.r16_quantize(x.ctypes.data, k, cols, a.ctypes.data, dx.ctypes.data, bs.ctypes.data)
            y = np.empty((k, rows), np.float32)
            lib.r16_gemm(packed.ctypes.data, rows, cols, a.ctypes.data, dx.ctypes.data, bs.ctypes.data, k,
                         y.ctypes.data, threads)
            for mode in (2, 6):
                ref = np.empty((k, rows), np.float32)
                shipped(blocks.ctypes.data, rows, cols, x.ctypes.data, k, ref.ctypes.data, threads, mode)
                if not np.array_equal(y.view(np.uint32), ref.view(np.uint32)):
                    sys.exit(f"r16 --prompt-steps differs from the prompt product (mode {mode}, {k} rows)")
    print("checks: r16 with the prompt product's steps = the prompt product (modes 2 and 6), bit for bit: "
          "14 matrices x 1, 5, 8, 40 rows", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", default="1,2,3,4,5,6,8,12,16,24,32")
    ap.add_argument("--out", default=None)
    ap.add_argument("--groups", default=None, help="G,...: the shipped kernel at most G rows an instance, instead")
    ap.add_argument("--prompt-steps", action="store_true",
                    help="r16 in the prompt product's arithmetic: checked bitwise against it, timed beside it")
    args = ap.parse_args()
    ks = [int(v) for v in args.rows.split(",")]
    lib = compile_study(("R16_PROMPT_STEPS",) if args.prompt_steps else ())
    shipped = build.load("q4k", "native").q4k_gemm
    shipped.argtypes = [P, ctypes.c_int, ctypes.c_int, P, ctypes.c_int, P, ctypes.c_int, ctypes.c_int]
    reader = GGUFReader(str(default_paths(progress=False)[0]))
    mats = []
    for t in reader.tensors:
        if t.tensor_type == GGMLQuantizationType.Q4_K and t.name.startswith("blk."):
            cols, rows = int(t.shape[0]), int(t.shape[1])
            blocks = np.ascontiguousarray(np.asarray(t.data).reshape(rows, -1).view(np.uint8))
            packed = np.empty((rows // 16) * (cols // 256) * 2368, dtype=np.uint8)
            lib.r16_pack(blocks.ctypes.data, rows, cols, packed.ctypes.data)
            mats.append((t.name, rows, cols, blocks, packed))
    nbytes = sum(m[3].nbytes for m in mats)
    print(f"{len(mats)} Q4_K matrices, {nbytes / 1e6:.0f} MB", flush=True)
    rng = np.random.default_rng(0)
    kmax = max(ks)
    xs = {c: rng.standard_normal((kmax, c)).astype(np.float32) for c in {m[2] for m in mats}}
    ys = {r: np.empty((kmax, r), dtype=np.float32) for r in {m[1] for m in mats}}
    if args.groups:
        study_groups([int(g) for g in args.groups.split(",")], mats, xs, ys, ks, args)
        return
    bufs = {c: (np.empty((kmax, c), np.int8), np.empty((kmax, c // 256), np.float32),
                np.empty((kmax, c // 256, 8), np.int16)) for c in xs}

    def run_shipped(k: int) -> None:
        for _, rows, cols, blocks, _ in mats:
            shipped(blocks.ctypes.data, rows, cols, xs[cols].ctypes.data, k, ys[rows].ctypes.data, args.threads, 0)

    def run_r16(k: int) -> None:
        for _, rows, cols, _, packed in mats:
            a, dx, bs = bufs[cols]
            lib.r16_quantize(xs[cols].ctypes.data, k, cols, a.ctypes.data, dx.ctypes.data, bs.ctypes.data)
            lib.r16_gemm(packed.ctypes.data, rows, cols, a.ctypes.data, dx.ctypes.data, bs.ctypes.data, k,
                         ys[rows].ctypes.data, args.threads)

    def run_prompt(k: int) -> None:  # the shipped prompt-reading product (mode 2: its panels packed per call)
        for _, rows, cols, blocks, _ in mats:
            shipped(blocks.ctypes.data, rows, cols, xs[cols].ctypes.data, k, ys[rows].ctypes.data, args.threads, 2)

    # checks on the first gate matrix: alone = in a block (bitwise), and close to the shipped kernel
    name, rows, cols, blocks, packed = next(m for m in mats if "ffn_gate" in m[0])
    x = xs[cols][:8]
    a, dx, bs = (np.empty((8, cols), np.int8), np.empty((8, cols // 256), np.float32),
                 np.empty((8, cols // 256, 8), np.int16))
    lib.r16_quantize(x.ctypes.data, 8, cols, a.ctypes.data, dx.ctypes.data, bs.ctypes.data)
    block_y = np.empty((8, rows), np.float32)
    lib.r16_gemm(packed.ctypes.data, rows, cols, a.ctypes.data, dx.ctypes.data, bs.ctypes.data, 8,
                 block_y.ctypes.data, args.threads)
    for r in range(8):
        one = np.empty((1, rows), np.float32)
        lib.r16_gemm(packed.ctypes.data, rows, cols, a[r:r + 1].ctypes.data, dx[r:r + 1].ctypes.data,
                     bs[r:r + 1].ctypes.data, 1, one.ctypes.data, 1)
        if not np.array_equal(one[0], block_y[r]):
            sys.exit(f"r16: row {r} alone differs from the same row in a block of 8")
    ref = np.empty((8, rows), np.float32)
    shipped(blocks.ctypes.data, rows, cols, x.ctypes.data, 8, ref.ctypes.data, args.threads, 0)
    rel = float(np.abs(block_y - ref).max() / np.abs(ref).max())
    print(f"checks: r16 alone = in a block of 8 (bitwise); max |r16 - shipped| / max|shipped| = {rel:.2e}")
    if rel > 1e-4:
        sys.exit("r16 disagrees with the shipped kernel beyond float rounding")
    modes = {"shipped": run_shipped, "r16": run_r16}
    if args.prompt_steps:
        check_prompt_steps(lib, shipped, mats, xs, args.threads)
        modes["prompt"] = run_prompt

    lines = ["| k | " + " | ".join(f"{label} T(k) ms" for label in modes) + " | r16 / shipped |",
             "|---" * (len(modes) + 2) + "|"]
    results = {}
    for k in ks:
        best = {}
        for label, fn in modes.items():
            fn(k)
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                fn(k)
                times.append(time.perf_counter() - t)
            best[label] = min(times)
        results[k] = best
        lines.append(f"| {k} | " + " | ".join(f"{1e3 * best[label]:.1f}" for label in modes)
                     + f" | {best['r16'] / best['shipped']:.2f} |")
        print(lines[-1], flush=True)
    k8 = [k for k in ks if k >= 8]
    if len(k8) >= 2:
        lo, hi = k8[0], k8[-1]
        for label in modes:
            per = (results[hi][label] - results[lo][label]) / (hi - lo)
            lines.append(f"\n{label}: marginal cost of a row from {lo} to {hi} rows = {1e3 * per:.2f} ms "
                         f"({nbytes / 1e6:.0f} MB of Q4_K weights)")
            print(lines[-1].strip())
    if args.out:
        flags = " ".join(f for f in cpu_flags() if f in ("avx2", "avx512f", "avx512_vnni", "amx_tile"))
        steps = (" --prompt-steps" if args.prompt_steps else "") + (
            f" --rows {args.rows}" if args.rows != ap.get_default("rows") else "")
        head = ["# Scoring kernels' shape: shipped Q4_K vs 16 output rows a zmm (r16)", "",
                f"`python benchmarks/kernel_shape/study.py --threads {args.threads}{steps} --out {args.out}`, "
                f"CPU flags {flags}, {os.cpu_count()} cores, the default target's {len(mats)} Q4_K matrices "
                f"({nbytes / 1e6:.0f} MB), best of {args.repeats}.", ""]
        pathlib.Path(args.out).write_text("\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main()
