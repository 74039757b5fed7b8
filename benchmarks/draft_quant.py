"""The draft as its file stores it against the draft re-quantized once to Q4_0 (``--draft-quant``), pair by pair.

    python benchmarks/draft_quant.py [--prompts 6] [--reps 1] [--out benchmarks/results/draft-quant]

For each prompt of ``specdec bench``'s set (``--categories``; writing and explanation by default), the main job
(``specdec generate PROMPT --compare --max-new-tokens 128 --json``, greedy, the default pair) runs once with
``--draft-quant none`` and once with ``--draft-quant q4_0``, one after the other, so each pair shares the machine's
hour. Reported per run: the speed-up over plain decoding in the same run, α, the draft's cost c and tokens/s; then
the means and the tokens/s ratio of each pair (q4_0 / none). Both give plain decoding's output (greedy): checked.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import subprocess
import sys

from specdec.machine import cpu_flags

HERE = pathlib.Path(__file__).resolve().parent
PROMPTS = HERE.parent / "src" / "specdec" / "data" / "bench_prompts.json"
QUANTS = ("none", "q4_0")


def run(prompt: str, quant: str, tokens: int) -> dict:
    cmd = [sys.executable, "-m", "specdec", "generate", prompt, "--compare", "--max-new-tokens", str(tokens),
           "--json", "--temperature", "0", "--draft-quant", quant]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    j = json.loads(done.stdout)
    if j.get("identical_to_baseline") is False:
        raise SystemExit(f"--draft-quant {quant}: greedy speculative output differs from plain decoding's")
    return {k: j[k] for k in ("speedup", "alpha", "cost_ratio_c", "tokens_per_second", "drafter",
                              "identical_to_baseline", "text")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=6, help="how many prompts (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=1, help="passes over the prompts (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per run (default: %(default)s)")
    ap.add_argument("--categories", nargs="+", default=["code-writing", "explanation"],
                    help="prompt categories of the bench set (default: %(default)s)")
    ap.add_argument("--out", default=None, help="write OUT.md and OUT.json (default: print only)")
    args = ap.parse_args()
    prompts = [p for p in json.loads(PROMPTS.read_text())["prompts"] if p["category"] in args.categories]
    prompts = prompts[: args.prompts]
    rows = []
    for rep in range(args.reps):
        for p in prompts:
            pair = {q: run(p["text"], q, args.tokens) for q in QUANTS}
            if pair["none"]["text"] != pair["q4_0"]["text"]:  # greedy: both are the target's own output
                raise SystemExit(f"{p['id']}: the two drafts gave different greedy outputs")
            rows.append({"prompt": p["id"], "rep": rep, **pair})
            print(p["id"], " ".join(f"{q}: {pair[q]['tokens_per_second']:.1f} tok/s c={pair[q]['cost_ratio_c']:.3f} "
                                    f"α={pair[q]['alpha']:.3f}" for q in QUANTS), flush=True)
    mean = {q: {k: statistics.mean(r[q][k] for r in rows) for k in ("speedup", "alpha", "cost_ratio_c",
                                                                     "tokens_per_second")} for q in QUANTS}
    ratios = [r["q4_0"]["tokens_per_second"] / r["none"]["tokens_per_second"] for r in rows]
    flags = " ".join(f for f in cpu_flags() if f in ("avx2", "avx512f", "avx512_vnni", "amx_tile"))
    command = "python benchmarks/draft_quant.py " + " ".join(sys.argv[1:])
    lines = ["# The draft as stored vs re-quantized once to Q4_0 (`--draft-quant`)", "",
             f"`{command.strip()}`, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, CPU flags "
             f"{flags}. The main job (greedy, {args.tokens} tokens, the default pair), each prompt with both "
             "settings one after the other; both outputs identical to plain decoding's and to each other "
             "(checked).", "",
             "| prompt | none tok/s | q4_0 tok/s | q4_0 / none | none speed-up | q4_0 speed-up | none α | q4_0 α "
             "| none c | q4_0 c |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r, ratio in zip(rows, ratios, strict=True):
        a, b = r["none"], r["q4_0"]
        lines.append(f"| {r['prompt']} | {a['tokens_per_second']:.1f} | {b['tokens_per_second']:.1f} | {ratio:.3f} | "
                     f"{a['speedup']:.3f} | {b['speedup']:.3f} | {a['alpha']:.3f} | {b['alpha']:.3f} | "
                     f"{a['cost_ratio_c']:.3f} | {b['cost_ratio_c']:.3f} |")
    lines += ["", f"Means: none {mean['none']['tokens_per_second']:.1f} tok/s (speed-up "
              f"{mean['none']['speedup']:.3f}, α {mean['none']['alpha']:.3f}, c {mean['none']['cost_ratio_c']:.3f}); "
              f"q4_0 {mean['q4_0']['tokens_per_second']:.1f} tok/s (speed-up {mean['q4_0']['speedup']:.3f}, "
              f"α {mean['q4_0']['alpha']:.3f}, c {mean['q4_0']['cost_ratio_c']:.3f}). Pairs q4_0 / none: mean "
              f"{statistics.mean(ratios):.3f}, {sum(x > 1 for x in ratios)} of {len(ratios)} above 1."]
    print("\n".join(lines))
    if args.out:
        pathlib.Path(args.out + ".md").write_text("\n".join(lines) + "\n")
        pathlib.Path(args.out + ".json").write_text(json.dumps({"command": command, "rows": rows, "mean": mean,
                                                                "ratios": ratios}, indent=1) + "\n")


if __name__ == "__main__":
    main()
