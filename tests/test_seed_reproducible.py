"""A request's own ``seed`` is honoured with ``--gamma auto`` (issue 26): the same seeded request gives the same tokens.

Speculative decoding's draws follow each round's γ, and the load-aware ``auto`` γ follows measured call times and
the other requests (``server.engine.batch_gamma``). A *reproducible* run (``RunSettings.reproducible``, set by the
server for a sampled request that gives its own ``seed``) prices γ with the pair's fixed costs
(``session.cost_prior``) and is never steered, so its γ depends on its own rounds' β alone. Held here: the cost
prior itself; that prepare sets the flag for a request's own seed only; and, on a tiny native pair through the
real engine, the same seeded request (temperature 0.8, γ auto) alone, beside three other generating requests, and
after its prompt was cached gives the same tokens and the same γ per round, as ``session.generate`` does; also
over HTTP. Exactness is untouched: γ is fixed before each round's draws (``test_exactness_adaptive.py`` runs the
chi-square test on an AdaptiveGamma with fixed costs).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import httpx
import pytest
import torch
from test_batched_engine import TinyPair, prompts
from test_step_plan import plans_of
from tiny_qwen2 import write_tiny_qwen2

from specdec import session
from specdec.gamma import AdaptiveGamma, CostEstimate
from specdec.models.prefix import PrefixCache
from specdec.models.toy import ToyPair
from specdec.sampling import SamplingParams
from specdec.server import ServeConfig, create_app
from specdec.server.engine.batch_gamma import SteeredGamma
from specdec.server.engine.runs import SequenceRun
from specdec.server.prepare import prepare
from specdec.server.runner import ServerThread
from specdec.server.schema import CompletionRequest
from specdec.server.text import Texts
from specdec.session import PRIOR_VERIFY_SLOPE, RunSettings, cost_prior, gamma_policy, weight_bytes

WARM = SamplingParams(temperature=0.8)
SEEDED = RunSettings(gamma="auto", max_new_tokens=40, sampling=WARM, seed=5, draft="model", reproducible=True)
OTHER = RunSettings(gamma="auto", max_new_tokens=60, sampling=WARM, seed=None, draft="model")  # load-aware γ


# ----------------------------------------------------------------------------- the cost prior of a pair


def test_cost_prior_is_the_ratio_of_weight_bytes_and_a_fixed_slope(tmp_path):
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target.write_bytes(b"\0" * 400)
    draft.write_bytes(b"\0" * 100)
    t, d = SimpleNamespace(path=str(target)), SimpleNamespace(path=str(draft))
    c, curve = cost_prior(t, d, drafts_by_model=True)
    assert c == 0.25
    assert [curve(k) for k in (1, 2, 5)] == [1.0, 1.0 + PRIOR_VERIFY_SLOPE, 1.0 + 4 * PRIOR_VERIFY_SLOPE]
    assert cost_prior(t, d, drafts_by_model=False)[0] == 0.0  # lookup, n-gram: next to nothing
    assert cost_prior(t, None, drafts_by_model=True)[0] == 0.0
    module = torch.nn.Linear(4, 4)  # a transformers model's weights: 16 + 4 float32 parameters
    assert weight_bytes(SimpleNamespace(model=module)) == 80
    toy = ToyPair()  # tables, no weight bytes: the costs' prior
    assert weight_bytes(toy.target) is None
    assert cost_prior(toy.target, toy.draft, True)[0] == CostEstimate().prior_c


def test_cost_prior_of_a_native_pair_is_the_same_on_every_load(tmp_path):
    t, d = write_tiny_qwen2(tmp_path / "t.gguf", seed=0), write_tiny_qwen2(tmp_path / "d.gguf", seed=1)
    first, second = TinyPair(t, d), TinyPair(t, d)
    c1, curve1 = cost_prior(first.target, first.draft, True)
    c2, curve2 = cost_prior(second.target, second.draft, True)
    assert c1 == c2 == pytest.approx(1.0, rel=0.01)  # two files of one shape
    assert [curve1(k) for k in range(1, 9)] == [curve2(k) for k in range(1, 9)]


def test_settings_and_policies():
    with pytest.raises(ValueError, match="reproducible"):
        RunSettings(reproducible=1).validate()
    with pytest.raises(ValueError, match="needs a seed"):
        RunSettings(reproducible=True, seed=None).validate()
    toy = ToyPair()
    fixed = gamma_policy(SEEDED, toy.target, toy.draft)
    assert isinstance(fixed, AdaptiveGamma) and fixed.fixed_c is not None and fixed.fixed_curve is not None
    measured = gamma_policy(OTHER, toy.target, toy.draft)
    assert isinstance(measured, AdaptiveGamma) and measured.fixed_c is None
    assert gamma_policy(RunSettings(gamma=3, reproducible=True), toy.target, toy.draft).gamma == 3
    # In the engine: a reproducible run keeps its own policy; the others are steered by the load.
    assert isinstance(SequenceRun(toy, toy.encode("the cat"), SEEDED).policy, AdaptiveGamma)
    assert isinstance(SequenceRun(toy, toy.encode("the cat"), OTHER).policy, SteeredGamma)


@pytest.mark.parametrize(("fields", "reproducible"), [
    ({"seed": 5, "temperature": 0.8}, True),  # the client's own seed
    ({"temperature": 0.8}, False),  # the server's default seed (7 here) promises nothing
    ({"seed": 5, "temperature": 0.0}, False),  # greedy: its tokens do not depend on γ
])
def test_prepare_makes_a_request_with_its_own_seed_reproducible(fields, reproducible):
    pair = ToyPair()
    defaults = RunSettings(gamma="auto", max_new_tokens=8, sampling=WARM, seed=7)
    run = prepare(CompletionRequest(prompt="the cat", **fields), pair, Texts(pair), defaults, ("specdec",))
    assert run.settings.reproducible is reproducible
    assert isinstance(run.policy, AdaptiveGamma if reproducible else SteeredGamma)


# ----------------------------------------------------------------------------- through the real engine


@pytest.fixture(scope="module")
def flat_pair(tmp_path_factory):
    """A tiny native pair with flat heads (α ≈ 0.85 at temperature 0.8, so γ auto moves with β)."""
    folder = tmp_path_factory.mktemp("tiny-seeded")
    return TinyPair(str(write_tiny_qwen2(folder / "t.gguf", seed=0, head_scale=0.1)),
                    str(write_tiny_qwen2(folder / "d.gguf", seed=1, head_scale=0.1)))


@pytest.fixture(params=["the pair's own prior", "a cheap draft"])
def priced(request, monkeypatch):
    """The pair's own cost prior (c = 1: two files of one size), or a draft 20× cheaper, where γ auto drafts long."""
    if request.param == "a cheap draft":
        cheap = (0.05, lambda k: 1.0 + PRIOR_VERIFY_SLOPE * (k - 1))
        monkeypatch.setattr(session, "cost_prior", lambda target, draft, by_model: cheap)
    return request.param


