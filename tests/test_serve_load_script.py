"""benchmarks/serve_load.py on the toy pair: it starts ``specdec serve --toy`` itself, runs two
concurrency levels, writes its JSON and markdown, and stops the server."""

import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "serve_load.py"


def test_serve_load_on_toy_pair(tmp_path):
    stem = tmp_path / "serve-load"
    done = subprocess.run([sys.executable, str(SCRIPT), "--clients", "1", "2", "--requests-per-client", "1",
                           "--max-tokens", "8", "--warmup", "0", "--timeout", "30", "--startup-timeout", "40",
                           "--out", str(stem), "--", "--toy"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(stem.with_suffix(".json").read_text())
    assert [row["clients"] for row in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert row["errors"] == 0 and row["completed"] == row["requests"] == row["clients"]
        assert row["ttft_p50_s"] > 0 and row["ttft_p95_s"] > 0
        assert row["tokens"] == 8 * row["clients"]  # the toy pair has no end of text: max_tokens each
    assert all(r["ok"] and r["ttft"] > 0 and r["done"] and r["finish_reason"] == "length" for r in report["requests"])
    assert report["server_args"] == ["--toy"] and report["machine"]["cpu"]
    assert "| clients |" in stem.with_suffix(".md").read_text()
    assert "| 2 | 2 |" in done.stdout
