"""T(k): the cost of scoring k rows of the default target in one call, with the Q4_K matrices in panels of 16 rows
(q4k16.cpp, the default) and as the file stores them (q4k.cpp), beside llama.cpp's batched rows on the same file.

    python benchmarks/target_rows.py [--rows 1 2 4 8 12 16 24 32] [--repeats 5] [--out FILE.md]

Both models load in one process, read the same ~200-token context, and score the same k tokens from it; per
repeat every k is timed on both, alternating which goes first; T(k) = the best of the repeats. Checked first:
the two give close logits (they sum in different orders: each matrix within float rounding, tests/; after 28
layers of random tokens a few % of the largest logit), and the panel model's
row alone = the same row in a block of 8, bit for bit. Then ``llama-bench -p 8,16,32 -n 0 -t THREADS`` on the
same file (benchmarks/build_llama_cpp_tools.sh's build, when there): its cost per row at 32 rows, the anchor of
issue 27's goal (a marginal row from 8 to 32 at most 0.6x that). Last, the time to read a prompt of each of
``--prompts`` tokens (prefill, the prompt-reading product), both ways, best of 3.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import time

import numpy as np
import torch

from specdec.bench.llamacpp_cli import tools_dir
from specdec.loading.defaults import DEFAULT_TARGET, ensure_gguf
from specdec.machine import cpu_flags
from specdec.models.native import NativeModel, NativeSettings


def llama_bench(path: str, threads: int, repeats: int) -> dict[int, float] | None:
    """rows → ms a call of that many prompt rows (llama-bench -p), or None without the tools."""
    tool = tools_dir() / "llama-bench"
    if not tool.is_file():
        return None
    run = subprocess.run([str(tool), "-m", path, "-p", "8,16,32", "-n", "0", "-t", str(threads), "-r", str(repeats),
                          "-o", "json"], capture_output=True, text=True)
    if run.returncode != 0:
        return None
    return {int(r["n_prompt"]): float(r["avg_ns"]) / 1e6 for r in json.loads(run.stdout) if r["n_prompt"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8, 12, 16, 24, 32])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--prompts", nargs="*", type=int, default=[64, 512])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    path = str(ensure_gguf(DEFAULT_TARGET))
    models = {kind: NativeModel(path, NativeSettings(threads=args.threads, panels=kind == "panels"))
              for kind in ("panels", "blocks")}
    rng = np.random.default_rng(0)
    context = [int(t) for t in rng.integers(0, 150000, args.context)]
    block = [int(t) for t in rng.integers(0, 150000, max(args.rows + [8]))]
    states = {}
    for kind, model in models.items():
        model.prefill(context)
        states[kind] = model.state()

    def score(kind: str, k: int) -> torch.Tensor:
        models[kind].restore(states[kind])
        return models[kind].score(block[:k])

    a, b = score("panels", 8), score("blocks", 8)
    rel = float((a - b).abs().max() / b.abs().max())
    alone = torch.equal(score("panels", 1)[0], a[0])
    print(f"checks: max |panels - blocks| / max |blocks| = {rel:.1e} over 8 rows; a row alone = in the block: {alone}",
          flush=True)
    if rel > 0.25 or not alone:  # 28 layers of random tokens amplify the rounding differences to a few %
        raise SystemExit("the panel kernels disagree")
    best = {(kind, k): float("inf") for kind in models for k in args.rows}
    for repeat in range(args.repeats + 1):  # the first: warm-up
        for k in args.rows:
            for kind in (("panels", "blocks") if repeat % 2 else ("blocks", "panels")):
                t = time.perf_counter()
                score(kind, k)
                if repeat:
                    best[kind, k] = min(best[kind, k], time.perf_counter() - t)
    reads = {}
    for n in args.prompts:
        tokens = [int(t) for t in rng.integers(0, 150000, n)]
        for _ in range(3):
            for kind, model in models.items():
                t = time.perf_counter()
                model.prefill(tokens)
                reads[kind, n] = min(reads.get((kind, n), float("inf")), time.perf_counter() - t)
    anchor = llama_bench(path, args.threads, args.repeats)
    flags = " ".join(f for f in cpu_flags() if f in ("avx2", "avx512f", "avx512_vnni", "amx_tile"))
    lines = ["# T(k) of the default target: Q4_K in panels of 16 rows vs as stored; llama.cpp's rows", "",
             f"`python benchmarks/target_rows.py --rows {' '.join(map(str, args.rows))} --repeats {args.repeats} "
             f"--prompts {' '.join(map(str, args.prompts))}`"
             f" on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: CPU flags {flags}, {os.cpu_count()} cores, "
             f"{args.threads} threads, a {args.context}-token context, best of {args.repeats}.", "",
             "| k | panels T(k) ms | blocks T(k) ms | panels / blocks |", "|---|---|---|---|"]
    for k in args.rows:
        p, q = 1e3 * best["panels", k], 1e3 * best["blocks", k]
        lines.append(f"| {k} | {p:.1f} | {q:.1f} | {p / q:.2f} |")
    lo, hi = min((k for k in args.rows if k >= 8), default=None), max(args.rows)
    if lo is not None and hi > lo:
        lines.append("")
        for kind in models:
            per = 1e3 * (best[kind, hi] - best[kind, lo]) / (hi - lo)
            text = f"- {kind}: marginal row from {lo} to {hi} rows {per:.2f} ms"
            if anchor and 32 in anchor:
                text += f" = {per / (anchor[32] / 32):.2f}x llama.cpp's row at 32 ({anchor[32] / 32:.2f} ms)"
            lines.append(text)
    for n in args.prompts:
        p, q = reads["panels", n], reads["blocks", n]
        lines.append(f"- reading a {n}-token prompt: panels {1e3 * p:.0f} ms, blocks {1e3 * q:.0f} ms ({p / q:.2f}x)")
    if anchor:
        lines.append("- llama-bench -p 8,16,32 -n 0 (ms a call): "
                     + ", ".join(f"{k}: {v:.1f}" for k, v in anchor.items()))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
