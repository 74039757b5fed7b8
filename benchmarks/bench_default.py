"""Speed of speculative decoding on the default pair, against plain decoding and transformers.

Everything runs in one process on the same loaded models, prompts and settings, in interleaved
order after a warm-up, and is reported as ratios over plain decoding (our own plain loop; the
transformers `generate` plain loop is shown too). Next to each measured speed-up stands the
paper's prediction (Thm 3.8) from the α and c measured in that same run, and the prediction
with the measured target cost curve T(k) (the paper assumes T(k) = T(1)).

    python benchmarks/bench_default.py                 # writes benchmarks/results/default-pair.{md,json}
    python benchmarks/bench_default.py --gammas 2 3 --max-new-tokens 64 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

from specdec import ModelDrafter, SamplingParams, autoregressive_generate, session, speculative_generate, theory

PROMPTS = {
    "fib": "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "csv": "Write a Python function that reads a CSV file and returns the average of a numeric column.",
    "stack": "Implement a Stack class in Python with push, pop, peek and is_empty methods.",
}


def measure_cost_curve(model, ks=(1, 2, 3, 4, 5, 6, 8), context=64, repeats=3) -> dict[int, float]:
    """Seconds for one call scoring k tokens after a context, best of `repeats`."""
    out = {}
    for k in ks:
        best = float("inf")
        for _ in range(repeats):
            model.prefill(list(range(100, 100 + context)))
            t0 = time.perf_counter()
            model.score(list(range(300, 300 + k)))
            best = min(best, time.perf_counter() - t0)
        out[k] = best
    return out


def hf_generate(pair, ids, max_new_tokens, assistant=None, temperature=0.0):
    kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=temperature > 0)
    if temperature > 0:
        kwargs |= {"temperature": temperature, "top_k": 0, "top_p": 1.0}
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    input_ids = torch.tensor([ids], device=pair.target.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = pair.target.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    seconds = time.perf_counter() - t0
    return out.shape[1] - len(ids), seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--stop-below", type=float, nargs="*", default=[],
                    help="also run ours with these draft confidence thresholds at the largest γ")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); else sampled, seed 0")
    ap.add_argument("--quantize", default="auto")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' own generate")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "default-pair"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = session.LoadSettings(dtype=args.dtype, quantize=args.quantize).for_device()
    pair = session.load(loaded, log=lambda m: print(m, file=sys.stderr, flush=True))
    sampling = SamplingParams(temperature=args.temperature)
    curve_target = measure_cost_curve(pair.target)
    curve_draft = measure_cost_curve(pair.draft, ks=(1,))
    c = curve_draft[1] / curve_target[1]
    print("T(k)/T(1) target: " + ", ".join(f"{k}: {v / curve_target[1]:.2f}" for k, v in curve_target.items())
          + f"; T(1) = {curve_target[1] * 1000:.0f} ms; draft call {curve_draft[1] * 1000:.0f} ms → c = {c:.2f}",
          file=sys.stderr)

    top = max(args.gammas)
    modes = (["plain"] + [f"ours γ={g}" for g in args.gammas] + [f"ours γ={top} stop<{t}" for t in args.stop_below]
             + ([] if args.no_hf else ["hf plain", "hf assisted"]))
    rows: dict[tuple[str, str], list[dict]] = {}
    for rep in range(args.repeats):
        for name, text in PROMPTS.items():
            ids = pair.encode(text, chat=True)
            order = modes if rep % 2 == 0 else list(reversed(modes))
            for mode in order:
                rec = {"mode": mode, "prompt": name}
                if mode == "plain":
                    gen = autoregressive_generate(pair.target, ids, max_new_tokens=args.max_new_tokens,
                                                  sampling=sampling, seed=0)
                    rec |= {"tokens_per_second": gen.stats.tokens_per_second, "tokens": gen.tokens}
                elif mode.startswith("ours"):
                    gamma = int(mode.split("=")[1].split()[0])
                    stop = float(mode.split("<")[1]) if "stop<" in mode else None
                    gen = speculative_generate(pair.target, ModelDrafter(pair.draft, stop_below=stop), ids,
                                               max_new_tokens=args.max_new_tokens, gamma=gamma, sampling=sampling,
                                               seed=0)
                    s = gen.stats
                    rec |= {"tokens_per_second": s.tokens_per_second, "tokens": gen.tokens, "alpha": s.alpha,
                            "tokens_per_target_call": s.tokens_per_target_call, "gamma": gamma,
                            "acceptance_rate": s.acceptance_rate, "loop_seconds_per_round": s.loop_seconds / s.rounds}
                else:
                    n, secs = hf_generate(pair, ids, args.max_new_tokens,
                                          assistant=pair.draft.model if mode == "hf assisted" else None,
                                          temperature=args.temperature)
                    rec |= {"tokens_per_second": n / secs}
                rows.setdefault((name, mode), []).append(rec)
                print(f"{name:6s} {mode:14s} {rec['tokens_per_second']:.2f} tok/s", file=sys.stderr, flush=True)

    table, results = [], []
    for name in PROMPTS:
        base = statistics.median(r["tokens_per_second"] for r in rows[(name, "plain")])
        plain_tokens = rows[(name, "plain")][0]["tokens"]
        for mode in modes:
            recs = rows[(name, mode)]
            tps = [r["tokens_per_second"] for r in recs]
            med = statistics.median(tps)
            entry = {"prompt": name, "mode": mode, "tokens_per_second": med, "min": min(tps), "max": max(tps),
                     "speedup": med / base}
            if mode.startswith("ours"):
                r0 = recs[0]
                alpha, gamma = r0["alpha"], r0["gamma"]
                entry |= {"alpha": alpha, "tokens_per_target_call": r0["tokens_per_target_call"],
                          "identical_to_plain": r0["tokens"] == plain_tokens if args.temperature == 0 else None,
                          "predicted_thm38": theory.expected_speedup(min(alpha, 0.999), gamma, c),
                          "predicted_with_cost_curve": theory.expected_speedup_cost_curve(
                              min(alpha, 0.999), gamma, c, {k: v / curve_target[1] for k, v in curve_target.items()})
                          if gamma + 1 in curve_target else None,
                          "loop_ms_per_round": 1000 * r0["loop_seconds_per_round"]}
            results.append(entry)
            table.append(entry)

    lines = [
        f"Command: `python benchmarks/bench_default.py {' '.join(argv or sys.argv[1:])}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} threads, "
        f"dtype {loaded.dtype}, quantize {loaded.quantize}; "
        f"{'greedy' if args.temperature == 0 else f'temperature {args.temperature}, seed 0'}, "
        f"{args.max_new_tokens} new tokens, chat template.  ",
        "Measured target cost T(k)/T(1): "
        + ", ".join(f"k={k}: {v / curve_target[1]:.2f}" for k, v in curve_target.items())
        + f"; T(1) = {curve_target[1] * 1000:.0f} ms, draft call {curve_draft[1] * 1000:.0f} ms, c = {c:.2f}.",
        "",
        "| prompt | mode | tokens/s | speed-up vs plain | α | tokens/target call | Thm 3.8 predicts | with T(k) "
        "| same as plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in table:
        def fmt(k: str, spec: str = ".2f", e: dict = e) -> str:
            return format(e[k], spec) if e.get(k) is not None else "—"

        same = {True: "yes", False: "NO"}.get(e.get("identical_to_plain"), "—")
        lines.append(f"| {e['prompt']} | {e['mode']} | {e['tokens_per_second']:.2f} | {e['speedup']:.2f}× "
                     f"| {fmt('alpha')} | {fmt('tokens_per_target_call')} | {fmt('predicted_thm38')} "
                     f"| {fmt('predicted_with_cost_curve')} | {same} |")
    md = "\n".join(lines) + "\n"
    print(md)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".md", "w") as f:
        f.write(md)
    with open(args.out + ".json", "w") as f:
        json.dump({"cost_curve_target_s": curve_target, "draft_call_s": curve_draft[1], "c": c, "results": results,
                   "threads": args.threads, "torch": torch.__version__}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
