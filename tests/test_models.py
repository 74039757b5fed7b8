"""Backends behind the LanguageModel protocol: BigramModel and HFModel (tiny, random weights)."""

import numpy as np
import pytest
import torch
from conftest import random_table, tiny_qwen

from specdec import BigramModel, HFModel


def test_bigram_scores_rows_of_its_table(rng):
    table = random_table(rng, 5)
    model = BigramModel(table)
    model.prefill([0, 1])
    logits = model.score([3, 4])
    assert model.length == 4
    assert torch.allclose(torch.exp(logits), torch.tensor(table[[3, 4]]))
    model.trim(2)
    assert model.length == 2


def test_bigram_fit_counts_transitions():
    model = BigramModel.fit([0, 1, 0, 1, 0, 2], vocab_size=3, smoothing=0.0)
    assert model.probs[0].tolist() == pytest.approx([0, 2 / 3, 1 / 3])
    assert model.probs[1].tolist() == pytest.approx([1, 0, 0])
    assert model.probs[2].tolist() == pytest.approx([1 / 3] * 3)  # never followed: uniform
    smoothed = BigramModel.fit([0, 1], vocab_size=2, smoothing=1.0)
    assert smoothed.probs[0].tolist() == pytest.approx([1 / 3, 2 / 3])


@pytest.mark.parametrize(
    "probs, fragment",
    [(np.ones((2, 3)) / 3, "square"), (np.array([[0.5, 0.6], [0.5, 0.5]]), "row-stochastic"),
     (-np.eye(2), "row-stochastic")],
)
def test_bigram_rejects_bad_tables(probs, fragment):
    with pytest.raises(ValueError, match=fragment):
        BigramModel(probs)


def test_bigram_fit_rejects_ids_outside_vocab():
    with pytest.raises(ValueError, match=r"\[0, 2\]"):
        BigramModel.fit([0, 5], vocab_size=3)


def test_trim_refuses_lengths_outside_the_cache(rng):
    model = BigramModel(random_table(rng, 3))
    model.prefill([0, 1])
    with pytest.raises(ValueError, match=r"\[0, 2\]"):
        model.trim(3)


@pytest.fixture(scope="module")
def hf():
    return HFModel(tiny_qwen())


def test_hf_score_matches_one_full_forward(hf):
    ids = torch.randint(0, hf.vocab_size, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        full = hf.model(torch.tensor([ids])).logits[0].float()  # [12, vocab]
    hf.prefill(ids[:5])
    part = torch.cat([hf.score(ids[5:8]), hf.score(ids[8:])])
    assert hf.length == 12
    assert torch.allclose(part, full[5:], atol=1e-9)


def test_hf_trim_then_reextend_equals_fresh_forward(hf):
    ids = torch.randint(0, hf.vocab_size, (10,), generator=torch.Generator().manual_seed(2)).tolist()
    other = [(t + 1) % hf.vocab_size for t in ids[6:]]
    hf.prefill(ids[:4])
    hf.score(ids[4:6] + other)  # a round whose last drafts get rejected
    hf.trim(6)
    rescored = hf.score(ids[6:])
    with torch.no_grad():
        fresh = hf.model(torch.tensor([ids])).logits[0, 6:].float()
    assert torch.allclose(rescored, fresh, atol=1e-9)
    assert hf.length == 10


def test_hf_refuses_a_cache_that_cannot_be_trimmed(monkeypatch):
    # Recurrent-state layers report is_croppable = False; refuse before any generation.
    from transformers import DynamicCache

    monkeypatch.setattr(DynamicCache, "is_croppable", property(lambda self: False))
    with pytest.raises(ValueError, match="cannot be trimmed"):
        HFModel(tiny_qwen())


def test_row_exact_int8_rows_do_not_depend_on_each_other():
    from specdec.models.quantize import RowExactInt8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    exact = RowExactInt8Linear(linear)
    x = torch.randn(6, 64) * torch.tensor([1, 100, 0.01, 5, 1, 1])[:, None]  # very different row scales
    x[4] = 0.5  # a constant row
    together = exact(x)
    alone = torch.cat([exact(x[i : i + 1]) for i in range(6)])
    assert torch.equal(together, alone)
    assert torch.allclose(together, linear(x), rtol=0.05, atol=0.05 * linear(x).abs().max().item())


def test_row_exact_int8_packing_on_several_threads_gives_the_same_model():
    from specdec.models.quantize import int8_row_exact

    ids = torch.tensor([[3, 14, 15, 9, 2, 6]])
    one = int8_row_exact(tiny_qwen(seed=3, dtype=torch.float32), workers=1)
    two = int8_row_exact(tiny_qwen(seed=3, dtype=torch.float32), workers=2)
    with torch.no_grad():
        assert torch.equal(one(input_ids=ids).logits, two(input_ids=ids).logits)


def test_torch_dynamic_int8_couples_rows_which_is_why_targets_avoid_it():
    from specdec.models.quantize import int8_dynamic

    torch.manual_seed(0)
    model = int8_dynamic(torch.nn.Sequential(torch.nn.Linear(64, 48)))
    x = torch.randn(6, 64) * torch.tensor([1, 100, 0.01, 5, 1, 1])[:, None]
    assert not torch.equal(model(x), torch.cat([model(x[i : i + 1]) for i in range(6)]))


def test_greedy_speculative_equals_plain_with_an_int8_target():
    from specdec import SamplingParams, autoregressive_generate, speculative_generate
    from specdec.models.quantize import int8_dynamic, int8_row_exact

    target = HFModel(int8_row_exact(tiny_qwen(seed=0, dtype=torch.float32)))
    draft = HFModel(int8_dynamic(tiny_qwen(seed=1, dtype=torch.float32)))
    greedy = SamplingParams(temperature=0.0)
    plain = autoregressive_generate(target, [3, 9, 27], max_new_tokens=30, sampling=greedy)
    for gamma in (1, 3, 8):
        spec = speculative_generate(target, draft, [3, 9, 27], max_new_tokens=30, gamma=gamma, sampling=greedy)
        assert spec.tokens == plain.tokens
