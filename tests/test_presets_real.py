"""The files users download: the real default target re-quantized into each llama-quantize preset (issue 28).

Each preset's file is written by llama.cpp's own quantizer (llama-cpp-python's ``llama_model_quantize``, from the
shipped Q4_K_M file with ``allow_requantize``: ``benchmarks/presets.py``'s ``requantize``, kept in specdec's cache
for the next run) and then, for each:

1. every tensor is read by a kernel: the model loads with de-quantization refused;
2. its perplexity on the committed text (``tests/data/gemma3-perplexity-text.md``, 2 chunks of 256 tokens, the
   second halves scored, as llama-perplexity computes it: ``benchmarks/perplexity.py``) is within 1% of
   llama.cpp's on the same file and the same tokens (llama-cpp-python's vendored llama.cpp, float32 KV cache);
3. greedy speculative decoding (prompt lookup) equals greedy plain decoding token for token.

Slow (about a minute a preset on 2 cores, most of it the quantizer on a fresh machine).
"""

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

from specdec import (
    NativeModel,
    NativeSettings,
    PromptLookupDrafter,
    SamplingParams,
    autoregressive_generate,
    speculative_generate,
)
from specdec.loading.defaults import default_paths

pytestmark = pytest.mark.slow
llama_cpp = pytest.importorskip("llama_cpp")

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXT = ROOT / "tests" / "data" / "gemma3-perplexity-text.md"
PRESETS = ["Q2_K", "Q3_K_M", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS", "F16", "BF16"]
CTX, CHUNKS, THREADS, TOLERANCE, NEW_TOKENS = 256, 2, 2, 0.01, 24
PROMPT = ("def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n\n\n"
          "# The same function with `total` renamed to `acc`:\ndef mean(xs):\n")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    sys.path.insert(0, str(ROOT / "benchmarks"))  # presets.py imports servers.py beside it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


@pytest.fixture(scope="module")
def ppl():
    return _script("perplexity")


@pytest.fixture(scope="module")
def source() -> str:
    return str(default_paths(progress=False)[0])


@pytest.fixture(scope="module")
def tokenizer(source):
    from specdec.loading.tokenizer import gguf_tokenizer

    return gguf_tokenizer(source)


@pytest.fixture(scope="module")
def chunks(ppl, tokenizer):
    tokens = tokenizer.encode(ppl.read_text(TEXT), add_special_tokens=False)  # Qwen's file adds no BOS
    out = ppl.chunk_tokens(tokens, CTX, CHUNKS)
    assert len(out) == CHUNKS
    return out


def llama_cpp_perplexity(ppl, path: str, chunks) -> float:
    theirs = llama_cpp.Llama(model_path=path, n_ctx=CTX, n_batch=CTX, n_threads=THREADS, logits_all=True,
                             verbose=False, type_k=0, type_v=0)  # float32 keys and values, as ours
    nlls = []
    for chunk in chunks:
        theirs.reset()
        theirs.eval(chunk)
        logits = np.array(theirs.scores[CTX // 2: CTX - 1], dtype=np.float64)  # predicting tokens first+1 ..
        nlls.append(ppl.chunk_nll(chunk, logits))
    del theirs
    return ppl.summarize(nlls).ppl


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_reads_natively_matches_llama_cpp_and_decodes_exactly(preset, ppl, source, tokenizer, chunks):
    path = _script("presets").requantize(source, preset)
    model = NativeModel(path, NativeSettings(threads=THREADS), tokenizer=tokenizer)  # refuses a float32 copy
    ours = ppl.native_perplexity(model, chunks).ppl
    theirs = llama_cpp_perplexity(ppl, path, chunks)
    assert 1.0 < ours < 100.0, (preset, ours)
    assert abs(ours / theirs - 1) <= TOLERANCE, f"{preset}: ours {ours:.4f}, llama.cpp {theirs:.4f}"
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    greedy = SamplingParams(temperature=0.0)
    plain = autoregressive_generate(model, ids, max_new_tokens=NEW_TOKENS, sampling=greedy)
    spec = speculative_generate(model, PromptLookupDrafter(model.vocab_size), ids, max_new_tokens=NEW_TOKENS, gamma=4,
                                sampling=greedy)
    assert spec.tokens == plain.tokens, preset
    assert spec.stats.accepted > 0, "prompt lookup never drafted a kept token: the exactness check checked nothing"
