"""The kernel build cache: the set-up's build step removes this CPU's builds of older sources, nothing else."""

from __future__ import annotations

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
