"""The history drafter and its table, on hand-built cases with known answers: a match found, the longest
match winning over a more recent one, frequencies, the draft's length from the match, eviction order,
tenants, save / load and corrupt files; then greedy speculative decoding with it, alone and chained, equal
to plain decoding token for token; and choosing it by name."""

import dataclasses
import doctest
import json
import os

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
    cli,
    session,
    speculative_generate,
)
from specdec.choices import FILELESS_FORMS, make_drafter, needs_draft_model, parse_draft, with_draft_model
from specdec.drafters import CompositeDrafter, HistoryDrafter, HistoryFileError, HistorySettings, HistoryTable
from specdec.drafters import history as history_module
from specdec.drafters.history import SuffixIndex
from specdec.drafters.history_table import MAGIC, tenant_id
from specdec.drafters.lookup import PromptLookupDrafter
from specdec.models.toy import ToyPair

GREEDY = SamplingParams(temperature=0.0)


def propose(drafter, sequence, gamma=4):
    drafter.begin(sequence)
    return drafter.propose(sequence, gamma, GREEDY, torch.Generator())


def table_of(*texts, budget=10_000, vocab=100, tenant=""):
    table = HistoryTable(vocab, budget)
    for text in texts:
        table.record(tenant, text)
    return table


# ---------------------------------------------------------------------- matching
def test_a_match_in_the_table_is_copied_with_one_hot_q():
    drafter = HistoryDrafter(10, table_of([7, 1, 2, 3, 4, 5], vocab=10).view())
    draft = propose(drafter, [9, 1, 2, 3], gamma=4)
    assert draft.tokens == [4, 5] and draft.calls == 0  # the document ends after 5
    assert draft.probs.shape == (2, 10) and draft.probs.argmax(1).tolist() == [4, 5]
    assert draft.probs.sum(1).tolist() == [1.0, 1.0]
    assert drafter.sources == {"request": 0, "history": 1}


def test_no_match_of_min_match_tokens_proposes_nothing():
    drafter = HistoryDrafter(10, table_of([7, 1, 2, 3, 4, 5], vocab=10).view())
    assert propose(drafter, [9, 8, 2, 3]).tokens == []  # (2, 3) matches, but 3 tokens must
    assert propose(drafter, [2, 3]).tokens == []  # shorter than min_match
    assert drafter.sources == {"request": 0, "history": 0}


def test_the_longest_match_wins_over_a_more_recent_one():
    # [9, 6, 1, 2, 3] matches 5 tokens of the older text and 4 of the newer one.
    table = table_of([8, 9, 6, 1, 2, 3, 30, 31, 32], [5, 6, 1, 2, 3, 20, 21, 22])
    found = table.match("", [9, 6, 1, 2, 3], 3)
    assert found.tokens == [30, 31, 32] and found.match_length == 5 and found.probs == [1.0, 1.0, 1.0]
    # With equal match lengths the most recent text wins a tie of votes.
    table = table_of([8, 6, 1, 2, 3, 30, 31, 32], [5, 6, 1, 2, 3, 20, 21, 22])
    assert table.match("", [9, 6, 1, 2, 3], 3).tokens[0] == 20


def test_the_most_frequent_continuation_wins_and_its_confidence_is_its_share():
    table = table_of([1, 2, 3, 40, 41], [5, 1, 2, 3, 40, 41], [6, 1, 2, 3, 50, 51])  # 50 is the most recent
    found = table.match("", [0, 1, 2, 3], 2)
    assert found.tokens == [40, 41] and found.probs == pytest.approx([2 / 3, 2 / 3]) and found.match_length == 3


def test_the_walk_stops_below_min_prob():
    texts = [[1, 2, 3, 10 + i] for i in range(5)]  # five continuations, one vote each: confidence 1/5
    index = SuffixIndex(HistorySettings(min_prob=0.25))
    for i, text in enumerate(texts):
        index.add(i, text)
    assert index.match([1, 2, 3], 3) is None
    index = SuffixIndex(HistorySettings(min_prob=0.2))
    for i, text in enumerate(texts):
        index.add(i, text)
    assert index.match([1, 2, 3], 3).tokens == [14]  # the most recent of the tie


