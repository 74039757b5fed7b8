"""Drafters beyond a small model: prompt lookup, the composite, choosing one by name, and greedy
speculative decoding with each of them equal to plain decoding token for token."""

import doctest

import numpy as np
import pytest
import torch
from conftest import random_table, tiny_qwen

from specdec import (
    BigramModel,
    HFModel,
    ModelDrafter,
    SamplingParams,
    autoregressive_generate,
    session,
    speculative_generate,
)
from specdec.choices import make_drafter, needs_draft_model, parse_draft
from specdec.decode import make_generator, speculative_round
from specdec.drafters import CompositeDrafter, Proposal, one_hot_rows
from specdec.drafters.lookup import PromptLookupDrafter, copy_from
from specdec.models.ngram import NgramModel
from specdec.models.toy import ToyPair
from specdec.stats import Timer

GREEDY = SamplingParams(temperature=0.0)


def propose(drafter, sequence, gamma=4):
    return drafter.propose(sequence, gamma, GREEDY, torch.Generator())


# ---------------------------------------------------------------------- prompt lookup


def test_lookup_copies_what_followed_the_longest_match():
    # The suffix (7, 8, 9) occurred once, followed by 1 2; the suffix (8, 9) also after 5; n = 3 wins.
    sequence = [7, 8, 9, 1, 2, 3, 5, 8, 9, 4, 4, 7, 8, 9]
    drafter = PromptLookupDrafter(10, min_ngram=1)
    drafter.begin(sequence)
    assert propose(drafter, sequence, 2).tokens == [1, 2]


def test_lookup_prefers_the_most_recent_occurrence():
    sequence = [1, 2, 3, 0, 1, 2, 5, 0, 1, 2]  # (1, 2) was followed by 3, later by 5
    drafter = PromptLookupDrafter(10, max_ngram=2, min_ngram=1)
    drafter.begin(sequence)
    assert propose(drafter, sequence, 1).tokens == [5]


def test_lookup_backs_off_to_shorter_ngrams():
    sequence = [4, 6, 9, 9, 3, 6]  # (3, 6) and (9, 3, 6) never occurred before; (6,) did, before 9
    drafter = PromptLookupDrafter(10, min_ngram=1)
    drafter.begin(sequence)
    assert propose(drafter, sequence, 3).tokens == [9, 9, 3]


def test_lookup_proposes_nothing_without_a_match():
    drafter = PromptLookupDrafter(10, min_ngram=1)
    drafter.begin([1, 2, 3])
    draft = propose(drafter, [1, 2, 3])
    assert draft.tokens == [] and draft.probs.shape == (0, 10) and draft.calls == 0
    strict = PromptLookupDrafter(10, min_ngram=2)  # single tokens no longer count as a match
    strict.begin([1, 2, 5, 2])
    assert propose(strict, [1, 2, 5, 2]).tokens == []


def test_lookup_copy_continues_a_repeating_pattern():
    assert copy_from([5, 1, 2, 1, 2], 3, 4) == [1, 2, 1, 2]  # reads the tokens it has just copied
    drafter = PromptLookupDrafter(10, min_ngram=1)
    drafter.begin([3, 3, 3])
    assert propose(drafter, [3, 3, 3], 5).tokens == [3, 3, 3, 3, 3]


def test_lookup_q_is_one_hot_on_each_guess():
    sequence = [1, 2, 3, 4, 1, 2]
    drafter = PromptLookupDrafter(6, min_ngram=1)
    drafter.begin(sequence)
    draft = propose(drafter, sequence, 3)
    assert draft.tokens == [3, 4, 1]
    expected = torch.zeros(3, 6)
    expected[[0, 1, 2], [3, 4, 1]] = 1.0
    assert torch.equal(draft.probs, expected)


