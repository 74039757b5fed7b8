"""The engine's step as data (specdec.server.engine.plan): which calls are answered together, and in what order.

Layers: ``next_batch`` on hand-built open calls (a pure function: known answers); ``StepPlan.line`` on a
hand-built plan; then the plans a real engine produces for staggered jobs on a tiny native pair, held to the
invariants of a step: ONE target call per step holding every generating job's γ_i + 1 rows, draft calls
batched by position (job i in the first γ_i of them), a prompt read in chunks of at most ``prompt_chunk``
while others generate; and ``specdec serve --log-steps`` printing each step's line.
"""

from __future__ import annotations

import re
import threading
from types import SimpleNamespace

import httpx
import pytest
from test_batched_engine import TinyPair, prompts
from tiny_qwen2 import write_tiny_qwen2

from specdec.sampling import SamplingParams
from specdec.server import ServeConfig, create_app
from specdec.server.engine import Engine, Failed, Finished, Job
from specdec.server.engine.plan import Part, StepPlan, next_batch
from specdec.server.engine.runs import SequenceRun
from specdec.server.metrics import Metrics
from specdec.server.runner import ServerThread
from specdec.server.text import Texts, TextTracker
from specdec.session import RunSettings


def call(kind: str, role: str = "target", job: int = 1):
    return SimpleNamespace(kind=kind, slot=SimpleNamespace(role=role, job=job))


def test_next_batch_orders_trims_then_a_prompt_chunk_then_drafts_then_one_target_call():
    trim, read, read2 = call("trim"), call("prefill", job=2), call("prefill", job=3)
    draft_a, draft_b = call("score", "draft", 1), call("score", "draft", 4)
    verify_a, verify_b = call("score", "target", 5), call("score", "target", 6)
    everything = [read, trim, draft_a, verify_a, read2, draft_b, verify_b]
    batch = next_batch(everything, 128)
    assert (batch.kind, batch.calls) == ("trim", (trim,))
    batch = next_batch([c for c in everything if c is not trim], 128)
    assert (batch.kind, batch.calls, batch.budget) == ("read", (read,), 128)  # the oldest prompt only
    no_prompts = [draft_a, verify_a, draft_b, verify_b]
    assert next_batch(no_prompts + [read], 0).kind == "draft"  # budget spent: the prompt waits
    batch = next_batch(no_prompts, None)
    assert (batch.kind, batch.calls) == ("draft", (draft_a, draft_b))  # every draft call, together
    batch = next_batch([verify_a, verify_b], None)
    assert (batch.kind, batch.calls) == ("verify", (verify_a, verify_b))  # one target call for all
    assert next_batch([read], 0) is None and next_batch([], None) is None


def test_a_plan_prints_as_one_line():
    plan = StepPlan(812, gammas={3: 2, 5: 0, 9: 3})
    plan.add("read", [Part(7, 1024, 1152), Part(7, 0, 128, "draft")], 0.3104)
    plan.add("draft", [Part(3, 10, 11), Part(9, 20, 21)], 0.014)
    plan.add("draft", [Part(9, 21, 22)], 0.0112)
    plan.add("verify", [Part(3, 100, 103), Part(5, 40, 41), Part(9, 80, 84)], 0.0626)
    plan.add("trim", [Part(3, 101, 103)])
    assert plan.line() == ("step 812: γ {3: 2, 5: 0, 9: 3}; read 7 [1024:1152] 310 ms; read 7 draft [0:128] 310 ms; "
                           "draft 3 9 14 ms; draft 9 11 ms; "
                           "verify 3[100:103] 5[40:41] 9[80:84] = 8 rows 63 ms")
    plan.wall = 0.4201
    assert plan.line().endswith("= 8 rows 63 ms; step 420 ms")
    assert plan.verify_rows == 8 and len(plan.of_kind("draft")) == 2


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-plan")
    return TinyPair(str(write_tiny_qwen2(folder / "t.gguf", seed=0)), str(write_tiny_qwen2(folder / "d.gguf", seed=1)))


