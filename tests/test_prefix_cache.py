"""The prefix cache (specdec.models.prefix) and the native model's prefill through it.

The property that matters: a request's output does not depend on what happened to be cached before
it. So every test compares a model that reads through a cache, after other prompts filled it, with a
fresh model that reads the same prompt whole: the KV rows and the logits that follow must be bitwise
equal, and the greedy/seeded generations token for token.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from tiny_qwen2 import VOCAB, write_tiny_qwen2

from specdec import ModelDrafter, SamplingParams, speculative_generate
from specdec.models.native import NativeModel, NativeSettings
from specdec.models.prefix import PrefixCache, check_cache_gb, common_prefix


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-qwen2-prefix")
    return write_tiny_qwen2(folder / "target.gguf", seed=0), write_tiny_qwen2(folder / "draft.gguf", seed=1)


def tokens(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, n)]


def fresh(path) -> NativeModel:
    return NativeModel(path, NativeSettings(threads=2))


def cached(path, gb: float = 1.0) -> NativeModel:
    model = fresh(path)
    model.prefix_cache = PrefixCache.of_gb(gb)
    return model


def kv(model: NativeModel) -> tuple[torch.Tensor, torch.Tensor]:
    cache, length = model.state()
    return cache.keys[:, :length], cache.values[:, :length]


@pytest.mark.parametrize(("shared", "rest"), [(1, 5), (37, 40), (300, 12), (505, 30), (600, 100)])
def test_reading_after_a_cached_prefix_gives_the_bits_of_reading_whole(tiny_paths, shared, rest):
    """600 + 100: the cached part was read in two chunks, the rest starts mid-chunk."""
    base, follow = tokens(shared, seed=shared), tokens(rest, seed=shared + 1)
    model = cached(tiny_paths[0])
    model.prefill(base + tokens(7, seed=99))  # an earlier request: same start, other tail
    model.prefill(base + follow)
    assert model.last_reused == shared
    reference = fresh(tiny_paths[0])
    reference.prefill(base + follow)
    for ours, theirs in zip(kv(model), kv(reference), strict=True):
        assert torch.equal(ours, theirs)
    probe = tokens(4, seed=7)
    assert torch.equal(model.score(probe), reference.score(probe))


def test_a_request_cannot_change_a_cached_entry(tiny_paths):
    prompt = tokens(50, seed=3)
    model = cached(tiny_paths[0])
    model.prefill(prompt)
    model.score(tokens(20, seed=4))  # generation writes past the prompt ...
    model.trim(10)
    model.score(tokens(30, seed=5))  # ... and over it, after a trim: the request's own copy
    model.prefill(prompt + [1, 2])
    assert model.last_reused == 50
    reference = fresh(tiny_paths[0])
    reference.prefill(prompt + [1, 2])
    for ours, theirs in zip(kv(model), kv(reference), strict=True):
        assert torch.equal(ours, theirs)


def test_generations_do_not_depend_on_what_was_cached(tiny_paths):
    """Greedy and seeded speculative generations, cache cold and warm (other prompts, the same prompt,
    a prompt it extends), equal token for token."""
    prompt = tokens(120, seed=11)
    settings = dict(max_new_tokens=24, gamma=3)
    outputs = []
    for warm in ([], [prompt[:60] + tokens(9, seed=1)], [prompt], [prompt + tokens(5, seed=2)], [prompt[:119]]):
        cache = PrefixCache.of_gb(1.0)
        target, draft = fresh(tiny_paths[0]), fresh(tiny_paths[1])
        target.prefix_cache = draft.prefix_cache = cache
        for earlier in warm:
            target.prefill(earlier)
            draft.prefill(earlier)
        greedy = speculative_generate(target, ModelDrafter(draft), prompt, sampling=SamplingParams(temperature=0),
                                      **settings).tokens
        sampled = speculative_generate(target, ModelDrafter(draft), prompt, sampling=SamplingParams(temperature=1),
                                       seed=5, **settings).tokens
        outputs.append((greedy, sampled))
    assert all(out == outputs[0] for out in outputs[1:])
    assert cache.stats().reused > 0  # the last warm-up did hit


def test_budget_evicts_least_recently_used_and_drops_extended_entries():
    cache = PrefixCache(max_bytes=300)
    cache.add("m", [1, 2, 3], "a", 100)
    cache.add("m", [1, 2, 3, 4, 5], "b", 100)  # extends a: a goes
    assert cache.stats().entries == 1
    cache.add("m", [7, 8], "c", 100)
    cache.add("other", [1, 2, 3], "d", 100)
    assert cache.longest("m", [1, 2, 3, 9]) == (cache.longest("m", [1, 2])[0], 3)
    cache.add("m", [9, 9], "e", 100)  # over 300 bytes: the least recently used (c) goes
    assert cache.longest("m", [7, 8])[1] == 0
    assert cache.longest("m", [1, 2, 3, 4, 5, 6])[1] == 5
    assert cache.longest("other", [1, 2, 3, 4, 5])[1] == 3  # models never share entries
    cache.add("m", [5], "huge", 10_000)  # larger than the whole budget: not kept
    assert cache.longest("m", [5])[1] == 0
    assert cache.stats().nbytes <= 300


def test_prompt_tokens_read_and_reused_are_counted(tiny_paths):
    model = cached(tiny_paths[0])
    model.prefill(tokens(40, seed=1))
    model.prefill(tokens(40, seed=1) + tokens(10, seed=2))
    stats = model.prefix_cache.stats()
    assert (stats.read, stats.reused) == (50, 40)


def test_a_zero_budget_keeps_nothing(tiny_paths):
    model = cached(tiny_paths[0], gb=0)
    model.prefill(tokens(40, seed=1))
    model.prefill(tokens(40, seed=1))
    assert model.last_reused == 0


def test_bad_budget_is_refused():
    with pytest.raises(ValueError, match="cache_gb=-1"):
        PrefixCache.of_gb(-1)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "2"])
def test_every_way_in_refuses_a_bad_budget_with_the_one_message(bad):
    from specdec.loading.settings import LoadSettings

    message = re.escape(f"cache_gb={bad!r} is invalid: must be a number >= 0 (0 turns the prefix cache off)")
    for make in (check_cache_gb, PrefixCache.of_gb, lambda gb: LoadSettings(cache_gb=gb)):
        with pytest.raises(ValueError, match=message):
            make(bad)
    with pytest.raises(ValueError, match=re.escape(f"--cache-gb={bad!r} is invalid")):
        check_cache_gb(bad, "--cache-gb")  # the serve command's spelling


def test_common_prefix():
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 3, 4])) == 3
    assert common_prefix(np.array([5]), np.array([1])) == 0
    assert common_prefix(np.array([], dtype=np.int64), np.array([1])) == 0


def test_holding_reuses_but_keeps_nothing_new(tiny_paths):
    """What run(..., compare=True) relies on: the speculative run meets the cache as the baseline will."""
    model = cached(tiny_paths[0])
    model.prefill(tokens(30, seed=1))
    with model.prefix_cache.holding():
        model.prefill(tokens(30, seed=1) + tokens(20, seed=2))
        assert model.last_reused == 30
    model.prefill(tokens(30, seed=1) + tokens(20, seed=2))
    assert model.last_reused == 30  # the held run added nothing
    model.prefill(tokens(30, seed=1) + tokens(20, seed=2))
    assert model.last_reused == 50


def entry_rows(model: NativeModel, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    entry, n = model.prefix_cache.longest(model._prefix_key, prompt)
    return entry.rows[0][:, :n].clone(), entry.rows[1][:, :n].clone()


def test_a_follow_up_borrows_the_buffer_once_the_request_before_is_gone(tiny_paths):
    """No copy: the request that read a prompt keeps writing after it in the same buffer, and the next request
    hitting that whole entry borrows it; the rows of the entry are never written, and outputs stay the same."""
    model, prompt = cached(tiny_paths[0]), tokens(80, seed=3)
    model.prefill(prompt)
    buffer = model.state()[0].keys
    kept = entry_rows(model, prompt)
    model.score(tokens(6, seed=4))  # the answer's rows go after the prompt's, in the same buffer
    model.trim(82)
    model.score(tokens(3, seed=5))
    assert model.state()[0].keys is buffer
    follow_up = prompt + tokens(20, seed=6)
    model.prefill(follow_up)  # the request before is gone: its buffer is lent
    assert model.prefix_cache.stats().lent == 1 and model.state()[0].keys is buffer
    assert all(torch.equal(a, b) for a, b in zip(kept, entry_rows(model, prompt), strict=True))
    logits = model.score([1, 2])
    whole = fresh(tiny_paths[0])
    whole.prefill(follow_up)
    assert torch.equal(logits, whole.score([1, 2]))
    assert all(torch.equal(a, b) for a, b in zip(kv(model), kv(whole), strict=True))


def test_a_buffer_still_written_by_a_live_sequence_is_copied_not_lent(tiny_paths):
    model, prompt = cached(tiny_paths[0]), tokens(50, seed=7)
    model.prefill(prompt)
    model.score([3, 4, 5])
    first = model.state()  # a sequence that lives on (a server's other request)
    model.prefill(prompt + [9])
    assert model.prefix_cache.stats().lent == 0 and model.state()[0].keys is not first[0].keys
    model.score([6, 7])
    model.restore(first)
    again = model.score([8])
    plain = fresh(tiny_paths[0])
    plain.prefill(prompt)
    plain.score([3, 4, 5])
    assert torch.equal(again, plain.score([8]))  # the copy's writes never reached the live sequence


def test_writing_below_an_entry_copies_first(tiny_paths):
    model, prompt = cached(tiny_paths[0]), tokens(40, seed=8)
    model.prefill(prompt)
    kept = entry_rows(model, prompt)
    model.trim(30)  # a rollback below the prompt (nothing in specdec does this; the cache must not care)
    model.score(tokens(15, seed=9))
    assert all(torch.equal(a, b) for a, b in zip(kept, entry_rows(model, prompt), strict=True))
