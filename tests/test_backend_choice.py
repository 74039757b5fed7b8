"""Choosing the backend (native, transformers or llama.cpp) for --target/--draft values; no model is loaded."""

import pytest

from specdec.cli import build_parser
from specdec.loading import backend as backend_module
from specdec.loading.backend import resolve_backend
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
        monkeypatch.setattr(backend_module, "native_available", lambda: None if value else "no C++ compiler (g++)")
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
    from tiny_archs import write_other_arch
    from tiny_gguf import write_tiny_llama
    from tiny_qwen2 import write_tiny_qwen2

    compiler(True)
    other, qwen2 = write_other_arch(tmp_path / "mamba.gguf"), write_tiny_qwen2(tmp_path / "qwen2.gguf")
    assert resolve_backend("auto", qwen2, qwen2) == "native"
    assert resolve_backend("auto", write_tiny_llama(tmp_path / "llama.gguf"), None) == "native"  # llama: native too
    assert resolve_backend("auto", other, None) == "transformers"
    assert resolve_backend("auto", qwen2, str(tmp_path / "missing.gguf")) == "native"  # the locator reports it


def test_the_cli_accepts_every_backend_the_loader_knows():
    from specdec.loading.settings import BACKENDS

    for backend in BACKENDS:
        assert build_parser().parse_args(["generate", "x", "--backend", backend]).backend == backend


@pytest.fixture
def broken_kernels(tmp_path, monkeypatch):
    """An empty kernel cache and $CXX pointing at a compiler that fails (``"missing"``: a program that does not
    exist; ``"header"``: a g++ stand-in reporting a missing header); returns the error line it causes."""
    from test_native_build import GXX_MISSING_HEADER, fake_compiler

    def set_up(kind: str) -> str:
        monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
        if kind == "missing":
            monkeypatch.setenv("CXX", "/nonexistent/g++")
            return "the C++ compiler '/nonexistent/g++' cannot be run (No such file or directory)"
        monkeypatch.setenv("CXX", fake_compiler(tmp_path, GXX_MISSING_HEADER))
        return "f32.cpp:3:10: fatal error: hsum.h: No such file or directory"

    backend_module.native_available.cache_clear()
    yield set_up
    backend_module.native_available.cache_clear()  # later tests see the real compiler again


@pytest.mark.parametrize("kind", ["missing", "header"])
def test_kernels_that_cannot_build_are_one_line_naming_the_compiler_error(tmp_path, broken_kernels, capsys, kind):
    from tiny_qwen2 import write_tiny_qwen2

    from specdec.cli import main

    error = broken_kernels(kind)
    qwen2 = write_tiny_qwen2(tmp_path / "qwen2.gguf", tokenizer=True)
    assert resolve_backend("auto", qwen2, qwen2) == "transformers"
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: --backend auto falls back to transformers")
    assert error in lines[0]
    with pytest.raises(ValueError, match=r"backend=native is unavailable: compiling [a-z0-9_]+\.cpp failed: ") as info:
        resolve_backend("native", qwen2, qwen2)
    assert error in str(info.value) and "\n" not in str(info.value)
    capsys.readouterr()
    assert main(["generate", "x", "--target", qwen2, "--draft-model", qwen2, "--backend", "native"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith("specdec generate: error: backend=native is unavailable: ") and error in err


@pytest.mark.parametrize("fields, message", [
    ({"backend": "vllm"}, r"backend='vllm' is invalid: choose one of auto, native, transformers, llamacpp"),
    ({"dtype": "int4"}, r"dtype='int4' is invalid: choose one of auto, float32, bfloat16, float16"),
    ({"quantize": "int4"}, r"quantize='int4' is invalid: choose one of auto, int8, none"),
    ({"kernels": "avx512"}, r"kernels='avx512' is invalid: choose one of native, avx2, scalar"),
    ({"threads": 0}, r"threads=0 is invalid: must be an integer >= 1"),
    ({"draft_head": -1}, r"draft_head=-1 is invalid: must be an integer >= 0"),
    ({"cache_gb": float("nan")}, r"cache_gb=nan is invalid: must be a number >= 0"),
    ({"target": 3}, r"target=3 is invalid"),
])
def test_load_settings_refuse_a_bad_value_where_they_are_built(fields, message):
    from specdec.loading.settings import LoadSettings

    with pytest.raises(ValueError, match=message):
        LoadSettings(**fields)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_threads_are_refused_by_the_one_check_wherever_they_come_from(bad):
    from specdec import session
    from specdec.loading.settings import LoadSettings

    for make in (session.set_threads, lambda n: LoadSettings(threads=n)):
        with pytest.raises(ValueError, match=rf"^threads={bad!r} is invalid: must be an integer >= 1$"):
            make(bad)


def test_load_settings_resolve_auto_for_the_device():
    from specdec.loading.settings import LoadSettings

    assert (LoadSettings().for_device().dtype, LoadSettings().for_device().quantize) == ("float32", "int8")
    cuda = LoadSettings(device="cuda").for_device()
    assert (cuda.dtype, cuda.quantize) == ("bfloat16", "none")
    assert LoadSettings(dtype="bfloat16", quantize="none").for_device().dtype == "bfloat16"
