"""Bad model, device and drafter values: one line on stderr, exit status 2, no weights loaded, no hub."""

import time

import pytest

from specdec import cli, session
from specdec.loading import hf_pair, locate, pair, tokenizer


@pytest.fixture(autouse=True)
def no_loading(monkeypatch):
    """Any attempt to load weights (or assemble the default pair) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("weights were about to load for a bad spec")
    for name in ("load_hf_model", "convert_gguf"):
        monkeypatch.setattr(hf_pair, name, refuse)
    monkeypatch.setattr(pair, "load_llamacpp_models", refuse)
    monkeypatch.setattr(tokenizer, "load_tokenizer", refuse)
    monkeypatch.setattr(session, "load", refuse)
    monkeypatch.setattr(session, "load_pair", refuse)


@pytest.fixture
def files(tmp_path):
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    fake = tmp_path / "x.gguf"
    fake.write_text("not a gguf file")
    return {"EMPTY": str(empty), "FAKE": str(fake), "MISSING_DIR": str(tmp_path / "no" / "such" / "dir"),
            "MISSING_FILE": str(tmp_path / "nope.gguf"), "NGRAM_MISSING": f"ngram:{tmp_path / 'no.ngram'}"}


CASES = [
    # (command line with placeholders, the bad value the one line must name)
    (["generate", "hi", "--draft", "bogus"], "bogus"),
    (["generate", "hi", "--draft", "NGRAM_MISSING"], "NGRAM_MISSING"),
    (["generate", "hi", "--target", "MISSING_FILE"], "MISSING_FILE"),
    (["generate", "hi", "--target", "MISSING_DIR"], "MISSING_DIR"),
    (["generate", "hi", "--target", "EMPTY"], "EMPTY"),
    (["generate", "hi", "--target", "FAKE"], "FAKE"),
    (["generate", "hi", "--draft-model", "MISSING_DIR"], "MISSING_DIR"),
    (["generate", "hi", "--draft-model", "FAKE"], "FAKE"),
    (["generate", "hi", "--device", "tpu"], "tpu"),
    (["generate", "hi", "--device", "cuda:99"], "cuda:99"),
    (["measure", "--drafts", "bogus", "--gammas"], "bogus"),
    (["measure", "--drafts", "lookup", "--gammas"], "lookup"),
    (["measure", "--target", "MISSING_DIR", "--gammas"], "MISSING_DIR"),
    (["measure", "--draft-model", "FAKE", "--gammas"], "FAKE"),
    (["measure", "--device", "tpu", "--gammas"], "tpu"),
    (["bench", "--target", "EMPTY", "--modes", "model:3", "--backends", "transformers"], "EMPTY"),
    (["bench", "--draft-model", "MISSING_FILE", "--modes", "model:3", "--backends", "transformers"], "MISSING_FILE"),
    (["bench", "--modes", "bogus:3", "--backends", "transformers", "--dry-run"], "bogus"),
]


@pytest.mark.parametrize("argv, bad", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_spec_is_one_line_and_exit_2(argv, bad, files, capsys, tmp_path):
    argv = [files.get(a, a) for a in argv]
    bad = files.get(bad, bad)
    if argv[0] == "bench":
        argv += ["--out", str(tmp_path / "out")]
    start = time.perf_counter()
    code = cli.main(argv)
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert code == 2, err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith(f"specdec {argv[0]}: error: ") and bad in lines[0]
    assert "huggingface" not in (out + err).lower()
    assert elapsed < 10  # nothing heavy ran


def test_the_drafter_help_comes_from_the_one_table():
    from specdec.choices import FORM_TABLE

    text = cli.build_parser()._subparsers._group_actions[0].choices["generate"].format_help()
    flat = " ".join(text.split())
    for form in FORM_TABLE:
        assert form.usage in flat


def test_locate_model_accepts_gguf_files_and_model_directories(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 16)
    assert locate.locate_model(str(gguf), "target") == ("gguf", str(gguf))
    holder = tmp_path / "holder"
    holder.mkdir()
    (holder / "only.gguf").write_bytes(b"GGUF")
    assert locate.locate_model(str(holder), "draft") == ("gguf", str(holder / "only.gguf"))
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text("{}")
    assert locate.locate_model(str(hf_dir), "target") == ("transformers", str(hf_dir))
    assert locate.locate_model(None, "target", assemble=False) == ("gguf", None)
