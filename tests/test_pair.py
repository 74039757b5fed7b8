"""Pair compatibility: a draft must speak the target's token language, checked before generating."""

from types import SimpleNamespace

import pytest

from specdec.loading.locate import model_source
from specdec.loading.pair import check_compatible


class Tok:
    def __init__(self, vocab, eos="<eos>", bos=None, pad=None, unk=None):
        self.vocab, self.eos_token, self.bos_token, self.pad_token, self.unk_token = vocab, eos, bos, pad, unk

    def get_vocab(self):
        return dict(self.vocab)


def model(vocab_size, tok):
    return SimpleNamespace(vocab_size=vocab_size, tokenizer=tok)


VOCAB = {"a": 0, "b": 1, "<eos>": 2}


def test_identical_tokenizers_pass():
    check_compatible(model(3, Tok(VOCAB)), model(3, Tok(VOCAB)))


def test_first_differing_id_is_named():
    with pytest.raises(ValueError, match=r"differ at id 1: target 'b', draft 'c'"):
        check_compatible(model(3, Tok(VOCAB)), model(3, Tok({"a": 0, "c": 1, "<eos>": 2})))


def test_different_special_tokens_are_named():
    with pytest.raises(ValueError, match="eos_token is '<eos>' in the target, 'a' in the draft"):
        check_compatible(model(3, Tok(VOCAB)), model(3, Tok(VOCAB, eos="a")))


def test_different_vocabulary_sizes_are_refused():
    with pytest.raises(ValueError, match="target scores 3 token ids, draft 4"):
        check_compatible(model(3, Tok(VOCAB)), model(4, Tok(VOCAB)))


def test_missing_gguf_file_is_named():
    with pytest.raises(ValueError, match="nope.gguf"):
        model_source("/no/such/nope.gguf")
