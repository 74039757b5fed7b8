"""One set of a generation's figures (``GenerationStats.figures``): the CLI's JSON (``RunResult.as_json``),
the server's ``specdec`` field and the explorer's live view agree on every key of it for the same run, with
None where nothing was measured; the bench's ``RunFigures`` holds the same numbers."""

import pytest

from specdec.bench.modes import run_figures
from specdec.decode import Generation
from specdec.explorer.live import Pieces
from specdec.models.toy import ToyPair
from specdec.sampling import SamplingParams
from specdec.server.engine.runs import PlainSequenceRun, SequenceRun
from specdec.session import RunResult, RunSettings
from specdec.stats import Timer, summarize

SHARED = ("new_tokens", "seconds", "tokens_per_second", "rounds", "target_calls", "draft_calls", "drafted",
          "accepted", "acceptance_rate", "alpha", "tokens_per_target_call", "mean_gamma", "gamma_histogram",
          "prefill_seconds", "draft_seconds", "target_seconds", "loop_seconds", "prompt_tokens_reused", "forced")


@pytest.fixture(scope="module")
def toy():
    return ToyPair()


def advanced(run, steps: int | None = None):
    """The run started and stepped ``steps`` times (None: to the end)."""
    run.start()
    while not run.done and (steps is None or steps > 0):
        run.step()
        steps = None if steps is None else steps - 1
    return run


def serialized(run, mode: str) -> dict[str, dict]:
    """Every serializer's figures of one run, read after it stopped (so the same timer)."""
    out = {"stats": run.stats().figures(drafting=mode != "plain"), "specdec": run.figures(),
           "live": Pieces(mode, run, None, lambda event: None).stats()}
    if mode != "plain":
        result = RunResult(text="", prompt_tokens=run.prompt_length, settings=run.settings,
                           speculative=Generation(run.new_tokens, run.stats()), drafter="toy")
        out["as_json"] = result.as_json()
        assert result.report()  # None figures print as n/a
    return out


def assert_agree(figures: dict[str, dict]) -> dict:
    one = figures["stats"]
    assert tuple(one) == SHARED
    for name, other in figures.items():
        assert {k: other[k] for k in SHARED} == one, name
    live = figures["live"]
    assert live["tokens"] == one["new_tokens"] and live["tokens_per_call"] == one["tokens_per_target_call"]
    return one


def settings(max_new_tokens: int) -> RunSettings:
    return RunSettings(gamma=3, max_new_tokens=max_new_tokens, sampling=SamplingParams(temperature=0.0), chat=False)


def test_a_speculative_run(toy):
    run = advanced(SequenceRun(toy, toy.encode("the cat"), settings(20)))
    one = assert_agree(serialized(run, "speculative"))
    assert one["new_tokens"] == 20 and one["drafted"] > 0 and one["alpha"] is not None
    assert one["tokens_per_target_call"] == pytest.approx(20 / one["target_calls"])
    bench = run_figures(Generation(run.new_tokens, run.stats()))
    assert (bench.seconds, bench.target_calls, bench.rounds, bench.drafted, bench.accepted, bench.alpha,
            bench.prefill_seconds, bench.draft_seconds, bench.target_seconds) == tuple(
        one[k] for k in ("seconds", "target_calls", "rounds", "drafted", "accepted", "alpha", "prefill_seconds",
                         "draft_seconds", "target_seconds"))


def test_a_run_without_drafts(toy):
    one = assert_agree(serialized(advanced(SequenceRun(toy, toy.encode("the cat"), settings(1))), "speculative"))
    assert (one["rounds"], one["drafted"], one["tokens_per_target_call"]) == (1, 0, 1.0)
    assert one["alpha"] is None and one["acceptance_rate"] is None
    assert one["mean_gamma"] == 0.0 and one["gamma_histogram"] == {"0": 1}  # a speculative run that drafted 0


def test_a_run_without_target_calls(toy):
    one = assert_agree(serialized(advanced(SequenceRun(toy, toy.encode("the cat"), settings(8)), steps=0),
                                  "speculative"))
    assert (one["new_tokens"], one["target_calls"], one["rounds"]) == (0, 0, 0)
    assert one["tokens_per_target_call"] is None and one["alpha"] is None and one["mean_gamma"] is None


def test_a_plain_run(toy):
    one = assert_agree(serialized(advanced(PlainSequenceRun(toy, toy.encode("the cat"), settings(6))), "plain"))
    assert (one["new_tokens"], one["target_calls"], one["drafted"], one["tokens_per_target_call"]) == (6, 6, 0, 1.0)
    assert one["mean_gamma"] is None and one["gamma_histogram"] == {} and one["alpha"] is None


def test_nothing_measured_is_none_not_zero():
    one = summarize([], 0, 0, Timer()).figures()
    assert one["tokens_per_target_call"] is None and one["tokens_per_second"] is None
    assert one["alpha"] is None and one["acceptance_rate"] is None and one["mean_gamma"] is None
