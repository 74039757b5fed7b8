"""Requests' model calls gathered into shared calls: one weight read for the rows of every request.

Terms:

- a *slot* (:class:`Slot`) is one request's view of a shared model: the LanguageModel protocol
  (``prefill``, ``score``, ``trim``, ``length``) over that request's own state (its KV cache). A slot
  computes nothing: each verb becomes a *call* handed to the engine thread, and the request's thread
  waits for the answer. So the decode loop (``decode.SpeculativeRun``, the drafters) runs unchanged,
  one thread per request (a :class:`Worker`), and never knows it shares the models;
- the *exchange* (:class:`Exchange`) holds the open calls. The engine thread waits until every busy
  worker waits on a call (:meth:`Exchange.settled`), then answers a group of them at once: every
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

from ..models.base import check_trim

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


class Exchange:
    """The open calls of the requests' threads, and how many of those threads are busy."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.open: list[Call] = []
        self.busy = 0  # workers running a turn: computing, or waiting on one open call

    def call(self, call: Call):
        """A worker's call: post it, wait for the engine's answer, return it (or raise its error)."""
        with self.cond:
            self.open.append(call)
            self.cond.notify_all()
            self.cond.wait_for(lambda: call.answered)
        if call.error is not None:
            raise call.error
        return call.result

    def answer(self, call: Call, result=None, error: BaseException | None = None) -> None:
        with self.cond:
            call.result, call.error, call.answered = result, error, True
            self.open.remove(call)
            self.cond.notify_all()

    def settled(self) -> list[Call]:
        """Wait until every busy worker waits on a call (or none is busy); the open calls, oldest first."""
        with self.cond:
            self.cond.wait_for(lambda: len(self.open) >= self.busy)
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
    """The thread of one request: runs ``turn()`` each time the engine says ``go()``."""

    def __init__(self, exchange: Exchange, turn: Callable[[], None], name: str = "specdec-request") -> None:
        self.exchange, self.turn = exchange, turn
        self.running = False
        self._go = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def go(self) -> None:
        with self.exchange.cond:
            self.exchange.busy += 1
            self.running = True
        self._go.set()

    def stop(self) -> None:
        """End the thread once its turn (if any) is over."""
        self._stopped = True
        self._go.set()

    def _loop(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._stopped:
                return
            try:
                self.turn()
            finally:
                with self.exchange.cond:
                    self.exchange.busy -= 1
                    self.running = False
                    self.exchange.cond.notify_all()
