"""A request inside the engine: its run, its text, and the events its HTTP handler reads.

Terms:

- a *job* is one request inside the engine: its id (the engine's step plans name jobs by it), its run
  (``runs.SequenceRun``, or ``PlainSequenceRun``), its text tracker, and the event queue its HTTP handler reads
  (``Delta`` text, then ``Finished`` or ``Failed``; with ``logprobs`` asked, each ``Delta`` carries the entries of
  the tokens whose text it completes and ``Finished`` the rest of the returned text's: ``server.logprobs``); its
  optional *round hook* (``on_round(record, kept)``, as
  ``decode.RoundCallback``) is called after each of its rounds, before that round's ``Delta`` (the explorer's
  live view colours its tokens by origin from it);
- :meth:`Job.advance` reads the prompt (the first time) or runs one round, and posts what it produced. The
  engine (``loop``) runs it, each step, as the job's greenlet on the engine's thread (``slots.Exchange.spawn``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...stats import RoundRecord
from ..logprobs import Entry, LogprobFeed
from ..metrics import Metrics
from ..text import TextTracker
from .runs import SequenceRun


@dataclass(frozen=True)
class Delta:
    text: str
    logprobs: tuple[Entry, ...] = ()  # of the tokens whose text this delta completes (logprobs asked)


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop" (EOS or a stop string) or "length"
    usage: dict
    figures: dict
    logprobs: tuple[Entry, ...] = ()  # of the returned text's tokens no Delta carried


@dataclass(frozen=True)
class Failed:
    status: int
    message: str
    type: str = "server_error"
    code: str | None = None


_ids = itertools.count(1)


@dataclass(eq=False)
class Job:
    run: SequenceRun
    tracker: TextTracker
    post: Callable[[object], None]  # hands an event to the request's handler (thread-safe)
    on_round: Callable[[RoundRecord, list[int]], None] | None = None  # after each round: its record, kept tokens
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    id: int = field(default_factory=lambda: next(_ids))
    task: object = None  # the greenlet running its advance() this step (``slots.Exchange.spawn``), or None
    last_tokens_at: float | None = None
    finished: bool = False
    feed: LogprobFeed | None = None  # its tokens' log-probabilities, when its run was asked for them

    @property
    def busy(self) -> bool:
        """Its greenlet waits on a call (between calls it never holds the thread)."""
        return self.task is not None and not self.task.dead

    def advance(self, metrics: Metrics) -> None:
        """Read the prompt first if not yet done, then one round; post what it produced."""
        if not self.run.started:
            self.run.start()
            metrics.prompt_tokens.inc(self.run.prompt_length)
            metrics.prompt_tokens_reused.inc(self.run.timer.prompt_reused)
        kept = self.run.step()
        now = time.perf_counter()
        first = self.last_tokens_at is None
        metrics.count_round(self.run.last_record, len(kept))
        metrics.count_latency(first, now - (self.arrived if first else self.last_tokens_at), len(kept))
        self.last_tokens_at = now
        if self.on_round is not None:
            self.on_round(self.run.last_record, kept)
        if self.run.logprobs is not None:
            self.feed = self.feed or LogprobFeed(self.tracker.texts, self.run.stop)
            self.feed.add(self.run.last_record.logprobs[: len(kept)])
        delta, stopped = self.tracker.update(self.run.new_tokens, final=self.run.done)
        entries = self.feed.ready(self.run.new_tokens, self.tracker.sent) if self.feed is not None else ()
        if delta or entries:
            self.post(Delta(delta, entries))
        if stopped or self.run.done:
            self.finish("stop" if stopped or self.run.ended_by_eos else "length", metrics)

    def finish(self, reason: str, metrics: Metrics) -> None:
        completion = self.tracker.tokens  # the tokens of the text returned (a stop string cuts the rest)
        usage = {"prompt_tokens": self.run.prompt_length, "completion_tokens": completion,
                 "total_tokens": self.run.prompt_length + completion}
        metrics.finished.labels(reason=reason).inc()
        self.run.record_history()  # before Finished: a client's next request may draft from this text
        self.finished = True
        rest = () if self.feed is None else self.feed.rest(self.run.new_tokens, completion, self.tracker.text)
        self.post(Finished(reason, usage, self.run.figures(), rest))

    def fail(self, status: int, message: str, type: str = "server_error", code: str | None = None) -> None:
        self.finished = True
        self.post(Failed(status, message, type, code))
