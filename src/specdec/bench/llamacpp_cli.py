"""llama.cpp's own command-line tools as ``specdec bench`` modes (one process per run).

- ``llamacpp-cli-plain``: ``llama-completion`` on the target's GGUF file;
- ``llamacpp-cli-spec[:N]``: ``llama-speculative`` with the draft's GGUF file and
  ``--spec-draft-n-max N`` (default 3, llama.cpp's own), one draft sequence (``-np 1``: no tree).
  Not ``llama-speculative-simple`` (which also needs ``--spec-type draft-simple``): that one does
  not print the end token, so a run could not tell "ended" from "ran out", and at T > 0 it accepts
  only drafts equal to the target's own draw, where this one uses the paper's rule (p/q, residual);
- ``llamacpp-cli-lookup[:N]``: ``llama-lookup`` (n-gram cache over the prompt and output, the
  prompt-lookup of its README) drafting up to N tokens (default 3, llama.cpp's own default).

The tools come from ``bash benchmarks/build_llama_cpp_tools.sh`` (``$SPECDEC_LLAMA_CPP_TOOLS``,
else ``<specdec cache>/llama.cpp-tools/bin``). Each run, like our modes:

- prompt: the exact text of ``prompt_ids`` (the pair's tokenizer, special tokens such as
  ``<|im_start|>`` kept) in a prompt file, with ``--no-escape`` (a ``\\n`` in code stays two
  characters; one extra newline is written because ``-f`` drops a final one). The tools parse
  special tokens and add BOS only where the GGUF file asks for it (Qwen's does not; Llama 3's and Gemma's
  do: a BOS that starts ``prompt_ids`` is then left out of the text, :func:`tool_prompt`); every run
  checks that the tool read exactly ``len(prompt_ids)`` tokens, else ValueError;
- sampling: ``--temp 0`` is greedy; at T > 0 ``--temp --top-k --top-p --min-p --seed`` with
  ``--sampling-seq tkpm`` (temperature first, then the filters, in our order) and no repeat
  penalty. No conversation mode, nothing interactive; ``-n`` tokens, stopping at an end token;
- the target's context size (n_ctx) and threads (one-token, batch), the draft's threads for
  the draft. Everything else is llama.cpp's default (f16 KV cache, flash attention auto, weight
  repacking, -b 2048 -ub 512), as a user of the tools runs it; our backend's target runs a bf16
  cache without repacking so that its rows do not depend on the block size
  (``specdec.models.llamacpp``), so greedy outputs may part after a near-tie;
- seconds: from the tool's own printed timings, never the process's wall time (model loading
  and the tool's warm-up run are left out): ``llama-completion``'s prompt eval + eval + sampling
  times; the speculative tools' "encoded" + "decoded" intervals. ``prefill_seconds``: the
  prompt part;
- tokens: the printed text re-tokenized with the pair's tokenizer, cut after the first end
  token and at ``max_new_tokens``: greedy identity with plain decoding is judged on that
  re-tokenized text. The speculative tools stop at the first round that passes ``-n`` (``-n N-1``
  makes that the first round reaching N tokens; ``llama-lookup`` reads ``-n 0`` as "no limit", so
  a 1-token run asks for 2); the tokens of that round past N are dropped, but its time counts;
- figures: target calls = tokens for plain; None for the speculative tools (they do not print
  their verification calls); drafted / accepted as they print them (over all they generated);
  rounds 0 and α None (β is not visible outside the tool).

The tools print through llama.cpp's logger, a worker thread they leave undrained at exit (llama.cpp
issue 22142): the end of their output was lost in 9 of 60 llama-completion runs on the tiny test
models. So each tool runs with a 6-line library preloaded (``FLUSH_LOG_SOURCE``, compiled once
with ``$CC``/cc into the specdec cache) whose destructor drains the logger; it touches nothing else.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import subprocess
import tempfile
from collections.abc import Sequence

from ..machine import cpu_flags_key
from ..sampling import SamplingParams
from .figures import RunFigures

TOOLS_ENV = "SPECDEC_LLAMA_CPP_TOOLS"
BUILD_COMMAND = "bash benchmarks/build_llama_cpp_tools.sh"
DEFAULT_DRAFT_MAX = 3  # llama.cpp's --spec-draft-n-max default (common/common.h), for both tools
TOOLS = {"llamacpp-cli-plain": "llama-completion", "llamacpp-cli-spec": "llama-speculative",
         "llamacpp-cli-lookup": "llama-lookup"}
END_OF_TEXT = b" [end of text]\n"  # llama-completion's note after an end token
STDERR_TAIL_LINES = 15
FLUSH_LOG_SOURCE = """\
struct common_log;  /* llama.cpp common/log.h: common_log_main(), common_log_pause() (drains, then joins) */
extern struct common_log * _Z15common_log_mainv(void) __attribute__((weak));
extern void _Z16common_log_pauseP10common_log(struct common_log *) __attribute__((weak));
__attribute__((destructor)) static void specdec_drain_llama_log(void) {
    if (_Z15common_log_mainv && _Z16common_log_pauseP10common_log)
        _Z16common_log_pauseP10common_log(_Z15common_log_mainv());
}
"""


def parse_cli_mode(name: str) -> tuple[str, int | None]:
    """(canonical name, draft max) of a llamacpp-cli-* name; ValueError naming the accepted forms."""
    base, sep, count = name.partition(":")
    if base == "llamacpp-cli-plain" and not sep:
        return base, None
    if base in ("llamacpp-cli-spec", "llamacpp-cli-lookup"):
        count = count if sep else str(DEFAULT_DRAFT_MAX)
        if count.isdigit() and int(count) >= 1:
            return f"{base}:{int(count)}", int(count)
        raise ValueError(f"mode {name!r} is invalid: {base}:N needs an integer N >= 1 (tokens drafted at most "
                         f"per round; default {DEFAULT_DRAFT_MAX})")
    raise ValueError(f"mode {name!r} is invalid: llama.cpp's tools run as llamacpp-cli-plain, "
                     f"llamacpp-cli-spec[:N] or llamacpp-cli-lookup[:N]")


def tools_dir() -> pathlib.Path:
    """Where the built tools are: ``$SPECDEC_LLAMA_CPP_TOOLS``, else the specdec cache's native build
    for this CPU's flags (``benchmarks/build_llama_cpp_tools.sh``)."""
    explicit = os.environ.get(TOOLS_ENV)
    if explicit:
        return pathlib.Path(explicit).expanduser()
    from ..cache import cache_dir

    return cache_dir() / "llama.cpp-tools" / f"native-{cpu_flags_key()}" / "bin"


