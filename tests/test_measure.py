"""`specdec measure` on the toy pair and tiny models: α by hand, call timings, JSON, CLI, plot."""

import itertools
import json
import os
import time

import numpy as np
import pytest
import torch
from conftest import tiny_qwen

from specdec import HFModel, SamplingParams, autoregressive_generate, theory
from specdec.analysis.measure import (
    MeasureSettings,
    NamedDraft,
    measure,
    measure_alphas,
    parse_drafts,
    target_text,
    time_calls,
)
from specdec.cli import main
from specdec.models.ngram import NgramModel
from specdec.models.toy import TOY_DRAFT, TOY_TARGET, ToyPair


def adjusted(table: np.ndarray, temperature: float) -> np.ndarray:
    """The sampling transform by hand: one-hot argmax at 0 (ties to the lowest id), else softmax(log p / T)."""
    if temperature == 0:
        out = np.zeros_like(table)
        out[np.arange(len(table)), table.argmax(1)] = 1.0
        return out
    with np.errstate(divide="ignore"):
        logits = np.log(table) / temperature
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.fixture()
def toy():
    return ToyPair()


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_alpha_is_the_mean_beta_over_the_targets_own_text(toy, temperature):
    prompts = [toy.encode("the"), toy.encode("the dog")]
    settings = MeasureSettings(temperatures=(temperature,), max_new_tokens=40, seed=3)
    rows, _ = measure_alphas(toy.target, [NamedDraft("model", toy.draft)], prompts, settings)
    p, q = adjusted(TOY_TARGET, temperature), adjusted(TOY_DRAFT, temperature)
    betas = []
    for i, prompt in enumerate(prompts):
        sampling = SamplingParams(temperature=temperature)
        tokens = autoregressive_generate(toy.target, prompt, max_new_tokens=40, sampling=sampling, seed=3 + i).tokens
        previous = [prompt[-1]] + tokens[:-1]
        betas += [np.minimum(p[prev], q[prev]).sum() for prev in previous]
    (row,) = rows
    assert row.positions == len(betas) == 80
    assert row.alpha == pytest.approx(np.mean(betas), abs=1e-6)
    assert 0.5 < row.alpha < 1.0  # the toy draft overlaps the target by 0.9 where there is a choice


def test_recorded_text_is_the_targets_plain_output(toy):
    prompt = toy.encode("the cat")
    sampling = SamplingParams(temperature=1.0)
    tokens, target_probs = target_text(toy.target, prompt, sampling, 25, seed=9)
    assert tokens == autoregressive_generate(toy.target, prompt, max_new_tokens=25, sampling=sampling, seed=9).tokens
    assert target_probs.shape == (25, 8)
    expected = torch.tensor(TOY_TARGET[[prompt[-1]] + tokens[:-1]], dtype=target_probs.dtype)
    assert torch.allclose(target_probs, expected, atol=1e-9)


class SleepyModel:
    """Scoring k tokens takes 2 ms + 1 ms·k of wall time; a stand-in with a known cost curve."""

    vocab_size, max_length, device = 8, None, torch.device("cpu")

    def __init__(self):
        self.tokens = []

    @property
    def length(self):
        return len(self.tokens)

    def prefill(self, tokens):
        self.tokens = list(tokens)

    def score(self, tokens):
        time.sleep(0.002 + 0.001 * len(tokens))
        self.tokens += list(tokens)
        return torch.zeros(len(tokens), 8)

    def trim(self, length):
        del self.tokens[length:]


def test_call_timings_follow_the_cost_curve_and_trim_back():
    model = SleepyModel()
    seconds = time_calls(model, [1, 2, 3, 4, 5], list(range(1, 17)), repeats=3)
    assert list(seconds) == list(range(1, 17))
    assert model.length == 5  # every timed call was trimmed back to the context
    ratios = [seconds[k] / seconds[1] for k in range(1, 17)]
    assert 4.0 < ratios[-1] < 8.0  # (2 + 16) / (2 + 1) = 6
    assert all(b > 0.8 * a for a, b in itertools.pairwise(ratios))  # monotone up to timing noise


