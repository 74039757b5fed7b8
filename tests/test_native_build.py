"""The kernel build cache: the set-up's build step removes this CPU's builds of older sources, nothing else."""

from __future__ import annotations

from specdec.machine import cpu_flags_key
from specdec.native import build


def test_prune_removes_only_older_builds_of_the_same_isa_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    current = build.library_path(build.sources()[0], "scalar").parent
    kernels = current.parent
    stale = kernels / f"scalar-{cpu_flags_key()}-000000000000"
    other_isa = kernels / f"avx2-{cpu_flags_key()}-000000000000"
    other_cpu = kernels / "scalar-othercpu-000000000000"
    for d in (current, stale, other_isa, other_cpu):
        d.mkdir(parents=True)
        (d / "libx.so").write_bytes(b"")
    assert build.prune("scalar") == [stale]
    assert not stale.exists()
    assert current.is_dir() and other_isa.is_dir() and other_cpu.is_dir()
    assert build.prune("scalar") == []
