"""How much could multi-candidate (tree) verification add to a chain of drafts, on the default pair, greedy?

    python benchmarks/tree_headroom.py                 # bench prompts of code writing and editing, 96 tokens
    python benchmarks/tree_headroom.py --categories code-editing --tokens 128 --threads 2

At temperature 0 a round's outcome is fixed by the draft's rank of each token the target will produce (rank 1 =
the draft's argmax). So, per prompt: the target's greedy continuation (plain decoding), the draft's rank of each of
its tokens given the true prefix (one draft call over the continuation), and then every scheme is replayed exactly:

- chain γ: γ drafted tokens; accepted = the run of rank-1 positions (≤ γ), plus one target token; γ + 1 rows;
- tree w × γ: the draft's top w tokens at the first position, each followed by the draft's greedy chain
  (γ - 1 more): accepted when the first token's rank ≤ w, then as a chain; w·γ + 1 rows, γ + (w - 1)(γ - 1)
  draft calls. (When the first token is accepted through branch j, branch j's continuation is the draft's
  argmax after the true prefix, so the ranks above decide it too.)

Each round costs (draft calls × c + T(rows)) / T(1) plain-token times, with the target's cost curve T(k) and the
draft's c measured here; the predicted speed-up over plain decoding is tokens / cost. This bounds what a tree
can add before paying for tree attention masks and KV compaction (which it ignores).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.bench.suite import load_prompts
from specdec.decode import autoregressive_generate
from specdec.loading.defaults import default_paths
from specdec.loading.native_pair import load_native_models
from specdec.machine import describe_cpu
from specdec.sampling import SamplingParams


def ranks_of(draft, prompt: list[int], continuation: list[int]) -> list[int]:
    """The draft's rank (1 = argmax) of each continuation token given the true prefix."""
    draft.prefill(prompt[:-1])
    logits = draft.score([prompt[-1], *continuation[:-1]])  # [n, vocab]: row i predicts continuation[i]
    chosen = logits.gather(1, torch.tensor(continuation).unsqueeze(1))
    return [int(r) + 1 for r in (logits > chosen).sum(1)]


def replay(ranks: list[int], gamma: int, width: int) -> tuple[int, list[tuple[int, int]]]:
    """Rounds over the ranks: total tokens and, per round, (draft calls, rows verified)."""
    t, tokens, rounds = 0, 0, []
    while t < len(ranks):
        ok = 0
        if ranks[t] <= width:
            ok = 1
            while ok < gamma and t + ok < len(ranks) and ranks[t + ok] == 1:
                ok += 1
        step = ok + 1
        tokens += min(step, len(ranks) - t)
        t += step
        rounds.append((gamma + (width - 1) * (gamma - 1), width * gamma + 1))
    return tokens, rounds


def cost_curve(target, context: list[int], ks: range, repeats: int) -> dict[int, float]:
    """Median seconds of one target call scoring k tokens after ``context``."""
    out = {}
    for k in ks:
        times = []
        for _ in range(repeats):
            target.prefill(context)
            start = time.perf_counter()
            target.score(context[-k:])
            times.append(time.perf_counter() - start)
        out[k] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--categories", nargs="+", default=["code-writing", "code-editing"])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--draft-head", type=int, default=32768)
    args = parser.parse_args()
    target_path, draft_path = (str(p) for p in default_paths())
    target, draft, tokenizer, _ = load_native_models(target_path, draft_path, threads=args.threads,
                                                     draft_head=args.draft_head)
    print(f"CPU: {describe_cpu()}; {args.threads} threads\n")
    ranks, prompts = [], [p for p in load_prompts() if p.category in args.categories]
    for p in prompts:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False,
                                             add_generation_prompt=True)
        ids = tokenizer(chat, add_special_tokens=False)["input_ids"]
        gen = autoregressive_generate(target, list(ids), max_new_tokens=args.tokens, sampling=SamplingParams(0.0))
        ranks.append((p.id, ranks_of(draft, list(ids), list(gen.tokens))))
        context = list(ids) + list(gen.tokens)
    curve = cost_curve(target, context, range(1, 18), repeats=3)
    draft.prefill(context[:-1])
    start = time.perf_counter()
    for token in context[-20:]:
        draft.score([token])
    c = (time.perf_counter() - start) / 20 / curve[1]
    print("T(k)/T(1): " + ", ".join(f"{k}: {curve[k] / curve[1]:.2f}" for k in curve) + f"; c = {c:.3f}\n")
    print("| scheme | tokens per round | rows per round | predicted speed-up over plain |")
    print("|---|---|---|---|")
    for width, gammas in ((1, (1, 2, 3, 4, 5, 6)), (2, (2, 3, 4)), (3, (2, 3))):
        for gamma in gammas:
            tokens = cost = rounds_total = 0
            for _, r in ranks:
                n, rounds = replay(r, gamma, width)
                tokens += n
                rounds_total += len(rounds)
                cost += sum(calls * c + curve[min(rows, 17)] / curve[1] for calls, rows in rounds)
            name = f"chain γ = {gamma}" if width == 1 else f"tree {width} × {gamma}"
            print(f"| {name} | {tokens / rounds_total:.2f} | {width * gamma + 1} | {tokens / cost:.2f}× |")
    first = sum(x == 1 for _, r in ranks for x in r) / sum(len(r) for _, r in ranks)
    second = sum(x == 2 for _, r in ranks for x in r) / sum(len(r) for _, r in ranks)
    print(f"\nrank of the target's token in the draft: 1 for {first:.1%}, 2 for {second:.1%} of positions "
          f"({sum(len(r) for _, r in ranks)} positions, prompts {', '.join(i for i, _ in ranks)})")


if __name__ == "__main__":
    main()
