"""A draft that reads only the last W tokens of a long prompt: α and time to first token against W.

The target always reads the whole prompt (its output is the product); the draft (``ModelDrafter(window=W)``)
reads at most W, so a cold long prompt costs the draft's reading of W tokens instead of all of them, and
the draft's guesses see less context. Both sides of each row run in this one process: the same prompt,
greedy, the target's reading of the prompt timed once (it is the same for every W, and taken from the
prefix cache after the first), the draft's reading timed per W, and a 64-token speculative generation
per W for α and tokens per target call.

    python benchmarks/draft_window.py          # ~3,000-token file + a question; W = all, 2048, 1024, 512, 256
    python benchmarks/draft_window.py --context-tokens 6000 --windows 0 4096 1024

Writes benchmarks/results/draft-window.md (and prints it).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import sysconfig
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
QUESTION = "\n\nExplain what the last function above does, then suggest one improvement."


def long_prompt(tokenizer, tokens: int) -> str:
    """The start of Python's own argparse.py, cut to about ``tokens`` tokens of the target's tokenizer."""
    text = pathlib.Path(sysconfig.get_paths()["stdlib"], "argparse.py").read_text()
    ids = tokenizer(text)["input_ids"][:tokens]
    return tokenizer.decode(ids)


def cpu_flags() -> str:
    out = subprocess.run("grep -o -w -E 'avx2|avx512f|avx512_vnni|amx_tile' /proc/cpuinfo | sort -u", shell=True,
                         capture_output=True, text=True).stdout.split()
    return " ".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context-tokens", type=int, default=3000)
    p.add_argument("--windows", type=int, nargs="+", default=[0, 2048, 1024, 512, 256], help="0 = the whole prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/draft-window.md"))
    args = p.parse_args(argv)

    sys.path.insert(0, str(ROOT / "src"))
    from specdec import ModelDrafter, SamplingParams, speculative_generate
    from specdec.gamma import AdaptiveGamma
    from specdec.loading.settings import LoadSettings
    from specdec.models.prefix import PrefixCache
    from specdec.session import load

    torch.set_num_threads(args.threads)
    pair = load(LoadSettings(threads=args.threads, cache_gb=0))
    ids = pair.encode(long_prompt(pair.tokenizer, args.context_tokens) + QUESTION, chat=True)
    target, draft = pair.target, pair.draft
    target.prefix_cache = PrefixCache.of_gb(2.0)  # the target reads the prompt once, then reuses it
    t0 = time.perf_counter()
    target.prefill(ids[:-1])
    target_read = time.perf_counter() - t0
    rows = []
    for w in args.windows:
        window = w or None
        drafter = ModelDrafter(draft, window=window)
        t0 = time.perf_counter()
        drafter.begin(ids)
        draft_read = time.perf_counter() - t0
        gen = speculative_generate(target, drafter, ids, max_new_tokens=args.max_new_tokens, gamma=AdaptiveGamma(),
                                   sampling=SamplingParams(temperature=0), eos_token_id=pair.eos_token_ids)
        s = gen.stats
        first_round = s.records[0] if s.records else None
        rows.append((w, len(ids) - 1 - drafter.offset, draft_read, s.alpha, s.tokens_per_target_call,
                     len(first_round.drafted) if first_round else 0))
        print(f"W={w or 'all'}: draft read {draft_read:.2f} s, alpha {s.alpha}", file=sys.stderr, flush=True)
    lines = [
        "# Draft window: α and time to first token against W",
        "",
        f"`python benchmarks/draft_window.py {' '.join(argv if argv is not None else sys.argv[1:])}` — "
        f"CPU flags: {cpu_flags()}; {args.threads} threads; prompt {len(ids)} tokens (argparse.py + a question, "
        f"chat template), greedy, {args.max_new_tokens} new tokens, γ auto.",
        "",
        f"Target reads the whole prompt: **{target_read:.2f} s** (every row). Time to first token ≈ target read + "
        "draft read + one round.",
        "",
        "| W | draft reads | draft read s | TTFT ≈ s | α | tokens / target call |",
        "|---|---|---|---|---|---|",
    ]
    for w, read, seconds, alpha, per_call, _ in rows:
        alpha_text = "n/a" if alpha is None else f"{alpha:.3f}"
        lines.append(f"| {w or 'all'} | {read} | {seconds:.2f} | {target_read + seconds:.2f} | {alpha_text} | "
                     f"{per_call:.2f} |")
    text = "\n".join(lines) + "\n"
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
