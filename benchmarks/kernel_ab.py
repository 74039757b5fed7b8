"""One kernel of this tree against the same kernel of an earlier revision (or the same tree under other compiler
flags), in one process, turn about: T(k) of each side, the ratio, and a check that both give the same bits.

    python benchmarks/kernel_ab.py --kernel q4_0p16 --type Q4_0 --gguf Q4_0.gguf [--base HEAD] [--rows 1,2,4,8]
    python benchmarks/kernel_ab.py --kernel q4_0p16 --type Q4_0 --gguf Q4_0.gguf --base . \\
        --base-flags=-DAVX2_ROWS32=1000 --rows 16,64,256          # a compile-time threshold, both sides this tree

The base's ``src/specdec/native`` is exported (``git archive``; ``--base .``: this tree) and both sides are compiled
with specdec's own flags for this CPU (``-march=native``) plus ``--base-flags`` / ``--flags``, into a temporary
folder. The matrices: every matrix of ``--type`` in ``--gguf`` (default: the default target) whose rows are a
multiple of 16, but the embedding, packed once by this tree's ``NAME_pack`` (the panel layout must be the same on
both sides; a kernel without one, e.g. f16, q5k, reads the file's blocks), in file order, so the weights stream from
memory as in decoding. Per repeat and k, both sides run (which goes first alternates) and T(k) = the best of
``--repeats``; first, both sides' outputs are compared bit for bit on the first 6 matrices at every k (a difference
stops the run).
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
from panel_kernel import packed_matrices

from specdec.loading.defaults import default_paths
from specdec.machine import cpu_flags
from specdec.native.build import COMMON_FLAGS, compiler
from specdec.native.isas import ISA_FLAGS

ROOT = pathlib.Path(__file__).resolve().parent.parent
NATIVE = "src/specdec/native"
P, INT = ctypes.c_void_p, ctypes.c_int


def compile_side(src: pathlib.Path, name: str, flags: list[str], out: pathlib.Path) -> ctypes.CDLL:
    cmd = [compiler(), *COMMON_FLAGS, *ISA_FLAGS["native"], *flags, "-I", str(src), "-o", str(out),
           str(src / f"{name}.cpp")]
    subprocess.run(cmd, check=True)
    return ctypes.CDLL(str(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", required=True, help="a kernel's source name, e.g. q4_0p16, q4k16, iq4_xsp16, f16, q5k")
    ap.add_argument("--type", required=True, help="the GGUF tensor type it reads, e.g. Q4_0, Q4_K, IQ4_XS")
    ap.add_argument("--gguf", default=None, help="the GGUF file (default: the default target)")
    ap.add_argument("--base", default="HEAD", help="the revision to compare with ('.': this tree)")
    ap.add_argument("--base-flags", default="", help="extra compiler flags of the base side")
    ap.add_argument("--flags", default="", help="extra compiler flags of this tree's side")
    ap.add_argument("--rows", default="1,2,3,4,8")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", type=int, default=0, help="the kernel's mode: 0 scoring, 2 the prompt product")
    ap.add_argument("--out", default=None, help="write the table here (.md)")
    args = ap.parse_args()
    ks = [int(v) for v in args.rows.split(",")]
    path = args.gguf or str(default_paths(progress=False)[0])
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="kernel-ab-"))
    if args.base == ".":
        base_src = ROOT / NATIVE
    else:
        subprocess.run(f"git -C {ROOT} archive {args.base} {NATIVE} | tar -x -C {tmp}", shell=True, check=True)
        base_src = tmp / NATIVE
    sides = {"base": compile_side(base_src, args.kernel, args.base_flags.split(), tmp / "base.so"),
             "this": compile_side(ROOT / NATIVE, args.kernel, args.flags.split(), tmp / "this.so")}
    gemm = {}
    for side, lib in sides.items():
        gemm[side] = getattr(lib, f"{args.kernel}_gemm")
        gemm[side].argtypes = [P, INT, INT, P, INT, P, INT, INT]
    mats = [(rows, cols, packed) for _, rows, cols, _, packed in
            packed_matrices(sides["this"], args.kernel, path, args.type, args.threads)]
    if not mats:
        sys.exit(f"no {args.type} matrix with rows a multiple of 16 in {path}")
    kmax = max(ks)
    rng = np.random.default_rng(0)
    xs = {c: rng.standard_normal((kmax, c)).astype(np.float32) for c in {m[1] for m in mats}}
    ys = {r: np.empty((kmax, r), np.float32) for r in {m[0] for m in mats}}
    for rows, cols, w in mats[:6]:
        for k in ks:
            y = {side: np.empty((k, rows), np.float32) for side in sides}
            for side in sides:
                assert gemm[side](w.ctypes.data, rows, cols, xs[cols].ctypes.data, k, y[side].ctypes.data,
                                  args.threads, args.mode) == 0
            if not np.array_equal(y["base"].view(np.uint32), y["this"].view(np.uint32)):
                sys.exit(f"{args.kernel}: the two sides differ ({k} rows, a {rows} x {cols} matrix)")
    print(f"{len(mats)} {args.type} matrices; both sides give the same bits at every k", flush=True)

    def go(side: str, k: int) -> None:
        for rows, cols, w in mats:
            gemm[side](w.ctypes.data, rows, cols, xs[cols].ctypes.data, k, ys[rows].ctypes.data, args.threads,
                       args.mode)

    best: dict[tuple[int, str], float] = {}
    for rep in range(args.repeats):
        for k in ks:
            for side in ("base", "this") if rep % 2 else ("this", "base"):
                go(side, k)
                t = time.perf_counter()
                go(side, k)
                best[k, side] = min(best.get((k, side), float("inf")), time.perf_counter() - t)
    lines = ["| k | base T(k) ms | this T(k) ms | this / base | base T(k)/T(first) | this T(k)/T(first) |",
             "|---|---|---|---|---|---|"]
    k0 = ks[0]
    for k in ks:
        b, t = best[k, "base"], best[k, "this"]
        lines.append(f"| {k} | {1e3 * b:.1f} | {1e3 * t:.1f} | {t / b:.2f} | {b / best[k0, 'base']:.2f} | "
                     f"{t / best[k0, 'this']:.2f} |")
    nbytes = sum(w.nbytes for _, _, w in mats)
    lines += ["", f"Weights read a pass: {nbytes / 1e6:.0f} MB; at k = {k0} base {nbytes / best[k0, 'base'] / 1e9:.1f} "
              f"GB/s, this {nbytes / best[k0, 'this'] / 1e9:.1f} GB/s."]
    macs, kl = sum(rows * cols for rows, cols, _ in mats), ks[-1]
    lines += [f"Multiply-adds at k = {kl}: base {macs * kl / best[kl, 'base'] / 1e9:.0f} G/s, this "
              f"{macs * kl / best[kl, 'this'] / 1e9:.0f} G/s."]
    print("\n".join(lines))
    if args.out:
        flags = " ".join(f for f in cpu_flags() if f in ("avx2", "avx512f", "avx512_vnni", "amx_tile"))
        cmd = " ".join(["python benchmarks/kernel_ab.py", *sys.argv[1:]])
        head = [f"# {args.kernel}: this tree against {args.base}", "",
                f"`{cmd}`, CPU flags {flags}, {os.cpu_count()} cores, {pathlib.Path(path).name}'s {len(mats)} "
                f"{args.type} matrices, {args.threads} threads, mode {args.mode}, best of {args.repeats}; base flags "
                f"`{args.base_flags or '-'}`, this tree's `{args.flags or '-'}`. Same bits on both sides (checked).",
                ""]
        pathlib.Path(args.out).write_text("\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main()
