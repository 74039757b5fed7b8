"""``specdec bench``: plain vs ours vs transformers (and llama.cpp) on a prompt set, in one process.

Argument parsing and printing only; the plan, the runs and the figures live in ``specdec.bench``,
the modes in ``specdec.bench.modes``, the files in ``specdec.bench.report``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import replace

from ..loading.settings import RUNNING_BACKENDS, check_threads
from . import options

DEFAULT_MODES = ("hf-plain", "hf-assisted", "hf-lookup", "model:3", "model:auto", "lookup:auto", "lookup+model:auto",
                 "llamacpp-own-plain")
DEFAULT_SAMPLING_MODES = ("hf-assisted", "model:3", "model:auto", "lookup+model:auto")
DEFAULT_PROMPTS_PER_CATEGORY = 2  # of the packaged 3: keeps the default run near 30 minutes on 2 cores
QUICK_MODES = ("hf-assisted", "hf-lookup", "model:3", "lookup:auto")

DESCRIPTION = """\
Benchmark decoding modes on the packaged prompt set (code writing, code editing that repeats
much of the prompt, explanation), all in one process over the same loaded models: a warm-up,
then every prompt with every mode, the mode order rotated from prompt to prompt, repeated.
Reports per prompt category and mode: tokens/s (median, min–max), speed-up over plain decoding
(ratio of medians in the same run), α, tokens per target call, mean γ, and for greedy decoding
whether the output equals plain decoding token for token. Writes STEM.md, STEM.json (every run,
the machine, the command) and STEM.png (speed-ups per category) into --out.

