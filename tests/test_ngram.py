"""NgramModel: counts and smoothing with known answers, backoff, the LanguageModel protocol,
files (round trip, atomic writes, damaged or foreign files refused)."""

import math
import zipfile

import numpy as np
import pytest
import torch

from specdec import LanguageModel, ModelDrafter, SamplingParams
from specdec.models.ngram import NgramModel, read_header

CORPUS = [[0, 1, 2, 0, 1, 3, 0, 1, 2]]  # counts: 0:3 1:3 2:2 3:1; bigrams 0→1 ×3, 1→2 ×2, 1→3, 2→0, 3→0
D = 0.75


def probs(model, context):
    model.prefill([])
    return model.score(context)[-1].exp().double()


def test_unigram_is_relative_frequency():
    model = NgramModel.fit(CORPUS, order=1, vocab_size=5)
    assert probs(model, [4]).tolist() == pytest.approx([3 / 9, 3 / 9, 2 / 9, 1 / 9, 0.0])


def test_bigram_is_interpolated_absolute_discounting():
    model = NgramModel.fit(CORPUS, order=2, vocab_size=5)
    unigram = np.array([3, 3, 2, 1, 0]) / 9
    # after 1: c = 3 (2 ×2, 3 ×1), two distinct continuations → backoff weight D·2/3
    expected = D * 2 / 3 * unigram
    expected[2] += (2 - D) / 3
    expected[3] += (1 - D) / 3
    assert probs(model, [1]).numpy() == pytest.approx(expected)
    assert probs(model, [4]).numpy() == pytest.approx(unigram)  # 4 never seen as a context: back off


def test_trigram_backs_off_through_each_order():
    model = NgramModel.fit(CORPUS, order=3, vocab_size=5)
    unigram = np.array([3, 3, 2, 1, 0]) / 9
    after_1 = D * 2 / 3 * unigram + np.array([0, 0, (2 - D) / 3, (1 - D) / 3, 0])
    after_0_1 = D * 2 / 3 * after_1 + np.array([0, 0, (2 - D) / 3, (1 - D) / 3, 0])  # (0, 1) → 2 ×2, 3 ×1
    assert probs(model, [0, 1]).numpy() == pytest.approx(after_0_1)
    assert probs(model, [3, 1]).numpy() == pytest.approx(after_1)  # (3, 1) unseen: the bigram row
    assert probs(model, [1]).numpy() == pytest.approx(after_1)  # one token of context only
    assert model.context_row([3, 1]) == model.context_row([1])


def test_ngrams_never_cross_sequence_boundaries():
    model = NgramModel.fit([[0, 1], [2, 3]], order=2, vocab_size=4)
    assert model.context_row([1])[0] == 0  # 1 is last in its sequence: never a context
    assert model.context_row([0])[0] == 1


def test_top_k_keeps_the_most_likely_and_renormalizes():
    model = NgramModel.fit([[0, 1, 0, 1, 0, 2, 0, 1, 0, 3]], order=2, vocab_size=4, top_k=2)
    row = probs(model, [0])
    assert (row > 0).sum() == 2 and row[1] == row.max() and row.sum() == pytest.approx(1.0)
    logits = model.score([0])[-1]
    assert torch.isinf(logits).sum() == 2 and bool((logits[torch.isinf(logits)] < 0).all())


def test_min_count_leaves_rare_contexts_to_the_lower_order():
    corpus = [[0, 1, 0, 1, 0, 2, 3, 1]]  # as contexts: 0 seen 3 times, 1 twice, 2 and 3 once each
    full = NgramModel.fit(corpus, order=2, vocab_size=4)
    pruned = NgramModel.fit(corpus, order=2, vocab_size=4, min_count=2)
    assert pruned.tables[1].contexts.ravel().tolist() == [0, 1] and full.tables[1].contexts.shape[0] == 4
    unigram = NgramModel.fit(corpus, order=1, vocab_size=4)
    assert probs(pruned, [2]).numpy() == pytest.approx(probs(unigram, [2]).numpy())
    assert probs(full, [2]).numpy() != pytest.approx(probs(unigram, [2]).numpy())
    assert probs(pruned, [0]).numpy() == pytest.approx(probs(full, [0]).numpy())


def test_it_is_a_language_model_with_a_cache():
    model = NgramModel.fit(CORPUS, order=3, vocab_size=5)
    assert isinstance(model, LanguageModel) and model.max_length is None and model.vocab_size == 5
    model.prefill([0, 1])
    rows = model.score([2, 0, 1])  # [3, vocab]: after 2, after 0, after 1
    assert rows.shape == (3, 5) and model.length == 5
    model.trim(2)
    assert torch.equal(model.score([2])[0], rows[0]) and model.length == 3
    with pytest.raises(ValueError, match="cannot trim"):
        model.trim(9)