def test_lookup_index_follows_the_growing_sequence_and_a_new_text():
    drafter = PromptLookupDrafter(20, min_ngram=1)
    sequence = [1, 2, 3]
    drafter.begin(sequence)
    assert propose(drafter, sequence).tokens == []
    sequence += [9, 1, 2]  # the loop appends verified tokens; the index catches up at propose
    drafter.commit(len(sequence))
    assert propose(drafter, sequence, 2).tokens == [3, 9]
    other = [5, 6, 5]  # a different text with no begin(): indexed from scratch, not mixed up
    assert propose(drafter, other, 1).tokens == [6]


def test_lookup_matches_a_brute_force_search_on_random_text():
    rng = np.random.default_rng(0)
    sequence = rng.integers(0, 6, 400).tolist()
    drafter = PromptLookupDrafter(6, min_ngram=1)
    drafter.begin(sequence[:10])
    for end in range(10, 400):
        expected = brute_force_lookup(sequence[:end], 3)
        assert propose(drafter, sequence[:end], 3).tokens == expected, end
        drafter.commit(end + 1)


def brute_force_lookup(tokens, gamma, max_ngram=3):
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        for start in range(len(tokens) - n - 1, -1, -1):  # latest earlier occurrence first
            if tokens[start : start + n] == tokens[-n:]:
                return copy_from(tokens, start + n, gamma)
    return []


