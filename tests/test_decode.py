"""The decode loops: greedy equality, invariants of the statistics, EOS, budgets, bad input."""

import numpy as np
import pytest
import torch
from conftest import random_table, tiny_qwen

from specdec import BigramModel, HFModel, SamplingParams, autoregressive_generate, speculative_generate

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def bigram_pair():
    rng = np.random.default_rng(7)
    target = random_table(rng, 12, concentration=0.3)
    draft = 0.6 * target + 0.4 * random_table(rng, 12, concentration=0.3)
    return BigramModel(target), BigramModel(draft)


@pytest.fixture(scope="module")
def hf_pair():
    return HFModel(tiny_qwen(seed=0)), HFModel(tiny_qwen(seed=1))


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_speculative_equals_greedy_plain_on_bigrams(bigram_pair, gamma):
    target, draft = bigram_pair
    for prompt in ([0], [3, 5, 1], [11]):
        plain = autoregressive_generate(target, prompt, max_new_tokens=40, sampling=GREEDY)
        spec = speculative_generate(target, draft, prompt, max_new_tokens=40, gamma=gamma, sampling=GREEDY)
        assert spec.tokens == plain.tokens


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_speculative_equals_greedy_plain_on_a_transformer(hf_pair, gamma):
    target, draft = hf_pair
    prompt = [5, 17, 42, 8, 60]
    plain = autoregressive_generate(target, prompt, max_new_tokens=30, sampling=GREEDY)
    spec = speculative_generate(target, draft, prompt, max_new_tokens=30, gamma=gamma, sampling=GREEDY)
    assert spec.tokens == plain.tokens
    assert spec.stats.target_calls < plain.stats.target_calls or spec.stats.accepted == 0


def test_a_transformer_draft_identical_to_the_target_accepts_everything(hf_pair):
    target, _ = hf_pair
    twin = HFModel(target.model)
    gen = speculative_generate(target, twin, [1, 2, 3], max_new_tokens=24, gamma=5, sampling=SamplingParams(), seed=3)
    assert gen.stats.accepted == gen.stats.drafted
    assert gen.stats.tokens_per_target_call == pytest.approx(6.0)  # γ + 1, 24 tokens in 4 calls


@pytest.mark.parametrize("gamma", [1, 4])
def test_identical_draft_yields_gamma_plus_one_tokens_per_call(bigram_pair, gamma):
    target, _ = bigram_pair
    twin = BigramModel(target.probs.numpy())
    new = 10 * (gamma + 1)
    gen = speculative_generate(target, twin, [0], max_new_tokens=new, gamma=gamma, seed=1)
    assert gen.stats.acceptance_rate == 1.0
    assert gen.stats.alpha == pytest.approx(1.0)
    assert gen.stats.target_calls == 10
    assert gen.stats.tokens_per_target_call == gamma + 1
    assert all(r.kind == "bonus" for r in gen.stats.records)


def test_stats_are_consistent(bigram_pair):
    target, draft = bigram_pair
    gen = speculative_generate(target, draft, [2], max_new_tokens=50, gamma=4, seed=5)
    s = gen.stats
    assert len(gen.tokens) == s.new_tokens == 50
    assert s.rounds == s.target_calls == len(s.records)
    assert s.drafted == sum(len(r.drafted) for r in s.records)
    assert s.accepted == sum(r.n_accepted for r in s.records)
    assert s.draft_calls == s.drafted
    assert [t for r in s.records for t in r.tokens][:50] == gen.tokens
    assert 0 < s.alpha < 1 and 0 <= s.acceptance_rate <= 1
    assert s.total_seconds >= s.draft_seconds + s.target_seconds
    for r in s.records:
        assert (r.kind == "bonus") == (r.n_accepted == len(r.drafted))


def test_seed_makes_runs_reproducible(bigram_pair):
    target, draft = bigram_pair
    runs = [speculative_generate(target, draft, [1], max_new_tokens=30, gamma=3, seed=42).tokens for _ in range(2)]
    assert runs[0] == runs[1]
    other = speculative_generate(target, draft, [1], max_new_tokens=30, gamma=3, seed=43).tokens
    assert other != runs[0]


