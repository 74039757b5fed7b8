"""What the history drafter costs: microseconds per proposal and bytes per token of its table, no model needed.

The table is filled to ``--budget`` tokens with texts made of Python's standard library (each module's words
and punctuation as tokens, ids below ``--vocab``, as a tokenizer's would be: repeated code and prose), recorded
``--doc-tokens`` at a time (evicting once full); then, for ``--proposals`` contexts cut from other modules'
texts (some that occurred in the table, some never seen), one ``HistoryDrafter.propose`` each, timed with
``time.perf_counter_ns``, γ = ``--gamma``: the lookup in the request and in the table plus the one-hot rows
(``--vocab`` wide, as the server builds them). Also the time of ``HistoryTable.record`` per token and the
table's memory per token (``tracemalloc``: what the table allocates, the token lists and the index).

    python benchmarks/history_cost.py                     # the default table: 262144 tokens
    python benchmarks/history_cost.py --budget 20000 --proposals 200 --out /tmp/history-cost   # quick

Results: ``--out``.md and .json with the command and the CPU's flags.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import re
import shlex
import sys
import sysconfig
import time
import tracemalloc

from servers import quantile, write_atomic

CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "amx_tile")
TOKEN = re.compile(r"\w+|[^\w\s]|\n")


def stdlib_texts(vocab: int) -> list[list[int]]:
    """Each standard-library module as token ids: words and punctuation marks, hashed (stably) below ``vocab``."""
    folder = pathlib.Path(sysconfig.get_paths()["stdlib"])
    ids: dict[str, int] = {}
    out = []
    for path in sorted(folder.glob("*.py")):
        words = TOKEN.findall(path.read_text(encoding="utf-8", errors="replace"))
        out.append([ids.setdefault(w, len(ids) % vocab) for w in words])
    return out


def measure(args) -> dict:
    import torch

    from specdec.drafters import HistoryDrafter, HistoryTable
    from specdec.sampling import SamplingParams

    texts = stdlib_texts(args.vocab)
    held_out, texts = texts[::10], [t for i, t in enumerate(texts) if i % 10]

    def fill(table) -> tuple[int, int]:
        """Record ``--doc-tokens`` chunks until the table is full and has evicted as much again."""
        spent, recorded = 0, 0
        for chunk in (t[i:i + args.doc_tokens] for t in texts for i in range(0, len(t), args.doc_tokens)):
            start = time.perf_counter_ns()
            table.record("", chunk)
            spent += time.perf_counter_ns() - start
            recorded += len(chunk)
            if recorded >= 2 * args.budget:
                break
        return spent, recorded

    tracemalloc.start()  # the memory pass: what the table allocates (tracing slows it: not timed)
    traced = HistoryTable(args.vocab, args.budget)
    fill(traced)
    memory, traced_tokens = tracemalloc.get_traced_memory()[0], traced.tokens
    tracemalloc.stop()
    del traced
    table = HistoryTable(args.vocab, args.budget)
    record_ns, recorded = fill(table)
    drafter, sampling, generator = HistoryDrafter(args.vocab, table.view()), SamplingParams(), torch.Generator()
    seen = [t for t in (doc for _, doc in table.texts()) if len(t) > 200]
    contexts = []
    for i in range(args.proposals):
        source = seen[i % len(seen)] if i % 2 == 0 else held_out[i % len(held_out)]
        end = 100 + (i * 7919) % max(len(source) - 100, 1)
        contexts.append(source[max(0, end - 400):end])
    times, matching, drafted = [], [], 0
    for context in contexts:
        drafter.begin(context[:-1])
        start = time.perf_counter_ns()
        draft = drafter.propose(context, args.gamma, sampling, generator)
        times.append((time.perf_counter_ns() - start) / 1000)
        counted = dict(drafter.sources)
        start = time.perf_counter_ns()
        drafter.lookup(args.gamma)  # the matching alone, without the one-hot rows
        matching.append((time.perf_counter_ns() - start) / 1000)
        drafter.sources = counted  # each proposal counted once
        drafted += bool(draft.tokens)
    return {"table_tokens": table.tokens, "documents": table.documents, "recorded_tokens": recorded,
            "record_us_per_token": record_ns / 1000 / max(recorded, 1),
            "bytes_per_token": memory / max(traced_tokens, 1),
            "proposals": len(times), "proposals_with_draft": drafted, "propose_us_p50": quantile(times, 0.5),
            "propose_us_p90": quantile(times, 0.9), "propose_us_p99": quantile(times, 0.99),
            "match_us_p50": quantile(matching, 0.5), "match_us_p90": quantile(matching, 0.9),
            "match_us_p99": quantile(matching, 0.99), "sources": dict(drafter.sources)}


def markdown(report: dict) -> str:
    r, m = report["result"], report["machine"]
    return "\n".join([
        f"# The history drafter's cost ({report['date']})", "",
        f"Command: `{report['command']}`", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, flags {' '.join(m['flags']) or 'none'}; Python {m['python']}.", "",
        "| table tokens | documents | bytes/token | record µs/token | proposals (with a draft) | match µs p50 / p90 "
        "/ p99 | propose µs p50 / p90 / p99 |", "|---|---|---|---|---|---|---|",
        f"| {r['table_tokens']} | {r['documents']} | {r['bytes_per_token']:.0f} | {r['record_us_per_token']:.2f} | "
        f"{r['proposals']} ({r['proposals_with_draft']}) | {r['match_us_p50']:.1f} / {r['match_us_p90']:.1f} / "
        f"{r['match_us_p99']:.1f} | {r['propose_us_p50']:.1f} / {r['propose_us_p90']:.1f} / "
        f"{r['propose_us_p99']:.1f} |", "",
        f"γ = {report['settings']['gamma']}. match: the look-up in the request and the table "
        "(``HistoryDrafter.lookup``); propose: the whole proposal, with the one-hot rows of q "
        f"({report['settings']['vocab']} wide, ``drafters.base.one_hot_rows``, as prompt lookup builds them). "
        "Drafts came from " + ", ".join(f"{k}: {v}" for k, v in r["sources"].items()) + ".", ""])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=int, default=262_144, metavar="N", help="the table's tokens (default: "
                   "%(default)s, the server's default)")
    p.add_argument("--doc-tokens", type=int, default=2000, metavar="N", help="tokens per recorded text (default: "
                   "%(default)s)")
    p.add_argument("--vocab", type=int, default=151_936, metavar="V", help="vocabulary size (default: %(default)s, "
                   "Qwen2.5's)")
    p.add_argument("--gamma", type=int, default=5, metavar="G", help="γ of each proposal (default: %(default)s)")
    p.add_argument("--proposals", type=int, default=2000, metavar="N", help="proposals timed (default: %(default)s)")
    p.add_argument("--out", default="benchmarks/results/history-cost", metavar="STEM",
                   help="writes STEM.md and STEM.json (default: %(default)s)")
    args = p.parse_args(argv)
    if min(args.budget, args.doc_tokens, args.vocab, args.gamma, args.proposals) < 1:
        p.error("every option must be >= 1")
    import platform

    from specdec import strict_json
    from specdec.machine import all_cpu_flags, describe_cpu

    flags = all_cpu_flags()
    report = {"command": shlex.join(["benchmarks/history_cost.py", *argv]),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": {"cpu": describe_cpu(), "flags": [f for f in CPU_FLAGS if f in flags],
                          "cores": os.cpu_count(), "python": platform.python_version()},
              "settings": vars(args), "result": measure(args)}
    write_atomic(args.out + ".json", strict_json.dumps(report, indent=2) + "\n")
    write_atomic(args.out + ".md", markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
