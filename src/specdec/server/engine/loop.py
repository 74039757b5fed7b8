"""The generation engine: one thread owns the models; every step runs one round of every active job, their
model calls batched (``plan`` defines the words: job, run, round, step, call, batch).

- *waiting* jobs are queued; *active* ones take part in every step. A step fixes each generating job's γ
  (``batch_gamma`` prices every ``--gamma auto`` job's for the whole batch; a job alone chooses its own, as the
  CLI does), starts each active job's greenlet (``slots.Exchange.spawn``: its first step reads its prompt, each
  step after is one round, ``decode.SpeculativeRun``), then answers the jobs' calls batch by batch as
  ``plan.next_batch`` chooses them (``calls``): a chunk of a new job's prompt (``prompt_chunk`` tokens while
  others generate, so their streams keep flowing; the whole prompt at once when nobody else waits), every job's
  draft call together, then ONE target call over every job's rows. So no job waits more than one step behind
  the others once its prompt is read. The step's :class:`plan.StepPlan` goes to ``on_step`` (``specdec serve
  --log-steps`` prints it);
- the queue is *bounded*: ``submit`` refuses a job (:class:`QueueFull`, answered 429) when
  ``max_active + max_waiting`` jobs are already in; a *cancelled* job (its client left) ends at its next
  call and its state is freed.

A pair whose models cannot switch state (llama.cpp: ``Abilities.switch_state`` False) serves one job at a time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import greenlet

from ...drafters import ModelDrafter
from ...gamma import CostEstimate
from ..metrics import Metrics
from . import batch_gamma, calls
from .jobs import Delta, Failed, Finished, Job
from .plan import Batch, StepPlan, next_batch
from .runs import can_switch
from .slots import Cancelled, Exchange, SlotPair

__all__ = ["PROMPT_CHUNK", "Delta", "Engine", "Failed", "Finished", "Job", "QueueFull", "ShuttingDown"]

PROMPT_CHUNK = 128  # prompt tokens read per step while other jobs generate
DRAFT_PRIOR_C = CostEstimate().prior_c  # a draft call's cost in target rows before one was timed


class QueueFull(Exception):
    """The engine holds as many jobs as it may; the client should retry later."""


class ShuttingDown(Exception):
    """The engine takes no new jobs: the server is stopping."""


class Engine:
    """Owns the pair's models on one thread; ``slot_pair()`` for each job's run, ``submit`` the job, ``close`` to
    stop. ``on_step(plan)``, if given, is called on the engine's thread after every step."""

    def __init__(self, pair, metrics: Metrics, *, max_active: int = 8, max_waiting: int = 16,
                 prompt_chunk: int = PROMPT_CHUNK, on_step: Callable[[StepPlan], None] | None = None) -> None:
        self.pair, self.metrics, self.prompt_chunk, self.on_step = pair, metrics, prompt_chunk, on_step
        self.switchable = can_switch(pair)
        self.max_active = max_active if self.switchable else 1
        self.max_waiting = max_waiting
        self.exchange = Exchange()
        self.costs = calls.CallCosts()
        self.steps = 0
        self._cond = threading.Condition()
        self._waiting: deque = deque()
        self._active: list = []
        self._accepting, self._stopping = True, False
        self._thread = threading.Thread(target=self._work, name="specdec-engine", daemon=True)

    def start(self) -> Engine:
        self._thread.start()
        return self

    def slot_pair(self) -> SlotPair:
        """The pair as one new job sees it: its own slots of the shared models."""
        return SlotPair(self.pair, self.exchange)

    @property
    def queue(self) -> tuple[int, int]:
        """(active, waiting) jobs."""
        with self._cond:
            return len(self._active), len(self._waiting)

    def submit(self, job: Job) -> None:
        with self._cond:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down and takes no new requests")
            if len(self._active) + len(self._waiting) >= self.max_active + self.max_waiting:
                raise QueueFull(f"the server is busy: {len(self._active)} requests generating and "
                                f"{len(self._waiting)} waiting (at most {self.max_waiting}); retry shortly")
            if not isinstance(job.run.pair, SlotPair):
                raise ValueError("a job's run must be built on engine.slot_pair() (the request's own slots)")
            job.run.pair.bind(job.id, job.cancelled)
            self._waiting.append(job)
            self._cond.notify()

    def close(self, grace: float = 0.0) -> None:
        """Take no new jobs; let open ones finish for up to ``grace`` seconds, then end them with an
        error event, and stop the thread."""
        with self._cond:
            self._accepting = False
            deadline = time.monotonic() + grace
            while (self._active or self._waiting) and time.monotonic() < deadline:
                self._cond.wait(timeout=max(0.0, min(0.05, deadline - time.monotonic())))
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    # --- the engine thread ----------------------------------------------------------------------
    def _work(self) -> None:
        self.exchange.hub = greenlet.getcurrent()
        while True:
            with self._cond:
                while not self._stopping and not self._waiting and not self._active:
                    self._cond.wait()
                if self._stopping:
                    break
                while self._waiting and len(self._active) < self.max_active:
                    self._active.append(self._waiting.popleft())
                jobs = list(self._active)
                self.metrics.running.set(len(self._active))
                self.metrics.waiting.set(len(self._waiting))
            plan = self._step(jobs)
            if self.on_step is not None:
                self.on_step(plan)
            for job in jobs:
                if (job.finished or job.cancelled.is_set()) and not job.busy:
                    self._drop(job)
        self._end_all()

    def _step(self, jobs: list[Job]) -> StepPlan:
        """One round of every generating job, and a chunk of a prompt being read."""
        self.steps += 1
        started = time.perf_counter()
        plan = StepPlan(self.steps)
        self._cancel_open_calls()
        generating = [j for j in jobs if j.run.started and not j.busy and not j.finished]
        self._assign_gammas(generating)
        plan.gammas = {j.id: j.run.next_gamma() for j in generating}
        joining = {j.id: len(j.run.records) for j in jobs if j not in generating}  # reading a prompt, or new
        for job in jobs:
            if not job.busy and not job.finished and not job.cancelled.is_set():
                job.task = self.exchange.spawn(lambda job=job: self._advance(job))
        budget = self.prompt_chunk if generating else None
        while (batch := next_batch(self.exchange.settled(), budget)) is not None:
            answered = time.perf_counter()
            parts = self._answer(batch)
            plan.add(batch.kind, parts, time.perf_counter() - answered)
            if batch.kind == "read" and budget is not None:
                budget -= sum(p.rows for p in parts)
        for job in jobs:  # a job whose prompt was read this step joined its round: its γ, chosen then
            if job.id in joining and len(job.run.records) > joining[job.id]:
                plan.gammas[job.id] = job.run.last_gamma
        plan.wall = time.perf_counter() - started
        return plan

    def _answer(self, batch: Batch) -> list:
        if batch.kind == "trim":
            return calls.answer_trims(self.exchange, list(batch.calls), self.switchable)
        if batch.kind == "read":
            return calls.answer_read(self.exchange, batch.calls[0], batch.budget, self.switchable)
        parts = calls.answer_scores(self.exchange, list(batch.calls), self.switchable, self.costs)
        if batch.kind == "verify":
            self.metrics.count_batch(len(parts), sum(p.rows for p in parts))
        return parts

    def _assign_gammas(self, jobs: list[Job]) -> None:
        """This step's γ of every steered job, priced with the batch's measured costs (a job alone chooses its
        own, as in the CLI)."""
        steered = [j for j in jobs if isinstance(j.run.policy, batch_gamma.SteeredGamma)]
        if len(jobs) == 1 and steered:
            steered[0].run.policy.assigned = None
        if len(jobs) < 2 or not steered:
            return
        target = self.costs.curve("target")
        draft = self.costs.curve("draft") if self.costs.measured("draft") else (
            lambda rows: DRAFT_PRIOR_C * target(1) * rows)
        gammas = batch_gamma.assign([demand(j.run) for j in jobs], target, draft)
        for job, gamma in zip(jobs, gammas, strict=True):
            if isinstance(job.run.policy, batch_gamma.SteeredGamma):
                job.run.policy.assigned = gamma  # 0: this step the job decodes plainly (a heavy load)

    def _advance(self, job: Job) -> None:
        """A job's part of a step, in its greenlet: read its prompt (its first step) or one round."""
        if job.cancelled.is_set():
            return
        try:
            job.advance(self.metrics)
        except Cancelled:
            pass
        except Exception as err:  # a bug or a backend failure: this job ends, the others go on
            self.metrics.errors.labels(kind="server_error").inc()
            job.fail(500, f"generation failed: {type(err).__name__}: {err}")

    def _cancel_open_calls(self) -> None:
        """Calls of cancelled jobs (a prompt being read) end with Cancelled, so their greenlets finish."""
        for call in list(self.exchange.open):
            if call.slot.cancelled is not None and call.slot.cancelled.is_set():
                self.exchange.answer(call, error=Cancelled())

    def _drop(self, job: Job) -> None:
        """Forget a finished or cancelled job and the state it held."""
        with self._cond:
            if job in self._active:
                self._active.remove(job)
            self._cond.notify_all()
        if job.cancelled.is_set() and not job.finished:
            self.metrics.errors.labels(kind="client_disconnected").inc()
        job.finished = True
        self.exchange.stop(job.task)
        for slot in job.run.pair.slots:
            slot.state = None

    def _end_all(self) -> None:
        with self._cond:
            jobs = list(self._active) + list(self._waiting)
            self._active.clear()
            self._waiting.clear()
        for call in list(self.exchange.open):
            self.exchange.answer(call, error=Cancelled())
        for job in jobs:
            if not job.finished:
                job.fail(503, "the server is shutting down: this request was ended before it finished",
                         type="service_unavailable", code="shutting_down")
            self.exchange.stop(job.task)


def demand(run) -> batch_gamma.Demand:
    """What ``run`` brings to the next step: a steered γ to choose, or its own, chosen now by its policy and kept
    for the step (``run.next_gamma``: a fixed, heuristic or reproducible ``auto`` γ; a plain run: 0)."""
    remaining = max(run.max_new_tokens - len(run.new_tokens) - 1, 0)
    policy, model_drafted = run.policy, isinstance(run.drafter, ModelDrafter)
    if run.first_token_alone and not run.draft_begun:  # its first token: the target alone
        return batch_gamma.Demand(0.0, 0, False, chosen=0)
    if isinstance(policy, batch_gamma.SteeredGamma):
        return batch_gamma.Demand(policy.alpha, max(min(policy.max_gamma, remaining), 1), model_drafted)
    own = run.next_gamma()  # what the run will draft this step (clipped to the budget), whoever shares it
    return batch_gamma.Demand(0.0, own, model_drafted, chosen=own)