def test_the_draft_is_as_long_as_the_match_allows():
    long_text = list(range(20, 40))
    table = table_of(long_text)
    assert len(table.match("", [20, 21, 22], 8).tokens) == 3  # a 3-token match: 3 tokens
    assert len(table.match("", list(range(20, 26)), 8).tokens) == 6  # a 6-token match: 6
    assert table.match("", list(range(20, 26)), 4).tokens == [26, 27, 28, 29]  # never more than γ
    wide = HistoryTable(100, settings=HistorySettings(spec_factor=2.0))
    wide.record("", long_text)
    assert len(wide.match("", [20, 21, 22], 8).tokens) == 6


def test_the_current_request_drafts_too_and_its_copy_runs_into_the_draft():
    drafter = HistoryDrafter(10)  # no table: the request alone
    assert propose(drafter, [1, 2, 3, 4, 1, 2, 3], gamma=3).tokens == [4, 1, 2]
    assert propose(drafter, [4, 4, 4, 4], gamma=3).tokens == [4, 4, 4]  # the last two read what it just copied
    assert propose(drafter, [4, 4, 4, 5], gamma=3).tokens == []
    assert drafter.sources["request"] == 2


def test_the_request_and_the_table_compete_by_score():
    table = table_of([1, 2, 3, 60, 61, 62, 63])
    drafter = HistoryDrafter(100, table.view())
    # the request has 1, 2, 3 followed by 70 once, the table by 60: equal scores, the request wins the tie
    assert propose(drafter, [1, 2, 3, 70, 1, 2, 3], gamma=4).tokens[0] == 70
    # a longer match in the table beats the request's
    table.record("", [9, 9, 8, 1, 2, 3, 80, 81, 82, 83, 84])
    assert propose(drafter, [5, 8, 1, 2, 3, 70, 9, 8, 1, 2, 3], gamma=4).tokens == [80, 81, 82, 83]
    assert drafter.sources == {"request": 1, "history": 1}


def test_the_index_follows_the_growing_sequence_and_a_new_text():
    drafter = HistoryDrafter(20)
    drafter.begin([1, 2, 3, 4])
    assert drafter.propose([1, 2, 3, 4, 1, 2, 3], 2, GREEDY, torch.Generator()).tokens == [4, 1]
    drafter.commit(7)
    assert drafter.propose([9, 9, 9, 1, 2, 3], 2, GREEDY, torch.Generator()).tokens == []  # a new text
    drafter.commit(4)
    assert drafter.propose([9, 9, 9, 1, 5, 9, 9, 9], 2, GREEDY, torch.Generator()).tokens == [1, 5]


