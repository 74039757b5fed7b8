"""The public library: README's library example runs as written (the default pair, natively), ``load_model``
and the native backend's names are exported, and ``import specdec`` stays light."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import specdec
from specdec.loading import defaults
from specdec.loading.locate import ModelSpecError

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def library_example() -> str:
    """The first python block after README's "As a library" line."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\nAs a library")
    found = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert found, "README has no python block after 'As a library'"
    return found.group(1)


def test_the_example_uses_only_exported_names():
    code = library_example()
    imported = re.search(r"from specdec import (.+)", code).group(1).split(", ")
    assert set(imported) <= set(specdec.__all__) and "load_model" in imported
    assert {"NativeModel", "NativeSettings", "load_model"} <= set(specdec.__all__)
    assert all(hasattr(specdec, name) for name in specdec.__all__)


def test_import_specdec_loads_neither_transformers_nor_llamacpp():
    probe = "import sys, specdec; print([m for m in ('transformers', 'tokenizers', 'llama_cpp') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]", out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_qwen2 import write_tiny_qwen2

    from specdec.loading.backend import native_available

    why = native_available()
    if why:
        pytest.skip(f"the native backend cannot run here: {why}")
    return write_tiny_qwen2(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tokenizer=True)


def test_load_model_gives_a_native_model_with_the_files_tokenizer(tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target = specdec.load_model(tiny, threads=1)
    assert isinstance(target, specdec.NativeModel) and target.settings == specdec.NativeSettings(threads=1)
    ids = target.tokenizer("the cat")["input_ids"]
    draft = specdec.load_model(tiny, "native", role="draft", threads=1, tokenizer=target.tokenizer)
    assert draft.tokenizer is target.tokenizer
    greedy = specdec.SamplingParams(temperature=0.0)
    plain = specdec.autoregressive_generate(target, ids, max_new_tokens=6, sampling=greedy)
    spec = specdec.speculative_generate(target, draft, ids, max_new_tokens=6, gamma=3, sampling=greedy)
    assert spec.tokens == plain.tokens and len(plain.tokens) == 6


def test_load_model_refuses_bad_values_in_one_line(tiny, tmp_path):
    with pytest.raises(ModelSpecError, match="nope.gguf"):
        specdec.load_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(ValueError, match=r"dtype='float32' applies to the transformers backend only"):
        specdec.load_model(tiny, "native", dtype="float32")
    with pytest.raises(ValueError, match="role='judge' is invalid"):
        specdec.load_model(tiny, role="judge")
    with pytest.raises(ValueError, match="backend"):
        specdec.load_model(tiny, "tpu")


@pytest.mark.slow
def test_the_readme_library_example_runs_the_default_pair_natively(capsys):
    if defaults.missing_packages(defaults.DEFAULT_TARGET) or defaults.missing_packages(defaults.DEFAULT_DRAFT):
        if os.environ.get("SPECDEC_REQUIRE_REAL"):
            raise RuntimeError("SPECDEC_REQUIRE_REAL is set but specdec[default-models] is not installed")
        pytest.skip("specdec[default-models] not installed")
    from specdec.loading.backend import native_available

    code = library_example()
    assert "max_new_tokens=64" in code
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        scope: dict = {}
        exec(compile(code.replace("max_new_tokens=64", "max_new_tokens=8"), str(README), "exec"), scope)
    finally:
        torch.set_num_threads(threads)
    gen = scope["gen"]
    assert 1 <= len(gen.tokens) <= 8 and gen.stats.target_calls >= 1
    if native_available() is None:
        assert isinstance(scope["target"], specdec.NativeModel) and isinstance(scope["draft"], specdec.NativeModel)
    assert capsys.readouterr().out.strip()  # the decoded text was printed