Modes: plain (our plain decoding, always included); hf-plain, hf-assisted, hf-lookup[:N]
(transformers' generate on the same int8 modules: plain, with assistant_model at its defaults,
with prompt_lookup_num_tokens=N, default 10); llamacpp-own-plain (llama-cpp-python's own
generation loop); llamacpp-cli-plain, llamacpp-cli-spec[:N], llamacpp-cli-lookup[:N] (llama.cpp's
own tools llama-completion, llama-speculative with the draft, llama-lookup; N drafted tokens at
most, default 3; one process per run, timed by the tools; build them with
bash benchmarks/build_llama_cpp_tools.sh); DRAFTER:GAMMA for ours, DRAFTER a drafter as for
generate's --draft (model = the --draft-model, lookup, lookup+model, ngram:FILE, ...) and GAMMA an
integer, auto or heuristic."""

EPILOG = """\
examples:
  specdec bench --dry-run
  specdec bench --quick
  specdec bench --modes model:2 model:3 model:4 model:auto model:heuristic --temperatures 0
  specdec bench --backends transformers llamacpp --modes model:3 lookup:auto llamacpp-own-plain"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmark plain, speculative and transformers decoding on a prompt set",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_argument_group("what to run")
    what.add_argument("--modes", nargs="+", default=None, metavar="MODE",
                      help="modes at temperature 0; refused when --temperatures has no 0 "
                      f"(default: {' '.join(DEFAULT_MODES)})")
    what.add_argument("--sampling-modes", nargs="+", default=None, metavar="MODE",
                      help="modes at temperatures > 0; refused when --temperatures has none "
                      f"(default: {' '.join(DEFAULT_SAMPLING_MODES)})")
    what.add_argument("--temperatures", nargs="+", type=float, default=None, metavar="T",
                      help="sampling temperatures, 0 = greedy (default: 0 1)")
    what.add_argument("--backends", nargs="+", default=None, choices=RUNNING_BACKENDS,
                      help="backends for our models; each mode runs on every backend it supports (llama.cpp's tools, "
                      "llamacpp-cli-*, on native or llamacpp), llamacpp is skipped with a note when llama-cpp-python "
                      "is not installed (default: native transformers)")
    what.add_argument("--max-new-tokens", type=int, default=None, metavar="N", help="tokens per run (default: 64)")
    what.add_argument("--repeats", type=int, default=None, metavar="R",
                      help="runs of each prompt and mode (default: 1)")
    what.add_argument("--categories", nargs="+", default=None, metavar="C",
                      help="prompt categories (default: all: code-writing code-editing explanation)")
    what.add_argument("--prompts-per-category", type=int, default=None, metavar="K",
                      help=f"the first K prompts of each category (default: {DEFAULT_PROMPTS_PER_CATEGORY}; "
                      "the packaged set has 3 per category)")
    what.add_argument("--prompts", default=None, metavar="FILE.json",
                      help="a prompt set of the packaged file's shape (default: specdec/data/bench_prompts.json)")
    what.add_argument("--seed", type=int, default=0, help="seed of repeat 0 (repeat r uses seed + r) (default: 0)")
    what.add_argument("--quick", action="store_true",
                      help="a small smoke run: 1 prompt per category, 16 tokens, greedy only, modes "
                      f"plain {' '.join(QUICK_MODES)}; writes STEM bench-quick (explicit options still apply)")
    models = p.add_argument_group("models")
    options.add_model_options(models, include=("target", "draft_model", "threads", "draft_head", "kernels",
                                               "dequantize"))
    out = p.add_argument_group("output")
    out.add_argument("--out", default="benchmarks/results", metavar="DIR", help="output folder (default: %(default)s)")
    out.add_argument("--name", default=None, metavar="STEM", help="file names STEM.md/.json/.png (default: bench)")
    out.add_argument("--dry-run", action="store_true", help="print the plan and a time estimate, run nothing")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def settings_from(args: argparse.Namespace):
    from ..bench.suite import BenchSettings

    quick = args.quick
    return BenchSettings(
        modes=tuple(args.modes or (QUICK_MODES if quick else DEFAULT_MODES)),
        sampling_modes=tuple(args.sampling_modes or (QUICK_MODES if quick else DEFAULT_SAMPLING_MODES)),
        temperatures=tuple(args.temperatures or ((0.0,) if quick else (0.0, 1.0))),
        backends=tuple(args.backends or ("native", "transformers")),
        max_new_tokens=args.max_new_tokens or (16 if quick else 64),
        repeats=args.repeats or 1,
        warmup_tokens=4 if quick else 8,
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    from ..bench import suite as bench
    from ..bench.modes import parse_mode

    settings = settings_from(args)
    settings.validate()
    check_modes_apply(args, settings.temperatures)
    for name in (args.modes or []) + (args.sampling_modes or []):
        spec = parse_mode(name)
        if not set(spec.backends) & set(settings.backends):
            raise ValueError(f"mode {name!r} runs on the {' or '.join(spec.backends)} backend, which --backends "
                             f"({' '.join(settings.backends)}) leaves out")
    check_threads(args.threads)
    options.check_model_options(args, backends=settings.backends)  # bad --target / --draft-model: one line, now
    per_category = args.prompts_per_category or (1 if args.quick else DEFAULT_PROMPTS_PER_CATEGORY)
    prompts = bench.select_prompts(bench.load_prompts(args.prompts), args.categories, per_category)
    backends, notes = bench.usable_backends(settings.backends)
    if not backends:
        raise ValueError("no backend can run here: " + "; ".join(notes))
    settings = replace(settings, backends=tuple(backends))
    plan = bench.plan_runs(settings, prompts)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    for note in notes:
        log(note)
    print(describe_plan(settings, prompts, plan), file=sys.stderr if not args.dry_run else sys.stdout)
    if args.dry_run:
        return 0

    from ..bench import report as bench_report

    check_writable(args.out)
    draft = options.drafter_value(argparse.Namespace(draft="model", draft_model=args.draft_model))
    pairs = bench.load_pairs(settings, args.target, draft, threads=args.threads, log=log, draft_head=args.draft_head,
                             kernels=args.kernels, dequantize=args.dequantize)
    log(f"warming up every mode once ({settings.warmup_tokens} tokens), then {len(plan)} runs ...")
    progress = _progress(len(plan), disabled=args.no_progress)
    command = shlex.join(["specdec", "bench", *_argv_after_bench()])
    result = bench.run_bench(settings, prompts, pairs, command=command, notes=notes, on_run=progress)
    progress.close()
    paths = bench_report.write_outputs(result, args.out, args.name or ("bench-quick" if args.quick else "bench"))
    print(bench_report.markdown(result))
    log("written: " + ", ".join(paths))
    return 0


def check_modes_apply(args: argparse.Namespace, temperatures) -> None:
    """--modes runs at temperature 0 and --sampling-modes at the others: naming modes for temperatures
    the run does not have would silently run other modes instead, so it is refused."""
    shown = " ".join(f"{t:g}" for t in temperatures)
    if args.modes and 0 not in temperatures:
        raise ValueError(f"--modes names the modes run at temperature 0, and --temperatures {shown} has no 0: "
                         "use --sampling-modes for temperatures > 0 (or add 0 to --temperatures)")
    if args.sampling_modes and not any(t > 0 for t in temperatures):
        raise ValueError(f"--sampling-modes names the modes run at temperatures > 0, and --temperatures {shown} has "
                         "none: use --modes for temperature 0 (or add a temperature > 0)")


def check_writable(folder: str) -> None:
    """Fail before the models load, not after the runs, when the results cannot be written."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise ValueError(f"cannot create the output folder {folder!r}: {err.strerror or err}") from err
    if not os.access(folder, os.W_OK):
        raise ValueError(f"cannot write into the output folder {folder!r}: permission denied")


def describe_plan(settings, prompts, plan) -> str:
    from ..bench import suite as bench

    lines = [f"plan: {len(prompts)} prompts ({', '.join(p.id for p in prompts)}), {settings.repeats} repeat(s), "
             f"{settings.max_new_tokens} new tokens, backends {', '.join(settings.backends)}"]
    for t in settings.temperatures:
        keys = bench.mode_keys(settings, t)
        runs = sum(1 for r in plan if r.temperature == t)
        names = ", ".join(m if len(settings.backends) == 1 else f"{m} [{b}]" for m, b in keys)
        lines.append(f"  temperature {t:g}: {len(keys)} modes × {len(prompts)} prompts × {settings.repeats} = "
                     f"{runs} runs: {names}")
    minutes = bench.estimate_seconds(settings, prompts) / 60
    rates = ", ".join(f"{b} ~{bench.ESTIMATE_TOKENS_PER_SECOND[b]:g} tokens/s" for b in settings.backends)
    lines.append(f"  {len(plan)} runs in all; estimated {minutes:.0f} min with model loading and warm-up "
                 f"(assuming every mode at about plain speed: {rates}, as on the project's 2-core machine)")
    return "\n".join(lines)


def _argv_after_bench() -> list[str]:
    """This command's own arguments, as typed (empty when called without a command line, e.g. in tests)."""
    argv = sys.argv[1:]
    return argv[argv.index("bench") + 1:] if "bench" in argv else []


def _progress(total: int, disabled: bool):
    from tqdm import tqdm

    bar = tqdm(total=total, unit="run", file=sys.stderr, disable=disabled, dynamic_ncols=True)

    class Progress:
        def __call__(self, planned, record) -> None:
            bar.set_postfix_str(f"{planned.prompt.id} {planned.mode} [{planned.backend}] T={planned.temperature:g}: "
                                f"{record.tokens_per_second:.2f} tok/s", refresh=False)
            bar.update(1)

        def close(self) -> None:
            bar.close()

    return Progress()
