"""specdec bench: modes on tiny in-process models, the plan, the aggregation math, the files, bad input.

Nothing here is timed: speeds come out of the runs but only their arithmetic is checked, on
hand-made records.
"""

import json
import os

import pytest
from conftest import tiny_qwen

from specdec.bench import report as bench_report
from specdec.bench import stats as bench_stats
from specdec.bench import suite as bench
from specdec.bench.modes import RunFigures, build_mode, parse_mode
from specdec.bench.suite import BenchPrompt, BenchResult, BenchSettings, RunRecord
from specdec.cli import main
from specdec.models.hf import HFModel

PROMPTS = [
    BenchPrompt("w", "code-writing", "abc abc abc abc"),
    BenchPrompt("e", "code-editing", "def f(x): return x + x"),
    BenchPrompt("x", "explanation", "why is the sky blue"),
]


class TinyPair:
    """Two random-weight transformers models (float64) with a character-level 'tokenizer'."""

    eos_token_ids: list[int] = []
    has_chat_template = False

    def __init__(self) -> None:
        self.target = HFModel(tiny_qwen(seed=0))
        self.draft = HFModel(tiny_qwen(seed=1))

    def encode(self, text: str, chat: bool = False) -> list[int]:
        return [ord(c) % self.target.vocab_size for c in text]


@pytest.fixture(scope="module")
def tiny_result():
    settings = BenchSettings(
        modes=("hf-plain", "hf-assisted", "hf-lookup:3", "model:2", "lookup:auto", "lookup+model:heuristic"),
        sampling_modes=("hf-assisted", "model:2", "lookup+model:auto"),
        temperatures=(0.0, 1.0), max_new_tokens=5, repeats=2, warmup_tokens=2,
    )
    return bench.run_bench(settings, PROMPTS, {"transformers": TinyPair()}, command="specdec bench --test")


# ------------------------------------------------------------------------------------ modes


def test_every_mode_runs_and_greedy_outputs_equal_plain(tiny_result):
    settings = tiny_result.settings
    plan = bench.plan_runs(settings, PROMPTS)
    assert len(tiny_result.records) == len(plan) == (7 + 4) * len(PROMPTS) * 2
    for record in tiny_result.records:
        assert 1 <= len(record.tokens) <= 5 and record.figures.seconds > 0
        if record.temperature == 0:
            # Ours is exact, and on float64 weights transformers' greedy loops agree token for token.
            assert record.same_as_plain is True, record
        else:
            assert record.same_as_plain is None
    by_mode = {(r.mode, r.temperature): r for r in tiny_result.rows if r.category == "code-writing"}
    assert by_mode[("plain", 0.0)].speedup == 1.0
    assert by_mode[("plain", 0.0)].tokens_per_target_call == 1.0
    assert by_mode[("hf-plain", 0.0)].tokens_per_target_call == 1.0  # the forward hook counts one call a token
    assert by_mode[("model:2", 0.0)].mean_gamma <= 2 and by_mode[("model:2", 0.0)].alpha is not None
    assert by_mode[("hf-assisted", 0.0)].alpha is None and by_mode[("hf-assisted", 0.0)].mean_gamma is None
    assert {(r.mode, r.temperature) for r in tiny_result.rows} == set(by_mode)


def test_greedy_tokens_are_the_same_across_repeats(tiny_result):
    runs = [r for r in tiny_result.records if r.temperature == 0 and r.prompt_id == "w"]
    assert len({r.tokens for r in runs}) == 1


def test_hf_modes_belong_to_transformers_and_need_a_draft_model():
    pair = TinyPair()
    with pytest.raises(ValueError, match="runs on the transformers backend, not 'llamacpp'"):
        build_mode(parse_mode("hf-assisted"), "llamacpp", pair)
    pair.draft = None
    with pytest.raises(ValueError, match="needs a draft model"):
        build_mode(parse_mode("model:3"), "transformers", pair)
    with pytest.raises(ValueError, match="needs a llama.cpp target"):
        build_mode(parse_mode("llamacpp-own-plain"), "llamacpp", pair)
    assert build_mode(parse_mode("lookup:2"), "transformers", pair).name == "lookup:2"


