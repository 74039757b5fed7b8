"""Standardized sampling: each setting as a transform logits → probabilities (spec §2.2)."""

import math
import re

import pytest
import torch

from specdec import SamplingParams, probs_from_logits


def logits_of(probs):
    return torch.log(torch.tensor(probs, dtype=torch.float64))


def test_temperature_one_is_softmax():
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0], dtype=torch.float64)
    assert torch.allclose(probs_from_logits(logits, SamplingParams()), torch.softmax(logits, -1))


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    out = probs_from_logits(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(out, torch.softmax(logits * 2, -1))


def test_greedy_is_one_hot_with_ties_to_lowest_id():
    logits = torch.tensor([[0.1, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    out = probs_from_logits(logits, SamplingParams(temperature=0.0))
    assert out.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


def test_top_k_keeps_exactly_k_and_breaks_ties_by_lowest_id():
    probs = [0.3, 0.2, 0.2, 0.2, 0.1]
    out = probs_from_logits(logits_of(probs), SamplingParams(top_k=2))
    assert torch.allclose(out, torch.tensor([0.6, 0.4, 0, 0, 0], dtype=torch.float64))


def test_top_p_is_smallest_set_reaching_p():
    probs = [0.5, 0.3, 0.15, 0.05]
    # 0.5 < 0.79, 0.5 + 0.3 = 0.8 reaches 0.79: the nucleus is {0, 1}.
    out = probs_from_logits(logits_of(probs), SamplingParams(top_p=0.79))
    assert torch.allclose(out, torch.tensor([0.625, 0.375, 0, 0], dtype=torch.float64))
    # 0.81 needs the third token.
    out = probs_from_logits(logits_of(probs), SamplingParams(top_p=0.81))
    assert torch.allclose(out, torch.tensor([0.5, 0.3, 0.15, 0], dtype=torch.float64) / 0.95)
    # The most likely token always survives.
    out = probs_from_logits(logits_of(probs), SamplingParams(top_p=0.01))
    assert out.tolist() == [1, 0, 0, 0]


def test_min_p_keeps_tokens_relative_to_the_best():
    probs = [0.5, 0.3, 0.15, 0.05]
    out = probs_from_logits(logits_of(probs), SamplingParams(min_p=0.3))  # threshold 0.15
    assert torch.allclose(out, torch.tensor([0.5, 0.3, 0.15, 0], dtype=torch.float64) / 0.95)


def test_filters_apply_in_order_temperature_topk_topp_minp():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0], dtype=torch.float64)
    params = SamplingParams(temperature=0.7, top_k=4, top_p=0.9, min_p=0.2)
    # Reference, step by step.
    z = logits / 0.7
    z[4] = -math.inf  # top-k 4
    p = torch.softmax(z, -1)
    order = torch.argsort(p, descending=True)
    cum = torch.cumsum(p[order], 0) - p[order]
    keep = torch.zeros(5, dtype=torch.bool)
    keep[order[cum < 0.9]] = True
    p = torch.where(keep, p, 0) / p[keep].sum()
    p = torch.where(p >= 0.2 * p.max(), p, 0)
    p = p / p.sum()
    assert torch.allclose(probs_from_logits(logits, params), p)


def test_zero_probability_logits_stay_zero():
    out = probs_from_logits(logits_of([0.5, 0.0, 0.5]), SamplingParams(temperature=0.7, top_p=0.9))
    assert out[1] == 0 and torch.isclose(out.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_batched_rows_are_independent():
    logits = torch.randn(3, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, min_p=0.05)
    batched = probs_from_logits(logits, params)
    for i in range(3):
        assert torch.allclose(batched[i], probs_from_logits(logits[i], params))


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"temperature": -0.5}, "temperature=-0.5"),
        ({"temperature": float("nan")}, "temperature=nan"),
        ({"top_k": -1}, "top_k=-1"),
        ({"top_k": 2.5}, "top_k=2.5"),
        ({"top_p": 0.0}, "top_p=0.0"),
        ({"top_p": 1.5}, "(0, 1]"),
        ({"min_p": 1.0}, "[0, 1)"),
        ({"min_p": -0.1}, "min_p=-0.1"),
    ],
)
def test_bad_settings_raise_naming_value_and_range(kwargs, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        SamplingParams(**kwargs)


# ----------------------------------------------------------------------------- tiny temperatures

FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def test_float32_softmax_fails_just_below_the_overflow_limit_and_not_at_the_greedy_threshold():
    # What the threshold guards against, shown on the raw computation the sampler would do.
    logits = torch.tensor([40.0, 39.0, 0.0])
    limit = 40.0 / FLOAT32_MAX  # 1.2e-37: below it, 40 / T is +inf
    assert torch.isnan(torch.softmax(logits / (limit * 0.9), -1)).all()
    assert torch.isfinite(torch.softmax(logits / (limit * 1.1), -1)).all()
    # At the threshold, even logits of ±1e4 divide to finite values and a proper distribution.
    from specdec.sampling import GREEDY_BELOW

    big = torch.tensor([1e4, -1e4, 9_999.0])
    probs = torch.softmax(big / GREEDY_BELOW, -1)
    assert torch.isfinite(probs).all() and probs.sum() == 1


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-40, 1e-38, 1e-37, 1e-20, 9.999e-6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_temperature_below_the_threshold_is_greedy(temperature, dtype):
    logits = torch.tensor([[0.5, 40.0, 39.9999, -3.0], [-1.2, -0.8, -float("inf"), -2.0]], dtype=dtype)
    params = SamplingParams(temperature=temperature)
    assert params.greedy
    assert torch.equal(probs_from_logits(logits, params), probs_from_logits(logits, SamplingParams(temperature=0.0)))


def test_the_threshold_itself_still_samples():
    from specdec.sampling import GREEDY_BELOW

    params = SamplingParams(temperature=GREEDY_BELOW)
    assert not params.greedy
    out = probs_from_logits(torch.tensor([0.0, GREEDY_BELOW], dtype=torch.float64), params)
    assert torch.allclose(out, torch.softmax(torch.tensor([0.0, 1.0], dtype=torch.float64), -1))


@pytest.mark.parametrize("logits", [[0.0, float("nan"), 1.0], [0.0, float("inf"), 1.0], [-float("inf")] * 3])
def test_a_row_that_is_not_finite_is_refused_not_drawn_from(logits):
    with pytest.raises(FloatingPointError, match="temperature=0.7"):
        probs_from_logits(torch.tensor(logits), SamplingParams(temperature=0.7))


@pytest.mark.parametrize("temperature", [1e-310, 1e-40, 1e-6, 1e-5, 0.3, 1.0, 4.0])
def test_no_token_of_probability_zero_is_ever_drawn(temperature):
    """The toy pair's target gives most word pairs probability 0: no generated pair may be one."""
    from specdec.decode import speculative_generate
    from specdec.models.toy import TOY_TARGET, ToyPair

    pair = ToyPair()
    out = speculative_generate(pair.target, pair.draft, [0], max_new_tokens=60, gamma=3,
                               sampling=SamplingParams(temperature=temperature), seed=1)
    sequence = [0, *out.tokens]
    assert len(out.tokens) == 60
    assert all(TOY_TARGET[a, b] > 0 for a, b in zip(sequence, sequence[1:], strict=False))
    if temperature < 1e-5:  # greedy: the same tokens as temperature 0
        greedy = speculative_generate(ToyPair().target, ToyPair().draft, [0], max_new_tokens=60, gamma=3,
                                      sampling=SamplingParams(temperature=0.0), seed=1)
        assert out.tokens == greedy.tokens
