"""benchmarks/agent_traffic.py without any server: its traffic, its options, the figures and the report from
fixed answers."""

import importlib
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def at():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its neighbour (servers) by name
    try:
        yield importlib.import_module("agent_traffic")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_traffic_edits_one_file_over_turns_and_repeats_tool_calls_and_tasks(at):
    args, _ = at.parse_args(["--turns", "3", "--tasks", "2", "--rounds", "2", "--lines", "12"])
    requests = at.traffic(args)
    assert len(requests) == 2 * (3 + 2 + 2)
    edits = [r for r in requests if r["scenario"] == "edit"]
    assert [r["conversation"] for r in edits] == ["edit-0"] * 3 + ["edit-1"] * 3  # one conversation a round
    assert "```python" in edits[0]["user"] and edits[0]["system"] == at.EDIT_SYSTEM and edits[1]["system"] is None
    tools = [r for r in requests if r["scenario"] == "tools"]
    assert len({r["conversation"] for r in tools}) == 4 and all(r["system"] == at.TOOL_SYSTEM for r in tools)
    variations = [r["user"] for r in requests if r["scenario"] == "variations"]
    assert "parse_csv_line" in variations[0] and "parse_tsv_line" in variations[1]
    assert variations[:2] == variations[2:]  # the second round asks the same again
    assert at.source_file(12).count("\n") == 12


def test_options_and_their_errors(at, capsys):
    args, server = at.parse_args(["--ours", "none", "history", "--llama", "--", "--threads", "2"])
    assert args.ours == ["none", "history"] and args.llama == [] and server == ["--threads", "2"]
    defaults, _ = at.parse_args([])
    assert defaults.ours == list(at.OURS) and defaults.llama == list(at.LLAMA) and defaults.max_tokens == 128
    for argv in (["--max-tokens", "0"], ["--tasks", "-1"], ["--", "--draft", "lookup"], ["--", "--port", "1"]):
        with pytest.raises(SystemExit) as exit_:
            at.parse_args(argv)
        assert exit_.value.code == 2
    assert "error:" in capsys.readouterr().err


def answer(scenario, tokens, seconds, text="x", ok=True):
    return {"scenario": scenario, "label": "", "seconds": seconds, "ok": ok, "text": text, "tokens": tokens,
            "tokens_per_s": tokens / seconds}


def test_figures_and_the_report(at):
    ours = [answer("edit", 10, 1.0), answer("tools", 30, 1.0, "y"), answer("edit", 20, 4.0)]
    plain = [answer("edit", 10, 2.0), answer("tools", 30, 3.0, "z"), answer("edit", 20, 4.0)]
    s = at.summary(ours)
    assert s["median_tokens_per_s"] == 10 and s["mean_tokens_per_s"] == pytest.approx(15)
    assert s["total_tokens_per_s"] == pytest.approx(60 / 6) and (s["requests"], s["ok"]) == (3, 3)
    assert at.identical(ours, plain) == "2/3" and at.identical(ours, None) == "–"
    configs = [{"server": server, "name": name, "summary": at.summary(a), "identical": "ref",
                "scenarios": {k: at.summary([x for x in a if x["scenario"] == k]) for k in ("edit", "tools")}}
               for server, name, a in (("specdec", "history+lookup", ours), ("llama-server", "none", plain),
                                       ("llama-server", "ngram-mod", plain[:1]))]
    report = {"date": "d", "command": "c", "model": "m.gguf", "complete": True, "scenarios": ["edit", "tools"],
              "machine": {"cpu": "AMD EPYC", "cores": 2, "flags": ["avx2"]}, "settings": {"max_tokens": 8},
              "configs": configs}
    text = at.markdown(report)
    assert "| specdec | history+lookup | 3/3 | 10.00 |" in text and "| 2.00x |" in text  # over ngram-mod's 5
    assert "flags avx2" in text and "Incomplete" not in text
