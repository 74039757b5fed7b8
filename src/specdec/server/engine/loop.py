"""The generation engine: one thread owns the models; every engine step runs one round of every active
request, their model calls batched.

Terms:

- a *job* is one request inside the engine (``jobs.Job``): its run, its text tracker, its events; its
  run is built on the engine's :meth:`Engine.slot_pair` (its own slots of the shared models);
- *waiting* jobs are queued, *active* ones have a worker (``slots.Worker``: a greenlet on the engine's
  thread, so every model call and tensor op runs on that one thread) that runs the job's turn: its first
  turn reads its prompt, each turn after is one round (``decode.SpeculativeRun``);
- an *engine step* starts the turn of every active job at once, then answers their model calls as they
  come (``slots.Exchange``): first a chunk of a new job's prompt (``prompt_chunk`` tokens while others
  generate, so their streams keep flowing; the whole prompt at once when nobody else waits for the
  models), then the draft's calls of every job together, then ONE target call over every job's rows.
  So no request waits more than one step behind the others once its prompt is read;
- the γ of every ``--gamma auto`` job is chosen per step for the whole batch (``batch_gamma``);
- the queue is *bounded*: ``submit`` refuses a job (:class:`QueueFull`, answered 429) when
  ``max_active + max_waiting`` jobs are already in; a *cancelled* job (its client left) ends at its next
  call and its state is freed.

A pair whose models cannot save their state (llama.cpp) is served one job at a time.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import greenlet

from ...drafters import ModelDrafter
from ..metrics import Metrics
from . import batch_gamma, calls
from .jobs import Delta, Failed, Finished, Job
from .runs import can_switch
from .slots import Call, Cancelled, Exchange, SlotPair, Worker

__all__ = ["PROMPT_CHUNK", "Delta", "Engine", "Failed", "Finished", "Job", "QueueFull", "ShuttingDown"]

PROMPT_CHUNK = 128  # prompt tokens read per engine step while other requests generate


class QueueFull(Exception):
    """The engine holds as many jobs as it may; the client should retry later."""


class ShuttingDown(Exception):
    """The engine takes no new jobs: the server is stopping."""


class Engine:
    """Owns the pair's models on one thread; ``slot_pair()`` for each request's run, ``submit`` its job,
    ``close`` to stop."""

    def __init__(self, pair, metrics: Metrics, *, max_active: int = 8, max_waiting: int = 16,
                 prompt_chunk: int = PROMPT_CHUNK) -> None:
        self.pair, self.metrics, self.prompt_chunk = pair, metrics, prompt_chunk
        self.switchable = can_switch(pair)
        self.max_active = max_active if self.switchable else 1
        self.max_waiting = max_waiting
        self.exchange = Exchange()
        self.costs = calls.CallCosts()
        self._cond = threading.Condition()
        self._waiting: deque = deque()
        self._active: list = []
        self._accepting, self._stopping = True, False
        self._thread = threading.Thread(target=self._work, name="specdec-engine", daemon=True)

    def start(self) -> Engine:
        self._thread.start()
        return self

    def slot_pair(self) -> SlotPair:
        """The pair as one new request sees it: its own slots of the shared models."""
        return SlotPair(self.pair, self.exchange)

    @property
    def load(self) -> tuple[int, int]:
        """(active, waiting) jobs."""
        with self._cond:
            return len(self._active), len(self._waiting)

    def submit(self, job) -> None:
        with self._cond:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down and takes no new requests")
            if len(self._active) + len(self._waiting) >= self.max_active + self.max_waiting:
                raise QueueFull(f"the server is busy: {len(self._active)} requests generating and "
                                f"{len(self._waiting)} waiting (at most {self.max_waiting}); retry shortly")
            if not isinstance(getattr(job.run, "pair", None), SlotPair):
                raise ValueError("a job's run must be built on engine.slot_pair() (the request's own slots)")
            policy = getattr(job.run, "policy", None)
            if policy is not None:
                job.run.policy = batch_gamma.steer(policy)
            job.run.pair.bind(job.cancelled)
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
                    job = self._waiting.popleft()
                    job.worker = Worker(self.exchange, lambda job=job: self._turn(job))
                    self._active.append(job)
                jobs = list(self._active)
                self.metrics.running.set(len(self._active))
                self.metrics.waiting.set(len(self._waiting))
            self._step(jobs)
            for job in jobs:
                if (job.finished or job.cancelled.is_set()) and not job.worker.running:
                    self._drop(job)
        self._end_all()

    def _step(self, jobs: list) -> None:
        """One round of every generating job, and a chunk of a prompt being read."""
        self._cancel_open_calls()
        generating = [j for j in jobs if j.run.started and not j.worker.running]
        self._assign_gammas(generating)
        for job in jobs:
            if not job.worker.running and not job.finished and not job.cancelled.is_set():
                job.worker.go()
        budget = self.prompt_chunk if generating else None
        while True:
            open_calls = self.exchange.settled()
            if not open_calls:
                return
            answered, read = self._answer(open_calls, budget)
            if not answered:
                return  # only prompts left to read, and this step's chunk is read
            if budget is not None:
                budget -= read

    def _answer(self, open_calls: list[Call], budget: int | None) -> tuple[bool, int]:
        """Answer one group of the open calls: trims; else a chunk of the oldest prompt while this step's
        budget lasts (so a job whose prompt is read now joins this step's round); else every draft score;
        else every target score, in one call. (answered anything, prompt tokens read)"""
        trims = [c for c in open_calls if c.kind == "trim"]
        if trims:
            calls.answer_trims(self.exchange, trims, self.switchable)
            return True, 0
        prompts = [c for c in open_calls if c.kind == "prefill"]
        if prompts and (budget is None or budget > 0):
            return True, calls.answer_prefill(self.exchange, prompts[0], budget, self.switchable)
        scores = [c for c in open_calls if c.kind == "score"]
        group = [c for c in scores if c.slot.role == "draft"] or scores
        if group:
            calls.answer_scores(self.exchange, group, self.switchable, self.costs)
            if group[0].slot.role == "target":
                self.metrics.count_batch(len(group), sum(len(c.tokens) for c in group))
            return True, 0
        return False, 0

    def _assign_gammas(self, jobs: list) -> None:
        """This step's γ of every steered job, priced with the batch's measured costs (a job alone
        chooses its own, as in the CLI)."""
        steered = [j for j in jobs if isinstance(getattr(j.run, "policy", None), batch_gamma.SteeredGamma)]
        if len(jobs) == 1 and steered:
            steered[0].run.policy.assigned = None
        if len(jobs) < 2 or not steered:
            return
        demands = [demand(j.run) for j in jobs]
        target = self.costs.curve("target")
        draft_curve = self.costs.curve("draft") if self.costs.by_role["draft"].by_k else (
            lambda rows: 0.2 * target(1) * rows)
        gammas = batch_gamma.assign(demands, target, draft_curve)
        for job, gamma in zip(jobs, gammas, strict=True):
            policy = getattr(job.run, "policy", None)
            if isinstance(policy, batch_gamma.SteeredGamma):
                policy.assigned = gamma  # 0: this step the request decodes plainly (a heavy load)

    def _turn(self, job) -> None:
        """A job's turn, in its worker's greenlet: read its prompt (first turn) or one round."""
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
        """Calls of cancelled jobs (a prompt being read) end with Cancelled, so their threads finish."""
        for call in list(self.exchange.open):
            if call.slot.cancelled is not None and call.slot.cancelled.is_set():
                self.exchange.answer(call, error=Cancelled())

    def _drop(self, job) -> None:
        """Forget a finished or cancelled job and the state it held."""
        with self._cond:
            if job in self._active:
                self._active.remove(job)
            self._cond.notify_all()
        if job.cancelled.is_set() and not job.finished:
            self.metrics.errors.labels(kind="client_disconnected").inc()
        job.finished = True
        job.worker.stop()
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
            if getattr(job, "worker", None) is not None:
                job.worker.stop()


def demand(run) -> batch_gamma.Demand:
    """What ``run`` brings to the next step: a steered γ to choose, or its own (a plain run: 0)."""
    remaining = max(run.max_new_tokens - len(run.new_tokens) - 1, 0)
    policy = getattr(run, "policy", None)
    drafter = getattr(run, "drafter", None)
    if getattr(run, "first_token_alone", False) and not run.draft_begun:  # its first token: the target alone
        return batch_gamma.Demand(0.0, 0, False, chosen=0)
    if isinstance(policy, batch_gamma.SteeredGamma):
        return batch_gamma.Demand(policy.alpha, max(min(policy.max_gamma, remaining), 1),
                                  isinstance(drafter, ModelDrafter))
    own = 0 if policy is None else int(getattr(policy, "gamma", 1))
    return batch_gamma.Demand(0.0, own, isinstance(drafter, ModelDrafter), chosen=min(own, remaining))
