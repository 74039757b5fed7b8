"""The generation engine: one thread owns the models, and active requests take turns round by round.

Terms:

- a *job* is one request inside the engine: its :class:`SequenceRun`, its text tracker, and the
  event queue its HTTP handler reads (``Delta`` text, then ``Finished`` or ``Failed``);
- *waiting* jobs are queued, *active* ones take turns; a *turn* is one round of one job (its first
  turn also reads its prompt). Before a job's turn the engine restores that job's model state and
  saves the previous owner's (``sequence.capture`` / ``restore``), so every job sees only its own
  caches. A long generation therefore delays a short one by at most one round per turn.
- the queue is *bounded*: ``submit`` refuses a job (:class:`QueueFull`, answered 429) when
  ``max_active + max_waiting`` jobs are already in; a *cancelled* job (its client left) is dropped
  at its next turn and its state freed.

A pair whose models cannot save their state (llama.cpp) is served one job at a time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .metrics import Metrics
from .sequence import SequenceRun, can_switch, capture, restore
from .text import TextTracker


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop" (EOS or a stop string) or "length"
    usage: dict
    figures: dict


@dataclass(frozen=True)
class Failed:
    status: int
    message: str
    type: str = "server_error"
    code: str | None = None


class QueueFull(Exception):
    """The engine holds as many jobs as it may; the client should retry later."""


class ShuttingDown(Exception):
    """The engine takes no new jobs: the server is stopping."""


@dataclass(eq=False)
class Job:
    run: SequenceRun
    tracker: TextTracker
    post: Callable[[object], None]  # hands an event to the request's handler (thread-safe)
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    states: list | None = None  # the models' state of this job while another job holds them
    last_tokens_at: float | None = None
    finished: bool = False

    def advance(self, metrics: Metrics) -> None:
        """One turn: read the prompt first if not yet done, then one round; post what it produced."""
        if not self.run.started:
            self.run.start()
            metrics.prompt_tokens.inc(self.run.prompt_length)
        kept = self.run.step()
        now = time.perf_counter()
        first = self.last_tokens_at is None
        metrics.count_round(self.run.last_record, len(kept))
        metrics.count_latency(first, now - (self.arrived if first else self.last_tokens_at), len(kept))
        self.last_tokens_at = now
        delta, stopped = self.tracker.update(self.run.new_tokens, final=self.run.done)
        if delta:
            self.post(Delta(delta))
        if stopped or self.run.done:
            self.finish("stop" if stopped or self.run.ended_by_eos else "length", metrics)

    def finish(self, reason: str, metrics: Metrics) -> None:
        completion = len(self.run.new_tokens)
        usage = {"prompt_tokens": self.run.prompt_length, "completion_tokens": completion,
                 "total_tokens": self.run.prompt_length + completion}
        metrics.finished.labels(reason=reason).inc()
        self.finished = True
        self.post(Finished(reason, usage, self.run.figures()))

    def fail(self, status: int, message: str, type: str = "server_error", code: str | None = None) -> None:
        self.finished = True
        self.post(Failed(status, message, type, code))


class Engine:
    """Owns the pair's models on one thread; ``submit`` jobs, ``close`` to stop."""

    def __init__(self, pair, metrics: Metrics, *, max_active: int = 8, max_waiting: int = 16) -> None:
        self.models = [m for m in (pair.target, pair.draft) if m is not None]
        self.switchable = can_switch(pair)
        self.max_active = max_active if self.switchable else 1
        self.max_waiting = max_waiting
        self.metrics = metrics
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._active: list[Job] = []
        self._owner: Job | None = None  # the job whose state the models hold now
        self._accepting, self._stopping = True, False
        self._thread = threading.Thread(target=self._work, name="specdec-engine", daemon=True)

    def start(self) -> Engine:
        self._thread.start()
        return self

    @property
    def load(self) -> tuple[int, int]:
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

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._waiting and not self._active:
                    self._cond.wait()
                if self._stopping:
                    break
                while self._waiting and len(self._active) < self.max_active:
                    self._active.append(self._waiting.popleft())
                job = self._next_job()
                self.metrics.running.set(len(self._active))
                self.metrics.waiting.set(len(self._waiting))
            self._take_turn(job)
        self._end_all()

    def _next_job(self) -> Job:
        """Whose round comes next: a request that has not read its prompt yet goes first (so a new
        request waits for at most the round in progress, not a whole turn of the others); the
        others take turns in order, one round each. Called with the lock held."""
        fresh = next((job for job in self._active if not job.run.started), None)
        if fresh is not None:
            return fresh
        job = self._active.pop(0)
        self._active.append(job)
        return job

    def _take_turn(self, job: Job) -> None:
        if not job.cancelled.is_set():
            try:
                self._switch_to(job)
                job.advance(self.metrics)
            except Exception as err:  # a bug or a backend failure: this job ends, the others go on
                self.metrics.errors.labels(kind="server_error").inc()
                job.fail(500, f"generation failed: {type(err).__name__}: {err}")
        if job.finished or job.cancelled.is_set():
            self._drop(job)

    def _switch_to(self, job: Job) -> None:
        if self._owner is job:
            return
        if self._owner is not None:
            self._owner.states = capture(self.models)
        if job.states is not None:
            restore(self.models, job.states)
            job.states = None
        self._owner = job

    def _drop(self, job: Job) -> None:
        """Forget a finished or cancelled job and the state it held."""
        with self._cond:
            if job in self._active:
                self._active.remove(job)
            self._cond.notify_all()
        if job.cancelled.is_set() and not job.finished:
            self.metrics.errors.labels(kind="client_disconnected").inc()
        job.states, job.finished = None, True
        if self._owner is job:
            self._owner = None

    def _end_all(self) -> None:
        with self._cond:
            jobs = list(self._active) + list(self._waiting)
            self._active.clear()
            self._waiting.clear()
        for job in jobs:
            if not job.finished:
                job.fail(503, "the server is shutting down: this request was ended before it finished",
                         type="service_unavailable", code="shutting_down")
            job.states = None
        self._owner = None