def test_generation_stops_after_eos(bigram_pair):
    target, draft = bigram_pair
    full = speculative_generate(target, draft, [4], max_new_tokens=60, gamma=3, seed=9).tokens
    eos = full[20]
    cut = full.index(eos)
    for gen in (
        speculative_generate(target, draft, [4], max_new_tokens=60, gamma=3, seed=9, eos_token_id=eos),
        speculative_generate(target, draft, [4], max_new_tokens=60, gamma=3, seed=9, eos_token_id=[eos, 10_000]),
    ):
        assert gen.tokens == full[: cut + 1]
    plain = autoregressive_generate(target, [4], max_new_tokens=60, sampling=GREEDY)
    eos = plain.tokens[5]
    stopped = autoregressive_generate(target, [4], max_new_tokens=60, sampling=GREEDY, eos_token_id=eos)
    assert stopped.tokens == plain.tokens[: plain.tokens.index(eos) + 1]


@pytest.mark.parametrize("n", [1, 2, 7, 13])
def test_exactly_max_new_tokens(bigram_pair, n):
    target, draft = bigram_pair
    assert len(speculative_generate(target, draft, [0], max_new_tokens=n, gamma=5, seed=0).tokens) == n
    assert len(autoregressive_generate(target, [0], max_new_tokens=n, seed=0).tokens) == n


def test_on_round_streams_every_token(bigram_pair):
    target, draft = bigram_pair
    streamed = []
    gen = speculative_generate(target, draft, [0], max_new_tokens=25, gamma=3, seed=2,
                               on_round=lambda rec, toks: streamed.extend(toks))
    assert streamed == gen.tokens


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"prompt": []}, "prompt is empty"),
        ({"gamma": 0}, "gamma=0"),
        ({"gamma": -2}, ">= 1"),
        ({"prompt": [12]}, r"prompt token 12 is outside the target's vocabulary: ids must be in \[0, 11\]"),
        ({"prompt": [-1]}, "prompt token -1"),
        ({"max_new_tokens": 0}, "max_new_tokens=0"),
    ],
)
def test_bad_input_raises_before_any_work(bigram_pair, kwargs, fragment):
    target, draft = bigram_pair
    args = {"prompt": [0], "max_new_tokens": 5, "gamma": 2} | kwargs
    with pytest.raises(ValueError, match=fragment):
        speculative_generate(target, draft, args.pop("prompt"), **args)


def test_different_vocabularies_are_refused(bigram_pair):
    target, _ = bigram_pair
    small = BigramModel(np.full((5, 5), 0.2))
    with pytest.raises(ValueError, match="target has 12 tokens, draft 5"):
        speculative_generate(target, small, [0], max_new_tokens=5, gamma=2)


def test_prompt_longer_than_the_context_is_refused(hf_pair):
    target, draft = hf_pair
    with pytest.raises(ValueError, match="context of 256 tokens"):
        speculative_generate(target, draft, [1] * 300, max_new_tokens=5, gamma=2)
    with pytest.raises(ValueError, match="context of 256 tokens"):
        autoregressive_generate(target, [1] * 250, max_new_tokens=10)


def test_bad_sampling_values_are_refused_when_built():
    with pytest.raises(ValueError, match="temperature=-1"):
        SamplingParams(temperature=-1)


def test_sampled_speculative_output_on_a_transformer_runs_and_is_reproducible(hf_pair):
    target, draft = hf_pair
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.95, min_p=0.01)
    a = speculative_generate(target, draft, [3, 4], max_new_tokens=20, gamma=3, sampling=params, seed=11)
    b = speculative_generate(target, draft, [3, 4], max_new_tokens=20, gamma=3, sampling=params, seed=11)
    assert a.tokens == b.tokens and len(a.tokens) == 20
    assert torch.tensor(a.tokens).max() < target.vocab_size
