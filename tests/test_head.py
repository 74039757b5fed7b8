"""The cut draft head (specdec.models.head) and its kept tokens (specdec.loading.frequent)."""

import numpy as np
import pytest
import torch
from conftest import tiny_qwen

from specdec import HFModel, ModelDrafter, SamplingParams, autoregressive_generate, speculative_generate
from specdec.loading.frequent import frequent_tokens, token_counts
from specdec.models.head import CutHead, cut_head


def test_cut_head_keeps_the_full_heads_logits_on_kept_tokens_and_minus_inf_elsewhere():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 10, bias=True)
    keep = torch.tensor([0, 3, 4, 9])
    cut = CutHead(head, keep, 10)
    hidden = torch.randn(2, 3, 8)
    full, out = head(hidden), cut(hidden)  # [2, 3, 10] each
    assert out.shape == full.shape
    torch.testing.assert_close(out[..., keep], full[..., keep], rtol=0, atol=1e-6)
    dropped = torch.tensor([i for i in range(10) if i not in keep.tolist()])
    assert torch.isinf(out[..., dropped]).all() and (out[..., dropped] < 0).all()


def test_cut_head_refuses_ids_outside_the_vocabulary():
    model = tiny_qwen(vocab=32)
    with pytest.raises(ValueError, match=r"\[0, 32\)"):
        cut_head(model, [0, 32])
    with pytest.raises(ValueError, match="at least one"):
        cut_head(model, [])


def test_greedy_speculative_with_a_cut_draft_head_equals_plain_decoding():
    target = HFModel(tiny_qwen(vocab=64, seed=0))
    draft_module = tiny_qwen(vocab=64, seed=1)
    cut_head(draft_module, range(0, 64, 2))  # odd tokens are never drafted
    draft = HFModel(draft_module)
    assert draft.vocab_size == 64
    prompt = [1, 5, 9]
    greedy = SamplingParams(temperature=0.0)
    plain = autoregressive_generate(target, prompt, max_new_tokens=24, sampling=greedy)
    spec = speculative_generate(target, ModelDrafter(draft), prompt, max_new_tokens=24, gamma=3, sampling=greedy)
    assert spec.tokens == plain.tokens
    drafted = [t for r in spec.stats.records for t in r.drafted]
    assert drafted and all(t % 2 == 0 for t in drafted)
    assert any(t % 2 for t in plain.tokens), "no odd token in the output: the test would not exercise the cut"


class _Tok:
    """A tokenizer stand-in: a letter's id is its code − 90; two special tokens at the top."""

    added_tokens_decoder = {98: "<s>", 99: "</s>"}
    all_special_ids = [98, 99]

    def __len__(self):
        return 100

    def get_vocab(self):
        return {chr(i): i for i in range(100)}

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) - 90 for c in text]}  # a → 7, b → 8, c → 9


def test_frequent_tokens_counts_a_corpus_keeps_specials_and_caches(tmp_path):
    corpus = tmp_path / "a.py"
    corpus.write_text("aaab" * 5 + "c")
    counts = token_counts(_Tok(), cache=tmp_path / "cache", files=[corpus])
    assert counts[7] == 15 and counts[8] == 5 and counts[9] == 1 and counts.sum() == 21
    assert list((tmp_path / "cache").iterdir()), "the counts were not cached"
    corpus.write_text("zzzz")  # the cache answers now, not the file
    assert np.array_equal(token_counts(_Tok(), cache=tmp_path / "cache", files=[corpus]), counts)
    assert frequent_tokens(_Tok(), 2, counts) == [7, 8, 98, 99]
    with pytest.raises(ValueError, match=r"\[1, 100\]"):
        frequent_tokens(_Tok(), 0, counts)


def test_the_counts_key_is_the_whole_tokenizer():
    """A tokenizer with a backend is keyed by its whole serialization (same content: same key; another vocabulary
    or pre-tokenizer: another key); one without a backend, by its vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specdec.loading.frequent import tokenizer_key

    def backed(vocab, split=True):
        backend = Tokenizer(models.WordLevel(vocab, unk_token="u"))
        if split:
            backend.pre_tokenizer = pre_tokenizers.Whitespace()
        return type("Backed", (_Tok,), {"backend_tokenizer": backend})()

    vocab = {"u": 0, "a": 1, "b": 2}
    assert tokenizer_key(backed(vocab)) == tokenizer_key(backed(dict(vocab)))
    assert tokenizer_key(backed(vocab)) != tokenizer_key(backed({**vocab, "c": 3}))
    assert tokenizer_key(backed(vocab)) != tokenizer_key(backed(vocab, split=False))
    assert tokenizer_key(_Tok()) == tokenizer_key(_Tok()) != tokenizer_key(backed(vocab))
