"""Requests' model calls gathered into shared calls: one weight read for the rows of every request.

Terms:

- a *slot* (:class:`Slot`) is one request's view of a shared model: the LanguageModel protocol
  (``prefill``, ``score``, ``trim``, ``length``) over that request's own state (its KV cache). A slot
  computes nothing: each verb becomes a *call* handed to the engine, and the request's turn waits for
  the answer. So the decode loop (``decode.SpeculativeRun``, the drafters) runs unchanged, each request's
  turn a greenlet on the engine's thread (a :class:`Worker`), and never knows it shares the models;
- the *exchange* (:class:`Exchange`) holds the open calls. Once every turn of a step waits on a call
  (:meth:`Exchange.settled`), the engine answers a group of them at once: every
  ``score`` call on the draft model in one ``score_many``, then every ``score`` call on the target in
  one (a whole engine step's verification: Σ(γ_i + 1) rows, one read of the weights), and a chunk of
  a prompt being read between them (``engine``).

Exactness: a model's rows are computed each by itself (``models/native.py``), so a request's logits are
bit for bit what it would get alone, whoever shares the call; each request keeps its own generator,
and its own calls come in its own order. Only *when* its calls are answered changes.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import greenlet

from ...models.base import check_trim

_arrivals = itertools.count()


class Cancelled(Exception):
    """The answer to a call of a request that was cancelled (its client left, or the server stops)."""


@dataclass(eq=False)
class Call:
    slot: Slot
    kind: str  # "prefill", "score" or "trim"
    tokens: list[int] = field(default_factory=list)
    length: int = 0  # trim's target length
    order: int = field(default_factory=lambda: next(_arrivals))
    progress: int = 0  # prefill: tokens of the prompt read so far (a long prompt is read in chunks)
    answered: bool = False
    result: object = None
    error: BaseException | None = None
    task: object = None  # the greenlet of the turn that made the call


class Exchange:
    """The open calls of the requests' turns. Every turn runs as a greenlet on the engine's own thread
    (:class:`Worker`), so the models, the kernels' thread pools and torch see one thread, as in plain
    decoding (a second OS thread calling OpenMP kernels halves their speed on a 2-core machine)."""

    def __init__(self) -> None:
        self.open: list[Call] = []
        self.hub: greenlet.greenlet | None = None  # the engine thread's own greenlet, set when it starts

    def call(self, call: Call):
        """A turn's call: post it and give the engine back its thread until the answer comes."""
        call.task = greenlet.getcurrent()
        self.open.append(call)
        return self.hub.switch()

    def answer(self, call: Call, result=None, error: BaseException | None = None) -> None:
        """The engine's answer: the turn that made ``call`` resumes, up to its next call or its end."""
        call.result, call.error, call.answered = result, error, True
        self.open.remove(call)
        if error is not None:
            call.task.throw(error)
        else:
            call.task.switch(result)

    def settled(self) -> list[Call]:
        """The open calls, oldest first (every turn not finished waits on one)."""
        return sorted(self.open, key=lambda c: c.order)


class Slot:
    """One request's view of a shared ``model``; ``role`` is "target" or "draft"."""

    def __init__(self, model, exchange: Exchange, role: str) -> None:
        self.model, self.exchange, self.role = model, exchange, role
        self.vocab_size, self.max_length, self.device = model.vocab_size, model.max_length, model.device
        self.name = str(getattr(model, "name", type(model).__name__))
        self.state = None  # the model's state of this request (``model.state()``), set by the engine
        self.cancelled: threading.Event | None = None  # the request's: set, its next call raises Cancelled
        self.last_reused = 0  # prompt tokens the last prefill took from the prefix cache
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    def prefill(self, tokens: Sequence[int]) -> None:
        self._call(Call(self, "prefill", tokens=[int(t) for t in tokens]))

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
    """A pair as one request sees it: slots of the shared target and draft, the rest of the pair as it is."""

    def __init__(self, pair, exchange: Exchange) -> None:
        self.pair = pair
        self.target = Slot(pair.target, exchange, "target")
        self.draft = Slot(pair.draft, exchange, "draft") if pair.draft is not None else None
        self.eos_token_ids = pair.eos_token_ids

    def bind(self, cancelled: threading.Event) -> None:
        """Tie the slots to their request: once ``cancelled`` is set, its calls raise Cancelled."""
        for slot in self.slots:
            slot.cancelled = cancelled

    @property
    def slots(self) -> list[Slot]:
        return [s for s in (self.target, self.draft) if s is not None]

    def __getattr__(self, name):  # encode, decode, tokenizer, ...: the shared pair's
        return getattr(self.pair, name)


class Worker:
    """The turns of one request: ``go()`` runs ``turn()`` as a greenlet on the engine thread, up to its
    first call (or its end); the engine's answers resume it (``Exchange.answer``)."""

    def __init__(self, exchange: Exchange, turn: Callable[[], None], name: str = "specdec-request") -> None:
        self.exchange, self.turn, self.name = exchange, turn, name
        self._task: greenlet.greenlet | None = None

    @property
    def running(self) -> bool:
        """In a turn: waiting on a call (a turn never holds the thread between calls)."""
        return self._task is not None and not self._task.dead

    def go(self) -> None:
        self._task = greenlet.greenlet(self.turn, parent=self.exchange.hub)
        self._task.switch()

    def stop(self) -> None:
        """End a turn still waiting on a call (it unwinds with GreenletExit)."""
        if self.running:
            self._task.throw(greenlet.GreenletExit)
