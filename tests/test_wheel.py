"""The package as a user installs it: a source distribution built from the repository's files, the wheel built from
that, installed into a fresh virtual environment outside the repository; then the main job's command on the native
backend (a tiny random Qwen2 GGUF pair) from a folder outside the repository. The kernels compile from the installed
package's own sources into an empty cache, so the run proves that the wheel carries every source and header, and its
output must equal the editable install's for the same command.

The fresh environment gets specdec from the wheel only; its dependencies (torch, transformers, ...) are the
repository environment's, seen through a ``.pth`` line naming that site-packages folder: a ``.pth`` line adds a
folder to ``sys.path`` without running the ``.pth`` files inside it, so the editable install's hook stays inert.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from tiny_qwen2 import write_tiny_qwen2

from specdec.cache import cache_dir
from specdec.native import build

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 300  # seconds per step, a bound for a stuck step (the whole test takes about a minute)
COMMAND = ["generate", "the cat sat on the mat", "--target", "target.gguf", "--draft-model", "draft.gguf",
           "--backend", "native", "--json", "--no-chat", "--max-new-tokens", "24", "--gamma", "3",
           "--draft-head", "0", "--threads", "2", "--temperature", "0"]
SAME = ("text", "prompt_tokens", "new_tokens", "target_calls", "draft_calls", "acceptance_rate", "gamma_histogram",
        "gamma_chosen", "drafter", "backend")  # every figure of the run that does not depend on timing


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def clean_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "SPECDEC_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin folder of a fresh virtual environment holding specdec installed from its wheel."""
    pytest.importorskip("setuptools", minversion="77")  # the build backend, used as installed (no download)
    root = tmp_path_factory.mktemp("wheel")
    tree = root / "tree"  # the files a source distribution is made of, copied: the build writes beside them
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "MANIFEST.in", "LICENSE"):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, tree / name)
    dist = root / "dist"
    sdist = dist / run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                        "print(b.build_sdist(sys.argv[1]))", str(dist)], cwd=tree).stdout.split()[-1]
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(sdist), "-w", str(dist)])
    (wheel,) = dist.glob("specdec-*.whl")
    packed = set(zipfile.ZipFile(wheel).namelist())
    native = REPO / "src" / "specdec" / "native"
    sources = {f"specdec/native/{p.name}" for p in native.iterdir() if p.suffix in (".cpp", ".h")}
    assert sources <= packed, f"the wheel lacks {sorted(sources - packed)}"

    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)])
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "specdec-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = run([str(python), "-c", "import specdec; print(specdec.__file__)"], cwd=root, env=clean_env(root)).stdout
    assert Path(where.strip()).is_relative_to(site) and not Path(where.strip()).is_relative_to(REPO), where
    return venv / "bin"


def test_the_installed_wheel_runs_the_native_backend_like_the_editable_install(installed, tmp_path):
    work = tmp_path / "work"  # outside the repository
    work.mkdir()
    write_tiny_qwen2(work / "target.gguf", seed=0, tokenizer=True)
    write_tiny_qwen2(work / "draft.gguf", seed=1, tokenizer=True)

    fresh = tmp_path / "cache-installed"  # empty: the kernels compile from the installed package's files
    done = run([str(installed / "specdec"), *COMMAND], cwd=work, env=clean_env(fresh))
    wheel_run = json.loads(done.stdout)
    assert wheel_run["backend"] == "native" and "falls back" not in done.stderr, done.stderr
    built = sorted(p.relative_to(fresh / "kernels") for p in (fresh / "kernels").glob("*/lib*.so"))
    # the same folders (hash of each source with every header) as the repository's sources give: the same files
    expected = sorted(build.library_path(name).relative_to(cache_dir() / "kernels") for name in build.sources())
    assert [str(p) for p in built] == [str(p) for p in expected]

    editable = tmp_path / "cache-editable"  # its own tokenizer cache; the kernels of the usual cache, to save time
    editable.mkdir()
    (cache_dir() / "kernels").mkdir(parents=True, exist_ok=True)
    (editable / "kernels").symlink_to(cache_dir() / "kernels", target_is_directory=True)
    done = run([sys.executable, "-m", "specdec", *COMMAND], cwd=work, env=clean_env(editable))
    editable_run = json.loads(done.stdout)
    assert {k: wheel_run[k] for k in SAME} == {k: editable_run[k] for k in SAME}
    assert wheel_run["new_tokens"] == 24 and wheel_run["text"]
