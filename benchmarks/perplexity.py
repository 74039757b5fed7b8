"""Perplexity of specdec's native backend next to llama.cpp's ``llama-perplexity`` on the same GGUF file.

The claim it checks: ``specdec.models.native.NativeModel`` runs the GGUF file's model faithfully (its
quantized blocks as stored, activations quantized the way llama.cpp does), so its perplexity on a fixed
text is within ``--tolerance`` (default 1%) of llama.cpp's own perplexity tool on the same file.

    python benchmarks/perplexity.py                 # default target GGUF, textwrap.py, 4 chunks of 512
    python benchmarks/perplexity.py --text FILE --ctx 1024 --chunks 8 --threads 2
    python benchmarks/perplexity.py --gguf ~/.cache/specdec/gemma-3-270m-q4_k_m.gguf --kv-cache f32

Both sides compute the same figure, the way llama.cpp's tools/perplexity/perplexity.cpp does it
(``perplexity()``, llama-cpp-python 0.3.36's vendored llama.cpp):

- text: the file's bytes as UTF-8, one final newline dropped (``-f`` does that);
- tokens: the whole text tokenized at once, plain (no chat template, special tokens not parsed), with
  BOS in front only where the file's ``tokenizer.ggml.add_bos_token`` asks for it (Qwen's does not);
- chunks: ``tokens[i*ctx:(i+1)*ctx]`` for i < min(--chunks, len(tokens) // ctx), the leftover tail unused;
  at least 2*ctx tokens are needed. With add_bos, each chunk's first token is replaced by BOS;
- per chunk, on an empty KV cache: only the second half is scored: with first = ctx // 2, the logits
  after positions first .. ctx-2 predict tokens first+1 .. ctx-1 (ctx - first - 1 tokens a chunk);
- PPL = exp(mean NLL) over all scored tokens, log-softmax in float64; "+/-" =
  PPL * sqrt((mean(NLL^2) - mean(NLL)^2) / (count - 1)), llama.cpp's estimate.

Ours reads each chunk's first half with ``prefill`` (no logits; the prompt-reading product, as for any
prompt) and scores the second half with one ``score`` call. llama.cpp's side runs
``llama-perplexity -m GGUF -f TEXT -c CTX --chunks N -t THREADS`` (its defaults otherwise: f16 KV cache,
flash attention auto, -b 2048) and its "Final estimate" line is parsed. ``--kv-cache f32`` adds
``-ctk f32 -ctv f32 -fa off``: llama.cpp then keeps keys and values in float32, as ours does (Gemma 3
270M on tests/data/gemma3-perplexity-text.md: ours 46.6287, llama.cpp 46.6497 with f32, -0.05%; 47.0565
with its f16 default, -0.9%: f16 keys and values cost Gemma that much). A second, cheap run of the tool
with ``-c <our token count>`` makes it print how many tokens it read the file as ("tokenizes to only N
tokens", the too-short-text error), so the two token counts are compared. The tools come from
``bash benchmarks/build_llama_cpp_tools.sh``; without them the script reports ours only.

Exit status: 0 when |ours / llama.cpp - 1| <= --tolerance, 1 when above it (or the token counts or
chunk counts differ), 2 when llama.cpp's tool is missing (not compared) or the arguments are wrong.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import pathlib
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_GGUF = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "perplexity.md"
TOOL = "llama-perplexity"
KV_FLAGS = {"f16": [], "f32": ["-ctk", "f32", "-ctv", "f32", "-fa", "off"]}  # --kv-cache: the tool's extra flags

FINAL_RE = re.compile(r"Final estimate: PPL = ([0-9.eE+-]+|nan|inf) \+/- ([0-9.eE+-]+|nan|inf)")
CHUNKS_RE = re.compile(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)")
TOO_SHORT_RE = re.compile(r"tokenizes to only (\d+) tokens")
RUNNING_RE = re.compile(r"\[(\d+)\]([0-9.]+|nan|inf),")


# --- what llama-perplexity does, step by step -------------------------------------------------------
def read_text(path: str | os.PathLike) -> str:
    """The text as ``-f`` reads it: the whole file, one final newline dropped."""
    text = pathlib.Path(path).read_bytes().decode("utf-8")
    return text[:-1] if text.endswith("\n") else text


def chunk_tokens(tokens: Sequence[int], ctx: int, chunks: int, bos_id: int | None = None) -> list[list[int]]:
    """llama-perplexity's chunks: ``min(chunks, len // ctx)`` (all for chunks < 0) windows of ``ctx`` tokens
    from the start, the first of each replaced by ``bos_id`` when the vocabulary adds BOS."""
    if ctx < 2:
        raise ValueError(f"the context must be at least 2 tokens (got {ctx})")
    if len(tokens) < 2 * ctx:
        raise ValueError(f"the text tokenizes to only {len(tokens)} tokens: at least {2 * ctx} (2 x ctx) are "
                         f"needed, as llama-perplexity asks")
    count = len(tokens) // ctx if chunks < 0 else min(chunks, len(tokens) // ctx)
    out = []
    for i in range(count):
        chunk = [int(t) for t in tokens[i * ctx : (i + 1) * ctx]]
        if bos_id is not None:
            chunk[0] = int(bos_id)
        out.append(chunk)
    return out


def token_nll(logits, targets: Sequence[int]) -> np.ndarray:
    """-log softmax(logits[k])[targets[k]] for each row k, in float64. logits: [n, vocab] (array or tensor)."""
    rows = np.asarray(logits, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    if rows.ndim != 2 or len(rows) != len(targets):
        raise ValueError(f"need one logits row per target: {rows.shape} rows for {len(targets)} targets")
    top = rows.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(rows - top).sum(axis=1))
    return log_z - rows[np.arange(len(targets)), targets]


def chunk_nll(chunk: Sequence[int], second_half_logits) -> np.ndarray:
    """NLL of a chunk's scored tokens, ``chunk[first+1:]``, from the logits after ``chunk[first:]``
    (row j follows chunk[first + j]; the last row, after the chunk's last token, predicts nothing here)."""
    first = len(chunk) // 2
    rows = second_half_logits[: len(chunk) - first - 1]
    return token_nll(rows, chunk[first + 1 :])


@dataclass
class Perplexity:
    ppl: float
    error: float  # llama.cpp's "+/-": ppl * standard error of the mean NLL
    count: int  # scored tokens
    running: list[float] = field(default_factory=list)  # PPL over chunks 1..i, as the tool prints [i]


def summarize(nlls: Sequence[np.ndarray]) -> Perplexity:
    """PPL and llama.cpp's error estimate over the chunks' NLLs (and the running PPL after each chunk)."""
    running, total, count = [], 0.0, 0
    for part in nlls:
        total, count = total + float(np.sum(part)), count + len(part)
        running.append(math.exp(total / count))
    values = np.concatenate([np.asarray(p, dtype=np.float64) for p in nlls])
    mean = float(values.mean())
    var = float((values**2).mean()) - mean * mean
    ppl = math.exp(mean)
    error = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else float("nan")
    return Perplexity(ppl, error, count, running)


def native_perplexity(model, chunks: Sequence[Sequence[int]],
                      progress: Callable[[str], None] | None = None) -> Perplexity:
    """Each chunk on a fresh cache: ``prefill`` its first half, ``score`` its second half."""
    nlls = []
    for i, chunk in enumerate(chunks):
        first = len(chunk) // 2
        started = time.perf_counter()
        model.prefill(chunk[:first])  # starts a new cache (llama.cpp clears its KV cache per chunk)
        logits = model.score(chunk[first:])
        nlls.append(chunk_nll(chunk, logits))
        if progress:
            so_far = summarize(nlls)
            progress(f"ours: chunk {i + 1}/{len(chunks)}: running PPL {so_far.ppl:.4f} "
                     f"({time.perf_counter() - started:.1f} s)")
    return summarize(nlls)


# --- llama-perplexity ---------------------------------------------------------------------------------
def parse_final(output: str) -> tuple[float, float]:
    """(PPL, +/-) from llama-perplexity's ``Final estimate: PPL = 9.1234 +/- 0.12345`` line."""
    matches = FINAL_RE.findall(output)
    if not matches:
        tail = "\n".join(output.rstrip().splitlines()[-15:])
        raise RuntimeError(f"{TOOL} printed no 'Final estimate: PPL = ... +/- ...' line; the end of its "
                           f"output:\n{tail}")
    ppl, error = matches[-1]
    return float(ppl), float(error)


def parse_chunks(output: str) -> tuple[int, int] | None:
    """(chunks, n_ctx) from ``calculating perplexity over 4 chunks, n_ctx=512, ...``."""
    match = CHUNKS_RE.search(output)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_running(output: str) -> list[float]:
    """The running PPL the tool prints after each chunk: ``[1]8.1234,[2]7.9876,...``."""
    return [float(v) for _, v in RUNNING_RE.findall(output)]


def parse_token_count(output: str) -> int | None:
    """The tool's token count from its too-short-text error (``... tokenizes to only 4980 tokens``)."""
    match = TOO_SHORT_RE.search(output)
    return int(match.group(1)) if match else None


def tool_command(tool: str, gguf: str, text_file: str, ctx: int, chunks: int, threads: int,
                 kv_cache: str = "f16") -> list[str]:
    if kv_cache not in KV_FLAGS:
        raise ValueError(f"kv_cache={kv_cache!r} is invalid: choose one of {', '.join(KV_FLAGS)}")
    return [tool, "-m", gguf, "-f", text_file, "-c", str(ctx), "--chunks", str(chunks), "-t", str(threads),
            *KV_FLAGS[kv_cache]]


def run_llama_perplexity(tool: str, gguf: str, text_file: str, ctx: int, chunks: int, threads: int,
                         kv_cache: str = "f16") -> str:
    """stdout + stderr of one run (the log-draining library preloaded, as specdec's other tool runs)."""
    from specdec.bench.llamacpp_cli import flush_log_library, run_tool

    out, err = run_tool(tool_command(tool, gguf, text_file, ctx, chunks, threads, kv_cache), cwd=str(ROOT),
                        preload=flush_log_library())
    return out.decode("utf-8", errors="replace") + "\n" + err


# --- the report ---------------------------------------------------------------------------------------
def relative_difference(ours: float, theirs: float) -> float:
    return ours / theirs - 1.0


def markdown(facts: dict) -> str:
    lines = ["# Perplexity: specdec native backend vs llama.cpp's llama-perplexity", "",
             f"Written by `{facts['command']}` on {facts['date']}.", "",
             "Same GGUF file, same text, same chunking (llama.cpp's tools/perplexity/perplexity.cpp: chunks of "
             "n_ctx tokens from the start of the text, each on an empty KV cache, only the second half of each "
             "chunk scored). Method and exit status: `python benchmarks/perplexity.py --help`.", "",
             "| | PPL | +/- | scored tokens | text tokens | chunks x n_ctx | seconds |",
             "|---|---|---|---|---|---|---|"]
    for row in facts["rows"]:
        lines.append(f"| {row['name']} | {row['ppl']} | {row['error']} | {row['count']} | {row['tokens']} | "
                     f"{row['chunks']} | {row['seconds']} |")
    lines += ["", f"- relative difference (ours / llama.cpp - 1): **{facts['difference']}** "
              f"(tolerance {facts['tolerance']:.2%}): **{facts['verdict']}**"]
    lines += [f"- {note}" for note in facts["notes"]]
    lines += [f"- llama.cpp runs {facts['kv_note']}; ours keeps a float32 KV cache. Seconds: wall time of each "
              "side, model loading included (not a speed comparison)"]
    lines += ["", "| setting | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in facts["settings"]]
    lines += ["", "llama.cpp's command:", "", "```", facts["tool_command"], "```", ""]
    return "\n".join(lines)


def file_digest(path: str) -> str:
    """sha256 of a file: the record specdec's download wrote beside it (``NAME.sha256``: digest, size,
    mtime) when it still describes the file, else hashed here."""
    try:
        record = json.loads(pathlib.Path(path + ".sha256").read_text())
        st = os.stat(path)
        if record["size"] == st.st_size and record["mtime_ns"] == st.st_mtime_ns:
            return str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fmt(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def main(argv: Sequence[str] | None = None) -> int:
    from specdec.cache import cache_dir

    default_gguf = cache_dir() / DEFAULT_GGUF
    parser = argparse.ArgumentParser(
        description="Perplexity of specdec's native backend and of llama.cpp's llama-perplexity on the same "
                    "GGUF file and text, computed the same way (chunks of --ctx tokens, second half of each "
                    "scored); exit 0 when they agree within --tolerance.",
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default=str(default_gguf),
                        help=f"the GGUF file (default: the default target, {default_gguf})")
    parser.add_argument("--text", default=None,
                        help="the text file (default: this Python's standard-library textwrap.py)")
    parser.add_argument("--ctx", type=int, default=512, help="tokens per chunk, llama-perplexity's -c (default 512)")
    parser.add_argument("--chunks", type=int, default=4,
                        help="chunks to score, llama-perplexity's --chunks; -1: all (default 4)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both sides (default 2)")
    parser.add_argument("--tolerance", type=float, default=0.01,
                        help="largest accepted |ours / llama.cpp - 1| (default 0.01)")
    parser.add_argument("--out", default=str(DEFAULT_OUT),
                        help="markdown report (default benchmarks/results/perplexity.md); '' for none")
    parser.add_argument("--kv-cache", choices=sorted(KV_FLAGS), default="f16",
                        help="llama-perplexity's KV cache: f16 (its default) or f32 (-ctk f32 -ctv f32 -fa off, "
                             "the float32 ours keeps) (default f16)")
    parser.add_argument("--skip-llamacpp", action="store_true", help="ours only (no comparison; exit status 2)")
    args = parser.parse_args(argv)
    if args.ctx < 2 or args.threads < 1 or args.chunks == 0:
        parser.error("--ctx must be >= 2, --threads >= 1, --chunks -1 or >= 1")
    if not os.path.isfile(args.gguf):
        parser.error(f"no GGUF file at {args.gguf} (the default target is downloaded by `specdec` on first use)")
    if args.text is None:
        import textwrap

        args.text = textwrap.__file__
    command = "python " + shlex.join(["benchmarks/perplexity.py", *(sys.argv[1:] if argv is None else argv)])

    import torch

    from specdec.bench.llamacpp_cli import BUILD_COMMAND, tools_dir
    from specdec.loading.tokenizer import gguf_tokenizer
    from specdec.machine import describe_cpu
    from specdec.models.native import NativeModel, NativeSettings
    from specdec.native.gguf_file import GGUFFile

    torch.set_num_threads(args.threads)
    text = read_text(args.text)
    file = GGUFFile(args.gguf)
    add_bos = bool(file.fields.get("tokenizer.ggml.add_bos_token", False))
    bos_id = int(file.fields["tokenizer.ggml.bos_token_id"]) if add_bos else None
    tokenizer = gguf_tokenizer(args.gguf)
    tokens = tokenizer.encode(text, add_special_tokens=False, verbose=False)
    if add_bos:
        tokens = [bos_id, *tokens]
    try:
        chunks = chunk_tokens(tokens, args.ctx, args.chunks, bos_id)
    except ValueError as err:
        parser.error(str(err))
    print(f"text: {args.text} ({len(text)} characters, {len(tokens)} tokens; BOS {'added' if add_bos else 'not added'})"
          f"; {len(chunks)} chunks of {args.ctx}", flush=True)

    started = time.perf_counter()
    model = NativeModel(args.gguf, NativeSettings(threads=args.threads))
    ours = native_perplexity(model, chunks, progress=lambda line: print(line, flush=True))
    ours_seconds = time.perf_counter() - started
    del model
    print(f"ours: PPL = {ours.ppl:.4f} +/- {ours.error:.5f} over {ours.count} tokens ({ours_seconds:.0f} s)",
          flush=True)

    tool = tools_dir() / TOOL
    notes, problems = [], []
    theirs = their_tokens = their_chunks = None
    their_running: list[float] = []
    their_seconds = None
    tool_cmd = shlex.join(tool_command(str(tool), args.gguf, args.text, args.ctx, args.chunks, args.threads,
                                       args.kv_cache))
    if args.skip_llamacpp:
        notes.append("llama.cpp not run (--skip-llamacpp)")
    elif not (tool.is_file() and os.access(tool, os.X_OK)):
        notes.append(f"llama.cpp's {TOOL} is not in {tools_dir()}: build it with `{BUILD_COMMAND}` "
                     f"(about 15 minutes on 2 cores); ours only")
        print(notes[-1], file=sys.stderr)
    else:
        print(f"llama.cpp: {tool_cmd}", flush=True)
        started = time.perf_counter()
        output = run_llama_perplexity(str(tool), args.gguf, args.text, args.ctx, args.chunks, args.threads,
                                      args.kv_cache)
        their_seconds = time.perf_counter() - started
        theirs = parse_final(output)
        their_running = parse_running(output)
        seen = parse_chunks(output)
        their_chunks = seen[0] if seen else None
        print(f"llama.cpp: PPL = {theirs[0]:.4f} +/- {theirs[1]:.5f} ({their_seconds:.0f} s)", flush=True)
        if their_chunks != len(chunks):
            problems.append(f"llama.cpp scored {their_chunks} chunks, ours {len(chunks)}")
        if len(tokens) <= 32768:  # the probe allocates a KV cache of that many tokens
            probe = run_llama_perplexity(str(tool), args.gguf, args.text, len(tokens), 1, args.threads)
            their_tokens = parse_token_count(probe)
            if their_tokens is None:
                problems.append(f"llama.cpp read the text as at least {2 * len(tokens)} tokens, ours {len(tokens)}")
            elif their_tokens != len(tokens):
                problems.append(f"token counts differ: llama.cpp {their_tokens}, ours {len(tokens)}")
        else:
            notes.append("token counts not compared (text over 32768 tokens)")

    difference = relative_difference(ours.ppl, theirs[0]) if theirs else None
    if difference is None:
        verdict, status = "not compared", 2
    elif problems:
        verdict, status = "FAIL (" + "; ".join(problems) + ")", 1
    elif abs(difference) <= args.tolerance:
        verdict, status = "within tolerance", 0
    else:
        verdict, status = "FAIL (above tolerance)", 1
    if their_running:
        notes.append("running PPL after each chunk: ours " + ", ".join(f"{v:.4f}" for v in ours.running)
                     + "; llama.cpp " + ", ".join(f"{v:.4f}" for v in their_running))

    rows = [dict(name="specdec native", ppl=fmt(ours.ppl), error=fmt(ours.error, 5), count=ours.count,
                 tokens=len(tokens), chunks=f"{len(chunks)} x {args.ctx}", seconds=f"{ours_seconds:.0f}")]
    if theirs:
        rows.append(dict(name=f"llama.cpp {TOOL}", ppl=fmt(theirs[0]), error=fmt(theirs[1], 5),
                         count=(their_chunks or 0) * (args.ctx - args.ctx // 2 - 1),
                         tokens=their_tokens if their_tokens is not None else "n/a",
                         chunks=f"{their_chunks} x {args.ctx}", seconds=f"{their_seconds:.0f}"))
    text_bytes = pathlib.Path(args.text).read_bytes()
    version_file = tools_dir() / "VERSION"
    settings = [
        ("GGUF", f"`{os.path.basename(args.gguf)}` (sha256 {file_digest(args.gguf)[:16]}...)"),
        ("text", f"`{args.text}` ({len(text_bytes)} bytes, sha256 {hashlib.sha256(text_bytes).hexdigest()[:16]}...; "
                 f"Python {sys.version.split()[0]})"),
        ("BOS", f"{'added' if add_bos else 'not added'} (tokenizer.ggml.add_bos_token = {add_bos})"),
        ("threads", args.threads),
        ("llama.cpp", f"llama-cpp-python {version_file.read_text().strip()} vendored tree, native build"
         if version_file.is_file() else "not built"),
        ("CPU", describe_cpu()),
    ]
    facts = dict(command=command, date=datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"), rows=rows,
                 difference=f"{difference:+.4%}" if difference is not None else "n/a", tolerance=args.tolerance,
                 verdict=verdict, notes=notes, settings=settings, tool_command=tool_cmd,
                 kv_note="its defaults (f16 KV cache, flash attention auto, -b 2048): a small difference is expected"
                 if args.kv_cache == "f16" else "with a float32 KV cache and no flash attention (-b 2048)")

    print()
    print(f"{'':26} {'PPL':>9} {'+/-':>9} {'scored':>7} {'tokens':>7} {'chunks':>9}")
    for row in rows:
        print(f"{row['name']:26} {row['ppl']:>9} {row['error']:>9} {row['count']:>7} {row['tokens']!s:>7} "
              f"{row['chunks']:>9}")
    print(f"relative difference: {facts['difference']} (tolerance {args.tolerance:.2%}): {verdict}")
    for note in notes:
        print(f"note: {note}")
    print(f"command: {command}")
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(markdown(facts))
        print(f"wrote {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
