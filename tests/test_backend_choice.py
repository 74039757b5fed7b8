"""Choosing the backend (transformers or llama.cpp) for --target/--draft values; no model is loaded."""

import pytest

from specdec.cli import build_parser
from specdec.loading.pair import resolve_backend
from specdec.models import llamacpp


@pytest.fixture
def installed(monkeypatch):
    """Pretend llama-cpp-python is (True) or is not (False) importable."""
    def pretend(value: bool) -> None:
        monkeypatch.setattr(llamacpp, "available", lambda: value)
    return pretend


def test_auto_picks_llamacpp_for_gguf_files_when_installed(installed):
    installed(True)
    assert resolve_backend("auto", None, None) == "llamacpp"  # the default pair is GGUF
    assert resolve_backend("auto", "a.gguf", "b.GGUF") == "llamacpp"
    assert resolve_backend("auto", "a.gguf", None) == "llamacpp"


def test_auto_falls_back_to_transformers(installed):
    installed(True)
    assert resolve_backend("auto", "Qwen/Qwen2.5-0.5B", "b.gguf") == "transformers"  # not every model is GGUF
    assert resolve_backend("auto", None, None, device="cuda") == "transformers"
    installed(False)
    assert resolve_backend("auto", None, None) == "transformers"


def test_explicit_backends(installed):
    installed(True)
    assert resolve_backend("transformers", None, None) == "transformers"
    assert resolve_backend("llamacpp", "t.gguf", None) == "llamacpp"


@pytest.mark.parametrize("args, kwargs, fragment", [
    (("vllm", None), {}, r"backend='vllm' is invalid: choose one of auto, transformers, llamacpp"),
    (("llamacpp", "some/model-dir", None), {}, r"GGUF files only: 'some/model-dir'"),
    (("llamacpp", None), {"device": "cuda"}, r"on the CPU here, not on device='cuda'"),
])
def test_llamacpp_refuses_what_it_cannot_run(installed, args, kwargs, fragment):
    installed(True)
    with pytest.raises(ValueError, match=fragment):
        resolve_backend(*args, **kwargs)


def test_llamacpp_not_installed_names_the_extra(installed):
    installed(False)
    with pytest.raises(ValueError, match=r"specdec\[llamacpp\]"):
        resolve_backend("llamacpp", None, None)


def test_cli_has_a_backend_flag():
    args = build_parser().parse_args(["generate", "x", "--backend", "llamacpp"])
    assert args.backend == "llamacpp"
    assert build_parser().parse_args(["generate", "x"]).backend == "transformers"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "x", "--backend", "onnx"])
