"""End to end on the real default pair (Qwen2.5-Coder 1.5B target, 0.5B draft, from PyPI parts).

The first run assembles and converts the GGUF files (minutes); later runs load from the cache.
Skipped only when the default-models extra is not installed and SPECDEC_REQUIRE_REAL is unset
(scripts/test.sh sets it, so CI cannot skip these silently).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from specdec import SamplingParams, autoregressive_generate, speculative_generate
from specdec.loading import defaults as zoo

pytestmark = pytest.mark.slow

if zoo.missing_packages(zoo.DEFAULT_TARGET) or zoo.missing_packages(zoo.DEFAULT_DRAFT):
    if os.environ.get("SPECDEC_REQUIRE_REAL"):
        raise RuntimeError("SPECDEC_REQUIRE_REAL is set but specdec[default-models] is not installed")
    pytest.skip("specdec[default-models] not installed", allow_module_level=True)

PROMPT = "Write a Python function that reverses a string."


@pytest.fixture(scope="module", params=["native", "transformers"])
def pair(request):
    """The default pair on the default backend (native) and on the reference path (transformers)."""
    from specdec import session

    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    loaded = session.load(session.LoadSettings(backend=request.param))
    assert loaded.backend == request.param
    yield loaded
    torch.set_num_threads(threads)


def test_pair_shares_one_tokenizer_and_has_a_chat_template(pair):
    assert pair.target.vocab_size == pair.draft.vocab_size == 151936
    assert pair.has_chat_template
    assert 151645 in pair.eos_token_ids  # <|im_end|>


def test_greedy_speculative_equals_plain_decoding_on_the_real_pair(pair):
    ids = pair.encode(PROMPT, chat=True)
    greedy = SamplingParams(temperature=0.0)
    plain = autoregressive_generate(pair.target, ids, max_new_tokens=32, sampling=greedy,
                                    eos_token_id=pair.eos_token_ids)
    spec = speculative_generate(pair.target, pair.draft, ids, max_new_tokens=32, gamma=4, sampling=greedy,
                                eos_token_id=pair.eos_token_ids)
    assert spec.tokens == plain.tokens
    assert "def" in pair.decode(spec.tokens)
    assert spec.stats.tokens_per_target_call > 1.5  # the 0.5B draft agrees often on code


def test_the_librarys_default_cuts_the_draft_head_as_the_clis_does(pair):
    """``LoadSettings()`` cuts the draft's head to the DEFAULT_DRAFT_HEAD most frequent tokens plus the special
    ones, as the CLI's default does: finite logits there, -inf (q zero) elsewhere; the target's head is whole."""
    from specdec.loading.settings import DEFAULT_DRAFT_HEAD

    ids = pair.encode(PROMPT, chat=True)
    rows = []
    for model in (pair.draft, pair.target):
        model.prefill(ids[:-1])
        rows.append(model.score(ids[-1:])[-1])  # [vocab]
    kept = int(torch.isfinite(rows[0]).sum())
    assert DEFAULT_DRAFT_HEAD <= kept <= DEFAULT_DRAFT_HEAD + 64 and bool(torch.isfinite(rows[1]).all())


def test_cli_json_fields_are_present_and_consistent():
    cmd = [sys.executable, "-m", "specdec", "generate", PROMPT, "--max-new-tokens", "24", "--compare", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)
    for key in ("text", "new_tokens", "tokens_per_second", "target_calls", "tokens_per_target_call",
                "acceptance_rate", "alpha", "gamma", "baseline_tokens_per_second", "speedup", "identical_to_baseline"):
        assert key in data, key
    assert data["new_tokens"] / data["target_calls"] == pytest.approx(data["tokens_per_target_call"])
    assert data["speedup"] == pytest.approx(data["tokens_per_second"] / data["baseline_tokens_per_second"])
    assert data["identical_to_baseline"] is True
    assert 0 < data["alpha"] <= 1 and 0 <= data["acceptance_rate"] <= 1
    assert data["gamma"] == "auto" and data["new_tokens"] <= 24  # the default: γ chosen each round
    assert data["backend"] == "native"  # the default backend for GGUF files on a CPU
    assert sum(data["gamma_histogram"].values()) == data["target_calls"]


def test_cli_refuses_bad_values_before_loading_anything():
    cmd = [sys.executable, "-m", "specdec", "generate", "x", "--top-p", "1.5"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "top_p=1.5" in out.stderr and "(0, 1]" in out.stderr
    assert "loading" not in out.stderr
