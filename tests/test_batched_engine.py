"""The batched engine (specdec.server.engine): several requests, staggered, through shared model calls.

Each request's tokens must equal the same request run alone: greedy bit for bit, seeded sampling with a
fixed γ draw for draw. Pairs: the toy pair (no batched call: the engine's fallback, one request's state at a
time), and a tiny random-weight Qwen2 GGUF pair on the native backend (``score_many``: one forward pass over
every request's rows). Also: the target call of a step really holds several requests' rows.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from tiny_qwen2 import VOCAB, write_tiny_qwen2

from specdec.models.native import NativeModel, NativeSettings
from specdec.models.toy import ToyPair
from specdec.sampling import SamplingParams
from specdec.server.engine import Engine, Failed, Finished, Job
from specdec.server.engine.runs import SequenceRun
from specdec.server.metrics import Metrics
from specdec.server.text import Texts, TextTracker
from specdec.session import RunSettings


class TinyPair:
    """A native pair over two tiny random GGUF files, with an id-per-character 'tokenizer'."""

    def __init__(self, target: str, draft: str) -> None:
        self.target = NativeModel(target, NativeSettings(threads=2))
        self.draft = NativeModel(draft, NativeSettings(threads=2))
        self.eos_token_ids: list[int] = []
        self.has_chat_template = False

    def encode(self, text: str, chat: bool = False) -> list[int]:
        return [ord(ch) % VOCAB for ch in text]

    def decode(self, ids) -> str:
        return "".join(chr(65 + int(i) % 26) for i in ids)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-batched")
    return TinyPair(str(write_tiny_qwen2(folder / "t.gguf", seed=0)), str(write_tiny_qwen2(folder / "d.gguf", seed=1)))


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, VOCAB, length + 7 * i)] for i in range(n)]


def alone(pair, ids, settings) -> list[int]:
    run = SequenceRun(pair, ids, settings)
    run.start()
    while not run.done:
        run.step()
    return run.new_tokens


def through_engine(pair, requests, settings_of, stagger: float = 0.0, **engine_options):
    """Submit every request (``stagger`` seconds apart) to one engine; their tokens, in order."""
    metrics = Metrics()
    engine = Engine(pair, metrics, **engine_options).start()
    texts, done, jobs = Texts(pair), [], []
    try:
        for i, ids in enumerate(requests):
            slot_pair = engine.slot_pair()
            run = SequenceRun(slot_pair, ids, settings_of(i))
            finished = threading.Event()
            events = []

            def post(event, events=events, finished=finished):
                events.append(event)
                if isinstance(event, Finished | Failed):
                    finished.set()

            job = Job(run, TextTracker(texts, []), post=post)
            jobs.append((job, events, finished))
            engine.submit(job)
            time.sleep(stagger)
        for job, events, finished in jobs:
            assert finished.wait(120), "a request never finished"
            assert not any(isinstance(e, Failed) for e in events), [e for e in events if isinstance(e, Failed)]
            done.append(job.run.new_tokens)
    finally:
        engine.close()
    return done, metrics


def batch_sizes(metrics: Metrics) -> float:
    """The mean number of requests one target call verified."""
    values = {s.name: s.value for m in metrics.registry.collect() if m.name == "specdec_batch_requests"
              for s in m.samples}
    return values["specdec_batch_requests_sum"] / max(values["specdec_batch_requests_count"], 1)


@pytest.mark.parametrize("gamma", [1, 3, "auto"])
def test_toy_pair_greedy_requests_equal_alone(gamma):
    pair = ToyPair()
    requests = [pair.encode(text) for text in ("the cat", "the dog sat on", "the", "the mat . the cat ran")]
    settings = RunSettings(gamma=gamma, max_new_tokens=20, sampling=SamplingParams(temperature=0), draft="model")
    got, metrics = through_engine(pair, requests, lambda i: settings, stagger=0.01)
    assert got == [alone(ToyPair(), ids, settings) for ids in requests]


def test_toy_pair_seeded_requests_equal_alone_draw_for_draw():
    pair = ToyPair()
    requests = [pair.encode(text) for text in ("the cat", "the dog", "the mat", "cat ran")] * 2

    def settings_of(i):
        return RunSettings(gamma=1 + i % 3, max_new_tokens=24, sampling=SamplingParams(temperature=1.0), seed=100 + i,
                           draft="model" if i % 2 else "lookup+model")

    got, _ = through_engine(pair, requests, settings_of)
    assert got == [alone(ToyPair(), ids, settings_of(i)) for i, ids in enumerate(requests)]


def test_native_requests_share_target_calls_and_equal_alone(tiny_pair):
    requests = prompts(4, 40, seed=3)
    greedy = RunSettings(gamma=3, max_new_tokens=16, sampling=SamplingParams(temperature=0), draft="model")
    expected = [alone(tiny_pair, ids, greedy) for ids in requests]
    got, metrics = through_engine(tiny_pair, requests, lambda i: greedy)
    assert got == expected
    assert batch_sizes(metrics) > 1.5  # the requests' rows really went through shared calls


def test_native_seeded_staggered_long_prompts_equal_alone(tiny_pair):
    """Prompts of 300+ tokens read in chunks of 32 between the other requests' rounds."""
    requests = prompts(3, 300, seed=5)

    def settings_of(i):
        return RunSettings(gamma=2, max_new_tokens=12, sampling=SamplingParams(temperature=1.0), seed=i, draft="model")

    expected = [alone(tiny_pair, ids, settings_of(i)) for i, ids in enumerate(requests)]
    got, _ = through_engine(tiny_pair, requests, settings_of, stagger=0.05, prompt_chunk=32)
    assert got == expected


