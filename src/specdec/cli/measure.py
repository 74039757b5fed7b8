"""``specdec measure``: α, c and T(k) on this machine, Thm 3.8 against the measured speed-up.

Argument parsing and printing only; the measuring lives in :mod:`specdec.analysis.measure`.
"""

from __future__ import annotations

import argparse
import sys

from .. import strict_json
from . import options

DESCRIPTION = """\
Measure, for a target and its drafts on this machine, what the paper's analysis needs and how
well it predicts the speed-up:
  α: the target generates text alone (each --temperature); at every position
     β = Σ min(p, q), with p the target's and q the draft's distribution there; α = mean β
     (the paper's §4.2 and Table 3, here for every draft of --drafts);
  c: one draft call / one target call after the same context, and the target's cost of
     scoring k tokens in one call, T(k)/T(1), k = 1..16 (Thm 3.8 assumes T(k) = T(1));
  speed-up: Thm 3.8 per γ, as in the paper and with the measured T(k), next to the speed-up
     measured here (speculative vs plain decoding, same prompts and seeds) for each of
     --gammas, and the γ the measured costs recommend.
The speed-ups use the first draft of --drafts. Without --target/--draft-model the default pair
(Qwen2.5-Coder 1.5B / 0.5B) is loaded; --toy uses the 8-word toy pair instead (no download).
Timings are indicative on a busy machine."""

EPILOG = """\
examples:
  specdec measure --toy --json
  specdec measure --prompts prompts.txt --max-new-tokens 48 --gammas 1 2 3 auto --plot measure.png
  specdec fit-draft --corpus stdlib --order 1 --out uni.ngram
  specdec fit-draft --corpus stdlib --order 2 --out bi.ngram
  specdec measure --drafts model unigram:uni.ngram bigram:bi.ngram --gammas   (α table only)"""

DEFAULT_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Write a Python function that reads a CSV file and returns the average of a numeric column.",
    "Implement a Stack class in Python with push, pop, peek and is_empty methods.",
    "Explain in three sentences what a hash table is.",
)
TOY_PROMPTS = ("the", "the dog", "the cat sat on")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "measure",
        help="measure α, c and the target's cost curve here; Thm 3.8 against the measured speed-up",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    models = p.add_argument_group("models")
    options.add_model_options(models, include=("target", "draft_model", "device", "dtype", "quantize", "threads",
                                               "draft_head", "backend", "kernels", "dequantize"))
    models.add_argument("--toy", action="store_true",
                        help="measure the toy pair (8-word bigram models) instead of real models (default: off)")
    what = p.add_argument_group("what to measure")
    what.add_argument("--drafts", nargs="+", default=["model"], metavar="DRAFTER",
                      help="drafts whose α to measure, each a drafter that is a language model: "
                      f"{drafts_help()}; the first one is used for the speed-ups (default: model)")
    what.add_argument("--prompts", default=None, metavar="FILE",
                      help="prompts, one per line (blank lines skipped) (default: 4 built-in coding prompts; "
                      "with --toy 3 toy sentences)")
    options.add_sampling_options(what, several_temperatures=True, filters=False,
                                 seed_help="seed of prompt i is SEED + i")
    what.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                      help="tokens the target generates per prompt, >= 2 (default: %(default)s)")
    what.add_argument("--gammas", nargs="*", default=["1", "2", "3", "4", "5", "auto"], metavar="γ",
                      help="γ values whose speed-up to measure: integers >= 1, auto, heuristic; none at all "
                      "skips the speed runs, the slow part on a CPU (default: 1 2 3 4 5 auto)")
    what.add_argument("--max-gamma", type=int, default=12, metavar="N",
                      help="predict γ = 1..N, N in [1, 63] (default: %(default)s)")
    what.add_argument("--repeats", type=int, default=5, metavar="R",
                      help="timings per call size; the median is kept (default: %(default)s)")
    what.add_argument("--no-chat", dest="chat", action="store_false", default=True,
                      help="use the prompts as they are, without the chat template "
                           "(default: template when there is one)")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print every figure as one JSON object (default: a table)")
    out.add_argument("--plot", default=None, metavar="FILE.png",
                     help="draw predicted and measured speed-up against γ into FILE.png (needs --gammas) "
                     "(default: no figure)")
    p.set_defaults(run=run)


def drafts_help() -> str:
    from ..analysis.measure import MEASURABLE_FORMS
    from ..choices import drafter_forms_help

    return drafter_forms_help(MEASURABLE_FORMS)


def read_prompts(path: str | None, toy: bool) -> list[str]:
    if path is None:
        return list(TOY_PROMPTS if toy else DEFAULT_PROMPTS)
    try:
        with open(path, encoding="utf-8") as f:
            prompts = [line.strip() for line in f if line.strip()]
    except OSError as err:
        raise ValueError(f"cannot read the prompts file {path!r}: {err.strerror or err}") from None
    if not prompts:
        raise ValueError(f"the prompts file {path!r} has no prompts: write one prompt per line")
    return prompts


