"""benchmarks/serve_compare.py without any server: its options, the prompt cutting, the choice of files, the
concurrency figures, llama-bench's output, the report's tables and goals from fixed measurements, ``--help``."""

import importlib
import json
import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPT = BENCHMARKS / "serve_compare.py"


@pytest.fixture(scope="module")
def sc():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its neighbours (servers, serve_load) by name
    try:
        yield importlib.import_module("serve_compare")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def report_module(sc):
    return sys.modules["serve_compare_report"]


def words(text: str) -> int:  # a stand-in tokenizer: one token per word
    return len(text.split())


def test_help_runs_without_a_server():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--prompt-lengths" in done.stdout and "-- specdec serve options" in done.stdout


def test_arguments(sc):
    args, server_args = sc.parse_args(["--sections", "long", "followup", "--clients", "8", "1", "8",
                                       "--prompt-lengths", "4096", "1024", "4096", "--", "--cache-gb", "2"])
    assert server_args == ["--cache-gb", "2"]
    assert args.sections == ["followup", "long"]  # the script's order, whatever the command line's
    assert args.clients == [1, 8] and args.prompt_lengths == [4096, 1024]
    defaults, none = sc.parse_args([])
    assert none == [] and defaults.sections == list(sc.SECTIONS) and defaults.clients == [1, 4, 8]
    assert (defaults.requests_per_client, defaults.max_tokens, defaults.context_tokens) == (2, 64, 3000)
    assert defaults.out == "benchmarks/results/serve-compare"


@pytest.mark.parametrize("argv", [["--clients", "0"], ["--max-tokens", "-1"], ["--prompt-lengths", "0"],
                                  ["--warmup", "-1"], ["--followups", "9"], ["--sections", "nope"],
                                  ["--", "--port", "9000"], ["--", "--host=0.0.0.0"]])
