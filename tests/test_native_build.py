"""The kernel build: the set-up's build step removes this CPU's builds of older sources, nothing else; a failed
build says why in its first line (the compiler's first error line) and leaves no library behind; the set-up's
``python -m specdec.native.build`` runs without runpy's warning."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from specdec.machine import cpu_flags_key
from specdec.native import build


def test_prune_removes_only_older_builds_of_the_same_isa_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    current = [build.library_path(name, "scalar").parent for name in build.sources()]  # a folder per source
    kernels = current[0].parent
    stale = kernels / f"scalar-{cpu_flags_key()}-000000000000"
    other_isa = kernels / f"avx2-{cpu_flags_key()}-000000000000"
    other_cpu = kernels / "scalar-othercpu-000000000000"
    for d in (*current, stale, other_isa, other_cpu):
        d.mkdir(parents=True, exist_ok=True)
        (d / "libx.so").write_bytes(b"")
    assert len(set(current)) > 1
    assert build.prune("scalar") == [stale]
    assert not stale.exists()
    assert all(d.is_dir() for d in (*current, other_isa, other_cpu))
    assert build.prune("scalar") == []


def fake_compiler(folder, stderr: str, status: int = 1) -> str:
    """A stand-in for g++ (through $CXX) that prints ``stderr`` and exits with ``status``."""
    script = folder / "fake-g++"
    script.write_text(f"#!/bin/sh\ncat >&2 <<'END'\n{stderr}\nEND\nexit {status}\n")
    script.chmod(0o755)
    return str(script)


GXX_MISSING_HEADER = ("In file included from f32.cpp:12:\n"
                      "f32.cpp:3:10: fatal error: hsum.h: No such file or directory\n"
                      "    3 | #include \"hsum.h\"\n"
                      "compilation terminated.")


def test_a_compiler_error_is_named_in_the_first_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", fake_compiler(tmp_path, GXX_MISSING_HEADER))
    with pytest.raises(build.KernelBuildError) as info:
        build.build("f32", "scalar")
    first, *rest = str(info.value).splitlines()
    assert first == "compiling f32.cpp failed: f32.cpp:3:10: fatal error: hsum.h: No such file or directory"
    assert any("fake-g++" in line for line in rest) and "compilation terminated." in rest  # the command, the output
    folder = build.library_path("f32", "scalar").parent
    assert sorted(p.name for p in folder.iterdir()) == ["libf32.lock"]  # no library, no temporary file


def test_a_compiler_that_cannot_run_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "nonexistent"))
    with pytest.raises(build.KernelBuildError, match=r"^compiling f32\.cpp failed: the C\+\+ compiler '.*nonexistent' "
                       r"cannot be run \(No such file or directory\); set CXX") as info:
        build.build("f32", "scalar")
    assert "\n" not in str(info.value)


def test_a_compiler_that_writes_nothing_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", fake_compiler(tmp_path, "", status=0))
    with pytest.raises(build.KernelBuildError, match=r"exited with status 0 but wrote no library"):
        build.build("f32", "scalar")
    assert not build.library_path("f32", "scalar").exists()


@pytest.mark.parametrize("stderr, status, first", [
    ("a.cpp: In function 'f':\na.cpp:2:1: error: 'x' was not declared\n", 1, "a.cpp:2:1: error: 'x' was not declared"),
    ("ld: cannot find -lgomp\ncollect2: ld returned 1 exit status\n", 1, "collect2: ld returned 1 exit status"),
    ("something odd\n\nlast words  \n", 1, "last words"),
    ("", 139, "the compiler exited with status 139 and printed nothing"),
])
def test_first_error_picks_the_line_that_says_why(stderr, status, first):
    assert build.first_error(stderr, status) == first


def test_the_sources_come_from_the_package_folder_headers_included():
    import specdec.native

    folder = pathlib.Path(specdec.native.__file__).parent
    assert build.HERE == folder.resolve()
    included = {line.split('"')[1] for src in (*folder.glob("*.cpp"), *folder.glob("*.h"))
                for line in src.read_text().splitlines()
                if line.startswith("#include \"")}
    assert included and all((folder / name).is_file() for name in included)


def test_the_build_command_runs_without_runpy_warning():
    """runpy imports the package (so ``import specdec``) before running ``build`` as ``__main__``, and warns when
    that import already imported ``build``: nothing may import it at import time (``specdec.native.isas``)."""
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "specdec.native.build", "no-such-isa"],
                          capture_output=True, text=True, timeout=120)
    assert "RuntimeWarning" not in done.stderr
    assert "isa='no-such-isa' is invalid" in done.stderr  # main ran, and refused the isa before compiling anything
