"""benchmarks/perplexity.py without a real model: llama-perplexity's chunking, the NLL over each chunk's
second half on hand-made logits, the parsing of the tool's output, and ``--help``."""

import importlib.util
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "perplexity.py"


@pytest.fixture(scope="module")
def ppl():
    spec = importlib.util.spec_from_file_location("perplexity_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# llama-perplexity's lines (format strings of llama-cpp-python 0.3.36's tools/perplexity/perplexity.cpp) with the
# figures of its run in benchmarks/results/perplexity.md; other lines shortened.
SAMPLE_OUTPUT = """\
perplexity: tokenizing the input ..
perplexity: tokenization took 9.1 ms
perplexity: calculating perplexity over 4 chunks, n_ctx=512, batch_size=2048, n_seq=4
perplexity: 41.19 seconds per pass - ETA 0.68 minutes
[1]3.5791,[2]4.4636,[3]3.7379,[4]3.9181,
Final estimate: PPL = 3.9181 +/- 0.26446

llama_perf_context_print:        load time =     812.13 ms
"""
TOO_SHORT_OUTPUT = """\
perplexity: you need at least 8838 tokens to evaluate perplexity with a context of 4419
perplexity: the data file you provided tokenizes to only 4419 tokens
"""


def test_parse_final_running_and_chunks(ppl):
    assert ppl.parse_final(SAMPLE_OUTPUT) == (3.9181, 0.26446)
    assert ppl.parse_running(SAMPLE_OUTPUT) == [3.5791, 4.4636, 3.7379, 3.9181]
    assert ppl.parse_chunks(SAMPLE_OUTPUT) == (4, 512)
    assert ppl.parse_token_count(TOO_SHORT_OUTPUT) == 4419
    assert ppl.parse_token_count(SAMPLE_OUTPUT) is None
    with pytest.raises(RuntimeError, match="Final estimate"):
        ppl.parse_final(SAMPLE_OUTPUT.replace("Final estimate", "Estimate"))


def test_chunking_as_llama_perplexity(ppl):
    tokens = list(range(100, 111))  # 11 tokens
    assert ppl.chunk_tokens(tokens, 4, 2) == [[100, 101, 102, 103], [104, 105, 106, 107]]
    assert len(ppl.chunk_tokens(tokens, 4, 10)) == 2  # at most len // ctx; the tail (3 tokens) unused
    assert len(ppl.chunk_tokens(tokens, 4, -1)) == 2
    assert len(ppl.chunk_tokens(tokens, 3, -1)) == 3
    assert ppl.chunk_tokens(tokens, 4, 2, bos_id=7) == [[7, 101, 102, 103], [7, 105, 106, 107]]  # replaced, not added
    with pytest.raises(ValueError, match="at least 12"):
        ppl.chunk_tokens(tokens, 6, 1)  # llama-perplexity wants 2 x ctx tokens


def test_token_nll_known_values(ppl):
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]))
    nll = ppl.token_nll(torch.tensor(logits, dtype=torch.float32) + 3.0, [0, 2])  # shift-invariant
    assert nll == pytest.approx([math.log(2), -math.log(0.7)], rel=1e-6)
    with pytest.raises(ValueError):
        ppl.token_nll(logits, [0])


class FakeModel:
    """Logits from a position's place in its chunk: uniform over V in the first half, and in the second
    half probability p on the true next token (the rest spread evenly). Records its calls."""

    def __init__(self, vocab, p):
        self.vocab, self.p, self.calls, self.chunk = vocab, p, [], None

    def prefill(self, tokens):
        self.calls.append(("prefill", list(tokens)))
        self.length = len(tokens)

    def score(self, tokens):
        self.calls.append(("score", list(tokens)))
        rows = np.zeros((len(tokens), self.vocab))
        for j in range(len(tokens)):
            pos = self.length + j
            if pos + 1 < len(self.chunk) and pos >= len(self.chunk) // 2:
                probs = np.full(self.vocab, (1 - self.p) / (self.vocab - 1))
                probs[self.chunk[pos + 1]] = self.p
                rows[j] = np.log(probs)
        self.length += len(tokens)
        return torch.tensor(rows, dtype=torch.float32)


def test_second_half_only_and_counts(ppl):
    ctx, vocab, p = 8, 5, 0.6
    chunks = ppl.chunk_tokens([i % vocab for i in range(3 * ctx + 2)], ctx, -1)
    model = FakeModel(vocab, p)
    result = ppl.native_perplexity(_Rechunking(model, chunks), chunks)
    assert result.count == 3 * (ctx - ctx // 2 - 1)  # llama.cpp scores ctx - first - 1 tokens a chunk
    assert result.ppl == pytest.approx(1 / p, rel=1e-6)  # uniform first halves (PPL 5) not counted
    assert result.running == pytest.approx([1 / p] * 3, rel=1e-6)
    assert model.calls == [(kind, c[:4] if kind == "prefill" else c[4:]) for c in chunks
                           for kind in ("prefill", "score")]  # each chunk: prefill (a fresh cache), then score


class _Rechunking:
    """Tells the fake model which chunk it is reading (a real model only sees the tokens)."""

    def __init__(self, model, chunks):
        self.model, self.chunks = model, iter(chunks)

    def prefill(self, tokens):
        self.model.chunk = next(self.chunks)
        self.model.prefill(tokens)

    def score(self, tokens):
        return self.model.score(tokens)


def test_summary_matches_llama_formula(ppl):
    nlls = [np.array([1.0, 2.0]), np.array([3.0])]
    result = ppl.summarize(nlls)
    mean, mean2 = 2.0, (1 + 4 + 9) / 3
    assert result.ppl == pytest.approx(math.exp(2.0))
    assert result.error == pytest.approx(math.exp(2.0) * math.sqrt((mean2 - mean * mean) / 2))
    assert result.running == pytest.approx([math.exp(1.5), math.exp(2.0)])
    assert ppl.relative_difference(10.1, 10.0) == pytest.approx(0.01)


def test_tool_command_and_its_kv_cache_flags(ppl):
    base = ["llama-perplexity", "-m", "m.gguf", "-f", "t.txt", "-c", "512", "--chunks", "4", "-t", "2"]
    assert ppl.tool_command("llama-perplexity", "m.gguf", "t.txt", 512, 4, 2) == base  # the tool's defaults
    f32 = ppl.tool_command("llama-perplexity", "m.gguf", "t.txt", 512, 4, 2, kv_cache="f32")
    assert f32 == [*base, "-ctk", "f32", "-ctv", "f32", "-fa", "off"]  # float32 keys and values, as ours
    with pytest.raises(ValueError, match="kv_cache='q8_0' is invalid: choose one of f16, f32"):
        ppl.tool_command("llama-perplexity", "m.gguf", "t.txt", 512, 4, 2, kv_cache="q8_0")


def test_read_text_drops_one_final_newline(ppl, tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes("a\u00e9\n\n".encode())
    assert ppl.read_text(path) == "a\u00e9\n"


def test_help_runs():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "llama-perplexity" in done.stdout and "--tolerance" in done.stdout and "second half" in done.stdout
    assert "--kv-cache {f16,f32}" in done.stdout