def test_a_model_drafter_draws_from_exactly_the_tables_distribution():
    model = NgramModel.fit(CORPUS, order=2, vocab_size=5, dtype=torch.float64)
    drafter = ModelDrafter(model)
    drafter.begin([0, 1])
    draft = drafter.propose([0, 1], 1, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert torch.allclose(draft.probs[0], probs(NgramModel.fit(CORPUS, order=2, vocab_size=5), [1]).to(torch.float64))
    assert draft.probs[0, draft.tokens[0]] > 0


def test_save_and_load_round_trip(tmp_path):
    model = NgramModel.fit(CORPUS + [[4, 4, 2]], order=3, vocab_size=5, top_k=3, meta={"corpus": "test"})
    path = tmp_path / "t.ngram"
    model.save(path)
    loaded = NgramModel.load(path)
    assert loaded.order == 3 and loaded.vocab_size == 5 and loaded.meta["corpus"] == "test"
    for context in ([0, 1], [4, 4], [2], [3, 3], [1, 2, 0]):
        assert torch.allclose(probs(loaded, context), probs(model, context), atol=1e-6)
    assert read_header(str(path))["order"] == 3
    assert list(tmp_path.iterdir()) == [path]  # the temporary file was renamed, none left behind


def test_an_order_with_no_contexts_saves_loads_and_backs_off(tmp_path):
    model = NgramModel.fit([[0, 1], [2, 1]], order=3, vocab_size=4)  # no sequence has 3 tokens
    assert model.tables[2].contexts.shape == (0, 2)
    model.save(tmp_path / "t.ngram")
    loaded = NgramModel.load(tmp_path / "t.ngram")
    assert torch.allclose(probs(loaded, [0, 0]), probs(model, [0]))


def test_load_can_widen_the_vocabulary_to_a_targets_never_narrow(tmp_path):
    path = tmp_path / "t.ngram"
    NgramModel.fit(CORPUS, order=2, vocab_size=5).save(path)
    wide = NgramModel.load(path, vocab_size=8)
    assert wide.vocab_size == 8 and probs(wide, [1])[5:].sum() == 0
    with pytest.raises(ValueError, match="different tokenizer"):
        NgramModel.load(path, vocab_size=4)


def test_damaged_and_foreign_files_are_refused_naming_the_path(tmp_path):
    good = tmp_path / "good.ngram"
    NgramModel.fit(CORPUS, order=2, vocab_size=5).save(good)
    data = good.read_bytes()
    truncated = tmp_path / "truncated.ngram"
    truncated.write_bytes(data[: len(data) // 2])
    text = tmp_path / "text.ngram"
    text.write_text("not an n-gram table")
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, x=np.arange(3))
    for path in (truncated, text, foreign, tmp_path / "missing.ngram"):
        with pytest.raises(ValueError, match="n-gram file") as err:
            NgramModel.load(path)
        assert str(path) in str(err.value)


def test_a_table_with_bad_entries_is_refused(tmp_path):
    path = tmp_path / "bad.ngram"
    NgramModel.fit(CORPUS, order=2, vocab_size=5).save(path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["tokens_2"] = arrays["tokens_2"] + 10  # ids beyond the vocabulary
    with zipfile.ZipFile(path, "w") as f:
        for key, value in arrays.items():
            with f.open(key + ".npy", "w") as out:
                np.lib.format.write_array(out, value)
    with pytest.raises(ValueError, match="inconsistent"):
        NgramModel.load(path)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"order": 0}, "order=0"),
    ({"vocab_size": 0}, "vocab_size=0"),
    ({"top_k": 0}, "top_k=0"),
    ({"discount": 1.0}, "discount=1.0"),
    ({"min_count": 0}, "min_count=0"),
    ({"order": 4, "vocab_size": 151_936}, "order must be <= 3"),
])
def test_bad_fit_settings_are_refused(kwargs, fragment):
    args = {"order": 2, "vocab_size": 5} | kwargs
    with pytest.raises(ValueError, match=fragment):
        NgramModel.fit(CORPUS, **args)


def test_bad_corpora_are_refused():
    with pytest.raises(ValueError, match="empty"):
        NgramModel.fit([[], []], order=2, vocab_size=5)
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        NgramModel.fit([[0, 7]], order=2, vocab_size=5)


def test_a_large_vocabulary_row_is_cheap_and_sparse():
    rng = np.random.default_rng(0)
    corpus = [rng.integers(0, 2000, 20_000).tolist()]
    model = NgramModel.fit(corpus, order=2, vocab_size=151_936, top_k=16)
    model.prefill(corpus[0][:10])
    row = model.score([int(corpus[0][10])])[0]
    assert row.shape == (151_936,) and int(torch.isfinite(row).sum()) == 16
    assert math.isclose(float(row.exp().sum()), 1.0, rel_tol=1e-5)