# ------------------------------------------------------------------------------------- plan


def test_plan_rotates_the_mode_order_and_covers_everything_once():
    settings = BenchSettings(modes=("model:2", "lookup:auto"), sampling_modes=("model:2",), temperatures=(0.0, 1.0),
                             repeats=2)
    plan = bench.plan_runs(settings, PROMPTS)
    keys = [(r.temperature, r.repeat, r.prompt.id, r.mode) for r in plan]
    assert len(keys) == len(set(keys)) == (3 + 2) * 3 * 2
    greedy = [r for r in plan if r.temperature == 0]
    firsts = [greedy[i].mode for i in range(0, len(greedy), 3)]  # the first mode of each prompt's block
    assert firsts == ["plain", "model:2", "lookup:auto", "plain", "model:2", "lookup:auto"]
    assert {r.seed for r in plan if r.repeat == 1} == {1}


def test_runs_of_a_prompt_stay_grouped_by_backend_and_both_orders_rotate():
    settings = BenchSettings(modes=("model:3", "lookup:auto"), sampling_modes=(), temperatures=(0.0,),
                             backends=("transformers", "llamacpp"))
    plan = bench.plan_runs(settings, PROMPTS)
    blocks = [[(r.mode, r.backend) for r in plan if r.prompt.id == p.id] for p in PROMPTS]
    assert blocks[0] == [("plain", "transformers"), ("model:3", "transformers"), ("lookup:auto", "transformers"),
                         ("plain", "llamacpp"), ("model:3", "llamacpp"), ("lookup:auto", "llamacpp")]
    assert blocks[1] == [("model:3", "llamacpp"), ("lookup:auto", "llamacpp"), ("plain", "llamacpp"),
                         ("model:3", "transformers"), ("lookup:auto", "transformers"), ("plain", "transformers")]


def test_modes_run_on_each_backend_they_support():
    settings = BenchSettings(modes=("hf-plain", "model:3", "llamacpp-own-plain"), sampling_modes=(),
                             temperatures=(0.0,), backends=("transformers", "llamacpp"))
    assert bench.mode_keys(settings, 0.0) == [
        ("plain", "transformers"), ("hf-plain", "transformers"), ("model:3", "transformers"),
        ("plain", "llamacpp"), ("model:3", "llamacpp"), ("llamacpp-own-plain", "llamacpp")]


def test_estimate_grows_with_the_plan():
    small = BenchSettings(modes=("model:3",), sampling_modes=(), temperatures=(0.0,), max_new_tokens=16)
    large = BenchSettings(modes=("model:3", "hf-plain"), sampling_modes=("model:3",), max_new_tokens=64, repeats=2)
    assert 0 < bench.estimate_seconds(small, PROMPTS) < bench.estimate_seconds(large, PROMPTS)


# ------------------------------------------------------------------------------ aggregation


def record(mode, tps, *, category="code-writing", prompt="w", repeat=0, temperature=0.0, tokens=(1, 2, 3, 4),
           target_calls=None, drafted=0, rounds=0, alpha=None, verified=0, backend="transformers", **parts):
    figures = RunFigures(seconds=len(tokens) / tps, target_calls=target_calls, rounds=rounds, drafted=drafted,
                         alpha=alpha, verified=verified, **parts)
    return RunRecord(temperature, repeat, category, prompt, mode, backend, repeat, 10, tuple(tokens), figures)


