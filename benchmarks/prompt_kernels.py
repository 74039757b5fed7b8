"""Per matrix: the scoring product against the prompt-reading product (VNNI and AMX paths), one process run.

    python benchmarks/prompt_kernels.py                       # the default target GGUF, 2 threads
    python benchmarks/prompt_kernels.py --rows 16 64 256 --threads 1 --isa avx2

Times ``<fmt>_gemm`` in mode 0 (scoring), mode 2 | 4 (prompt product without AMX) and mode 2 (prompt product,
AMX where the CPU and the kernel allow it) on real tensors, best of --repeats, interleaved; prints a Markdown
table with the CPU's flags. Ratios are to the scoring product on the same matrix, rows and threads.
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec.cache import cache_dir
from specdec.machine import describe_cpu
from specdec.native.gguf_file import GGUFFile
from specdec.native.kernels import KERNELS, QuantMatrix

TENSORS = ("blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "blk.0.attn_q.weight")
MODES = (("scoring", 0), ("prompt, no AMX", 2 | 4), ("prompt", 2))


def best_seconds(matrix: QuantMatrix, x: torch.Tensor, mode: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matrix(x, mode=mode)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", default=str(cache_dir() / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    parser.add_argument("--tensors", nargs="+", default=list(TENSORS))
    parser.add_argument("--rows", nargs="+", type=int, default=[16, 64, 256])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--isa", default="native", choices=["native", "avx2", "scalar"])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    tensors = GGUFFile(args.gguf).tensors
    print(f"CPU: {describe_cpu()}; {args.threads} threads; kernels: {args.isa}\n")
    print("| matrix | rows | " + " | ".join(f"{name} ms" for name, _ in MODES) + " | prompt vs scoring |")
    print("|---" * (len(MODES) + 3) + "|")
    for name in args.tensors:
        t = tensors[name]
        if t.qtype not in KERNELS:
            continue
        matrix = QuantMatrix(t.data, t.qtype, int(t.shape[0]), threads=args.threads, isa=args.isa)
        for k in args.rows:
            x = torch.randn(k, matrix.cols)
            for _, mode in MODES:
                matrix(x, mode=mode)  # warm: pages of the file, thread pool
            times = {label: float("inf") for label, _ in MODES}
            for _ in range(2):  # two interleaved passes over the modes
                for label, mode in MODES:
                    times[label] = min(times[label], best_seconds(matrix, x, mode, args.repeats))
            cells = " | ".join(f"{1e3 * times[label]:.2f}" for label, _ in MODES)
            ratio = times["scoring"] / times["prompt"]
            print(f"| {name} {t.qtype.name} {matrix.rows}×{matrix.cols} | {k} | {cells} | {ratio:.2f}× |")


if __name__ == "__main__":
    main()
