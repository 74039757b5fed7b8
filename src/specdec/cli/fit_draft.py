"""``specdec fit-draft``: fit an n-gram draft table from a text corpus or the target's own output.

Argument parsing and printing only; the table is ``specdec.models.ngram.NgramModel``, the tokenizer comes
from ``specdec.loading.tokenizer.load_tokenizer`` (no weights are loaded unless --from-target asks for them).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import sysconfig
import time
from collections.abc import Iterator

DESCRIPTION = """\
Fit an n-gram draft (order 1 = unigram, 2 = bigram, 3 = trigram, with backoff to lower orders)
and save it as a small file for `specdec generate --draft ngram:FILE` (or lookup+ngram:FILE).
Text is tokenized with the target's tokenizer, so the table speaks the target's token ids.
Sources: text files and directories (--corpus; `stdlib` = this Python's standard library
sources, tests left out), and/or the target's own generations for a file of prompts
(--from-target; slow on a CPU, a few tokens per second)."""

EPILOG = """\
examples:
  specdec fit-draft --corpus stdlib --order 2 --out stdlib.ngram
  specdec fit-draft --corpus src/ docs/ --glob '*.py' --glob '*.md' --order 3 --out project.ngram
  specdec fit-draft --from-target prompts.txt --tokens 200 --order 2 --out target.ngram"""

STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("fit-draft", help="fit an n-gram draft table from a corpus or the target's output",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("sources (at least one)")
    src.add_argument("--corpus", nargs="+", default=[], metavar="PATH",
                     help="text files and directories (searched recursively with --glob); 'stdlib' is this "
                     "Python's standard library sources without their tests")
    src.add_argument("--glob", action="append", default=None, metavar="PATTERN",
                     help="file name pattern inside directories, repeatable (default: *.py)")
    src.add_argument("--from-target", default=None, metavar="PROMPTS_FILE",
                     help="also fit on the target's own generations: one prompt per line of this file")
    src.add_argument("--tokens", type=int, default=128, metavar="N",
                     help="with --from-target: tokens to generate per prompt (default: %(default)s)")
    src.add_argument("--temperature", type=float, default=0.0, metavar="T",
                     help="with --from-target: sampling temperature, 0 = greedy (default: %(default)s)")
    fit = p.add_argument_group("the table")
    fit.add_argument("--order", type=int, default=2, metavar="N",
                     help="n-gram order: 1 unigram, 2 bigram, 3 trigram (default: %(default)s)")
    fit.add_argument("--top-k", type=int, default=32, metavar="K",
                     help="continuations kept per context; a score call writes K entries (default: %(default)s)")
    fit.add_argument("--discount", type=float, default=0.75, metavar="D",
                     help="absolute discount in (0, 1): mass moved to the lower order (default: %(default)s)")
    fit.add_argument("--min-count", type=int, default=2, metavar="C",
                     help="leave out contexts of order >= 2 seen fewer than C times; 1 keeps all "
                          "(default: %(default)s)")
    fit.add_argument("--out", required=True, metavar="FILE", help="where to write the table (written atomically)")
    models = p.add_argument_group("models")
    models.add_argument("--tokenizer-of", "--target", dest="target", default=None, metavar="MODEL",
                        help="the target whose tokenizer (and, with --from-target, weights) to use; same forms as "
                        "`generate --target` (default: Qwen2.5-Coder-1.5B-Instruct)")
    models.add_argument("--device", default="cpu", help="with --from-target: cpu or cuda (default: %(default)s)")
    models.add_argument("--dequantize", action="store_true",
                        help="with --from-target: as `generate --dequantize` (a GGUF target with matrices of a type "
                        "the native kernels do not read runs them as float32 copies; without it, it is refused) "
                        "(default: off)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..loading.tokenizer import load_tokenizer
    from ..models.ngram import NgramModel, check_fit_args

    if not args.corpus and not args.from_target:
        raise ValueError("no source given: pass --corpus PATH... and/or --from-target PROMPTS_FILE")
    check_fit_args(args.order, 2, args.top_k, args.discount, args.min_count)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise ValueError(f"--out {args.out!r}: directory {out_dir!r} does not exist")
    if args.from_target and args.tokens < 1:
        raise ValueError(f"--tokens {args.tokens} is invalid: must be an integer >= 1")
    if args.from_target:
        from ..loading.backend import refuse_float32

        refuse_float32("auto", args.target, device=args.device, dequantize=args.dequantize)  # before any corpus work
    prompts = read_prompts(args.from_target) if args.from_target else []
    files = corpus_files(args.corpus, args.glob or ["*.py"])
    start = time.perf_counter()
    tokenizer = load_tokenizer(args.target)
    sequences = list(tokenize_files(tokenizer, files))
    if prompts:
        sequences += target_generations(args, prompts)
    vocab_size = len(tokenizer)
    table = NgramModel.fit(sequences, args.order, vocab_size, top_k=args.top_k, discount=args.discount,
                           min_count=args.min_count,
                           meta={"tokenizer": args.target or "default target", "files": len(files),
                                 "prompts": len(prompts)})
    table.save(args.out)
    contexts = sum(t.contexts.shape[0] for t in table.tables)
    print(f"fitted an order-{args.order} n-gram on {table.meta['tokens']:,} tokens ({len(files)} files, "
          f"{len(prompts)} target generations) in {time.perf_counter() - start:.1f} s: {contexts:,} contexts, "
          f"top {args.top_k} each; wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB)", file=sys.stderr)
    print(f"use it: specdec generate PROMPT --draft ngram:{args.out}   (or --draft lookup+ngram:{args.out})",
          file=sys.stderr)
    return 0


def corpus_files(paths: list[str], patterns: list[str]) -> list[pathlib.Path]:
    """The files named, and those under the directories named that match a pattern; sorted."""
    files: list[pathlib.Path] = []
    for spec in paths:
        if spec == "stdlib":
            root = pathlib.Path(sysconfig.get_paths()["stdlib"])
            files += sorted(f for f in root.rglob("*.py") if not STDLIB_SKIP & set(f.relative_to(root).parts))
        elif os.path.isdir(spec):
            found = sorted({f for pattern in patterns for f in pathlib.Path(spec).rglob(pattern) if f.is_file()})
            if not found:
                raise ValueError(f"--corpus {spec!r}: no file matching {' or '.join(patterns)} in that directory")
            files += found
        elif os.path.isfile(spec):
            files.append(pathlib.Path(spec))
        else:
            raise ValueError(f"--corpus {spec!r} is neither a file, a directory, nor 'stdlib'")
    return files


def read_prompts(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise ValueError(f"--from-target {path!r} does not exist: give a text file with one prompt per line")
    prompts = [line.strip() for line in pathlib.Path(path).read_text(encoding="utf-8", errors="replace").splitlines()]
    prompts = [p for p in prompts if p]
    if not prompts:
        raise ValueError(f"--from-target {path!r} has no prompts: give one prompt per line")
    return prompts


def tokenize_files(tokenizer, files: list[pathlib.Path], batch: int = 32) -> Iterator[list[int]]:
    """Token ids of each file (no special tokens), in batches, with a progress bar over files."""
    from tqdm.auto import tqdm

    backend = getattr(tokenizer, "backend_tokenizer", None)  # fast tokenizers: batches run in parallel
    with tqdm(total=len(files), unit="file", desc="tokenizing", file=sys.stderr, disable=not files) as bar:
        for i in range(0, len(files), batch):
            texts = [f.read_text(encoding="utf-8", errors="replace") for f in files[i : i + batch]]
            if backend is not None:
                yield from (e.ids for e in backend.encode_batch(texts, add_special_tokens=False))
            else:
                yield from (tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts)
            bar.update(len(texts))


def target_generations(args: argparse.Namespace, prompts: list[str]) -> list[list[int]]:
    """Prompt + the target's own continuation for each prompt (loads the target's weights)."""
    from tqdm.auto import tqdm

    from .. import session
    from ..decode import autoregressive_generate
    from ..sampling import SamplingParams

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    sampling = SamplingParams(temperature=args.temperature)
    pair = session.load(session.LoadSettings(target=args.target, device=args.device, with_draft=False,
                                             dequantize=args.dequantize), log=log)
    out = []
    for i, prompt in enumerate(tqdm(prompts, unit="prompt", desc="generating", file=sys.stderr)):
        ids = pair.encode(prompt, chat=True)  # the chat template when the tokenizer has one
        gen = autoregressive_generate(pair.target, ids, max_new_tokens=args.tokens, sampling=sampling, seed=i,
                                      eos_token_id=pair.eos_token_ids)
        out.append(ids + gen.tokens)
    return out