def test_rows_take_medians_ratios_of_medians_and_pooled_ratios():
    records = [
        record("plain", 4.0, repeat=0, target_calls=4), record("plain", 6.0, repeat=1, target_calls=4),
        record("plain", 5.0, repeat=2, target_calls=4),
        record("model:3", 6.0, repeat=0, target_calls=2, drafted=6, rounds=2, alpha=0.5, verified=2),
        record("model:3", 9.0, repeat=1, target_calls=1, drafted=3, rounds=1, alpha=0.8, verified=6),
        record("model:3", 7.5, repeat=2, tokens=(1, 2, 3, 9), target_calls=1, drafted=3, rounds=1, alpha=0.9,
               verified=2),
    ]
    rows = bench_stats.summarize_runs(bench_stats.compare_to_plain(records))
    plain, ours = rows
    assert (plain.mode, plain.median_tps, plain.min_tps, plain.max_tps, plain.speedup) == ("plain", 5.0, 4.0, 6.0, 1.0)
    assert ours.median_tps == 7.5 and ours.speedup == pytest.approx(7.5 / 5.0)
    assert ours.tokens_per_target_call == pytest.approx(12 / 4)
    assert ours.mean_gamma == pytest.approx(12 / 4)
    assert ours.alpha == pytest.approx((0.5 * 2 + 0.8 * 6 + 0.9 * 2) / 10)
    assert ours.same_as_plain is False and ours.differing_runs == 1 and plain.same_as_plain is True


def test_equal_output_is_checked_against_plain_of_the_same_prompt_repeat_and_backend():
    records = [
        record("plain", 5, tokens=(1, 2)), record("plain", 5, prompt="v", tokens=(7, 8)),
        record("plain", 5, backend="llamacpp", tokens=(3, 3)),
        record("hf-plain", 5, tokens=(1, 2)), record("model:3", 5, prompt="v", tokens=(1, 2)),
        record("llamacpp-own-plain", 5, backend="llamacpp", tokens=(3, 3)),
        record("model:3", 5, temperature=1.0, tokens=(1, 2)),
    ]
    marked = {(r.mode, r.prompt_id, r.backend, r.temperature): r.same_as_plain
              for r in bench_stats.compare_to_plain(records)}
    assert marked[("hf-plain", "w", "transformers", 0.0)] is True
    assert marked[("model:3", "v", "transformers", 0.0)] is False
    assert marked[("llamacpp-own-plain", "w", "llamacpp", 0.0)] is True
    assert marked[("model:3", "w", "transformers", 1.0)] is None


def test_speedup_is_per_backend_and_best_and_slower_rows_are_found():
    records = [
        record("plain", 5.0), record("model:3", 7.0), record("lookup:auto", 4.0), record("hf-plain", 7.5),
        record("plain", 10.0, backend="llamacpp"), record("model:3", 12.0, backend="llamacpp"),
        record("plain", 5.0, category="explanation", prompt="x"),
        record("model:3", 4.5, category="explanation", prompt="x"),
    ]
    # greedy + sampled lists
    rows = bench_stats.summarize_runs(records, mode_order=["model:3", "lookup:auto", "model:3"])
    speed = {(r.mode, r.backend, r.category): r.speedup for r in rows}
    assert speed[("model:3", "llamacpp", "code-writing")] == pytest.approx(1.2)
    assert speed[("model:3", "transformers", "code-writing")] == pytest.approx(1.4)
    assert [(r.mode, r.backend) for r in rows if r.category == "code-writing"] == [
        ("plain", "transformers"), ("model:3", "transformers"), ("lookup:auto", "transformers"),
        ("hf-plain", "transformers"), ("plain", "llamacpp"), ("model:3", "llamacpp")]
    best = {(r.category, r.mode, r.backend) for r in bench_stats.best_rows(rows)}
    assert best == {("code-writing", "model:3", "transformers"), ("code-writing", "model:3", "llamacpp"),
                    ("explanation", "model:3", "transformers")}
    fastest = {(r.category, r.mode, r.backend) for r in bench_stats.fastest_rows(rows)}
    assert fastest == {("code-writing", "model:3", "llamacpp"), ("explanation", "plain", "transformers")}
    slower = {(r.category, r.mode) for r in bench_stats.slower_than_plain(rows)}
    assert slower == {("code-writing", "lookup:auto"), ("explanation", "model:3")}


