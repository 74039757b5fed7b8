"""The options several sub-commands share, defined once: models, drafter, γ, sampling.

Each ``add_*`` function adds its options to a parser (or an argument group) and returns it;
``check_model_options`` checks the values that name things (models, device, drafter) before any
weights load, so a bad one is one line and exit status 2 (``specdec.cli.main``).
"""

from __future__ import annotations

import argparse
import os
import sys

from ..drafters.model import DEFAULT_DRAFT_WINDOW, MIN_DRAFT_WINDOW
from ..loading.settings import BACKENDS, DEFAULT_DRAFT_HEAD, DEFAULT_DRAFT_QUANT, DRAFT_QUANTS, DTYPES, ISAS, QUANTIZE

MODEL_OPTIONS = ("target", "draft_model", "device", "dtype", "quantize", "backend", "threads", "draft_head",
                 "kernels", "dequantize", "draft_quant")

TARGET_HELP = ("target model: a GGUF file, a transformers model directory (with config.json), a directory holding "
               "one GGUF file, or a model id already in the local cache; nothing is downloaded "
               "(default: Qwen2.5-Coder-1.5B-Instruct Q4_K_M from specdec[default-models])")
DRAFT_MODEL_HELP = ("the draft model that the 'model' drafter runs, same forms as --target, sharing its tokenizer "
                    "(default: Qwen2.5-Coder-0.5B-Instruct Q4_K_M from specdec[default-models])")


def add_model_options(parser, *, include=MODEL_OPTIONS, backend_default: str = "auto",
                      dtype_default: str = "auto"):
    """--target, --draft-model, --device, --dtype, --quantize, --backend, --threads, --draft-head, --kernels,
    --dequantize, --draft-quant (those in ``include``)."""
    unknown = set(include) - set(MODEL_OPTIONS)
    if unknown:
        raise ValueError(f"unknown model options {sorted(unknown)}: choose from {', '.join(MODEL_OPTIONS)}")
    if "target" in include:
        parser.add_argument("--target", default=None, metavar="MODEL", help=TARGET_HELP)
    if "draft_model" in include:
        parser.add_argument("--draft-model", default=None, metavar="MODEL", help=DRAFT_MODEL_HELP)
    if "device" in include:
        parser.add_argument("--device", default="cpu",
                            help="where torch runs the models: cpu, cuda or cuda:N (cuda only when torch sees a GPU) "
                            "(default: %(default)s)")
    if "dtype" in include:
        parser.add_argument("--dtype", default=dtype_default, choices=DTYPES,
                            help="weights' dtype; auto = float32 on cpu, bfloat16 on cuda (default: %(default)s)")
    if "quantize" in include:
        parser.add_argument("--quantize", default="auto", choices=QUANTIZE,
                            help="int8 weights on the CPU (fbgemm; the target's rows stay independent so the rule "
                            "stays exact); auto = int8 on cpu, none on cuda (default: %(default)s)")
    if "backend" in include:
        parser.add_argument("--backend", default=backend_default, choices=BACKENDS,
                            help="what runs the models: native = specdec's own CPU kernels straight over the GGUF "
                            "files' 4-8-bit blocks (compiled here once; verifying k tokens costs little more than one, "
                            "and a token's logits are the same alone or in a block); transformers = torch (CUDA too; "
                            "--dtype and --quantize apply to it only); llamacpp = llama.cpp on the GGUF files (pip "
                            "install 'specdec[llamacpp]'; verifying k tokens costs nearly k single calls there); "
                            "auto = native for GGUF files on the CPU when a C++ compiler is here, else transformers; "
                            "the report says which ran (default: %(default)s)")
    if "draft_head" in include:
        parser.add_argument("--draft-head", type=draft_head_value, default=None, metavar="N",
                            help="cut the draft model's output head to the N tokens most frequent in Python's "
                            "standard library (plus special tokens): a cheaper draft, and still exact, since q is "
                            "zero outside the kept set; 0 = the whole vocabulary; native and transformers backends "
                            f"(default: {DEFAULT_DRAFT_HEAD} where the vocabulary is larger, else the whole; the "
                            "library's LoadSettings the same)")
    if "draft_quant" in include:
        parser.add_argument("--draft-quant", default=DEFAULT_DRAFT_QUANT, choices=DRAFT_QUANTS,
                            help="native backend: the draft GGUF's matrices stored in more than 4.5 bits a weight "
                            "(Q5_0, Q6_K, Q8_0, ...) re-quantized once to Q4_0 and kept in the cache (a few seconds "
                            "on first use): its calls read fewer bytes, and the output stays exactly the target's, "
                            "since q is whatever the draft reports; none = the draft as its file stores it "
                            "(default: %(default)s)")
    if "kernels" in include:
        parser.add_argument("--kernels", default="native", choices=ISAS,
                            help="instruction sets of the native backend's kernels: native = all this CPU has "
                            "(AVX-512 VNNI where present), avx2 = AVX2/FMA/F16C only (what an AVX2-only machine "
                            "runs), scalar = plain C++; all give the same bits (default: %(default)s)")
    if "threads" in include:
        parser.add_argument("--threads", type=int, default=None, metavar="N",
                            help="CPU threads for the native kernels, torch and llama.cpp "
                                 "(default: torch's choice; all cores for llama.cpp)")
    if "dequantize" in include:
        parser.add_argument("--dequantize", action="store_true",
                            help="let the native backend run a GGUF file's matrices of a type its kernels do not "
                            f"read ({native_types_help()} are read as stored) as float32 copies: 4 bytes a weight "
                            "and several times slower, said on stderr; without it such a file is one error line "
                            "and exit status 2 before anything loads (default: off)")
    return parser