def plans_of(pair, requests, settings_of, **engine_options) -> tuple[list[StepPlan], list[Job]]:
    plans: list[StepPlan] = []
    engine = Engine(pair, Metrics(), on_step=plans.append, **engine_options).start()
    texts, jobs, done = Texts(pair), [], []
    try:
        for i, ids in enumerate(requests):
            finished = threading.Event()
            post = lambda event, finished=finished: finished.set() if isinstance(event, Finished | Failed) else None  # noqa: E731
            job = Job(SequenceRun(engine.slot_pair(), ids, settings_of(i)), TextTracker(texts, []), post=post)
            jobs.append(job)
            done.append(finished)
            engine.submit(job)
        assert all(f.wait(120) for f in done), "a request never finished"
    finally:
        engine.close()
    return plans, jobs


def test_each_step_is_one_target_call_over_every_generating_job(tiny_pair):
    gammas = [1, 3, 0, 2]
    greedy = SamplingParams(temperature=0)
    requests = prompts(4, 150, seed=5)  # 150-178 tokens: prompts read over several steps while others generate
    settings = lambda i: RunSettings(gamma=gammas[i] or 1, max_new_tokens=12, sampling=greedy,  # noqa: E731
                                     draft="model" if gammas[i] else "lookup")
    plans, jobs = plans_of(tiny_pair, requests, settings, prompt_chunk=64)
    ids = {job.id: i for i, job in enumerate(jobs)}
    shared = 0
    for plan in plans:
        verifies = plan.of_kind("verify")
        assert len(verifies) <= 1, plan.line()
        if plan.gammas:
            generating = set(plan.gammas)
            (verify,) = verifies
            assert {p.job for p in verify} >= generating, plan.line()  # every generating job, in ONE call
            assert len({p.job for p in verify}) == len(verify)  # each once
            for part in verify:
                if part.job in plan.gammas and settings(ids[part.job]).draft == "model":
                    assert part.rows == plan.gammas[part.job] + 1, plan.line()  # γ_i drafts + the bonus row
            drafts = plan.of_kind("draft")
            for position, parts in enumerate(drafts, start=1):
                assert {p.job for p in parts} <= {j for j, g in plan.gammas.items() if g >= position}, plan.line()
            shared += len(verify) > 1
        readers = {p.job for parts in plan.of_kind("read") for p in parts}
        if any(job not in readers for job in plan.gammas):  # others generate: a prompt is read a chunk at a time
            assert all(p.rows <= 64 for parts in plan.of_kind("read") for p in parts), plan.line()
        assert re.fullmatch(r"step \d+: γ \{.*\}(; .+)*", plan.line())
    assert shared >= 3, "the jobs never shared a target call"
    assert [plan.step for plan in plans] == list(range(1, len(plans) + 1))
    reads = {}
    for plan in plans:
        for parts in plan.of_kind("read"):
            for p in parts:
                if p.model == "target":
                    reads.setdefault(p.job, []).append((p.start, p.end))
    for job in jobs:  # every prompt read in contiguous chunks, to its last token but one
        chunks = reads[job.id]
        assert chunks[0][0] == 0 and chunks[-1][1] == job.run.prompt_length - 1
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:], strict=False))


def test_serve_log_steps_prints_each_step(tiny_pair, capfd):
    config = ServeConfig(defaults=RunSettings(gamma=2, max_new_tokens=6, sampling=SamplingParams(temperature=0)),
                         log_steps=True)
    with ServerThread(create_app(config, pair=tiny_pair)) as server:
        reply = httpx.post(f"{server.url}/v1/completions", json={"model": "specdec", "prompt": "abcdefgh",
                                                                 "max_tokens": 6}, timeout=60)
        assert reply.status_code == 200, reply.text
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("step ")]
    assert lines and any("verify" in line and "rows" in line for line in lines), lines
    assert any(re.search(r"; read \d+ \[0:7\]", line) for line in lines), lines  # "abcdefgh": 8 ids, 7 read
