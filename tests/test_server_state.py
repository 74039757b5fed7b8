"""Model state saved and restored per sequence, and the engine's turn-taking giving each request exactly
what it would get alone (greedy: the same tokens as ``session.generate``)."""

import threading

import numpy as np
import torch
from conftest import random_table, tiny_qwen

from specdec.models.base import NO_ABILITIES
from specdec.models.bigram import BigramModel
from specdec.models.hf import HFModel
from specdec.models.toy import ToyPair
from specdec.sampling import SamplingParams
from specdec.server.engine import Delta, Engine, Failed, Finished, Job
from specdec.server.engine.runs import SequenceRun, can_switch
from specdec.server.metrics import Metrics
from specdec.server.text import Texts, TextTracker, first_stop
from specdec.session import RunSettings, generate


def interleaved_logits(model, a, b):
    """Score a and b token by token, switching sequences between calls; the rows each one got."""
    model.prefill(a[:1])
    state_a = model.state()
    model.prefill(b[:1])
    state_b = model.state()
    rows_a, rows_b = [], []
    for i in range(1, min(len(a), len(b))):
        model.restore(state_a)
        rows_a.append(model.score([a[i]]))
        state_a = model.state()
        model.restore(state_b)
        rows_b.append(model.score([b[i]]))
        model.trim(model.length)  # a no-op trim keeps working on a restored state
        state_b = model.state()
    return torch.cat(rows_a), torch.cat(rows_b)


def alone(model, seq):
    model.prefill(seq[:1])
    return model.score(seq[1:])


def test_bigram_state_restore():
    model = BigramModel(random_table(np.random.default_rng(0), 6))
    a, b = [0, 1, 2, 3, 4], [5, 4, 3, 2, 1]
    got_a, got_b = interleaved_logits(model, a, b)
    assert torch.equal(got_a, alone(model, a)) and torch.equal(got_b, alone(model, b))


def test_hf_state_restore():
    model = HFModel(tiny_qwen(vocab=48))
    a, b = [1, 7, 9, 3, 30, 2], [40, 2, 2, 5, 11, 6]
    got_a, got_b = interleaved_logits(model, a, b)
    assert torch.allclose(got_a, alone(model, a), atol=1e-9) and torch.allclose(got_b, alone(model, b), atol=1e-9)


def test_pairs_without_state_are_served_one_at_a_time():
    pair = ToyPair()
    assert can_switch(pair)

    class NoState:  # llama.cpp's model declares no switch_state: one job at a time
        vocab_size, device, max_length, abilities = 8, torch.device("cpu"), None, NO_ABILITIES

    pair.draft = NoState()
    assert not can_switch(pair) and Engine(pair, Metrics()).max_active == 1


def run_interleaved(engine, pair, jobs, timeout):
    """Submit ``jobs`` ((prompt, settings) pairs) to ``engine`` at once; return each one's events."""
    results, done = {}, threading.Event()

    def post_for(i):
        def post(event):
            results.setdefault(i, []).append(event)
            if sum(isinstance(e[-1], (Finished, Failed)) for e in results.values()) == len(jobs):
                done.set()
        return post

    for i, (prompt, settings) in enumerate(jobs):
        engine.submit(Job(SequenceRun(engine.slot_pair(), pair.encode(prompt), settings), TextTracker(Texts(pair), []),
                          post_for(i)))
    assert done.wait(timeout)
    engine.close()
    return results


def test_engine_turns_give_each_job_its_own_tokens():
    """Six greedy jobs of mixed drafters, γ and lengths, interleaved round by round on one pair."""
    pair, metrics = ToyPair(), Metrics()
    engine = Engine(pair, metrics, max_active=6).start()
    cases = [("the", 40, "model", 3), ("the dog", 25, "lookup+model", "auto"), ("the cat sat", 7, "lookup", 2),
             ("on the mat", 33, "model", "heuristic"), ("the dog ran", 1, "model", 1), (". the", 18, "model", 5)]
    greedy = SamplingParams(temperature=0.0)
    results = run_interleaved(engine, pair, [(prompt, RunSettings(gamma=gamma, max_new_tokens=n, sampling=greedy,
                                                                  draft=draft))
                                             for prompt, n, draft, gamma in cases], timeout=20)
    for i, (prompt, n, draft, gamma) in enumerate(cases):
        reference = ToyPair()
        settings = RunSettings(gamma=gamma, max_new_tokens=n, sampling=SamplingParams(temperature=0.0), draft=draft)
        want = reference.decode(generate(reference, reference.encode(prompt), settings).generation.tokens)
        events = results[i]
        assert isinstance(events[-1], Finished) and events[-1].usage["completion_tokens"] == n
        assert "".join(e.text for e in events if isinstance(e, Delta)) == want


def test_stop_string_held_back_until_decided():
    pair = ToyPair()
    tracker = TextTracker(Texts(pair), ["sat on"])
    ids = pair.encode("cat sat")
    delta, stopped = tracker.update(ids)
    assert not stopped and not delta.endswith("sat")  # "sat" might begin "sat on"
    delta2, stopped = tracker.update(ids + pair.encode("on the"))
    assert stopped and delta + delta2 == "cat " and first_stop("a cat sat", ["sat", "cat"]) == 2


class TinyHFPair:
    """Two random-weight Qwen2 models (float64) with ids as text: real KV caches, no tokenizer."""

    eos_token_ids: list[int] = []

    def __init__(self) -> None:
        self.target, self.draft = HFModel(tiny_qwen(vocab=48, seed=0)), HFModel(tiny_qwen(vocab=48, seed=1))

    def encode(self, text, chat=False):
        return [int(t) for t in text.split()]

    def decode(self, ids):
        return " ".join(str(t) for t in ids)


def test_engine_switches_real_kv_caches_between_jobs():
    pair = TinyHFPair()
    engine = Engine(pair, Metrics(), max_active=3).start()
    cases = [("1 2 3 4", 10, 3), ("9 8 7", 12, 2), ("5 40 5 40 5", 8, 4)]
    greedy = SamplingParams(temperature=0.0)
    results = run_interleaved(engine, pair, [(prompt, RunSettings(gamma=gamma, max_new_tokens=n, sampling=greedy))
                                             for prompt, n, gamma in cases], timeout=60)
    for i, (prompt, n, gamma) in enumerate(cases):
        settings = RunSettings(gamma=gamma, max_new_tokens=n, sampling=SamplingParams(temperature=0.0))
        want = pair.decode(generate(pair, pair.encode(prompt), settings).generation.tokens)
        assert isinstance(results[i][-1], Finished)
        assert "".join(e.text for e in results[i] if isinstance(e, Delta)) == want


def test_chat_prompt_goes_through_the_template():
    class Tokenizer:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [len(part) for part in text.split("|")]}

    class Pair:
        tokenizer, has_chat_template = Tokenizer(), True

    ids = Texts(Pair()).chat_ids([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert ids == [len("system:be brief"), len("user:hi"), len("assistant:")]
