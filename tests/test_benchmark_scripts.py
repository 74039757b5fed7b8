"""Every maintained tool in benchmarks/ still starts: ``--help`` exits 0 and names its options (the scripts with
pure parts worth more have tests of their own: test_serve_load_script, test_serve_compare_script,
test_perplexity_script). A script that no longer imports, or whose options no longer parse, fails here."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = ["bench_default.py", "profile_round.py", "prompt_kernels.py", "tree_headroom.py", "batch_rows.py",
           "draft_window.py", "tree_ab.py", "constrained.py", "agent_traffic.py", "history_cost.py", "presets.py",
           "serve_replicas.py", "draft_quant.py", "panel_kernel.py", "target_rows.py", "stacked_products.py",
           "kernel_ab.py"]


def test_every_script_in_benchmarks_is_covered():
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    tested_elsewhere = {"serve_load.py", "serve_compare.py", "serve_compare_report.py", "servers.py", "perplexity.py"}
    assert scripts == set(SCRIPTS) | tested_elsewhere


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_help(script):
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout and "--" in done.stdout