def find_tool(tool: str) -> pathlib.Path:
    path = tools_dir() / tool
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ValueError(f"llama.cpp's {tool} is not in {tools_dir()}: build the tools with {BUILD_COMMAND} "
                         f"(or point ${TOOLS_ENV} at a folder that holds them)")
    return path


class LlamaCppToolMode:
    """One of llama.cpp's tools, run once per prompt on the pair's GGUF files (module docstring)."""

    def __init__(self, name: str, pair, backend: str = "llamacpp") -> None:
        self.backend = backend  # whose loaded pair names the GGUF files and threads (llamacpp or native)
        self.name, self.draft_max = parse_cli_mode(name)
        self.kind = self.name.partition(":")[0]
        self.tool = find_tool(TOOLS[self.kind])
        self.preload = flush_log_library()
        target = pair.target
        if not hasattr(target, "path") or not hasattr(target, "threads"):
            raise ValueError(f"mode {name!r} needs a GGUF target (the llamacpp or native backend)")
        if self.kind == "llamacpp-cli-spec" and getattr(pair.draft, "path", None) is None:
            raise ValueError(f"mode {name!r} needs a GGUF draft model (the pair was loaded without one)")
        self.pair = pair
        from ..loading.tokenizer import llamacpp_add_bos
        from ..native.gguf_file import GGUFFile

        self.adds_bos = llamacpp_add_bos(GGUFFile(target.path).fields)  # the tools add a BOS of their own

    def command(self, prompt_file: str, max_new_tokens: int, sampling: SamplingParams, seed: int) -> list[str]:
        """The tool's command line for one run."""
        target = self.pair.target
        n_threads, n_threads_batch = target.threads
        cmd = [str(self.tool), "-m", target.path, "-f", prompt_file, "-c", str(target.max_length + 1),
               "-t", str(n_threads), "-tb", str(n_threads_batch), "--no-escape"]
        if self.kind == "llamacpp-cli-plain":
            cmd += ["-n", str(max_new_tokens), "-no-cnv", "--no-display-prompt", "-sp", "--verbose-prompt"]
        else:
            limit = max(max_new_tokens - 1, 0 if self.kind == "llamacpp-cli-spec" else 1)
            cmd += ["-n", str(limit), "--spec-draft-n-max", str(self.draft_max)]
        if self.kind == "llamacpp-cli-spec":
            draft_threads, draft_threads_batch = self.pair.draft.threads
            cmd += ["-md", self.pair.draft.path, "-td", str(draft_threads), "-tbd", str(draft_threads_batch)]
        return cmd + sampling_flags(sampling, seed)

    def run(self, prompt_ids, max_new_tokens, sampling, seed):
        tokenizer = self.pair.tokenizer
        text, echoed = tool_prompt(tokenizer, prompt_ids, self.adds_bos)
        with tempfile.TemporaryDirectory(prefix="specdec-llamacpp-") as folder:
            prompt_file = os.path.join(folder, "prompt.txt")
            with open(prompt_file, "wb") as f:
                f.write(text.encode("utf-8") + b"\n")  # -f drops one final newline
            out, err = run_tool(self.command(prompt_file, max_new_tokens, sampling, seed), folder, self.preload)
        if self.kind == "llamacpp-cli-plain":
            perf = parse_completion_stderr(err)
            generated = completion_text(out)
            prompt_tokens, prefill = perf["prompt_tokens"], perf["prompt_seconds"]
            seconds = perf["prompt_seconds"] + perf["eval_seconds"] + perf["sampling_seconds"]
        else:
            stats = parse_speculative_stderr(err)
            generated = speculative_text(out, echoed + text.encode("utf-8"))
            prompt_tokens, prefill = stats["encoded_tokens"], stats["encoded_seconds"]
            seconds = stats["encoded_seconds"] + stats["decoded_seconds"]
        if prompt_tokens != len(prompt_ids):
            raise ValueError(f"{self.tool.name} read the prompt as {prompt_tokens} tokens, not the {len(prompt_ids)} "
                             f"of prompt_ids: its tokenization of the prompt text differs from the pair's tokenizer")
        tokens = retokenize(tokenizer, generated.decode("utf-8", errors="replace"), self.pair.eos_token_ids,
                            max_new_tokens)
        if self.kind == "llamacpp-cli-plain":
            return tokens, RunFigures(seconds=seconds, target_calls=len(tokens), prefill_seconds=prefill)
        return tokens, RunFigures(seconds=seconds, target_calls=None, drafted=stats["n_drafted"],
                                  accepted=stats["n_accept"], prefill_seconds=prefill)