def native_types_help() -> str:
    """The GGUF types the native kernels read, for help texts (``specdec.models.kernel_types``)."""
    from ..models.kernel_types import native_types

    return ", ".join(native_types())


def draft_head_value(text: str) -> int:
    """argparse type for --draft-head: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--draft-head {text!r} is invalid: an integer >= 0 "
                                         "(0 = the whole vocabulary)")
    return value


def drafter_help() -> str:
    from ..choices import drafter_forms_help

    return drafter_forms_help()


def add_drafter_options(parser, *, default: str | None = None, history: bool = False):
    """--draft DRAFTER: a drafter spec, the forms of ``specdec.choices.FORM_TABLE``; None: ``model``, or
    ``lookup`` for a --target the default draft model cannot draft for (:func:`drafter_value`), after ``history+``
    where ``history`` (the server's default)."""
    shown = default or ("history+" if history else "") + "model, or " + ("history+" if history else "") + \
        "lookup when --target has another vocabulary than the default draft model's and no --draft-model is given"
    parser.add_argument("--draft", default=default, metavar="DRAFTER",
                        help=f"who drafts: {drafter_help()} (default: {shown})")
    parser.add_argument("--draft-window", type=draft_window_value, default=DEFAULT_DRAFT_WINDOW, metavar="W",
                        help="a draft model reads only about the last W prompt tokens (still exact: q is what it "
                        "reports); a long prompt's time to first token then pays the draft's reading of W tokens, "
                        "not all; 0 = the whole prompt (default: %(default)s)")
    return parser


def add_history_options(parser, *, serving: bool = False):
    """--history-file FILE and --history-tokens N: the table the ``history`` drafter drafts from."""
    from ..drafters.history_table import DEFAULT_BUDGET, MAX_BUDGET

    when = ("read at start when it exists, written atomically at shutdown" if serving else
            "read before the run when it exists, written atomically after it with this run's text added")
    parser.add_argument("--history-file", default=None, metavar="FILE",
                        help=f"the history table (earlier texts the 'history' drafter copies from): {when}; a bad "
                        "or corrupt file is one error line naming it (default: none, the table lives in memory"
                        f"{' only' if serving else ' for this run only'})")
    default = (f"{DEFAULT_BUDGET} when --draft names history or --history-file is given, else 0" if serving
               else str(DEFAULT_BUDGET))
    parser.add_argument("--history-tokens", type=history_tokens_value, default=None, metavar="N",
                        help="the history table's bound: at most N tokens of earlier requests' texts (prompt and "
                        "answer), over all tenants, the least recently used evicted past it (about 130 bytes a "
                        f"token); an integer in [0, {MAX_BUDGET}]" + (", 0 = keep no table" if serving else "")
                        + f" (default: {default})")
    return parser


def history_tokens_value(text: str) -> int:
    """argparse type for --history-tokens: an integer in [0, MAX_BUDGET]."""
    from ..drafters.history_table import MAX_BUDGET

    value = int(text) if text.strip().isdigit() else -1
    if not 0 <= value <= MAX_BUDGET:
        raise argparse.ArgumentTypeError(f"--history-tokens {text!r} is invalid: an integer in [0, {MAX_BUDGET}]")
    return value


def history_budget(args: argparse.Namespace, draft: str) -> int:
    """The history table's budget --history-tokens and the drafter ask for (0: none kept); a --history-file that
    exists is read now, so that a bad one is one line before any model loads."""
    from ..choices import parse_draft
    from ..drafters.history_table import DEFAULT_BUDGET, HistoryTable

    budget = args.history_tokens
    if budget is None:
        wanted = parse_draft(draft).history or args.history_file is not None
        budget = DEFAULT_BUDGET if wanted else 0
    if args.history_file is not None and budget == 0:
        raise ValueError(f"--history-file {args.history_file!r} needs a table: --history-tokens 0 keeps none")
    if args.history_file is not None and os.path.exists(args.history_file):
        HistoryTable.load(args.history_file, budget=budget)
    return budget


def window_value(option: str, zero: str = "the whole prompt"):
    """An argparse type for a draft window option: 0 (None: ``zero``) or an integer >= MIN_DRAFT_WINDOW."""

    def value(text: str) -> int | None:
        if text.strip().isdigit() and (int(text) == 0 or int(text) >= MIN_DRAFT_WINDOW):
            return int(text) or None
        raise argparse.ArgumentTypeError(f"{option} {text!r} is invalid: 0 ({zero}) or an integer "
                                         f">= {MIN_DRAFT_WINDOW}")

    return value


draft_window_value = window_value("--draft-window")  # 0: the whole prompt


def add_gamma_option(parser, *, default: str = "auto"):
    """--gamma: an integer in [1, MAX_GAMMA], auto or heuristic."""
    from ..choices import MAX_GAMMA

    parser.add_argument("--gamma", type=gamma_value, default=default, metavar="γ",
                        help=f"drafted tokens per round: an integer in [1, {MAX_GAMMA}]; auto = chosen each round to "
                        "maximise the speed-up learned so far (α from the β of verified drafts, costs from timed "
                        "calls; γ then follows the machine's timings, so a sampled run repeats exactly only with a "
                        "fixed γ); "
                        "heuristic = transformers' schedule (+2 after a fully accepted round, −1 otherwise) "
                        "(default: %(default)s)")
    return parser


def gamma_value(text: str) -> int | str:
    """argparse type for --gamma: an integer, auto or heuristic."""
    from ..choices import parse_gamma

    try:
        return parse_gamma(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_sampling_options(parser, *, several_temperatures: bool = False, filters: bool = True,
                         seed_help: str = "random seed; the same seed repeats a run"):
    """--temperature (one value, or with ``several_temperatures`` a list, default 0 1), --top-k,
    --top-p, --min-p (``filters``) and --seed."""
    if several_temperatures:
        parser.add_argument("--temperature", nargs="+", type=float, default=[0.0, 1.0], metavar="T",
                            help="sampling temperatures, each >= 0 (0 = greedy) (default: 0 1)")
    else:
        parser.add_argument("--temperature", type=float, default=0.0, metavar="T",
                            help="sampling temperature >= 0; 0 is greedy decoding (default: %(default)s)")
    if filters:
        parser.add_argument("--top-k", type=int, default=0, metavar="K",
                            help="keep the K most likely tokens; 0 = off (default: 0)")
        parser.add_argument("--top-p", type=float, default=1.0, metavar="P",
                            help="nucleus sampling: smallest set of tokens reaching mass P, in (0, 1]; 1 = off "
                            "(default: 1.0)")
        parser.add_argument("--min-p", type=float, default=0.0, metavar="M",
                            help="drop tokens below M × the top probability, in [0, 1); 0 = off (default: 0.0)")
    parser.add_argument("--seed", type=int, default=0, help=f"{seed_help} (default: %(default)s)")
    return parser


def check_model_options(args: argparse.Namespace, *, draft_needed: bool = True,
                        backends: tuple[str, ...] | None = None) -> None:
    """Resolve every model, device and drafter value of ``args`` now, before any weights load:
    a bad one is a ValueError (one line naming the value and what is accepted). A GGUF file with matrices of a
    type the native kernels do not read, on a backend that would run it natively (``--backend``, or each of
    ``backends``), is refused the same way unless ``--dequantize`` (``loading.backend.refuse_float32``)."""
    from ..loading.backend import refuse_float32
    from ..loading.locate import check_device, locate_model
    from ..native.gguf_file import check_gguf

    if getattr(args, "device", None) is not None:
        check_device(args.device)
    values = [getattr(args, "target", None), getattr(args, "draft_model", None) if draft_needed else None]
    for role, value in zip(("target", "draft"), values, strict=True):
        kind, path = locate_model(value, role, assemble=False) if value is not None else (None, None)
        if kind == "gguf" and path is not None:  # None: a named model not assembled yet (checked when it is)
            check_gguf(path, tokenizer=role == "target")  # truncated or damaged: one line naming it (tens of ms)
    given = [value for value in values if value is not None]
    for backend in backends or (getattr(args, "backend", "auto"),):
        refuse_float32(backend, *given, device=getattr(args, "device", "cpu"),
                       dequantize=bool(getattr(args, "dequantize", False)))


LOAD_FIELDS = ("target", "device", "dtype", "quantize", "backend", "threads", "draft_head", "kernels", "dequantize",
               "draft_quant")


def load_settings(args: argparse.Namespace, drafter: str | None, **overrides):
    """The ``LoadSettings`` the parsed model options name (those the command has), for the drafter value
    ``drafter`` (:func:`drafter_value`); ``overrides``: other fields (``cache_gb``, ``with_draft``)."""
    from ..session import load_settings as settings_for

    fields = {name: getattr(args, name) for name in LOAD_FIELDS if hasattr(args, name)}
    return settings_for(drafter, **{**fields, **overrides})


def drafter_value(args: argparse.Namespace, history: bool = False) -> str | None:
    """--draft with --draft-model folded in (``model`` → ``model:PATH``), checked; without --draft and with
    ``history`` (the server's default), the default drafter after ``history+``."""
    from ..choices import HISTORY_PREFIX, parse_draft, with_draft_model

    value, draft_model = getattr(args, "draft", None), getattr(args, "draft_model", None)
    target = getattr(args, "target", None)
    if value is None:  # not given: a draft model, unless the default one cannot draft for this target
        from ..loading.zoo import default_draft_fits

        value = "model" if draft_model is not None or default_draft_fits(target) else "lookup"
        if value == "lookup":
            print(f"note: the default draft model (Qwen2.5-Coder-0.5B) has another vocabulary than {target}; drafting "
                  "by prompt lookup (--draft lookup). Give --draft-model for a draft model of its family.",
                  file=sys.stderr)
        value = f"{HISTORY_PREFIX}{value}" if history else value
    draft = with_draft_model(value, draft_model)
    parse_draft(draft)
    return draft
