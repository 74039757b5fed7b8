"""A long prompt's first token from the target alone, before the draft reads (``decode.FIRST_TOKEN_ALONE_FROM``).

The first round is then a γ 0 round (the target's own draw) and the draft reads the prompt and that token
after it; every later round is as before. Exactness: a sequence-level chi-square test of whole outputs against
their exact probabilities (the bigram pair of ``test_exactness``, 12,000 seeded runs, false alarm 1e-3), and
greedy output equal to plain decoding token for token.
"""

import numpy as np
import pytest
import torch
from test_exactness import FALSE_ALARM, NEW_TOKENS, PROMPT, chi_square_pvalue, exact_distribution, models

from specdec import (
    BigramModel,
    ModelDrafter,
    PromptLookupDrafter,
    SamplingParams,
    autoregressive_generate,
    speculative_generate,
)
from specdec.decode import FIRST_TOKEN_ALONE_FROM, SpeculativeRun

RUNS = 12_000


def run_to_end(run: SpeculativeRun) -> SpeculativeRun:
    run.start()
    while not run.done:
        run.step()
    return run


def test_sequences_keep_the_target_distribution_when_the_first_token_comes_alone():
    torch.set_num_threads(1)
    target, draft_model = models()
    sampling = SamplingParams(temperature=1.0)
    counts: dict = {}
    for seed in range(RUNS):
        run = run_to_end(SpeculativeRun(target, ModelDrafter(draft_model), PROMPT, max_new_tokens=NEW_TOKENS,
                                        gamma=2, sampling=sampling, seed=seed, first_token_alone_from=1))
        assert run.records[0].drafted == ()  # the first round: the target alone
        key = tuple(run.new_tokens)
        counts[key] = counts.get(key, 0) + 1
    assert chi_square_pvalue(counts, exact_distribution(target, sampling, NEW_TOKENS), RUNS) > FALSE_ALARM


class CountingDrafter(ModelDrafter):
    def __init__(self, model):
        super().__init__(model)
        self.begun_with: list[int] | None = None

    def begin(self, prompt):
        self.begun_with = list(prompt)
        super().begin(prompt)


def test_a_long_prompt_gets_its_first_token_before_the_draft_reads_and_greedy_equals_plain():
    rng = np.random.default_rng(3)
    target, draft = (BigramModel(rng.dirichlet(np.ones(16), size=16)) for _ in range(2))
    prompt = [int(t) for t in rng.integers(0, 16, FIRST_TOKEN_ALONE_FROM)]
    drafter = CountingDrafter(draft)
    run = SpeculativeRun(target, drafter, prompt, max_new_tokens=40, gamma=3, sampling=SamplingParams(temperature=0))
    run.start()
    assert run.first_token_alone and drafter.begun_with is None  # the prompt read: only the target's
    first = run.step()
    assert len(first) == 1 and drafter.begun_with is None and run.records[0].drafted == ()
    run.step()
    assert drafter.begun_with == prompt + first  # the draft reads the prompt and the first token
    assert len(run.records[1].drafted) == 3
    while not run.done:
        run.step()
    plain = autoregressive_generate(target, prompt, max_new_tokens=40, sampling=SamplingParams(temperature=0))
    assert run.new_tokens == plain.tokens
    assert speculative_generate(target, draft, prompt, max_new_tokens=40, gamma=3,
                                sampling=SamplingParams(temperature=0)).tokens == plain.tokens


@pytest.mark.parametrize("length", [FIRST_TOKEN_ALONE_FROM - 1, 2])
def test_a_short_prompt_drafts_from_the_first_round(length):
    target, draft = models()
    run = SpeculativeRun(target, ModelDrafter(draft), [1] * length, max_new_tokens=4, gamma=2)
    run_to_end(run)
    assert not run.first_token_alone and len(run.records[0].drafted) > 0


def test_a_drafter_without_a_model_drafts_from_the_first_round():
    target, _ = models()
    run = SpeculativeRun(target, PromptLookupDrafter(target.vocab_size), [1, 2, 3] * 300, max_new_tokens=4, gamma=2)
    assert not run.first_token_alone


def test_long_prompts_through_the_engine_equal_alone_draw_for_draw():
    from test_batched_engine import alone, through_engine

    from specdec.models.toy import ToyPair
    from specdec.session import RunSettings

    pair = ToyPair()
    rng = np.random.default_rng(5)
    requests = [[int(t) for t in rng.integers(0, 8, FIRST_TOKEN_ALONE_FROM + 40 * i)] for i in range(3)]
    requests.append([1, 2, 3])  # a short one among them

    def settings_of(i):
        return RunSettings(gamma=2 + i % 2, max_new_tokens=16, sampling=SamplingParams(temperature=1.0),
                           seed=7 + i, draft="model")

    from specdec.server.engine.runs import SequenceRun

    assert SequenceRun(ToyPair(), requests[0], settings_of(0)).first_token_alone
    got, _ = through_engine(pair, requests, settings_of, stagger=0.005)
    assert got == [alone(ToyPair(), ids, settings_of(i)) for i, ids in enumerate(requests)]
