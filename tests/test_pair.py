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


def test_two_native_files_are_compared_by_their_own_token_lists(tmp_path):
    """The native pair shares the target's tokenizer object, so the check reads each GGUF file's own token list:
    alike (compared whole, as stored) passes; one token respelled is named by its id."""
    from tiny_qwen2 import VOCAB as ROWS
    from tiny_qwen2 import write_tiny_qwen2

    from specdec.models.base import check_same_vocabulary
    from specdec.models.native import NativeModel

    a = write_tiny_qwen2(tmp_path / "a.gguf", tokenizer=True)
    b = write_tiny_qwen2(tmp_path / "b.gguf", seed=1, tokenizer=True)  # other weights, the same vocabulary
    data = (tmp_path / "a.gguf").read_bytes()
    assert data.count(b"<|endoftext|>") == 1
    (tmp_path / "c.gguf").write_bytes(data.replace(b"<|endoftext|>", b"<|endoftexx|>"))
    target = NativeModel(a)
    assert target.vocabulary() == NativeModel(b).vocabulary() is not None
    check_same_vocabulary(target, NativeModel(b))
    with pytest.raises(ValueError, match=rf"differ at id {ROWS - 1}: target '<\|endoftext\|>', draft '<\|endoftexx"):
        check_same_vocabulary(target, NativeModel(str(tmp_path / "c.gguf")))
