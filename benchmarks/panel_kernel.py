"""A type in panels of 16 output rows (src/specdec/native/q4k16.cpp, q6k16.cpp, q2k16.cpp, q3k16.cpp, q5k16.cpp,
q4_0p16.cpp) against the kernels of the file's blocks.

    python benchmarks/panel_kernel.py [--type Q4_K|Q6_K|Q2_K|Q3_K|Q5_K|Q4_0] [--gguf FILE] [--threads 2] [--repeats 5]
                                      [--rows 1,2,4,8,16,32,40] [--out FILE.md]

Every matrix of that type in the default target (or ``--gguf FILE``, e.g. the Q2_K or Q3_K_M preset) whose rows are
a multiple of 16, but the embedding (what one token's scoring reads of that type, in file order, so the weights
stream from memory as in decoding), for k activation rows: T(k) = the best of ``--repeats`` passes of the panels
(mode 0), the scoring kernel of the blocks (q4k.cpp / q6k.cpp / q2k.cpp / q3k.cpp / q5k.cpp / q4_0.cpp mode 0) and their
prompt-reading product (mode 2, which packs its panels on every call and uses AMX tiles above 32 rows where the CPU
has them). Q4_0: e.g. ``--gguf`` the draft re-quantized to Q4_0 (specdec.loading.requantize's file).
Checked first, on the first 14 matrices: the panels equal the prompt product bit for bit (modes 2 and 6) on 1, 5, 8
and 40 rows, and each of 8 rows alone equals the same row in the block.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pathlib
import sys
import time

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

from specdec.loading.defaults import default_paths
from specdec.machine import cpu_flags
from specdec.native import build

P, INT = ctypes.c_void_p, ctypes.c_int
GEMM = [P, INT, INT, P, INT, P, INT, INT]
# --type -> (the blocks' kernel, the panels' kernel)
KINDS = {"Q4_K": ("q4k", "q4k16"), "Q6_K": ("q6k", "q6k16"), "Q2_K": ("q2k", "q2k16"), "Q3_K": ("q3k", "q3k16"),
         "Q5_K": ("q5k", "q5k16"), "Q4_0": ("q4_0", "q4_0p16")}


def packed_matrices(lib: ctypes.CDLL, pname: str, path: str, type_name: str,
                    threads: int) -> list[tuple[str, int, int, np.ndarray, np.ndarray]]:
    """Every ``type_name`` matrix of the GGUF file ``path`` whose rows are a multiple of 16, but the embedding, in
    file order: (name, rows, cols, its blocks, its panels packed by ``lib``'s ``{pname}_pack``; a kernel without one,
    e.g. f16 or q5k, reads the file's blocks as they are, and gets them)."""
    packs = hasattr(lib, f"{pname}_pack")
    if packs:
        size, pack = getattr(lib, f"{pname}_bytes"), getattr(lib, f"{pname}_pack")
        size.restype, size.argtypes = ctypes.c_size_t, [INT, INT]
        pack.argtypes = [P, INT, INT, P, INT]
    mats = []
    for t in GGUFReader(path).tensors:
        wanted = t.tensor_type == GGMLQuantizationType[type_name] and t.name != "token_embd.weight"
        if wanted and int(t.shape[1]) % 16 == 0:
            cols, rows = int(t.shape[0]), int(t.shape[1])
            blocks = np.ascontiguousarray(np.asarray(t.data).reshape(rows, -1).view(np.uint8))
            packed = blocks
            if packs:
                packed = np.empty(size(rows, cols), np.uint8)
                assert pack(blocks.ctypes.data, rows, cols, packed.ctypes.data, threads) == 0
            mats.append((t.name, rows, cols, blocks, packed))
    return mats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", default="1,2,4,8,16,32,40")
    ap.add_argument("--type", default="Q4_K", choices=list(KINDS))
    ap.add_argument("--gguf", default=None, help="the GGUF file (default: the default target)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    name, pname = KINDS[args.type]
    ks = [int(v) for v in args.rows.split(",")]
    lib16, lib4 = build.load(pname, "native"), build.load(name, "native")
    panels, old = getattr(lib16, f"{pname}_gemm"), getattr(lib4, f"{name}_gemm")
    panels.argtypes = old.argtypes = GEMM
    path = args.gguf or str(default_paths(progress=False)[0])
    mats = packed_matrices(lib16, pname, path, args.type, args.threads)
    nbytes = sum(m[3].nbytes for m in mats)
    print(f"{len(mats)} {args.type} matrices, {nbytes / 1e6:.0f} MB", flush=True)
    rng = np.random.default_rng(0)
    kmax = max(ks + [40])
    xs = {c: rng.standard_normal((kmax, c)).astype(np.float32) for c in {m[2] for m in mats}}
    ys = {r: np.empty((kmax, r), np.float32) for r in {m[1] for m in mats}}

    def call(fn, w, rows, cols, x, k, mode, threads=args.threads):
        y = np.empty((k, rows), np.float32)
        assert fn(w.ctypes.data, rows, cols, x.ctypes.data, k, y.ctypes.data, threads, mode) == 0
        return y

    for _, rows, cols, blocks, packed in mats[:14]:
        for k in (1, 5, 8, 40):
            x = np.ascontiguousarray(xs[cols][:k])
            y = call(panels, packed, rows, cols, x, k, 0)
            for mode in (2, 6):
                if not np.array_equal(y.view(np.uint32), call(old, blocks, rows, cols, x, k, mode).view(np.uint32)):
                    sys.exit(f"{pname} differs from the prompt product (mode {mode}, {k} rows)")
        block = call(panels, packed, rows, cols, np.ascontiguousarray(xs[cols][:8]), 8, 0)
        for r in range(8):
            one = call(panels, packed, rows, cols, np.ascontiguousarray(xs[cols][r:r + 1]), 1, 0, threads=1)
            if not np.array_equal(one[0].view(np.uint32), block[r].view(np.uint32)):
                sys.exit(f"{pname}: row {r} alone differs from the same row in a block of 8")
    print(f"checks: {pname} = the prompt product (modes 2 and 6) bit for bit on 14 matrices x 1, 5, 8, 40 rows; "
          "a row alone = in a block of 8", flush=True)

    def run(fn, which, mode):
        def go(k):
            for m in mats:
                fn(m[which].ctypes.data, m[1], m[2], xs[m[2]].ctypes.data, k, ys[m[1]].ctypes.data, args.threads, mode)
        return go

    kinds = {pname: run(panels, 4, 0), f"{name} scoring": run(old, 3, 0), f"{name} prompt": run(old, 3, 2)}
    lines = ["| k | " + " | ".join(f"{label} T(k) ms" for label in kinds) + f" | {pname} / {name} scoring |",
             "|---" * (len(kinds) + 2) + "|"]
    best = {}
    for k in ks:
        for label, go in kinds.items():
            go(k)
            ts = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                go(k)
                ts.append(time.perf_counter() - t)
            best[k, label] = min(ts)
        lines.append(f"| {k} | " + " | ".join(f"{1e3 * best[k, label]:.1f}" for label in kinds)
                     + f" | {best[k, pname] / best[k, name + ' scoring']:.2f} |")
        print(lines[-1], flush=True)
    k8 = [k for k in ks if k >= 8]
    if len(k8) >= 2:
        lo, hi = k8[0], k8[-1]
        lines.append("")
        for label in kinds:
            lines.append(f"- {label}: marginal cost of a row from {lo} to {hi} rows = "
                         f"{1e3 * (best[hi, label] - best[lo, label]) / (hi - lo):.2f} ms")
            print(lines[-1])
    if args.out:
        flags = " ".join(f for f in cpu_flags() if f in ("avx2", "avx512f", "avx512_vnni", "amx_tile"))
        head = [f"# {args.type} in panels of 16 output rows ({pname}) against {name}'s scoring and prompt product",
                "", f"`python benchmarks/panel_kernel.py --type {args.type}{' --gguf ' + path if args.gguf else ''} "
                f"--threads {args.threads} "
                f"--rows {args.rows} --out {args.out}`, "
                f"CPU flags {flags}, {os.cpu_count()} cores, {pathlib.Path(path).name}'s {len(mats)} {args.type} "
                f"matrices "
                f"({nbytes / 1e6:.0f} MB), best of {args.repeats}.", ""]
        pathlib.Path(args.out).write_text("\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main()
