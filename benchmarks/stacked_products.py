"""Stacked products on and off: the default pair's score calls with q/k/v and gate/up as one matrix each
(``NativeSettings(stack=True)``, the default) and as separate calls (``stack=False``), in one process, alternately.

    python benchmarks/stacked_products.py [--rounds 3] [--calls 150] [--out benchmarks/results/stacked-products]

For each model (the draft re-quantized to Q4_0 as the CLI loads it, its head cut to 32,768 rows; the Q4_K_M target)
and k = 1 and 4: after a 100-token prompt, the mean seconds of ``score(k tokens)`` then ``trim`` over ``--calls``
calls (a third of them for the target), stacked and unstacked in turn, ``--rounds`` times. The logits are the same
bits either way (tests/test_native_stacked.py); this measures only the time.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time

import numpy as np

from specdec.loading import defaults as zoo
from specdec.loading.requantize import requantized
from specdec.models.native import NativeModel, NativeSettings

PROMPT_TOKENS, HEAD_ROWS = 100, 32768


def flags() -> str:
    with open("/proc/cpuinfo") as f:
        found = set(re.findall(r"\b(avx2|avx512f|avx512_vnni|amx_tile)\b", f.read()))
    return " ".join(sorted(found)) or "none of avx2 avx512f avx512_vnni amx_tile"


def timed(model: NativeModel, prompt: list[int], tokens: list[int], calls: int) -> float:
    model.prefill(prompt)
    model.score(tokens)
    model.trim(len(prompt))
    start = time.perf_counter()
    for _ in range(calls):
        model.score(tokens)
        model.trim(len(prompt))
    return (time.perf_counter() - start) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="stacked/unstacked alternations (default: %(default)s)")
    ap.add_argument("--calls", type=int, default=150, help="draft calls a measurement (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default=None, help="the target's GGUF file (default: the default pair's)")
    ap.add_argument("--no-draft", action="store_true", help="the target only")
    ap.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = ap.parse_args()
    target, draft = zoo.default_paths(progress=False)
    target = args.target or target
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 30000, PROMPT_TOKENS).tolist()
    rows = []
    pair = [("draft", requantized(str(draft), progress=False), args.calls)] if not args.no_draft else []
    for which, path, calls in pair + [("target", str(target), max(args.calls // 3, 1))]:
        models = {s: NativeModel(path, NativeSettings(threads=args.threads, stack=s)) for s in (False, True)}
        if which == "draft":
            for m in models.values():
                m.cut_head(list(range(HEAD_ROWS)))
        for k in (1, 4):
            tokens = rng.integers(0, 30000, k).tolist()
            ms = {s: [] for s in models}
            for _ in range(args.rounds):
                for s, m in models.items():
                    ms[s].append(timed(m, prompt, tokens, calls) * 1e3)
            row = {"model": which, "k": k, "unstacked_ms": ms[False], "stacked_ms": ms[True],
                   "ratio_of_medians": float(np.median(ms[True]) / np.median(ms[False]))}
            rows.append(row)
            print(f"{which} k={k}: unstacked {', '.join(f'{t:.2f}' for t in ms[False])} ms; stacked "
                  f"{', '.join(f'{t:.2f}' for t in ms[True])} ms; {row['ratio_of_medians']:.2f}x", flush=True)
        del models
    if args.out:
        command = " ".join(["python benchmarks/stacked_products.py", *sys.argv[1:]])
        what = target if args.target else "the default pair"
        lines = [f"# Stacked products on and off: score calls of {what}", "",
                 f"`{command}`; {platform.processor() or platform.machine()}, flags {flags()}, {args.threads} threads; "
                 f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. ms a call after a {PROMPT_TOKENS}-token "
                 "prompt, each round stacked and unstacked in turn (the draft: re-quantized to Q4_0, head cut to "
                 f"{HEAD_ROWS} rows).", "",
                 "| model | k | unstacked ms | stacked ms | stacked / unstacked (medians) |", "|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['model']} | {r['k']} | {', '.join(f'{t:.2f}' for t in r['unstacked_ms'])} | "
                         f"{', '.join(f'{t:.2f}' for t in r['stacked_ms'])} | {r['ratio_of_medians']:.2f}× |")
        with open(args.out + ".md", "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(args.out + ".json", "w") as f:
            json.dump({"command": command, "flags": flags(), "rows": rows}, f, indent=2)
        print(f"wrote {args.out}.md and {args.out}.json")


if __name__ == "__main__":
    main()
