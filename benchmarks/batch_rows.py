"""T(total rows) of the native target: n sequences × r rows in one ``score_many`` call vs the same rows as n
``score`` calls (each sequence alone), the table a batching engine prices its rounds with.

    python benchmarks/batch_rows.py                        # the default target GGUF (assembled if needed), 2 threads
    python benchmarks/batch_rows.py --seqs 1 2 4 8 --rows 1 2 3 4 --context 200 --repeats 9 --json out.json

Each of the n sequences has its own ~``--context``-token prompt (read once); every timed call starts from those
states again. Per repeat, each (n, r) is timed both ways back to back (batched first on even repeats, separate first
on odd ones), so both see the same load; the table shows medians and, in brackets, the best of the repeats (the
least disturbed by other jobs). Also checks once that the batched logits equal the separate ones bit for bit.
Prints the CPU's flags and the load average before and after: on a shared machine, read the ratios (same run,
same load) before the ms.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import time

import numpy as np
import torch

from specdec.machine import describe_cpu
from specdec.models.native import NativeModel, NativeSettings
from specdec.strict_json import dumps


def cpu_flags() -> str:  # grep -o -w -E 'avx2|avx512f|avx512_vnni|amx_tile' /proc/cpuinfo | sort -u
    text = pathlib.Path("/proc/cpuinfo").read_text()
    return " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_vnni|amx_tile)\b", text))))


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", default=None, help="target GGUF (default: the default target, assembled if needed)")
    parser.add_argument("--seqs", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 3, 4])
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--isa", default="native", choices=["native", "avx2", "scalar"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", default=None, help="also write the table here (strict JSON)")
    args = parser.parse_args()
    if args.gguf is None:
        from specdec.loading.defaults import DEFAULT_TARGET, ensure_gguf

        args.gguf = str(ensure_gguf(DEFAULT_TARGET))
    model = NativeModel(args.gguf, NativeSettings(threads=args.threads, isa=args.isa))
    rng = np.random.default_rng(0)
    vocab = min(model.vocab_size, 150000)
    states = []
    for s in range(max(args.seqs)):  # contexts context - 7 .. context + 7: the sequences differ in length too
        model.prefill([int(t) for t in rng.integers(0, vocab, args.context + (s * 5) % 15 - 7)])
        states.append(model.state())
    blocks = [[int(t) for t in rng.integers(0, vocab, max(args.rows))] for _ in states]

    def batched(n: int, r: int):
        return model.score_many(states[:n], [b[:r] for b in blocks[:n]])[0]

    def separate(n: int, r: int):
        out = []
        for state, block in zip(states[:n], blocks[:n], strict=True):
            model.restore(state)
            out.append(model.score(block[:r]))
        return out

    n, r = max(args.seqs), max(args.rows)
    exact = all(torch.equal(a, b) for a, b in zip(batched(n, r), separate(n, r), strict=True))
    cells = [(n, r) for n in args.seqs for r in args.rows]
    times: dict[tuple[int, int], tuple[list[float], list[float]]] = {c: ([], []) for c in cells}
    for n, r in cells:  # warm: pages of the file, thread pool, allocator
        batched(n, r)
        separate(n, r)
    before = load_average()
    for repeat in range(args.repeats):
        for n, r in cells:
            one, many = times[(n, r)]
            if repeat % 2 == 0:
                one.append(seconds(lambda: batched(n, r)))  # noqa: B023 (called at once)
                many.append(seconds(lambda: separate(n, r)))  # noqa: B023
            else:
                many.append(seconds(lambda: separate(n, r)))  # noqa: B023
                one.append(seconds(lambda: batched(n, r)))  # noqa: B023
    after = load_average()
    t1 = (statistics.median(times[(1, 1)][0]), min(times[(1, 1)][0])) if (1, 1) in times else None

    print(f"CPU: {describe_cpu()}; flags: {cpu_flags()}; {os.cpu_count()} cores; {args.threads} threads; "
          f"kernels: {args.isa}")
    print(f"model: {os.path.basename(args.gguf)}; contexts {args.context} ± 7 tokens; {args.repeats} repeats, "
          f"medians (bests); load average before {before}, after {after} (shared machine: other jobs ran meanwhile)")
    print(f"batched logits equal the separate calls' bit for bit ({n} × {r} rows): {exact}\n")
    print("| sequences | rows each | total rows | score_many ms: median (best) | n × score ms: median (best) "
          "| separate / batched: medians (bests) |" + (" batched / T(1): medians (bests) |" if t1 else ""))
    print("|---" * (6 + (1 if t1 else 0)) + "|")
    table = []
    for n, r in cells:
        one, many = (statistics.median(x) for x in times[(n, r)])
        best_one, best_many = (min(x) for x in times[(n, r)])
        row = {"sequences": n, "rows_each": r, "total_rows": n * r, "batched_ms": one * 1e3, "separate_ms": many * 1e3,
               "batched_best_ms": best_one * 1e3, "separate_best_ms": best_many * 1e3}
        table.append(row)
        print(f"| {n} | {r} | {n * r} | {one * 1e3:.1f} ({best_one * 1e3:.1f}) "
              f"| {many * 1e3:.1f} ({best_many * 1e3:.1f}) | {many / one:.2f}× ({best_many / best_one:.2f}×) |"
              + (f" {one / t1[0]:.2f} ({best_one / t1[1]:.2f}) |" if t1 else ""))
    if args.json:
        pathlib.Path(args.json).write_text(dumps({
            "cpu": describe_cpu(), "flags": cpu_flags(), "threads": args.threads, "isa": args.isa,
            "model": os.path.basename(args.gguf), "context": args.context, "repeats": args.repeats,
            "load_before": before, "load_after": after, "bitwise_equal": exact, "table": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
