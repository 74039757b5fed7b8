"""The user-facing run (CLI and explorer share it) on the toy pair: report and JSON figures."""

import io

import pytest

from specdec import SamplingParams, session
from specdec.models.toy import ToyPair


@pytest.fixture(scope="module")
def toy():
    return ToyPair()


def test_compare_run_reports_consistent_figures(toy):
    settings = session.RunSettings(gamma=3, max_new_tokens=30, sampling=SamplingParams(temperature=0.0), chat=False)
    result = session.run(toy, "the cat", settings, compare=True)
    data = result.as_json()
    assert data["new_tokens"] == len(result.speculative.tokens) == 30
    assert data["new_tokens"] / data["target_calls"] == pytest.approx(data["tokens_per_target_call"])
    assert data["speedup"] == pytest.approx(data["tokens_per_second"] / data["baseline_tokens_per_second"])
    assert data["identical_to_baseline"] is True
    assert data["cost_ratio_c"] > 0 and data["predicted_speedup"] > 0
    report = result.report()
    assert "tokens per target call" in report and "identical output" in report and "Thm 3.8" in report


def test_sampled_compare_does_not_claim_identity(toy):
    settings = session.RunSettings(gamma=2, max_new_tokens=20, sampling=SamplingParams(temperature=1.0), seed=4,
                                   chat=False)
    result = session.run(toy, "the dog", settings, compare=True)
    assert result.identical_to_baseline is None
    assert "outputs differ by design" in result.report()


def test_text_stream_writes_exactly_the_decoded_text(toy):
    out = io.StringIO()
    settings = session.RunSettings(gamma=2, max_new_tokens=15, sampling=SamplingParams(temperature=0.0), chat=False)
    result = session.run(toy, "the cat", settings, on_round=session.TextStream(toy, out))
    assert out.getvalue() == result.text


@pytest.mark.parametrize("kwargs, fragment", [({"gamma": 0}, "gamma=0"), ({"stop_below": 1.5}, "stop_below=1.5"),
                                              ({"max_new_tokens": 0}, "max_new_tokens=0")])
def test_bad_settings_are_refused(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        session.RunSettings(**kwargs).validate()