def seeded_run(pair, others: int = 0):
    """The seeded request through the engine after ``others`` load-aware requests: (tokens, γ per round, its job,
    the step plans)."""
    ids = prompts(1, 600, seed=9)[0]  # a long prompt: its first token drawn by the target alone, as in the issue
    requests = prompts(others, 80, seed=10) + [ids]
    plans, jobs = plans_of(pair, requests, lambda i: SEEDED if i == others else OTHER, prompt_chunk=64)
    job = jobs[-1]
    assert job.run.done and len(job.run.new_tokens) == SEEDED.max_new_tokens
    return job.run.new_tokens, list(job.run.policy.chosen), job, plans


def test_a_seeded_auto_request_gives_the_same_tokens_alone_beside_others_and_cached(flat_pair, priced):
    alone, gammas, _, _ = seeded_run(flat_pair)
    assert len(set(gammas)) >= 2  # γ really varied from round to round
    reference = session.generate(flat_pair, prompts(1, 600, seed=9)[0], SEEDED)  # the CLI's loop, no engine
    assert (list(reference.generation.tokens), list(reference.gamma_chosen)) == (alone, gammas)

    shared, shared_gammas, job, plans = seeded_run(flat_pair, others=3)
    assert (shared, shared_gammas) == (alone, gammas)
    together = [p for p in plans if job.id in p.gammas and len(p.gammas) >= 2]
    assert len(together) >= 5, "the seeded request never shared a step with the others"

    cache = PrefixCache(256 << 20)
    session.share_prefix_cache(flat_pair, cache)
    try:
        seeded_run(flat_pair)  # reads the prompt into the cache
        cached, cached_gammas, job, _ = seeded_run(flat_pair, others=3)
        assert job.run.timer.prompt_reused > 500  # the prompt came from the cache
        assert (cached, cached_gammas) == (alone, gammas)
    finally:
        session.share_prefix_cache(flat_pair, None)


# ----------------------------------------------------------------------------- over HTTP


def test_two_identical_seeded_requests_over_http_give_the_same_text(flat_pair):
    config = ServeConfig(defaults=RunSettings(gamma="auto", max_new_tokens=32, sampling=WARM, seed=None))
    prompt = "".join(chr(97 + (7 * i) % 26) for i in range(300))
    body = {"model": "specdec", "prompt": prompt, "max_tokens": 32, "temperature": 0.8, "seed": 5}
    session.share_prefix_cache(flat_pair, PrefixCache(256 << 20))
    with ServerThread(create_app(config, pair=flat_pair)) as server:
        url = f"{server.url}/v1/completions"
        first = httpx.post(url, json=body, timeout=120)
        assert first.status_code == 200, first.text
        noise = [threading.Thread(target=httpx.post, args=(url,), kwargs={
            "json": {"model": "specdec", "prompt": prompt[: 40 + 10 * i], "max_tokens": 48, "temperature": 0.8},
            "timeout": 120}) for i in range(3)]
        for thread in noise:
            thread.start()
        second = httpx.post(url, json=body, timeout=120)  # beside the others, its prompt now cached
        for thread in noise:
            thread.join()
        assert second.status_code == 200, second.text
    session.share_prefix_cache(flat_pair, None)
    one, two = first.json(), second.json()
    assert one["choices"][0]["text"] == two["choices"][0]["text"]
    assert one["specdec"]["gamma_chosen"] == two["specdec"]["gamma_chosen"]
