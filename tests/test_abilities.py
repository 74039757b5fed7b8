"""Every backend's declared abilities (``specdec.models.base.Abilities``) are what it offers, and do what they say.

The engine reads ``model.abilities`` and never probes for methods, so a backend that declares an ability must
implement its Protocol and its behaviour, and one that offers a Protocol must declare it (else the engine would
serve it worse than it can, silently). Per ability:

- ``switch_state``: a sequence's state saved, another sequence run, the state restored: the next logits are
  bit for bit those of the sequence run alone;
- ``score_many``: several sequences' rows in one call equal each scored alone (bitwise where ``batch_scores``
  holds on this device; to 1e-9 in float64 for a padded pass), the model's own current state untouched;
- ``read_prefix``: ``prefill`` returns the tokens taken from the prefix cache, and reading through the three
  verbs gives the bits a plain read gives.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_qwen
from tiny_qwen2 import VOCAB, write_tiny_qwen2

from specdec.models.base import ABILITY_PROTOCOLS, NO_ABILITIES, Abilities, LanguageModel
from specdec.models.bigram import BigramModel
from specdec.models.hf import HFModel
from specdec.models.native import NativeModel, NativeSettings
from specdec.models.ngram import NgramModel
from specdec.models.prefix import PrefixCache
from specdec.models.recording import RecordingModel


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return write_tiny_qwen2(tmp_path_factory.mktemp("abilities") / "tiny.gguf", seed=3)


def _bigram():
    rng = np.random.default_rng(0)
    table = rng.dirichlet(np.ones(VOCAB), size=VOCAB)
    return BigramModel(table)


def _llamacpp(tmp_path_factory):
    llamacpp = pytest.importorskip("specdec.models.llamacpp")
    if not llamacpp.available():
        pytest.skip("llama-cpp-python not installed")
    from tiny_gguf import write_tiny_llama

    path = write_tiny_llama(tmp_path_factory.mktemp("abilities-llama") / "tiny.gguf", vocab=16)
    return llamacpp.LlamaCppModel(path, llamacpp.LlamaCppSettings(n_threads=1, batch_invariant=True))


BACKENDS = ["native", "transformers", "bigram", "ngram", "recording", "llamacpp"]


@pytest.fixture(params=BACKENDS)
def model(request, gguf, tmp_path_factory):
    name = request.param
    if name == "native":
        return NativeModel(gguf, NativeSettings(threads=2))
    if name == "transformers":
        return HFModel(tiny_qwen(vocab=VOCAB))
    if name == "bigram":
        return _bigram()
    if name == "ngram":
        rng = np.random.default_rng(1)
        return NgramModel.fit([list(rng.integers(0, VOCAB, 400))], order=3, vocab_size=VOCAB)
    if name == "recording":
        return RecordingModel(_bigram())
    return _llamacpp(tmp_path_factory)


def prompt(n: int, seed: int, vocab: int = VOCAB) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def test_what_a_backend_declares_is_what_it_offers(model):
    assert isinstance(model, LanguageModel)
    declared = model.abilities
    assert isinstance(declared, Abilities)
    for name, protocol in ABILITY_PROTOCOLS.items():
        assert getattr(declared, name) == isinstance(model, protocol), (type(model).__name__, name)


def test_prefill_says_how_much_came_from_a_prefix_cache(model):
    assert model.prefill(prompt(20, 0, model.vocab_size)) == 0  # nothing cached: every token read
    if not model.abilities.read_prefix:
        return
    model.prefix_cache = PrefixCache.of_gb(0.1)
    first = prompt(40, 1)
    assert model.prefill(first) == 0
    assert model.prefill(first[:30] + prompt(10, 2)) == 30 == model.last_reused


def test_switch_state_restores_a_sequence_bit_for_bit(model):
    if not model.abilities.switch_state:
        pytest.skip(f"{type(model).__name__} does not switch state")
    a, b = prompt(24, 3), prompt(17, 4)
    model.prefill(a)
    saved = model.state()
    model.prefill(b)
    model.score(prompt(3, 5))
    model.restore(saved)
    resumed = model.score([5, 6])
    model.prefill(a)
    assert torch.equal(resumed, model.score([5, 6]))


def test_score_many_equals_each_sequence_alone(model):
    if not model.abilities.score_many:
        pytest.skip(f"{type(model).__name__} scores one sequence a call")
    prompts, rows = [prompt(12, 6), prompt(30, 7), prompt(5, 8)], [[1, 2, 3], [4], [7, 8]]
    alone, states = [], []
    for p, r in zip(prompts, rows, strict=True):
        model.prefill(p)
        states.append(model.state())
        alone.append(model.score(r))
        model.prefill(p)  # the same sequence again, for score_many below (a fresh cache of its own)
        states[-1] = model.state()
    current = model.state()
    many, new_states = model.score_many(states, rows)
    assert model.state()[1] == current[1]  # the model's own sequence is left where it was
    for got, want, state, p, r in zip(many, alone, new_states, prompts, rows, strict=True):
        assert got.shape == want.shape
        if model.abilities.batch_scores and model.device.type == "cpu":
            assert torch.equal(got, want)  # used by the engine here: bit for bit each request's own
        else:
            assert torch.allclose(got, want, atol=1e-9, rtol=0)
        model.restore(state)
        assert model.length == len(p) + len(r)


def test_read_prefix_in_three_verbs_gives_the_bits_of_one_prefill(model):
    if not model.abilities.read_prefix:
        pytest.skip(f"{type(model).__name__} reads a prompt whole")
    tokens = prompt(60, 9)
    model.prefix_cache = None
    model.prefill(tokens)
    want = model.score([1, 2])
    assert model.reuse_prefix(tokens) == 0
    model.read(tokens[:25])
    model.read(tokens[25:])
    model.keep_prefix(tokens)
    assert torch.equal(model.score([1, 2]), want)


def test_abilities_refuse_what_cannot_be():
    with pytest.raises(ValueError, match="score_many .* needs switch_state"):
        Abilities(score_many=True)
    with pytest.raises(ValueError, match="batch_scores .* needs score_many"):
        Abilities(switch_state=True, batch_scores=True)
    assert NO_ABILITIES == Abilities()


def test_the_engine_s_slots_and_the_transformers_cpu_backend_declare_what_the_engine_may_use():
    from specdec.server.engine.slots import Exchange, Slot

    assert Slot(_bigram(), Exchange(), "target").abilities == NO_ABILITIES  # a request's view: three verbs
    hf = HFModel(tiny_qwen(vocab=VOCAB))
    assert hf.abilities.score_many and not hf.abilities.batch_scores  # CPU: requests take turns (bitwise)
