"""HFModel.score_many: several sequences' rows in one padded forward pass, against each scored alone.

Padding changes the matrix products' shapes, so the logits agree to float64 rounding (1e-9), not bit for bit;
on the CPU the server keeps scoring requests in turn (``abilities.batch_scores`` False). With it forced on, served
greedy requests still equal their runs alone token for token.
"""

import dataclasses

import pytest
import torch
from conftest import tiny_qwen

from specdec import HFModel


@pytest.fixture(scope="module")
def model():
    return HFModel(tiny_qwen(seed=0))


def states_of(model, prompts):
    states = []
    for prompt in prompts:
        model.prefill(prompt)
        states.append(model.state())
    return states


@pytest.mark.parametrize("lengths", [[(5, 3), (17, 1), (9, 5)], [(1, 4), (30, 2)], [(12, 0), (3, 3), (0, 0)]])
def test_score_many_equals_each_sequence_scored_alone(model, lengths):
    gen = torch.Generator().manual_seed(sum(n for n, _ in lengths))
    prompts = [torch.randint(0, 96, (n,), generator=gen).tolist() for n, _ in lengths]
    tokens = [torch.randint(0, 96, (k,), generator=gen).tolist() for _, k in lengths]
    batched, new_states = model.score_many(states_of(model, prompts), tokens)
    for prompt, toks, rows, state in zip(prompts, tokens, batched, new_states, strict=True):
        model.prefill(prompt)
        alone = model.score(toks) if toks else torch.zeros(0, model.vocab_size)
        assert rows.shape == alone.shape
        torch.testing.assert_close(rows, alone, rtol=0, atol=1e-9)
        assert state[1] == len(prompt) + len(toks)
        # the new state continues as the sequence alone does
        nxt = [7, 11]
        model.restore(state)
        after_batch = model.score(nxt)
        model.prefill(prompt + toks)
        torch.testing.assert_close(after_batch, model.score(nxt), rtol=0, atol=1e-9)


def test_score_many_leaves_the_inputs_and_the_model_state_alone(model):
    states = states_of(model, [[1, 2, 3], [4, 5]])
    model.prefill([9, 9, 9, 9])
    before = [s[0].layers[0].keys.clone() for s in states]
    model.score_many(states, [[6], [7, 8]])
    assert model.length == 4
    assert all(torch.equal(s[0].layers[0].keys, b) for s, b in zip(states, before, strict=True))
    with pytest.raises(ValueError, match="one token list per state"):
        model.score_many(states, [[1]])


class HFPair:
    """Two tiny random Qwen2 models (transformers), ids as text."""

    def __init__(self) -> None:
        self.target, self.draft = HFModel(tiny_qwen(seed=0)), HFModel(tiny_qwen(seed=1))
        self.eos_token_ids: list[int] = []
        self.has_chat_template = False

    def encode(self, text: str, chat: bool = False) -> list[int]:
        return [ord(ch) % 96 for ch in text]

    def decode(self, ids) -> str:
        return "".join(chr(65 + int(i) % 26) for i in ids)


@pytest.mark.parametrize("batched", [True, False])
def test_served_greedy_requests_equal_alone_with_and_without_one_forward_pass(batched):
    from test_batched_engine import alone, batch_sizes, through_engine

    from specdec import SamplingParams
    from specdec.session import RunSettings

    pair = HFPair()
    assert not pair.target.abilities.batch_scores  # on the CPU: turns, unless asked
    for model in (pair.target, pair.draft):
        model.abilities = dataclasses.replace(model.abilities, batch_scores=batched)
    calls = []
    real = pair.target.score_many
    pair.target.score_many = lambda states, tokens: calls.append(len(states)) or real(states, tokens)
    requests = [[1, 2, 3, 4], [5, 6], [7, 8, 9, 10, 11, 12], [13] * 9]
    settings = RunSettings(gamma=3, max_new_tokens=16, sampling=SamplingParams(temperature=0), draft="model")
    got, metrics = through_engine(pair, requests, lambda i: settings)
    assert got == [alone(HFPair(), ids, settings) for ids in requests]
    assert batch_sizes(metrics) > 1.5  # several requests per target call
    assert (max(calls, default=0) > 1) == batched  # one forward pass held several requests only when asked