def tool_prompt(tokenizer, prompt_ids, adds_bos: bool) -> tuple[str, bytes]:
    """(the prompt file's text, what the speculative tools echo before it) for ``prompt_ids``: their text,
    special tokens kept, but for a leading BOS when the tool adds its own (``adds_bos``; it echoes it)."""
    ids, echoed = list(prompt_ids), b""
    bos = getattr(tokenizer, "bos_token_id", None)
    if adds_bos and bos is not None and ids[:1] == [bos]:
        ids, echoed = ids[1:], str(tokenizer.bos_token).encode("utf-8")
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False), echoed


def sampling_flags(sampling: SamplingParams, seed: int) -> list[str]:
    """Our sampling settings as the tools' flags (temperature 0 = greedy; no repeat penalty)."""
    return ["--temp", repr(float(sampling.temperature)), "--top-k", str(sampling.top_k), "--top-p",
            repr(float(sampling.top_p)), "--min-p", repr(float(sampling.min_p)), "--sampling-seq", "tkpm",
            "--repeat-penalty", "1", "--seed", str(int(seed) % 0xFFFFFFFF)]


def flush_log_library() -> pathlib.Path:
    """The compiled ``FLUSH_LOG_SOURCE`` (module docstring), built once into the specdec cache."""
    from ..cache import cache_dir

    digest = hashlib.sha256(FLUSH_LOG_SOURCE.encode()).hexdigest()[:12]
    path = cache_dir() / "llama.cpp-tools" / f"specdec-flush-log-{digest}.so"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory(dir=path.parent) as folder:
        source, built = os.path.join(folder, "flush_log.c"), os.path.join(folder, "flush_log.so")
        pathlib.Path(source).write_text(FLUSH_LOG_SOURCE)
        try:
            done = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", built, source], capture_output=True,
                                  text=True)
        except OSError as err:
            raise ValueError(f"llama.cpp's tools run with a small library built by a C compiler, but {compiler!r} "
                             f"cannot run: {err} (set $CC)") from err
        if done.returncode != 0:
            raise ValueError(f"{compiler} could not build the log-draining library: {done.stderr.strip()[-500:]}")
        os.replace(built, path)
    return path