def test_adaptive_gamma_is_set_against_the_best_fixed_gamma_of_the_same_drafter():
    records = [record("plain", 5.0), record("model:2", 6.0), record("model:4", 6.5), record("model:auto", 6.2),
               record("model:heuristic", 5.5), record("lookup:3", 5.2), record("lookup+model:auto", 7.0)]
    comparisons = bench_stats.compare_gammas(bench_stats.summarize_runs(records))
    assert len(comparisons) == 1  # lookup and lookup+model have no fixed-and-adaptive pair
    c = comparisons[0]
    assert (c.drafter, c.best_fixed.mode, [r.mode for r in c.adaptive]) == ("model", "model:4",
                                                                           ["model:auto", "model:heuristic"])


def test_ratio_of_sums_is_unknown_without_every_denominator():
    assert bench_stats.ratio_of_sums([4, 4], [2, 2]) == 2.0
    assert bench_stats.ratio_of_sums([4, 4], [2, None]) is None
    assert bench_stats.ratio_of_sums([4], [0]) is None


# ------------------------------------------------------------------------------------ files


def test_rows_predict_the_decoding_speedup_from_their_own_timings():
    # plain: 8 tokens in 2.0 s, 0.4 s of it prompt reading → 0.2 s per token, T(1) = 1.6 s / 8 calls = 0.2 s.
    # ours: 8 tokens in 1.4 s, 0.4 s prompt → 0.125 s per token (decoding-only speed-up 1.6);
    # 2 rounds of γ = 3: 6 drafted in 0.24 s → c = 0.04 / 0.2 = 0.2; verification 0.6 s / 2 calls = 1.5·T(1).
    tokens = tuple(range(8))
    plain = record("plain", 4.0, tokens=tokens, target_calls=8, prefill_seconds=0.4, draft_seconds=0.0,
                   target_seconds=1.6)
    ours = record("model:3", 8 / 1.4, tokens=tokens, target_calls=2, drafted=6, rounds=2, alpha=0.75, verified=8,
                  prefill_seconds=0.4, draft_seconds=0.24, target_seconds=0.6)
    hf = record("hf-assisted", 5.0, tokens=tokens, target_calls=3)
    _, row, hf_row = bench_stats.summarize_runs([plain, ours, hf], ["model:3", "hf-assisted"])
    expected_tokens = (1 - 0.75 ** 4) / (1 - 0.75)
    assert row.decode_speedup == pytest.approx(1.6)
    assert row.predicted_paper == pytest.approx(expected_tokens / (3 * 0.2 + 1))
    assert row.predicted_cost_curve == pytest.approx(expected_tokens / (3 * 0.2 + 1.5))
    assert hf_row.decode_speedup is None and hf_row.predicted_paper is None  # its parts are not timed
    line = bench_report._table_line(row, bold=False)
    assert f"| 1.60× | {row.predicted_paper:.2f}× / {row.predicted_cost_curve:.2f}× | 0.75 |" in line


def hand_made_result() -> BenchResult:
    records = bench_stats.compare_to_plain([
        record("plain", 5.0, target_calls=4), record("model:3", 7.0, target_calls=2, drafted=6, rounds=2, alpha=0.9,
                                                     verified=4),
        record("hf-assisted", 4.0, tokens=(1, 2, 3, 5), target_calls=3),
        record("plain", 5.0, temperature=1.0, target_calls=4), record("model:3", 6.0, temperature=1.0, target_calls=2),
    ])
    settings = BenchSettings(modes=("model:3", "hf-assisted"), sampling_modes=("model:3",))
    rows = tuple(bench_stats.summarize_runs(records, ["model:3", "hf-assisted"]))
    return BenchResult(settings, (PROMPTS[0],), tuple(records), rows,
                       bench_stats.machine_info(), "specdec bench --x", ("llamacpp rows skipped: not installed",))


