"""Profile where one speculative generation on the default pair spends its time (cProfile).

    python benchmarks/profile_round.py [--gamma 3] [--max-new-tokens 64]

Prints tokens/s of plain and speculative decoding, whether greedy outputs agree, the time per
round spent in our own loop (sampling transforms, the rule, bookkeeping), and the cProfile lines of
specdec's functions sorted by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch

from specdec import SamplingParams, autoregressive_generate, session, speculative_generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(2)
    pair = session.load()
    ids = pair.encode("Write a Python function that checks whether a number is prime.", chat=True)
    greedy = SamplingParams(temperature=0.0)
    plain = autoregressive_generate(pair.target, ids, max_new_tokens=args.max_new_tokens, sampling=greedy)
    profiler = cProfile.Profile()
    profiler.enable()
    spec = speculative_generate(pair.target, pair.draft, ids, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                                sampling=greedy)
    profiler.disable()
    s = spec.stats
    print(f"plain {plain.stats.tokens_per_second:.2f} tok/s, speculative {s.tokens_per_second:.2f} tok/s, "
          f"identical: {plain.tokens == spec.tokens}")
    print(f"per round: target {1000 * s.target_seconds / s.rounds:.1f} ms, "
          f"draft {1000 * s.draft_seconds / s.rounds:.1f} ms, "
          f"our loop {1000 * s.loop_seconds / s.rounds:.2f} ms ({s.rounds} rounds)")
    pstats.Stats(profiler).sort_stats("cumtime").print_stats("specdec", 25)


if __name__ == "__main__":
    main()