def test_bad_arguments_exit_with_status_2(sc, argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        sc.parse_args(argv)
    assert exit_.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_cut_to_tokens_keeps_whole_lines_up_to_the_limit(sc):
    text = "".join(f"line {i} has some words\n" for i in range(100))  # 5 words a line
    cut = sc.cut_to_tokens(text, 52, words)
    assert text.startswith(cut) and cut.endswith("\n")
    assert words(cut) == 50  # 10 lines; an 11th would pass 52
    assert sc.cut_to_tokens(text, 10_000, words) == text
    assert sc.cut_to_tokens(text, 4, words) == ""


def test_documents_use_a_file_each_and_skip_short_ones(sc):
    sources = {"short.py": "a b\n" * 10, "one.py": "x y z\n" * 100, "two.py": "p q\n" * 300, "three.py": "k\n" * 50}
    args, _ = sc.parse_args(["--context-tokens", "30", "--prompt-lengths", "40"])
    needs = sc.document_needs(args)
    assert needs == {"followup": 30, "cold": 30, "long-40": 40}
    picked = sc.pick_documents(needs, sources, words)
    assert {k: name for k, (name, _) in picked.items()} == {"followup": "one.py", "cold": "two.py",
                                                           "long-40": "three.py"}
    assert [words(text) for _, text in picked.values()] == [30, 30, 40]
    with pytest.raises(ValueError, match="long-40: no unused source file has 40 tokens"):
        sc.pick_documents(needs, {k: sources[k] for k in ("one.py", "two.py")}, words)


def test_slot_context_fits_the_longest_prompt(sc):
    assert sc.slot_context(sc.parse_args([])[0]) == 9216  # 8192 + 256 + 64, rounded up to 1024
    assert sc.slot_context(sc.parse_args(["--sections", "followup", "concurrency"])[0]) == 4096
    assert sc.slot_context(sc.parse_args(["--sections", "long", "--prompt-lengths", "16200"])[0]) == 17408
    assert sc.slot_context(sc.parse_args(["--slot-context", "2048"])[0]) == 2048


def test_option_value_and_llama_bench_output(sc):
    from servers import option_value

    assert option_value(["--api-key", "a", "--x", "--api-key=b"], "--api-key") == "b"
    assert option_value(["--target", "t.gguf"], "--target") == "t.gguf"
    assert option_value(["--api-key"], "--api-key") is None
    out = json.dumps([{"n_prompt": 512, "n_gen": 0, "avg_ts": 150.5}, {"n_prompt": 1024, "n_gen": 0, "avg_ts": 140.0},
                      {"n_prompt": 0, "n_gen": 16, "avg_ts": 30.0}])
    assert sc.parse_llama_bench(out) == {512: 150.5, 1024: 140.0}


def answer(server, section, label, ttft, ok=True, tokens=32, prompt_tokens=3050, client=0, index=0):
    return {"server": server, "section": section, "label": label, "ttft": ttft, "ok": ok, "tokens": tokens,
            "prompt_tokens": prompt_tokens, "client": client, "index": index,
            "error": None if ok else "timeout: no complete answer within 600 s"}


def level(report_module, server, clients, rate_per_client, wall=10.0):
    per_client = [([answer(server, "concurrency", f"N={clients}", 0.5 + c, tokens=int(rate_per_client * wall))],
                   wall) for c in range(clients)]
    return report_module.level_summary(clients, per_client, wall)


def test_level_summary(report_module):
    per_client = [([answer("specdec", "concurrency", "N=2", 1.0, tokens=64),
                    answer("specdec", "concurrency", "N=2", 3.0, tokens=64)], 8.0),
                  ([answer("specdec", "concurrency", "N=2", 2.0, tokens=64),
                    answer("specdec", "concurrency", "N=2", 9.0, ok=False, tokens=5)], 4.0)]
    row = report_module.level_summary(2, per_client, 10.0)
    assert (row["requests"], row["errors"], row["tokens"]) == (4, 1, 192)  # the failed answer's tokens not counted
    assert row["tokens_per_s"] == pytest.approx(19.2)
    assert row["ttft_p50_s"] == pytest.approx(2.0) and row["ttft_p95_s"] == pytest.approx(2.9)
    assert row["client_tokens_per_s"] == pytest.approx((128 / 8 + 64 / 4) / 2)


def fixed_report(report_module):
    answers = {"specdec": [answer("specdec", "followup", "cold", 30.0),
                           answer("specdec", "followup", "follow-up 1", 0.5) | {"extra": {"specdec": {
                               "alpha": 0.8, "prompt_tokens_reused": 3000}}},
                           answer("specdec", "followup", "follow-up 2", 0.9), answer("specdec", "cold", "cold", 20.0)],
               "llama-server": [answer("llama-server", "followup", "cold", 24.0),
                                answer("llama-server", "followup", "follow-up 1", 0.4) | {"extra": {"timings": {
                                    "cache_n": 2990, "prompt_n": 60}}},
                                answer("llama-server", "followup", "follow-up 2", 0.5),
                                answer("llama-server", "cold", "cold", 25.0, ok=False)]}
    levels = {"specdec": [level(report_module, "specdec", 1, 40.0), level(report_module, "specdec", 4, 30.0)],
              "llama-server": [level(report_module, "llama-server", 1, 24.0),
                               level(report_module, "llama-server", 4, 8.0)]}
    return {"command": "benchmarks/serve_compare.py --clients 1 4", "date": "2025-01-01T00:00:00+00:00",
            "complete": True, "model": "/m/target.gguf",
            "machine": {"cpu": "AMD EPYC; AVX2, AVX-512 (VNNI)", "flags": ["avx2", "avx512f", "avx512_vnni"],
                        "cores": 2, "python": "3.11.7"},
            "llama_server": {"version": "version: 1 (abc)\nbuilt with cc", "slot_context": 4096},
            "settings": {"sections": ["followup", "cold", "concurrency"], "requests_per_client": 1, "max_tokens": 64,
                         "answer_tokens": 32, "warmup": 1},
            "documents": {"followup": {"file": "textwrap.py", "tokens": 2999},
                          "cold": {"file": "argparse.py", "tokens": 2991}},
            "questions": ["Q0", "Q1", "Q2"],
            "servers": {name: {"commands": [f"{name} --port 1"], "answers": answers[name], "levels": levels[name]}
                        for name in answers}}


def test_report_tables_and_goals_from_fixed_measurements(report_module):
    report = fixed_report(report_module)
    text = report_module.markdown(report)
    assert "| follow-up 1 | 3050 / 3050 | 3000 / 2990 | 0.50 | 0.40 | 1.25 | – |" in text
    assert "| follow-up 2 | 3050 / 3050 | – / – | 0.90 | 0.50 | 1.80 | – |" in text
    assert "| cold | 3050 / 3050 | – / – | 20.00 | – | – | llama-server: timeout" in text  # a failed one: no TTFT
    # N=4: specdec 4 x 30 = 120 tok/s vs 40 at N=1 (3.00x); llama-server 4 x 8 = 32 vs 24 (1.33x); 120/32 = 3.75
    assert "| 4 | 120.0 | 32.0 | 3.75 | 3.00 | 1.33 |" in text
    assert "| 1 | 40.0 | 24.0 | 1.67 | 1.00 | 1.00 |" in text
    for line in ("`specdec --port 1`", "`llama-server --port 1`", "avx2 avx512f avx512_vnni", "/m/target.gguf",
                 "`benchmarks/serve_compare.py --clients 1 4`", "textwrap.py (2999 tokens)"):
        assert line in text
    met = {g["goal"]: g["met"] for g in report_module.goals(report)}
    assert met["follow-up TTFT <= 1 s (worst follow-up, specdec)"] is True
    assert met["follow-up TTFT <= 1.5x llama-server's (worst ratio)"] is False  # 1.8
    assert met["cold long context TTFT <= llama-server's (ratio)"] is None  # llama-server's answer failed
    assert met["4 clients: aggregate tokens/s >= 2.5x specdec's own 1-client figure"] is True
    assert met["4 clients: aggregate tokens/s >= 1.5x llama-server --parallel 4"] is True
    assert met["8 clients: aggregate tokens/s >= 3.0x specdec's own 1-client figure"] is None
    assert "**not met**" in text and "not measured" in text