def settings_from(args: argparse.Namespace):
    from ..analysis.measure import MeasureSettings
    from ..choices import parse_gamma

    settings = MeasureSettings(
        temperatures=tuple(args.temperature), max_new_tokens=args.max_new_tokens,
        gammas=tuple(parse_gamma(g) for g in args.gammas), max_gamma=args.max_gamma, repeats=args.repeats,
        seed=args.seed,
    )
    settings.validate()
    if args.plot and not settings.gammas:
        raise ValueError("--plot draws measured speed-ups: give at least one value to --gammas")
    return settings


def run(args: argparse.Namespace) -> int:
    from ..analysis import measure

    settings = settings_from(args)
    parsed = measure.parse_drafts(args.drafts)  # bad forms fail before any model is loaded
    if not args.toy:
        options.check_model_options(args)
    texts = read_prompts(args.prompts, args.toy)
    log = (lambda msg: None) if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.toy:
        from ..models.toy import ToyPair

        pair, chat = ToyPair(), False
    else:
        from .. import session

        session.set_threads(args.threads)
        with_draft = any(spec.needs_draft_model for spec in parsed)
        draft = options.drafter_value(argparse.Namespace(draft="model", draft_model=args.draft_model))
        pair = session.load(options.load_settings(args, draft, with_draft=with_draft, cache_gb=0),  # prompts read whole
                            log=log)
        chat = args.chat and pair.has_chat_template
    drafts = measure.load_drafts(args.drafts, pair.draft, pair.target.vocab_size)
    prompts = [pair.encode(t, chat=chat) for t in texts]
    result = measure.measure(pair.target, drafts, prompts, settings, eos_token_ids=pair.eos_token_ids, log=log)
    if args.plot:
        from ..analysis import plots

        try:
            plots.plot_measure(result, args.plot)
        except OSError as err:
            raise ValueError(f"cannot write the plot to {args.plot!r}: {err.strerror or err}") from err
    if args.json:
        print(strict_json.dumps(result.as_json() | {"plot": args.plot}, indent=2))
    else:
        print(report(result))
        if args.plot:
            print(f"figure written to {args.plot}")
    return 0


def report(m) -> str:
    """The measurement as readable tables."""
    temps = sorted({r.temperature for r in m.alphas})
    drafts = list(dict.fromkeys(r.draft for r in m.alphas))
    width = max(12, *(len(d) for d in drafts))
    lines = [f"α = mean β over the target's own text ({m.prompts} prompts × up to {m.max_new_tokens} tokens):",
             f"  {'draft':<{width}}" + "".join(f"  {'temp ' + format(t, 'g'):>9}" for t in temps)]
    for d in drafts:
        cells = "".join(f"  {m.alpha(d, t):>9.3f}" for t in temps)
        lines.append(f"  {d:<{width}}{cells}")
    ratios = m.target_cost_ratios
    lines += ["", f"call costs after a context of {m.context_tokens} tokens (median of the timings):",
              f"  target T(1) = {_duration(m.target_seconds[1])}; T(k)/T(1) for k = 1..{max(ratios)}:",
              "    " + " ".join(f"{k}:{r:.2f}" for k, r in ratios.items())]
    for cost in m.draft_costs:
        lines.append(f"  draft {cost.draft}: {_duration(cost.seconds)} per call → c = {cost.c:.3f}")
    for t in m.speed:
        lines += ["", f"speed-up at temperature {t.temperature:g} with draft {t.draft} "
                      f"(α = {t.alpha:.3f}, c = {t.c:.3f}):",
                  f"  {'γ':>4}  {'Thm 3.8':>8}  {'with T(k)':>9}  {'measured':>8}"]
        for r in t.rows:
            mark = "*" if r.gamma == t.recommended_gamma else " "
            measured = "" if r.measured is None else f"{r.measured:.2f}×"
            lines.append(f"{mark} {r.gamma:>4}  {r.predicted:>7.2f}×  {r.predicted_cost_curve:>8.2f}×  {measured:>8}")
        for run in t.runs:
            if not run.gamma.isdigit():
                mean = "n/a" if run.mean_gamma is None else f"{run.mean_gamma:.2f}"
                lines.append(f"  {run.gamma:>9}: measured {run.speedup:.2f}× (mean γ drafted {mean})")
        if t.plain_tokens_per_second is not None:
            lines.append(f"  plain decoding: {t.plain_tokens_per_second:.2f} tokens/s, "
                         f"target call {_duration(t.plain_call_seconds)} inside the loop")
        draft_calls = [r.draft_call_seconds for r in t.runs if r.draft_call_seconds is not None]
        if draft_calls and t.plain_call_seconds:
            inside = sum(draft_calls) / len(draft_calls)
            lines.append(f"  draft call inside the loop {_duration(inside)} → c = {inside / t.plain_call_seconds:.3f} "
                         f"there (sampling the draft's q included)")
        lines.append(f"  recommended γ = {t.recommended_gamma} (largest Thm 3.8 with the measured T(k))")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms" if seconds >= 1e-3 else f"{1e6 * seconds:.1f} µs"