def run_tool(cmd: Sequence[str], cwd: str, preload: pathlib.Path | None = None) -> tuple[bytes, str]:
    """(stdout bytes, stderr text) of one tool run; RuntimeError with the tail of stderr if it fails."""
    folder = str(pathlib.Path(cmd[0]).parent)
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(p for p in (folder, os.environ.get("LD_LIBRARY_PATH")) if p))
    if preload is not None:
        env["LD_PRELOAD"] = os.pathsep.join(p for p in (str(preload), os.environ.get("LD_PRELOAD")) if p)
    env.pop("GGML_CPU_TILED_MM", None)  # specdec's own batch-invariance switch; the tools run at their defaults
    done = subprocess.run(list(cmd), capture_output=True, stdin=subprocess.DEVNULL, cwd=cwd, env=env)
    err = done.stderr.decode("utf-8", errors="replace")
    if done.returncode != 0:
        raise RuntimeError(f"{pathlib.Path(cmd[0]).name} failed (exit code {done.returncode}); the end of its "
                           f"output:\n{stderr_tail(err)}")
    return done.stdout, err


def stderr_tail(err: str) -> str:
    return "\n".join(err.rstrip().splitlines()[-STDERR_TAIL_LINES:])


def _find(pattern: str, err: str, what: str, tool: str) -> re.Match:
    match = re.search(pattern, err)
    if match is None:
        raise RuntimeError(f"{tool} printed no {what} line (is it the build of {BUILD_COMMAND}?); the end of its "
                           f"output:\n{stderr_tail(err)}")
    return match


def parse_completion_stderr(err: str) -> dict:
    """llama-completion's prompt size and its perf lines, in seconds."""
    tool = "llama-completion"
    prompt = _find(r"number of tokens in prompt = (\d+)", err, "'number of tokens in prompt'", tool)
    prompt_eval = _find(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", err, "'prompt eval time'", tool)
    evals = _find(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs", err, "'eval time'", tool)
    sampling = _find(r"sampling time =\s*([\d.]+) ms", err, "'sampling time'", tool)
    return {"prompt_tokens": int(prompt.group(1)), "prompt_seconds": float(prompt_eval.group(1)) / 1e3,
            "eval_seconds": float(evals.group(1)) / 1e3, "eval_runs": int(evals.group(2)),
            "sampling_seconds": float(sampling.group(1)) / 1e3}


def parse_speculative_stderr(err: str) -> dict:
    """llama-speculative's / llama-lookup's summary: encoded and decoded tokens and seconds, draft counts."""
    tool = "the speculative tool"
    encoded = _find(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", err, "'encoded N tokens'", tool)
    decoded = _find(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", err, "'decoded N tokens'", tool)
    out = {"encoded_tokens": int(encoded.group(1)), "encoded_seconds": float(encoded.group(2)),
           "decoded_tokens": int(decoded.group(1)), "decoded_seconds": float(decoded.group(2))}
    for key in ("n_draft", "n_predict", "n_drafted", "n_accept"):
        out[key] = int(_find(rf"\b{key}\s*=\s*(\d+)", err, f"'{key} ='", tool).group(1))
    return out


def completion_text(out: bytes) -> bytes:
    """The generated bytes of llama-completion's stdout (prompt not echoed; its closing lines removed)."""
    if not out.endswith(b"\n\n"):
        raise RuntimeError(f"llama-completion's output does not end as expected (two newlines): ...{out[-80:]!r}")
    return out[:-2].removesuffix(END_OF_TEXT)


def speculative_text(out: bytes, prompt: bytes) -> bytes:
    """The generated bytes of llama-speculative's / llama-lookup's stdout (echoed prompt and closing lines removed)."""
    head, tail = b"\n\n" + prompt, b"\n\n\n\n"
    if not out.startswith(head):
        raise ValueError(f"the tool echoed another prompt than the one given: {out[:len(head)][-80:]!r} instead of "
                         f"{head[-80:]!r}")
    if not out.endswith(tail) or len(out) < len(head) + len(tail):
        raise RuntimeError(f"the tool's output does not end as expected (four newlines): ...{out[-80:]!r}")
    return out[len(head): -len(tail)]


def retokenize(tokenizer, text: str, eos_token_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """The pair tokenizer's ids of ``text``, cut after the first end token and at ``max_new_tokens``."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    stop = set(eos_token_ids)
    end = next((i + 1 for i, t in enumerate(ids) if t in stop), len(ids))
    return ids[: min(end, max_new_tokens)]