@pytest.mark.parametrize("kwargs, fragment", [
    ({"vocab_size": 0}, "vocab_size=0"),
    ({"vocab_size": 10, "min_ngram": 0}, "min_ngram=0"),
    ({"vocab_size": 10, "max_ngram": 2, "min_ngram": 3}, "max_ngram=2"),
])
def test_lookup_refuses_bad_settings(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        PromptLookupDrafter(**kwargs)


def test_one_hot_rows_are_built_on_the_requested_device_and_dtype():
    rows = one_hot_rows([2, 0], 5, "cpu", torch.float64)
    assert rows.dtype == torch.float64 and rows.device.type == "cpu"
    assert rows.tolist() == [[0, 0, 1, 0, 0], [1, 0, 0, 0, 0]]
    assert one_hot_rows([], 5, "cpu").shape == (0, 5)


# ---------------------------------------------------------------------- an empty draft in the loop


class NeverDrafts:
    """A drafter that always proposes nothing: every round must be a plain target step."""

    name, reads_prompt = "never drafts", False

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size

    def begin(self, prompt):
        pass

    def propose(self, sequence, gamma, sampling, generator):
        return Proposal([], torch.empty(0, self.vocab_size), calls=0)

    def commit(self, length):
        pass


@pytest.fixture
def bigram_target(rng):
    return BigramModel(random_table(rng, 12, concentration=0.5))


def test_an_empty_draft_makes_a_plain_target_step(bigram_target):
    sequence = [1, 2]
    bigram_target.prefill(sequence[:-1])
    record = speculative_round(bigram_target, NeverDrafts(12), sequence, 3, GREEDY, make_generator(0), Timer())
    assert record.drafted == () and record.n_accepted == 0 and record.kind == "bonus"
    assert record.next_token == int(bigram_target.probs[2].argmax()) and bigram_target.length == 2


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_a_drafter_that_never_drafts_reproduces_plain_decoding(bigram_target, sampling):
    plain = autoregressive_generate(bigram_target, [3, 4], max_new_tokens=20, sampling=sampling, seed=5)
    spec = speculative_generate(bigram_target, NeverDrafts(12), [3, 4], max_new_tokens=20, gamma=3,
                                sampling=sampling, seed=5)
    assert spec.tokens == plain.tokens and spec.stats.target_calls == 20 and spec.stats.alpha is None


# ---------------------------------------------------------------------- the composite


class RecordingDrafter(ModelDrafter):
    """A model drafter that checks, at each proposal, that its cache holds a prefix of the sequence."""

    def propose(self, sequence, gamma, sampling, generator):
        assert self.model._tokens == list(sequence[: self.model.length])
        assert self.model.length <= len(sequence) - 1
        self.proposed = getattr(self, "proposed", 0) + 1
        return super().propose(sequence, gamma, sampling, generator)


def test_composite_falls_back_and_keeps_the_fallback_in_step():
    table = NgramModel.fit([[1, 2, 3, 4, 5, 6, 7, 8, 9, 1]], order=2, vocab_size=12)
    fallback = RecordingDrafter(table)
    composite = CompositeDrafter(PromptLookupDrafter(12, min_ngram=1), fallback)
    target = BigramModel(random_table(np.random.default_rng(3), 12, concentration=0.3))
    prompt = [1, 2, 3, 1, 2, 3, 10, 11]
    gen = speculative_generate(target, composite, prompt, max_new_tokens=30, gamma=3, sampling=GREEDY)
    plain = autoregressive_generate(target, prompt, max_new_tokens=30, sampling=GREEDY)
    assert gen.tokens == plain.tokens
    assert composite.rounds["first"] > 0 and composite.rounds["fallback"] == fallback.proposed > 0
    assert table.length <= len(prompt) + 30 - 1


def test_composite_uses_the_first_drafter_when_it_has_a_guess():
    composite = CompositeDrafter(PromptLookupDrafter(10, min_ngram=1), NeverDrafts(10))
    composite.begin([1, 2, 3, 1])
    assert propose(composite, [1, 2, 3, 1], 2).tokens == [2, 3]
    assert composite.rounds == {"first": 1, "fallback": 0}
    assert propose(composite, [1, 2, 3, 1, 7], 2).tokens == []
    assert composite.rounds == {"first": 1, "fallback": 1}


def test_composite_refuses_parts_with_different_vocabularies():
    with pytest.raises(ValueError, match="vocabulary"):
        CompositeDrafter(PromptLookupDrafter(10), NeverDrafts(11))


# ---------------------------------------------------------------------- greedy equality


@pytest.fixture(scope="module")
def qwen_target():
    return HFModel(tiny_qwen(seed=0))


def drafters_for(vocab, corpus, draft_model):
    table = NgramModel.fit(corpus, order=3, vocab_size=vocab, top_k=8)
    return {
        "lookup": PromptLookupDrafter(vocab),
        "ngram": ModelDrafter(table),
        "lookup+ngram": CompositeDrafter(PromptLookupDrafter(vocab),
                                         ModelDrafter(NgramModel.fit(corpus, order=2, vocab_size=vocab))),
        "lookup+model": CompositeDrafter(PromptLookupDrafter(vocab), ModelDrafter(draft_model)),
    }


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_speculative_equals_plain_with_each_drafter_on_bigrams(gamma):
    rng = np.random.default_rng(11)
    target = BigramModel(random_table(rng, 16, concentration=0.3))
    draft = BigramModel(random_table(rng, 16, concentration=0.3))
    prompt = [1, 2, 3, 4, 1, 2, 3]
    plain = autoregressive_generate(target, prompt, max_new_tokens=40, sampling=GREEDY)
    for name, drafter in drafters_for(16, [plain.tokens[:25], rng.integers(0, 16, 200).tolist()], draft).items():
        spec = speculative_generate(target, drafter, prompt, max_new_tokens=40, gamma=gamma, sampling=GREEDY)
        assert spec.tokens == plain.tokens, name
        assert spec.stats.drafted > 0, name


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_speculative_equals_plain_with_each_drafter_on_a_transformer(qwen_target, gamma):
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11, 5, 6]
    plain = autoregressive_generate(qwen_target, prompt, max_new_tokens=30, sampling=GREEDY)
    corpus = [plain.tokens[:15], list(range(96))]
    for name, drafter in drafters_for(96, corpus, HFModel(tiny_qwen(seed=1))).items():
        spec = speculative_generate(qwen_target, drafter, prompt, max_new_tokens=30, gamma=gamma, sampling=GREEDY)
        assert spec.tokens == plain.tokens, name
        assert spec.stats.accepted > 0, name


# ---------------------------------------------------------------------- choosing a drafter by name


@pytest.fixture
def ngram_file(tmp_path):
    path = tmp_path / "t.ngram"
    NgramModel.fit([[0, 1, 2, 0, 1, 2, 3]], order=2, vocab_size=4).save(path)
    return str(path)


