"""ruff (pyflakes, pycodestyle, import order, bugbear, pyupgrade; settings in pyproject.toml) finds nothing.

Skipped only when ruff is not installed and SPECDEC_REQUIRE_REAL is unset (scripts/test.sh sets it,
so CI cannot skip it silently). Fix findings with ``ruff check --fix src tests benchmarks`` (safe
fixes) and by hand.
"""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATHS = ("src", "tests", "benchmarks")


def ruff_command() -> list[str] | None:
    """ruff next to this Python (the venv's), else ``python -m ruff``, else one on PATH."""
    beside = pathlib.Path(sys.executable).parent / ("ruff.exe" if os.name == "nt" else "ruff")
    if beside.is_file():
        return [str(beside)]
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    on_path = shutil.which("ruff")
    return [on_path] if on_path else None


def test_ruff_finds_nothing():
    command = ruff_command()
    if command is None:
        if os.environ.get("SPECDEC_REQUIRE_REAL"):
            raise RuntimeError("SPECDEC_REQUIRE_REAL is set but ruff is not installed (pip install -e '.[test]')")
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    paths = [p for p in PATHS if (ROOT / p).exists()]
    done = subprocess.run([*command, "check", "--no-cache", "--output-format", "concise", *paths],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"ruff check {' '.join(paths)} found problems:\n{done.stdout}{done.stderr}"