def test_the_match_lengths_agree_with_a_brute_force_search_on_random_text():
    """Random texts over 3 tokens: every occurrence (with a next token) of the context's last 3 tokens is a
    candidate, with the longest suffix of the context that ends there (up to max_match), most recent first."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        docs = [rng.integers(0, 3, int(rng.integers(3, 30))).tolist() for _ in range(3)]
        context = rng.integers(0, 3, 12).tolist()
        index = SuffixIndex(HistorySettings(max_match=10, max_candidates=1000))
        for i, doc in enumerate(docs):
            index.add(i, doc)
        found = [(m, i, end) for m, i, _, end in index.candidates(context)]
        expected = []
        for i, doc in enumerate(docs):
            for end in range(3, len(doc)):
                if doc[end - 3:end] == context[-3:]:
                    m = max(m for m in range(3, min(10, end) + 1) if doc[end - m:end] == context[-m:])
                    expected.append((m, i, end))
        assert found == expected[::-1]
        match = index.match(context, 4)
        assert (match is None) == (not expected)


def test_settings_are_checked_with_the_accepted_range():
    with pytest.raises(ValueError, match=r"min_match=0 is invalid: must be an integer in \[1, 64\]"):
        HistorySettings(min_match=0)
    with pytest.raises(ValueError, match="max_match=2 is invalid"):
        HistorySettings(max_match=2)
    with pytest.raises(ValueError, match=r"min_prob=1.5 is invalid: must be a number in \[0, 1\]"):
        HistorySettings(min_prob=1.5)
    with pytest.raises(ValueError, match=r"history budget=0 is invalid: must be an integer in \[1, "):
        HistoryTable(10, 0)
    with pytest.raises(ValueError, match=r"token id 10 is outside the vocabulary: ids must be in \[0, 9\]"):
        HistoryTable(10).record("", [1, 10])


# ---------------------------------------------------------------------- the table
def test_eviction_takes_the_least_recently_used_first():
    table = HistoryTable(100, budget=10)
    a, b, c = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    table.record("", a)
    table.record("", b)
    drafter = HistoryDrafter(100, table.view())
    assert propose(drafter, [0, 1, 2, 3], gamma=1).tokens == [4]  # a supplied a draft: now the most recent
    table.record("", c)  # 12 tokens > 10: b goes
    assert [text for _, text in table.texts()] == [a, c] and table.tokens == 8
    table.record("", [13, 14, 15, 16])  # a is now the least recently used
    assert [text for _, text in table.texts()] == [c, [13, 14, 15, 16]]
    assert table.match("", [5, 6, 7], 1) is None  # b's K-grams left the index with it


def test_one_budget_bounds_every_tenant_together():
    table = HistoryTable(100, budget=10)
    table.record("a", [1, 2, 3, 4])
    table.record("b", [5, 6, 7, 8])
    table.record("b", [9, 10, 11, 12])  # 12 tokens: a's text, the least recently used, goes
    assert table.texts() == [("b", [5, 6, 7, 8]), ("b", [9, 10, 11, 12])] and table.tenants() == ["b"]
    assert table.match("a", [1, 2, 3], 1) is None


def test_a_text_longer_than_the_budget_keeps_its_end():
    table = HistoryTable(100, budget=5)
    table.record("", list(range(10)))
    assert table.texts() == [("", [5, 6, 7, 8, 9])]


def test_a_text_that_continues_a_stored_one_replaces_it():
    table = table_of([1, 2, 3, 4])
    table.record("", [1, 2, 3, 4, 5, 6])  # the next turn re-sends the last one
    table.record("", [1, 2, 3, 4, 5, 6])  # the same text again
    assert table.texts() == [("", [1, 2, 3, 4, 5, 6])] and table.tokens == 6
    table.record("other", [1, 2, 3, 4, 5, 6, 7])  # another tenant's: kept apart
    assert table.documents == 2


def test_one_tenants_text_never_drafts_for_another():
    table = HistoryTable(100)
    table.record(tenant_id("key-a"), [7, 1, 2, 3, 4, 5])
    for tenant in (tenant_id("key-b"), ""):
        assert table.match(tenant, [9, 1, 2, 3], 4) is None
        assert propose(HistoryDrafter(100, table.view(tenant)), [9, 1, 2, 3]).tokens == []
    assert propose(HistoryDrafter(100, table.view(tenant_id("key-a"))), [9, 1, 2, 3]).tokens == [4, 5]
    assert table.tenants() == [tenant_id("key-a")] and tenant_id(None) == ""
    assert tenant_id("key-a") != tenant_id("key-b") and "key-a" not in tenant_id("key-a")


# ---------------------------------------------------------------------- the file
def test_save_and_load_give_the_same_table(tmp_path):
    table = HistoryTable(300, budget=100)
    table.record("", [1, 2, 3, 4, 5])
    table.record(tenant_id("k"), [299, 0, 1, 2])
    table.record("", [6, 7, 8, 9, 10, 11])
    path = tmp_path / "h.bin"
    table.save(path)
    again = HistoryTable.load(path, vocab_size=300, budget=100)
    assert again.texts() == table.texts() and again.tokens == 15 and again.vocab_size == 300
    assert again.match(tenant_id("k"), [299, 0, 1], 1).tokens == [2]
    small = HistoryTable.load(path, budget=10)  # the most recently used that fit
    assert [text for _, text in small.texts()] == [[299, 0, 1, 2], [6, 7, 8, 9, 10, 11]]
    assert [text for _, text in HistoryTable.load(path, budget=3).texts()] == [[9, 10, 11]]


def test_saving_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "h.bin"
    table_of([1, 2, 3, 4]).save(path)
    before = path.read_bytes()

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        table_of([5, 6, 7, 8, 9]).save(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["h.bin"]  # nothing half-written, no leftover


def corrupt_files(good: bytes) -> dict:
    _, line, rest = good.split(b"\n", 2)
    header = json.loads(line)
    flipped = bytearray(good)
    flipped[-1] ^= 1
    return {
        "not a table": (b"PK\x03\x04 zip bytes", "does not start with the line 'specdec-history'"),
        "empty": (b"", "does not start with the line"),
        "cut in the header": (good[: len(MAGIC) + 10], "header line is cut off"),
        "header not JSON": (MAGIC + b"{nope\n" + rest, "header is not JSON"),
        "no format": (MAGIC + json.dumps({**header, "format": 9}).encode() + b"\n" + rest, "names no format 1"),
        "bad document": (MAGIC + json.dumps({**header, "documents": [["", -1]]}).encode() + b"\n" + rest,
                         "not \\[tenant, length\\]"),
        "lengths": (MAGIC + json.dumps({**header, "tokens": 3}).encode() + b"\n" + rest, "do not add up"),
        "truncated": (good[:-4], "truncated or appended to"),
        "appended to": (good + b"\0\0\0\0", "truncated or appended to"),
        "a flipped bit": (bytes(flipped), "do not match its SHA-256"),
    }


CORRUPT = ("not a table", "empty", "cut in the header", "header not JSON", "no format", "bad document", "lengths",
           "truncated", "appended to", "a flipped bit")


@pytest.mark.parametrize("case", CORRUPT)
def test_a_bad_or_corrupt_file_is_an_error_naming_it(tmp_path, case):
    good = tmp_path / "good.bin"
    table_of([1, 2, 3, 4], [5, 6, 7]).save(good)
    data, why = corrupt_files(good.read_bytes())[case]
    bad = tmp_path / "bad.bin"
    bad.write_bytes(data)
    with pytest.raises(HistoryFileError, match=why) as err:
        HistoryTable.load(bad)
    assert repr(str(bad)) in str(err.value)


def test_a_missing_file_or_another_vocabulary_is_an_error_naming_it(tmp_path):
    with pytest.raises(HistoryFileError, match="cannot be read") as err:
        HistoryTable.load(tmp_path / "none.bin")
    assert "none.bin" in str(err.value)
    path = tmp_path / "h.bin"
    table_of([1, 2, 3], vocab=100).save(path)
    with pytest.raises(HistoryFileError, match="vocabulary of 100 tokens, and this model has 50") as err:
        HistoryTable.load(path, vocab_size=50)
    assert repr(str(path)) in str(err.value)


# ---------------------------------------------------------------------- greedy equality
def history_drafters(vocab, texts, draft_model):
    """The history forms over a table of ``texts``, built by name as the CLI and the server build them."""
    table = HistoryTable(vocab)
    for text in texts:
        table.record("", text)
    out = {}
    for name in ("history", "history+lookup", "history+model", "history+lookup+model"):
        out[name] = make_drafter(name, draft_model=draft_model, vocab_size=vocab, device="cpu", history=table)
    return out


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_speculative_equals_plain_with_history_on_bigrams(gamma):
    rng = np.random.default_rng(11)
    target = BigramModel(random_table(rng, 16, concentration=0.3))
    draft = BigramModel(random_table(rng, 16, concentration=0.3))
    prompt = [1, 2, 3, 4, 1, 2, 3]
    plain = autoregressive_generate(target, prompt, max_new_tokens=40, sampling=GREEDY)
    wrong = [(t + 1) % 16 for t in plain.tokens[:8]]  # the most recent text: its guesses are rejected
    texts = [prompt + plain.tokens[:25], rng.integers(0, 16, 300).tolist(), prompt + wrong]
    for name, drafter in history_drafters(16, texts, draft).items():
        spec = speculative_generate(target, drafter, prompt, max_new_tokens=40, gamma=gamma, sampling=GREEDY)
        assert spec.tokens == plain.tokens, name
        first = drafter.first if isinstance(drafter, CompositeDrafter) else drafter
        assert first.sources["history"] > 0 and spec.stats.accepted > 0, name
        assert spec.stats.accepted < spec.stats.drafted, name  # some guesses rejected too


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_speculative_equals_plain_with_history_on_a_transformer(gamma):
    target = HFModel(tiny_qwen(seed=0))
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11, 5, 6]
    plain = autoregressive_generate(target, prompt, max_new_tokens=30, sampling=GREEDY)
    texts = [prompt + plain.tokens[:15], list(range(96))]
    for name, drafter in history_drafters(96, texts, HFModel(tiny_qwen(seed=1))).items():
        spec = speculative_generate(target, drafter, prompt, max_new_tokens=30, gamma=gamma, sampling=GREEDY)
        assert spec.tokens == plain.tokens, name
        assert spec.stats.accepted > 0, name


# ---------------------------------------------------------------------- by name
def test_parse_draft_reads_the_history_forms():
    assert parse_draft("history").history and parse_draft("history").source is None
    assert not parse_draft("history").lookup and not needs_draft_model("history")
    form = parse_draft("history+lookup+model")
    assert (form.history, form.lookup, form.source) == (True, True, "model") and needs_draft_model(form.text)
    assert (parse_draft("history+lookup").lookup, parse_draft("history+lookup").source) == (True, None)
    assert not parse_draft("lookup+model").history
    assert {"history", "history+lookup", "history+model", "history+lookup+model"} <= set(FILELESS_FORMS)
    assert with_draft_model("history+lookup+model", "d.gguf") == "history+lookup+model:d.gguf"
    assert with_draft_model("history+lookup", "d.gguf") == "history+lookup"


@pytest.mark.parametrize("text, fragment", [
    ("history+", "after 'history\\+'"), ("history+history", "after 'history\\+'"),
    ("history+history+lookup", "after 'history\\+'"), ("lookup+history", "unknown form 'history'"),
    ("history:4", "unknown form 'history'"), ("history+nope", "unknown form 'nope'"),
])
def test_bad_history_forms_name_the_value_and_the_forms(text, fragment):
    with pytest.raises(ValueError, match=fragment) as err:
        parse_draft(text)
    assert repr(text) in str(err.value) and "history+lookup+model" in str(err.value)


def test_make_drafter_chains_history_first():
    draft = BigramModel(random_table(np.random.default_rng(0), 6))
    common = dict(draft_model=draft, vocab_size=6, device="cpu")
    assert isinstance(make_drafter("history", **common), HistoryDrafter)
    both = make_drafter("history+lookup", **common)
    assert isinstance(both.first, HistoryDrafter) and isinstance(both.fallback, PromptLookupDrafter)
    three = make_drafter("history+lookup+model", **common)
    assert isinstance(three.first, HistoryDrafter) and isinstance(three.fallback, CompositeDrafter)
    assert isinstance(three.fallback.fallback, ModelDrafter) and three.fallback.fallback.model is draft
    table = HistoryTable(6)
    assert make_drafter("history", **common, history=table).history.table is table  # a table: its tenant ""
    assert make_drafter("history", **common).history is None


def test_the_worked_example_of_the_docstring():
    table = HistoryTable(10)
    table.record("", [7, 1, 2, 3, 4, 5])
    drafter = HistoryDrafter(10, table.view())
    assert propose(drafter, [9, 1, 2, 3]).tokens == [4, 5] and drafter.sources["history"] == 1
    result = doctest.testmod(history_module)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------- the session and the CLI
def test_a_session_run_drafts_from_the_table_and_keeps_its_text():
    toy, table = ToyPair(), HistoryTable(8)
    settings = session.RunSettings(gamma=3, max_new_tokens=6, sampling=GREEDY, chat=False, draft="history")
    first = session.run(toy, "mat .", settings, history=table)
    assert first.speculative.stats.drafted == 0  # "the cat sat on the cat": nothing earlier to copy
    assert table.texts() == [("", toy.encode("mat .") + first.speculative.tokens)]
    session.run(toy, "dog", dataclasses.replace(settings, max_new_tokens=10), history=table)
    again = session.run(toy, "mat .", settings, history=table, compare=True)
    assert again.identical_to_baseline and again.speculative.stats.accepted > 0
    assert "from earlier ones" in again.drafter and again.text == first.text
    assert table.documents == 2  # the second "mat ." replaced the first


def test_generate_refuses_a_bad_history_file_by_name_before_loading(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("the models were about to load")

    monkeypatch.setattr(session, "load", refuse)
    bad = tmp_path / "broken.bin"
    bad.write_bytes(b"not a history table")
    assert cli.main(["generate", "hi", "--draft", "history", "--history-file", str(bad)]) == 2
    err = capsys.readouterr().err.strip().split("\n")
    assert len(err) == 1 and "broken.bin" in err[0] and "not a valid specdec history table" in err[0]
    assert cli.main(["generate", "hi", "--history-file", str(bad), "--history-tokens", "0"]) == 2
    assert "--history-tokens 0 keeps none" in capsys.readouterr().err