def test_call_timings_on_a_transformer_have_one_positive_entry_per_k():
    model = HFModel(tiny_qwen(seed=0))
    seconds = time_calls(model, list(range(30)), list(range(1, 17)), repeats=2)
    assert sorted(seconds) == list(range(1, 17)) and all(t > 0 for t in seconds.values())
    assert model.length == 30
    assert seconds[16] > 0.3 * seconds[1]  # a sanity bound only: this machine's timings are noisy


def test_measure_predictions_are_thm_3_8_with_the_measured_figures(toy):
    settings = MeasureSettings(temperatures=(1.0,), max_new_tokens=16, gammas=(1, 3, "auto"), max_gamma=6, repeats=2)
    m = measure(toy.target, [NamedDraft("model", toy.draft)], [toy.encode("the")], settings)
    (table,) = m.speed
    assert table.alpha == m.alpha("model", 1.0) and table.c == m.draft_costs[0].c
    assert [r.gamma for r in table.rows] == list(range(1, 7))
    for r in table.rows:
        assert r.predicted == pytest.approx(theory.expected_speedup(table.alpha, r.gamma, table.c))
        assert r.predicted_cost_curve == pytest.approx(
            theory.expected_speedup_cost_curve(table.alpha, r.gamma, table.c, m.target_seconds))
        assert (r.measured is not None) == (r.gamma in (1, 3))
    assert table.recommended_gamma == max(table.rows, key=lambda r: r.predicted_cost_curve).gamma
    assert [run.gamma for run in table.runs] == ["1", "3", "auto"]
    assert all(run.speedup > 0 for run in table.runs)
    assert m.target_cost_ratios[1] == 1.0 and sorted(m.target_seconds) == list(range(1, 17))


# --------------------------------------------------------------------------- the CLI