def test_parse_draft_reads_every_form(ngram_file):
    assert parse_draft(None) == parse_draft("model")
    model = parse_draft("model")
    assert (model.lookup, model.source, model.path) == (False, "model", None)
    assert (parse_draft("lookup").lookup, parse_draft("lookup").source) == (True, None)
    for text in (f"ngram:{ngram_file}", f"bigram:{ngram_file}"):
        spec = parse_draft(text)
        assert (spec.lookup, spec.source, spec.path) == (False, "ngram", ngram_file)
    assert (parse_draft("lookup+model").lookup, parse_draft("lookup+model").source) == (True, "model")
    spec = parse_draft(f"lookup+ngram:{ngram_file}")
    assert (spec.lookup, spec.source, spec.path) == (True, "ngram", ngram_file)
    with pytest.raises(ValueError, match="unknown form.*--draft-model '/models/small.gguf'"):
        parse_draft("/models/small.gguf")  # a draft model goes to --draft-model now
    with pytest.raises(ValueError, match="unknown form 'bogus'"):
        parse_draft("bogus")


def test_needs_draft_model(ngram_file):
    assert needs_draft_model("model") and needs_draft_model(None) and needs_draft_model("lookup+model")
    assert not needs_draft_model("lookup")
    assert not needs_draft_model(f"ngram:{ngram_file}") and not needs_draft_model(f"lookup+ngram:{ngram_file}")


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"),
    ("ngram:", "needs a file"),
    ("ngram:/no/such/file.ngram", "does not exist"),
    ("lookup+bigram:/no/such/file", "does not exist"),
    ("lookup+", "after 'lookup\\+'"),
    ("lookup+lookup", "after 'lookup\\+'"),
    ("lookup:4", "takes no ':'"),
])
def test_bad_draft_values_name_the_value_and_the_forms(text, fragment):
    with pytest.raises(ValueError, match=fragment) as err:
        parse_draft(text)
    assert repr(text) in str(err.value) and "lookup+ngram:FILE" in str(err.value)


