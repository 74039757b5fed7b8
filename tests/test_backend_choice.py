"""Choosing the backend (native, transformers or llama.cpp) for --target/--draft values; no model is loaded."""

import pytest

from specdec.cli import build_parser
from specdec.loading import native
from specdec.loading.pair import resolve_backend
from specdec.models import llamacpp


@pytest.fixture
def installed(monkeypatch):
    """Pretend llama-cpp-python is (True) or is not (False) importable."""
    def pretend(value: bool) -> None:
        monkeypatch.setattr(llamacpp, "available", lambda: value)
    return pretend


@pytest.fixture
def compiler(monkeypatch):
    """Pretend a C++ compiler is (True) or is not (False) here, for the native backend's kernels."""
    def pretend(value: bool) -> None:
        monkeypatch.setattr(native, "native_available", lambda: None if value else "no C++ compiler (g++)")
    return pretend


def test_auto_picks_native_for_gguf_files_on_the_cpu(installed, compiler):
    installed(True)
    compiler(True)
    assert resolve_backend("auto", None, None) == "native"  # the default pair is GGUF
    assert resolve_backend("auto", "a.gguf", "b.GGUF") == "native"
    assert resolve_backend("auto", "a.gguf", None) == "native"


def test_auto_falls_back_to_transformers(installed, compiler):
    installed(True)
    compiler(True)
    assert resolve_backend("auto", "Qwen/Qwen2.5-0.5B", "b.gguf") == "transformers"  # not every model is GGUF
    assert resolve_backend("auto", None, None, device="cuda") == "transformers"
    compiler(False)
    assert resolve_backend("auto", None, None) == "transformers"


def test_explicit_backends(installed, compiler):
    installed(True)
    compiler(True)
    assert resolve_backend("transformers", None, None) == "transformers"
    assert resolve_backend("llamacpp", "t.gguf", None) == "llamacpp"
    assert resolve_backend("native", "t.gguf", None) == "native"


@pytest.mark.parametrize("args, kwargs, fragment", [
    (("vllm", None), {}, r"backend='vllm' is invalid: choose one of auto, native, transformers, llamacpp"),
    (("llamacpp", "some/model-dir", None), {}, r"GGUF files only: 'some/model-dir'"),
    (("llamacpp", None), {"device": "cuda"}, r"on the CPU here, not on device='cuda'"),
    (("native", "some/model-dir", None), {}, r"backend=native runs GGUF files only: 'some/model-dir'"),
    (("native", None), {"device": "cuda"}, r"backend=native runs on the CPU, not on device='cuda'"),
])
def test_backends_refuse_what_they_cannot_run(installed, compiler, args, kwargs, fragment):
    installed(True)
    compiler(True)
    with pytest.raises(ValueError, match=fragment):
        resolve_backend(*args, **kwargs)


def test_missing_pieces_are_named(installed, compiler):
    installed(False)
    with pytest.raises(ValueError, match=r"specdec\[llamacpp\]"):
        resolve_backend("llamacpp", None, None)
    compiler(False)
    with pytest.raises(ValueError, match=r"backend=native is unavailable: no C\+\+ compiler"):
        resolve_backend("native", None, None)


def test_cli_has_a_backend_flag():
    args = build_parser().parse_args(["generate", "x", "--backend", "llamacpp"])
    assert args.backend == "llamacpp"
    assert build_parser().parse_args(["generate", "x"]).backend == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "x", "--backend", "onnx"])


def test_auto_leaves_architectures_the_native_backend_cannot_run_to_transformers(tmp_path, compiler):
    from tiny_gguf import write_tiny_llama
    from tiny_qwen2 import write_tiny_qwen2

    compiler(True)
    llama, qwen2 = write_tiny_llama(tmp_path / "llama.gguf"), write_tiny_qwen2(tmp_path / "qwen2.gguf")
    assert resolve_backend("auto", qwen2, qwen2) == "native"
    assert resolve_backend("auto", llama, None) == "transformers"
    assert resolve_backend("auto", qwen2, str(tmp_path / "missing.gguf")) == "native"  # the locator reports it