def run_cli(capsys, *args):
    code = main(["measure", "--toy", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def prompts_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("the dog\n\nthe cat sat\n")
    return str(path)


def test_json_has_every_figure(capsys, prompts_file):
    code, out, _ = run_cli(capsys, "--prompts", prompts_file, "--json", "--max-new-tokens", "12", "--gammas", "2",
                           "heuristic", "--max-gamma", "5", "--repeats", "2")
    assert code == 0
    data = json.loads(out)
    assert data["prompts"] == 2 and data["max_new_tokens"] == 12
    assert {(r["draft"], r["temperature"]) for r in data["alphas"]} == {("model", 0.0), ("model", 1.0)}
    assert all(r["positions"] == 24 and 0 <= r["alpha"] <= 1 for r in data["alphas"])
    assert list(data["target_seconds"]) == [str(k) for k in range(1, 17)]
    assert data["target_cost_ratios"]["1"] == 1.0
    assert data["draft_costs"][0]["draft"] == "model" and data["draft_costs"][0]["c"] > 0
    for table in data["speed"]:
        assert len(table["rows"]) == 5 and 1 <= table["recommended_gamma"] <= 5
        assert [r["gamma"] for r in table["runs"]] == ["2", "heuristic"]
        assert table["rows"][1]["measured"] == table["runs"][0]["speedup"]
        assert table["plain_tokens_per_second"] > 0 and table["plain_call_seconds"] > 0
        assert all(r["draft_call_seconds"] > 0 and r["target_call_seconds"] > 0 for r in table["runs"])
        assert table["runs"][0]["mean_gamma"] <= 2
    assert data["plot"] is None


def test_table_3_with_ngram_drafts(capsys, tmp_path, toy, prompts_file):
    rng = torch.Generator().manual_seed(0)
    seeds = [int(torch.randint(1 << 30, (1,), generator=rng)) for _ in range(30)]
    texts = [autoregressive_generate(toy.target, [0], max_new_tokens=60, seed=seed).tokens for seed in seeds]
    for order, name in ((1, "uni"), (2, "bi")):
        NgramModel.fit(texts, order, 8).save(tmp_path / f"{name}.ngram")
    code, out, _ = run_cli(capsys, "--prompts", prompts_file, "--json", "--max-new-tokens", "20", "--gammas",
                           "--drafts", "model", f"unigram:{tmp_path / 'uni.ngram'}", f"bigram:{tmp_path / 'bi.ngram'}")
    assert code == 0
    data = json.loads(out)
    alpha = {(r["draft"], r["temperature"]): r["alpha"] for r in data["alphas"]}
    assert len(alpha) == 6 and data["speed"][0]["runs"] == []
    for t in (0.0, 1.0):  # a bigram fitted on the target's own text beats a unigram
        assert alpha[("bigram (bi.ngram)", t)] > alpha[("unigram (uni.ngram)", t)]
    assert alpha[("bigram (bi.ngram)", 1.0)] > 0.8
    code, _, err = run_cli(capsys, "--drafts", f"bigram:{tmp_path / 'uni.ngram'}", "--gammas")
    assert code == 2 and "has order 1, not 2" in err


def test_report_is_a_readable_table(capsys, prompts_file):
    code, out, _ = run_cli(capsys, "--prompts", prompts_file, "--max-new-tokens", "10", "--gammas", "1", "auto",
                           "--max-gamma", "4", "--repeats", "1", "--temperature", "0")
    assert code == 0
    assert "α = mean β" in out and "T(k)/T(1)" in out and "c = " in out
    assert "recommended γ = " in out and "auto: measured" in out


def test_plot_is_written_atomically(capsys, tmp_path, prompts_file):
    target = tmp_path / "figures" / "measure.png"
    target.parent.mkdir()
    code, out, _ = run_cli(capsys, "--prompts", prompts_file, "--max-new-tokens", "10", "--gammas", "1", "auto",
                           "--max-gamma", "4", "--repeats", "1", "--plot", str(target))
    assert code == 0 and f"figure written to {target}" in out
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(target.parent) == ["measure.png"]  # no temporary file left behind
    code, _, err = run_cli(capsys, "--prompts", prompts_file, "--max-new-tokens", "10", "--gammas", "1",
                           "--repeats", "1", "--plot", str(tmp_path / "missing" / "m.png"))
    assert code == 2 and "cannot write the plot" in err
    assert os.listdir(tmp_path / "figures") == ["measure.png"]


@pytest.mark.parametrize("args, fragment", [
    (["--temperature", "-1"], "temperature=-1.0 is invalid"),
    (["--gammas", "0"], "gamma=0 is invalid"),
    (["--gammas", "fast"], "gamma='fast' is invalid"),
    (["--max-new-tokens", "1"], "max_new_tokens=1 is invalid"),
    (["--max-gamma", "0"], "max_gamma=0 is invalid"),
    (["--repeats", "0"], "repeats=0 is invalid"),
    (["--drafts", "trigram"], "'trigram' is invalid"),
    (["--drafts", "ngram:/no/such.ngram"], "does not exist"),
    (["--prompts", "/no/such/prompts.txt"], "cannot read the prompts file"),
    (["--gammas", "--plot", "x.png"], "--plot draws measured speed-ups"),
])
def test_bad_values_are_one_clear_error(capsys, args, fragment):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert fragment in err and err.count("\n") == 1


def test_empty_prompts_file_is_refused(capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    code, _, err = run_cli(capsys, "--prompts", str(empty))
    assert code == 2 and "has no prompts" in err


def test_parse_drafts_forms(tmp_path):
    from specdec.models.ngram import NgramModel

    path = str(tmp_path / "b.ngram")
    NgramModel.fit([[0, 1, 2, 0, 1, 2, 3]], order=2, vocab_size=4).save(path)
    parsed = parse_drafts(["model", f"ngram:{path}", f"bigram:{path}"])
    assert [(p.source, p.path, p.order) for p in parsed] == [("model", None, None), ("ngram", path, None),
                                                             ("ngram", path, 2)]
    with pytest.raises(ValueError, match="has order 2, not 3"):
        parse_drafts([f"trigram:{path}"])
    with pytest.raises(ValueError, match="prompt lookup"):
        parse_drafts(["lookup+model"])
    with pytest.raises(ValueError, match="no drafts given"):
        parse_drafts([])
