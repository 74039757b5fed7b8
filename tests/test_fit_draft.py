"""``specdec fit-draft``: corpus files to an n-gram table file, with a small local tokenizer
(no model weights anywhere), the target-generations path on the toy pair, and input errors."""

import pathlib
import sysconfig

import pytest

from specdec import session
from specdec.cli import main
from specdec.cli.fit_draft import corpus_files
from specdec.models.ngram import NgramModel
from specdec.models.toy import TOY_WORDS, ToyPair

WORDS = ["def", "return", "x", "total", "for", "in", ":", "(", ")", "=", "+", "[UNK]"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A word-level tokenizer saved like a model directory, but with no weights in it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)
    return str(path)


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    (root / "pkg").mkdir(parents=True)
    (root / "a.py").write_text("def total ( x ) : return x + x")
    (root / "pkg" / "b.py").write_text("for x in total : x = x + total")
    (root / "notes.md").write_text("return return return")  # not matched by the default *.py
    return root


def test_fit_draft_writes_a_table_from_corpus_files(tmp_path, corpus, tokenizer_dir, capsys):
    out = tmp_path / "draft.ngram"
    code = main(["fit-draft", "--corpus", str(corpus), "--order", "2", "--min-count", "1",
                 "--tokenizer-of", tokenizer_dir, "--out", str(out)])
    assert code == 0
    model = NgramModel.load(out)
    assert model.order == 2 and model.vocab_size == len(WORDS)
    assert model.meta["tokens"] == 10 + 10 and model.meta["files"] == 2
    ids = {w: i for i, w in enumerate(WORDS)}
    model.prefill([])
    after_def = model.score([ids["def"]])[0].exp()
    assert int(after_def.argmax()) == ids["total"]  # "def" is always followed by "total"
    assert "fitted an order-2 n-gram on 20 tokens" in capsys.readouterr().err


def test_fit_draft_globs_and_files(tmp_path, corpus, tokenizer_dir):
    out = tmp_path / "md.ngram"
    assert main(["fit-draft", "--corpus", str(corpus), "--glob", "*.md", "--order", "1",
                 "--tokenizer-of", tokenizer_dir, "--out", str(out)]) == 0
    assert NgramModel.load(out).meta["tokens"] == 3
    assert corpus_files([str(corpus / "a.py")], ["*.md"]) == [corpus / "a.py"]  # a named file is always read


def test_stdlib_shorthand_lists_the_standard_library_without_its_tests():
    files = corpus_files(["stdlib"], ["*.py"])
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    names = {str(f.relative_to(root)) for f in files}
    assert "os.py" in names and "json/decoder.py" in names
    assert not any(part in ("test", "tests", "site-packages") for f in files for part in f.relative_to(root).parts)


def test_fit_draft_from_the_targets_own_generations(tmp_path, monkeypatch, capsys):
    """--from-target on the toy pair (no weights): prompt + continuation become the sequences."""
    loaded = []

    def fake_load(settings, log=None):
        loaded.append((settings.target, settings.with_draft))
        return ToyPair()

    monkeypatch.setattr(session, "load", fake_load)
    monkeypatch.setattr("specdec.loading.tokenizer.load_tokenizer", lambda spec=None: _ToyTokenizer())
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat\n\nthe dog ran\n")
    out = tmp_path / "target.ngram"
    assert main(["fit-draft", "--from-target", str(prompts), "--tokens", "6", "--order", "2", "--min-count", "1",
                 "--out", str(out)]) == 0
    assert loaded == [(None, False)]  # the default target only, no draft model
    model = NgramModel.load(out)
    assert model.meta["prompts"] == 2 and model.meta["tokens"] == (2 + 6) + (3 + 6)


class _ToyTokenizer:
    def __len__(self):
        return len(TOY_WORDS)


@pytest.mark.parametrize("argv, fragment", [
    (["--out", "x.ngram"], "no source given"),
    (["--corpus", "/no/such/dir", "--out", "x.ngram"], "neither a file, a directory"),
    (["--corpus", "stdlib", "--order", "0", "--out", "x.ngram"], "order=0"),
    (["--corpus", "stdlib", "--out", "/no/such/dir/x.ngram"], "does not exist"),
    (["--from-target", "/no/such/prompts.txt", "--out", "x.ngram"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, fragment, capsys):
    assert main(["fit-draft", *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_an_empty_directory_is_refused(tmp_path, capsys):
    assert main(["fit-draft", "--corpus", str(tmp_path), "--out", str(tmp_path / "x.ngram")]) == 2
    assert "no file matching *.py" in capsys.readouterr().err