class BigramPair:
    """The exactness tests' random bigram tables (V = 4) as a pair the engine serves."""

    eos_token_ids: list[int] = []
    has_chat_template = False

    def __init__(self) -> None:
        from test_exactness import models

        self.target, self.draft = models()

    def decode(self, ids) -> str:
        return "".join("abcd"[int(i)] for i in ids)


def test_sequences_through_the_batched_engine_have_the_target_distribution():
    """Sequence-level chi-square through the batched path: 6,000 seeded requests, eight at a time sharing
    the engine's steps, γ 1–3 (a fixed γ per request) and temperature 1; whole 4-token outputs against
    their exact probabilities (test_exactness.exact_distribution). False alarm 1e-3, fixed seeds."""
    from test_exactness import PROMPT, chi_square_pvalue, exact_distribution

    runs, new = 6000, 4
    pair = BigramPair()

    def settings_of(i):
        return RunSettings(gamma=1 + i % 3, max_new_tokens=new, sampling=SamplingParams(temperature=1.0), seed=i,
                           draft="model")

    got, metrics = through_engine(pair, [PROMPT] * runs, settings_of, max_active=8, max_waiting=runs)
    counts: dict = {}
    for tokens in got:
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    dist = exact_distribution(pair.target, SamplingParams(temperature=1.0), new)
    assert chi_square_pvalue(counts, dist, runs) > 1e-3
    assert batch_sizes(metrics) > 2  # the requests really shared steps


@pytest.mark.slow
def test_real_pair_requests_staggered_through_the_engine_equal_alone():
    """The default pair (native): three greedy chat requests sharing a 300-token context, staggered, then
    the same three again (their prompts now in the prefix cache): every answer equals the request alone."""
    from specdec.loading import defaults as zoo
    from specdec.session import LoadSettings, load

    if zoo.missing_packages(zoo.DEFAULT_TARGET) or zoo.missing_packages(zoo.DEFAULT_DRAFT):
        pytest.skip("specdec[default-models] not installed")
    pair = load(LoadSettings(cache_gb=1.0))
    context = "import math\n\n" + "\n".join(f"def f{i}(x):\n    return math.sqrt(x) + {i}\n" for i in range(25))
    questions = ("What does f3 return?", "Rename f1 to g1.", "Which functions use math?")
    requests = [pair.encode(context + "\n" + q, chat=True) for q in questions]
    greedy = RunSettings(gamma="auto", max_new_tokens=24, sampling=SamplingParams(temperature=0), draft="model")
    pair.target.prefix_cache.clear()
    expected = [alone(pair, ids, greedy) for ids in requests]
    pair.target.prefix_cache.clear()
    for _ in range(2):  # cold, then warm
        got, metrics = through_engine(pair, requests, lambda i: greedy, stagger=0.3)
        assert got == expected
    assert pair.target.prefix_cache.stats().reused > 2 * 250


def test_a_follow_up_through_the_engine_borrows_the_finished_request_buffers(tmp_path):
    import gc

    from specdec.models.prefix import PrefixCache

    target, draft = write_tiny_qwen2(tmp_path / "t.gguf", seed=0), write_tiny_qwen2(tmp_path / "d.gguf", seed=1)
    pair = TinyPair(str(target), str(draft))
    pair.target.prefix_cache = pair.draft.prefix_cache = PrefixCache.of_gb(0.5)
    settings = RunSettings(gamma=3, max_new_tokens=12, sampling=SamplingParams(temperature=0), draft="model")
    context = prompts(1, 200, seed=4)[0]
    first, _ = through_engine(pair, [context + [1, 2, 3]], lambda i: settings)
    gc.collect()
    second, _ = through_engine(pair, [context + [4, 5]], lambda i: settings)
    stats = pair.target.prefix_cache.stats()
    assert stats.reused >= 200 and stats.lent >= 1  # the follow-up read 2 tokens, copying nothing
    fresh = TinyPair(pair.target.path, pair.draft.path)
    assert second == [alone(fresh, context + [4, 5], settings)]