def test_markdown_json_and_png_are_written(tmp_path):
    result = hand_made_result()
    paths = bench_report.write_outputs(result, tmp_path / "out", "t")
    assert [os.path.basename(p) for p in paths] == ["t.md", "t.json", "t.png"]
    assert sorted(os.listdir(tmp_path / "out")) == ["t.json", "t.md", "t.png"]  # no temporary files left
    with open(paths[0], encoding="utf-8") as f:
        md = f.read()
    assert "Command: `specdec bench --x`" in md and "## Greedy (temperature 0)" in md
    assert "## Sampling at temperature 1" in md and "### code-writing (w)" in md
    assert "| **model:3** | transformers | 7.00 (7.00–7.00) | 1.40× | — | — | — | 0.90 | 2.00 | 3.00 | yes |" in md
    assert ("| hf-assisted | transformers | 4.00 (4.00–4.00) | 0.80× | — | — | — | — | 1.33 | — "
            "| NO (1 of 1 runs differ) |") in md
    assert "SLOWER than plain: hf-assisted (transformers) on code-writing at greedy: 0.80×" in md
    assert "llamacpp rows skipped" in md and "Best at greedy on code-writing: model:3, 1.40× over plain" in md
    with open(paths[1], encoding="utf-8") as f:
        data = json.load(f)
    assert data["command"] == "specdec bench --x" and data["machine"]["cores"] == os.cpu_count()
    assert {"cpu", "cpu_flags", "versions", "date", "torch_threads"} <= set(data["machine"])
    assert "(flags: " in md
    assert len(data["runs"]) == 5 and data["runs"][1]["tokens"] == [1, 2, 3, 4]
    assert data["runs"][1]["tokens_per_second"] == pytest.approx(7.0)
    assert [r["mode"] for r in data["rows"]] == ["plain", "model:3", "hf-assisted", "plain", "model:3"]
    with open(paths[2], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_rows_are_compared_with_llama_cpp_plain_when_it_ran():
    result = hand_made_result()
    row = next(r for r in result.rows if r.mode == "model:3")
    line = bench_report._table_line(row, bold=False, anchor=5.6)
    assert "| 7.00 (7.00–7.00) | 1.40× | 1.25× |" in line  # 7.00 / 5.6 tokens/s


def test_a_failed_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "a.md"
    path.write_text("old")

    def fail(f):
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        bench_report.write_atomic(path, fail)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["a.md"]


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("name, message", [
    ("fast", "accepted forms are plain"),
    ("model", "accepted forms are plain"),
    ("model:0", "gamma"),
    ("model:x", "gamma"),
    ("hf-lookup:0", "hf-lookup:N needs an integer N >= 1"),
    ("ngram:/no/such/file:3", "/no/such/file"),
    ("some/model/dir:3", "a draft model goes to --draft-model 'some/model/dir'"),
])
def test_bad_mode_names_are_refused_with_the_accepted_forms(name, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_mode(name)
    assert "model:3, lookup:auto" in str(err.value)


def test_mode_names_are_canonical():
    assert parse_mode("hf-lookup").name == "hf-lookup:10"
    assert parse_mode("model:03").name == "model:3"
    assert parse_mode("lookup+model:auto").drafter == "lookup+model"


@pytest.mark.parametrize("changes, message", [
    (dict(temperatures=(-1.0,)), "temperatures"),
    (dict(temperatures=(0.0, 0.0)), "distinct"),
    (dict(backends=("vllm",)), "backends"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(repeats=0), "repeats"),
    (dict(modes=("nope",)), "accepted forms"),
])
def test_bad_settings_are_refused(changes, message):
    settings = BenchSettings(**{"modes": ("model:3",), "sampling_modes": ("model:3",), **changes})
    with pytest.raises(ValueError, match=message):
        settings.validate()


def test_prompt_set_and_selection():
    prompts = bench.load_prompts()
    by_category = {c: [p for p in prompts if p.category == c] for c in bench_stats.CATEGORIES}
    assert all(2 <= len(ps) <= 3 for ps in by_category.values()) and len(prompts) == sum(map(len, by_category.values()))
    for p in by_category["code-editing"]:
        code = p.text.split("```python\n")[1].split("```")[0]
        assert 25 <= code.count("\n") <= 40 and "return the whole function" in p.text
    chosen = bench.select_prompts(prompts, ["explanation", "code-writing"], 1)
    assert [p.category for p in chosen] == ["explanation", "code-writing"]
    with pytest.raises(ValueError, match="unknown: choose from code-writing, code-editing, explanation"):
        bench.select_prompts(prompts, ["poetry"])


def test_bad_prompt_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot read the prompt file"):
        bench.load_prompts(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"prompts": [{"id": "a"}]}')
    with pytest.raises(ValueError, match="not of the expected shape"):
        bench.load_prompts(str(bad))
    bad.write_text('{"prompts": []}')
    with pytest.raises(ValueError, match="at least one prompt"):
        bench.load_prompts(str(bad))


def test_cli_dry_run_prints_the_plan_without_loading_models(capsys):
    assert main(["bench", "--dry-run", "--backends", "transformers", "--modes", "model:3", "hf-lookup",
                 "--sampling-modes", "model:3", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "temperature 0: 3 modes × 6 prompts × 2 = 36 runs: plain, model:3, hf-lookup:10" in out
    assert "temperature 1: 2 modes × 6 prompts × 2 = 24 runs" in out and "60 runs in all; estimated" in out


def test_cli_refuses_a_mode_no_chosen_backend_runs(capsys):
    assert main(["bench", "--dry-run", "--backends", "transformers", "--modes", "llamacpp-own-plain"]) == 2
    assert "runs on the llamacpp backend, which --backends (transformers) leaves out" in capsys.readouterr().err


def test_cli_bad_mode_is_one_line_error(capsys):
    assert main(["bench", "--dry-run", "--modes", "turbo"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec bench: error: mode 'turbo' is invalid") and err.count("\n") == 1


def test_cli_runs_on_injected_models(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "load_pairs", lambda settings, target, draft, **kw: {"transformers": TinyPair()})
    monkeypatch.setattr(bench, "load_prompts", lambda path=None: PROMPTS)
    assert main(["bench", "--backends", "transformers", "--modes", "model:2", "--temperatures", "0",
                 "--max-new-tokens", "3", "--out", str(tmp_path), "--name", "cli", "--no-progress"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["cli.json", "cli.md", "cli.png"]
    assert "| **model:2** | transformers |" in capsys.readouterr().out


# ------------------------------------------------------------------------------- llama.cpp

def _llamacpp_missing() -> bool:
    from specdec.models import llamacpp

    required = os.environ.get("SPECDEC_REQUIRE_LLAMACPP") or os.environ.get("SPECDEC_REQUIRE_REAL")
    return not llamacpp.available() and not required


@pytest.mark.skipif(_llamacpp_missing(), reason="llama-cpp-python not installed")
def test_llamacpp_backend_rows_and_llamacpp_own_plain(tmp_path):
    from tiny_gguf import write_tiny_llama

    from specdec.models.llamacpp import LlamaCppModel, LlamaCppSettings

    one_thread = LlamaCppSettings(n_threads=1)

    class TinyLlamaPair:
        eos_token_ids: list[int] = []

        def __init__(self) -> None:
            self.target = LlamaCppModel(write_tiny_llama(tmp_path / "t.gguf"), one_thread)
            self.draft = LlamaCppModel(write_tiny_llama(tmp_path / "d.gguf", head_noise=0.8), one_thread)

        def encode(self, text: str, chat: bool = False) -> list[int]:
            return [ord(c) % self.target.vocab_size for c in text]

    settings = BenchSettings(modes=("model:2", "lookup:auto", "llamacpp-own-plain", "hf-plain"),
                             sampling_modes=("model:2", "llamacpp-own-plain"), temperatures=(0.0, 1.0),
                             backends=("llamacpp",), max_new_tokens=6, warmup_tokens=2)
    result = bench.run_bench(settings, PROMPTS[:2], {"llamacpp": TinyLlamaPair()})
    assert {(r.mode, r.backend) for r in result.records} == {
        ("plain", "llamacpp"), ("model:2", "llamacpp"), ("lookup:auto", "llamacpp"), ("llamacpp-own-plain", "llamacpp")}
    assert all(len(r.tokens) == 6 for r in result.records)
    greedy = [r for r in result.records if r.temperature == 0]
    assert all(r.same_as_plain for r in greedy), [(r.mode, r.tokens) for r in greedy]
    assert result.machine["llamacpp_threads"] == [1, 1]
