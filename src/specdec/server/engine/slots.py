"""A job's view of the shared models, and the exchange where its calls wait for the engine's answers.

Terms (``plan`` defines the engine's words):

- a *slot* (:class:`Slot`) is one job's view of a shared model: the LanguageModel protocol (``prefill``,
  ``score``, ``trim``, ``length``) over that job's own state (its KV cache, ``state``). A slot computes
  nothing: each verb becomes a :class:`Call` posted to the exchange, and the job's greenlet waits for the
  answer. So the decode loop (``decode.SpeculativeRun``, the drafters) runs unchanged and never knows it
  shares the models;
- the *exchange* (:class:`Exchange`) runs each job's work as a greenlet on the engine's own thread
  (:meth:`Exchange.spawn`), up to its next call, and holds the open calls until the engine answers them
  (``plan.next_batch`` chooses which, ``calls`` answers them). The models, the kernels' thread pools and torch
  see one thread, as in plain decoding (a second OS thread calling OpenMP kernels halves their speed on a
  2-core machine).

Exactness: a model's rows are computed each by itself (``models/native.py``), so a job's logits are bit for
bit what it would get alone, whoever shares the call; each job keeps its own generator, and its own calls come
in its own order. Only *when* its calls are answered changes.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import greenlet

from ...models.base import NO_ABILITIES, check_trim

_arrivals = itertools.count()


class Cancelled(Exception):
    """The answer to a call of a job that was cancelled (its client left, or the server stops)."""


@dataclass(eq=False)
class Call:
    slot: Slot
    kind: str  # "prefill", "score" or "trim"
    tokens: list[int] = field(default_factory=list)
    length: int = 0  # trim's target length
    order: int = field(default_factory=lambda: next(_arrivals))
    progress: int = 0  # prefill: tokens of the prompt read so far (a long prompt is read in chunks)
    reused: int = 0  # prefill: tokens of the prompt taken from the prefix cache (its answer)
    task: greenlet.greenlet | None = None  # the greenlet of the job that made the call


class Exchange:
    """The jobs' greenlets and their open calls, on the engine's thread."""

    def __init__(self) -> None:
        self.open: list[Call] = []
        self.hub: greenlet.greenlet | None = None  # the engine thread's own greenlet, set when it starts

    def spawn(self, work: Callable[[], None]) -> greenlet.greenlet:
        """Run ``work`` as a greenlet up to its first call (or its end); the engine's answers resume it."""
        task = greenlet.greenlet(work, parent=self.hub)
        task.switch()
        return task

    @staticmethod
    def stop(task: greenlet.greenlet | None) -> None:
        """End a greenlet still waiting on a call (it unwinds with GreenletExit)."""
        if task is not None and not task.dead:
            task.throw(greenlet.GreenletExit)

    def call(self, call: Call):
        """A job's call: post it and give the engine back its thread until the answer comes."""
        call.task = greenlet.getcurrent()
        self.open.append(call)
        return self.hub.switch()

    def answer(self, call: Call, result=None, error: BaseException | None = None) -> None:
        """The engine's answer: the job that made ``call`` resumes, up to its next call or its end."""
        self.open.remove(call)
        if error is not None:
            call.task.throw(error)
        else:
            call.task.switch(result)

    def settled(self) -> list[Call]:
        """The open calls, oldest first (every job not finished waits on one)."""
        return sorted(self.open, key=lambda c: c.order)


class Slot:
    """One job's view of a shared ``model``; ``role`` is "target" or "draft". Only the three verbs: the engine,
    not the job, uses the model's own abilities. ``length`` and ``state`` are the engine's to keep."""

    abilities = NO_ABILITIES

    def __init__(self, model, exchange: Exchange, role: str) -> None:
        self.model, self.exchange, self.role = model, exchange, role
        self.vocab_size, self.max_length, self.device = model.vocab_size, model.max_length, model.device
        self.name = str(getattr(model, "name", type(model).__name__))  # as ModelDrafter names a model
        self.job: int | None = None  # the id of the job it serves (``SlotPair.bind``)
        self.state = None  # the model's state of this job (``model.state()``), set by the engine
        self.cancelled: threading.Event | None = None  # the job's: set, its next call raises Cancelled
        self.length = 0  # tokens in the job's cache, as the engine answered its calls

    def prefill(self, tokens: Sequence[int]) -> int:
        return self._call(Call(self, "prefill", tokens=[int(t) for t in tokens]))

    def score(self, tokens: Sequence[int]):  # → [len(tokens), vocab] logits
        return self._call(Call(self, "score", tokens=[int(t) for t in tokens]))

    def trim(self, length: int) -> None:
        check_trim(self, length)
        self._call(Call(self, "trim", length=length))

    def _call(self, call: Call):
        if self.cancelled is not None and self.cancelled.is_set():
            raise Cancelled
        return self.exchange.call(call)


class SlotPair:
    """A pair as one job sees it: slots of the shared target and draft, the pair's stop tokens and its tokenizer
    (a grammar's matcher reads it; None for a pair without one, the toy pair's)."""

    def __init__(self, pair, exchange: Exchange) -> None:
        self.target = Slot(pair.target, exchange, "target")
        self.draft = Slot(pair.draft, exchange, "draft") if pair.draft is not None else None
        self.eos_token_ids = pair.eos_token_ids
        self.tokenizer = getattr(pair, "tokenizer", None)

    def bind(self, job: int, cancelled: threading.Event) -> None:
        """Tie the slots to their job: its id, and once ``cancelled`` is set, its calls raise Cancelled."""
        for slot in self.slots:
            slot.job, slot.cancelled = job, cancelled

    @property
    def slots(self) -> list[Slot]:
        return [s for s in (self.target, self.draft) if s is not None]