def test_a_file_that_is_not_an_ngram_table_is_refused_at_parse_time(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    with pytest.raises(ValueError, match="not a specdec n-gram file"):
        parse_draft(f"ngram:{bad}")


def test_an_ngram_file_given_as_a_model_gets_a_hint(ngram_file):
    with pytest.raises(ValueError, match="is an n-gram table: write ngram:"):
        parse_draft(ngram_file)


def test_make_drafter_builds_each_kind(ngram_file):
    draft_model = BigramModel(np.full((6, 6), 1 / 6))
    common = dict(draft_model=draft_model, vocab_size=6, device="cpu")
    assert isinstance(make_drafter("model", **common), ModelDrafter)
    assert make_drafter("model", stop_below=0.3, **common).stop_below == 0.3
    assert isinstance(make_drafter("lookup", **common), PromptLookupDrafter)
    ngram = make_drafter(f"ngram:{ngram_file}", **common)
    assert isinstance(ngram.model, NgramModel) and ngram.vocab_size == 6  # widened to the target's vocabulary
    both = make_drafter(f"lookup+ngram:{ngram_file}", **common)
    assert isinstance(both, CompositeDrafter) and isinstance(both.fallback.model, NgramModel)
    assert make_drafter("lookup+model", **common).fallback.model is draft_model
    with pytest.raises(ValueError, match="no draft model was loaded"):
        make_drafter("lookup+model", draft_model=None, vocab_size=6, device="cpu")


# ---------------------------------------------------------------------- the session (CLI and explorer)


def test_session_runs_prompt_lookup_and_reports_it():
    toy = ToyPair()
    settings = session.RunSettings(gamma=3, max_new_tokens=30, sampling=GREEDY, chat=False, draft="lookup")
    result = session.run(toy, "the cat sat on the mat . the cat", settings, compare=True)
    assert result.identical_to_baseline is True
    data = result.as_json()
    assert data["draft"] == "lookup" and "prompt lookup" in data["drafter"]
    assert data["draft_calls"] == 0 and result.speculative.stats.drafted > 0
    assert "drafter: prompt lookup" in result.report()


def test_session_validates_the_draft_value_before_loading():
    with pytest.raises(ValueError, match="ngram:"):
        session.RunSettings(draft="ngram:").validate()


def test_session_load_skips_the_draft_model_when_none_is_needed(monkeypatch, ngram_file, tmp_path):
    gguf = tmp_path / "draft.gguf"
    gguf.write_bytes(b"GGUF" + bytes(16))
    calls = []

    def fake_load_pair(settings):
        calls.append((settings.target, settings.draft_model, settings.with_draft))
        return ToyPair()

    monkeypatch.setattr(session, "load_pair", fake_load_pair)
    monkeypatch.setattr(session, "warm_up", lambda pair: None)
    for value, expected in [("lookup", (None, None, False)), (f"lookup+ngram:{ngram_file}", (None, None, False)),
                            (None, (None, None, True)), ("lookup+model", (None, None, True)),
                            (f"model:{gguf}", (None, str(gguf), True))]:
        session.load(session.load_settings(value))
        assert calls[-1] == expected, value
    session.load(session.load_settings("model", with_draft=False))
    assert calls[-1] == (None, None, False)


def test_prompt_lookup_worked_example_of_the_docstring():
    """PromptLookupDrafter.propose's docstring example: as written (its >>> lines) and spelled out."""
    drafter = PromptLookupDrafter(vocab_size=5)
    draft = drafter.propose([1, 2, 3, 4, 2, 3], 3, SamplingParams(), torch.Generator())
    assert (draft.tokens, draft.probs.argmax(dim=1).tolist(), draft.calls) == ([4, 2, 3], [4, 2, 3], 0)
    assert torch.equal(draft.probs, one_hot_rows([4, 2, 3], 5, "cpu"))
    for sequence, expected in (([1, 2, 1, 2], [1, 2, 1]), ([1, 2, 3, 4], [])):
        drafter = PromptLookupDrafter(vocab_size=5)
        assert drafter.propose(sequence, 3, SamplingParams(), torch.Generator()).tokens == expected
    globs = {"PromptLookupDrafter": PromptLookupDrafter, "SamplingParams": SamplingParams, "torch": torch}
    examples = doctest.DocTestFinder().find(PromptLookupDrafter.propose, "propose", globs=globs)
    runner = doctest.DocTestRunner()
    for example in examples:
        runner.run(example)
    assert runner.tries >= 3 and runner.failures == 0


def test_model_and_composite_worked_examples_of_the_docstrings():
    table = BigramModel([[0.1, 0.9, 0.0], [0.0, 0.2, 0.8], [1.0, 0.0, 0.0]])
    greedy = SamplingParams(temperature=0.0)
    drafter = ModelDrafter(table)
    drafter.begin([0])
    draft = drafter.propose([0], 2, greedy, torch.Generator())
    assert (draft.tokens, draft.calls) == ([1, 2], 2)
    assert torch.equal(draft.probs, one_hot_rows([1, 2], 3, "cpu", torch.float64))
    drafter.begin([0])
    draft = drafter.propose([0], 2, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert draft.calls == 2
    assert torch.allclose(draft.probs[0], table.probs[0])
    assert torch.allclose(draft.probs[1], table.probs[draft.tokens[0]])

    for sequence, expected, calls, used in (([0, 2, 0, 2], [0, 2], 0, "first"), ([2, 0], [1, 2], 2, "fallback")):
        composite = CompositeDrafter(PromptLookupDrafter(3), ModelDrafter(table))
        composite.begin(sequence)
        draft = composite.propose(sequence, 2, greedy, torch.Generator())
        assert (draft.tokens, draft.calls) == (expected, calls)
        assert composite.rounds[used] == 1 and sum(composite.rounds.values()) == 1
