"""A draft that reads only the last W prompt tokens (``ModelDrafter(window=W)``): still exact, since q is what
it reports; its window starts on a grid so that a follow-up prompt meets the prefix cache."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_qwen2 import VOCAB, write_tiny_qwen2

from specdec import ModelDrafter, SamplingParams, autoregressive_generate, speculative_generate
from specdec.drafters.model import window_offset
from specdec.models.native import NativeModel, NativeSettings
from specdec.models.prefix import PrefixCache


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-window")
    settings = NativeSettings(threads=2)
    return (NativeModel(str(write_tiny_qwen2(folder / "t.gguf", seed=0)), settings),
            NativeModel(str(write_tiny_qwen2(folder / "d.gguf", seed=1)), settings))


def prompt(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, n)]


@pytest.mark.parametrize(("length", "window", "offset"), [(100, None, 0), (100, 128, 0), (3000, 1024, 2048),
                                                          (3100, 1024, 2304), (3001, 1024, 2048)])
def test_the_window_starts_on_a_grid_of_a_quarter_window(length, window, offset):
    assert window_offset(length, window) == offset
    if window is not None:
        assert 0.75 * window <= length - offset <= window or offset == 0


def test_a_window_below_16_tokens_is_refused(tiny):
    with pytest.raises(ValueError, match="draft_window=8"):
        ModelDrafter(tiny[1], window=8)


@pytest.mark.parametrize(("window", "start"), [(16, 0), (64, 0), (None, 0), (None, 1), (None, 150), (None, 298)])
def test_greedy_with_a_windowed_or_late_starting_draft_equals_plain_decoding(tiny, window, start):
    """A draft that reads only the last W prompt tokens, or skips the prompt's first ``start`` (the tools'
    declaration): greedy speculative output is plain decoding's."""
    target, draft = tiny
    ids = prompt(300, seed=4)
    greedy = SamplingParams(temperature=0)
    plain = autoregressive_generate(target, ids, max_new_tokens=24, sampling=greedy)
    spec = speculative_generate(target, ModelDrafter(draft, window=window, start=start), ids, max_new_tokens=24,
                                gamma=3, sampling=greedy)
    assert spec.tokens == plain.tokens and spec.stats.drafted > 0


def test_a_follow_up_prompt_reuses_the_windowed_drafts_cache(tiny):
    target, draft = tiny
    draft.prefix_cache = PrefixCache.of_gb(0.5)
    try:
        first = prompt(400, seed=7)
        drafter = ModelDrafter(draft, window=128)
        drafter.begin(first + [1])
        drafter.begin(first + [1, 2, 3])  # a longer prompt, same start: the same window start
        assert drafter.offset == window_offset(402, 128) and draft.last_reused > 64
    finally:
        draft.prefix_cache = None


def test_cli_draft_window_values():
    import argparse

    from specdec.cli.options import draft_window_value

    assert draft_window_value("0") is None and draft_window_value("1024") == 1024
    for bad in ("8", "-5", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="--draft-window"):
            draft_window_value(bad)


def test_run_settings_refuse_a_tiny_window():
    from specdec.session import RunSettings

    with pytest.raises(ValueError, match="draft_window=4"):
        RunSettings(draft_window=4).validate()


@pytest.mark.parametrize(("start", "window", "offset"), [(0, None, 0), (120, None, 120), (120, 64, 240),
                                                         (250, 64, 250), (400, None, 298)])
def test_a_draft_start_skips_that_many_prompt_tokens(tiny, start, window, offset):
    """``start`` (the server's: a tool declaration) and the window: the draft begins at the later of the two, and
    always reads at least one prompt token before the last."""
    _, draft = tiny
    drafter = ModelDrafter(draft, window=window, start=start)
    drafter.begin(prompt(300, seed=5))
    assert drafter.offset == offset and draft.length == 299 - offset



def test_a_negative_draft_start_is_refused(tiny):
    from specdec.session import RunSettings

    with pytest.raises(ValueError, match="draft_start=-1"):
        ModelDrafter(tiny[1], start=-1)
    with pytest.raises(ValueError, match="draft_start=-2"):
        RunSettings(draft_start=-2).validate()
