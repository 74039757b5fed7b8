"""The live view: one request of the OpenAI routes' own shape, run as jobs on a server engine, streamed as events.

Terms:

- the *live body* is what ``POST /v1/completions`` takes (``prompt``, ``max_tokens``, ``temperature``,
  ``seed``, ``stop``, ``speculative: {draft, gamma}``, ...) or, with ``messages``, what ``POST
  /v1/chat/completions`` takes, plus ``compare`` (decode it plainly too, afterwards). It is checked by
  the same pydantic models and ``server.prepare.prepare`` as those routes: one validation, one
  refusal for one fault (an ``ApiError``), and no value of it is ever used as a path.
- the *backend* is a ``server.app.ServerState`` (pair, texts, engine, request defaults): in ``specdec
  serve`` the server's own, so live readers share its steps with the API's requests; in
  ``specdec explore`` one of the explorer's own, attached on first use to the pair ``factory()`` loads.
- a *live stream* is a speculative job and, with ``compare``, a plain one after it
  (``server.engine.runs.PlainSequenceRun``); each round's pieces, tagged by origin (accepted / recovered /
  bonus; target for plain decoding), and the running figures come from the job's round hook
  (:class:`Pieces`). A reader who leaves cancels the job, which the engine drops at its next call.

Events: ``status`` (loading the pair), per mode ``start``, ``round``…, ``done``; then ``end``, or
``error`` (once the stream has begun, a refusal or a failure comes as this event).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from pydantic import StrictBool, ValidationError

from ..sampling import SamplingParams
from ..server.app import ServeConfig, ServerState, poster
from ..server.engine import Failed, Finished, Job, QueueFull, ShuttingDown
from ..server.engine.runs import PlainSequenceRun, SequenceRun
from ..server.errors import ApiError, describe_validation
from ..server.prepare import prepare
from ..server.schema import ChatRequest, CompletionRequest
from ..server.text import TextTracker
from ..session import RunSettings, load_settings
from ..session import load as load_warm

# The explorer's own request defaults, for fields a live body leaves out (the page sends them all).
LIVE_DEFAULTS = RunSettings(gamma=4, max_new_tokens=64, sampling=SamplingParams(temperature=1.0), seed=None)


class LiveChat(ChatRequest):
    compare: StrictBool = False


class LiveCompletion(CompletionRequest):
    compare: StrictBool = False


def parse_body(data: dict) -> LiveChat | LiveCompletion:
    """The live body, checked by the OpenAI routes' models (``messages`` → chat); an ApiError (400)
    worded as those routes word it."""
    model = LiveChat if "messages" in data else LiveCompletion
    try:
        return model.model_validate(data)
    except ValidationError as err:
        message, param, code = describe_validation(list(err.errors()))
        raise ApiError(400, message, param=param, code=code) from None


@dataclass(frozen=True)
class Round:
    """A live job's event: one round's pieces and the running figures."""

    payload: dict


class Pieces:
    """A job's round hook (on the engine's thread): the round's new tokens decoded to text pieces,
    tagged by origin, and the figures so far, posted as a :class:`Round`."""

    def __init__(self, mode: str, run: SequenceRun | PlainSequenceRun, texts, post: Callable[[object], None]) -> None:
        self.mode, self.run, self.texts, self.post = mode, run, texts, post
        self.shown = ""
        self.figures: dict = {}

    def __call__(self, record, kept: list[int]) -> None:
        if self.mode == "plain":
            kinds = ["target"] * len(kept)
        else:
            kinds = (["accepted"] * record.n_accepted + [record.kind])[: len(kept)]
        new = self.run.new_tokens
        before, pieces = len(new) - len(kept), []
        for i, kind in enumerate(kinds):
            text = self.texts.decode(new[: before + i + 1])
            if text.endswith("\ufffd"):  # half of a multi-byte character: the next token shows it
                pieces.append({"text": "", "kind": kind})
                continue
            pieces.append({"text": text[len(self.shown):], "kind": kind})
            self.shown = text
        self.figures = self.stats()
        self.post(Round({"mode": self.mode, "pieces": pieces, **self.figures}))

    def stats(self) -> dict:
        """The run's figures (``GenerationStats.figures``) and the names the panels show them by
        (``tokens``, ``tokens_per_call``); ``seconds`` is the time its own prompt read and rounds took
        (not the turns of other requests in between), so tokens/s compare fairly under load."""
        figures = self.run.stats().figures(drafting=self.mode != "plain")
        return figures | {"tokens": figures["new_tokens"], "tokens_per_call": figures["tokens_per_target_call"]}


@dataclass(frozen=True)
class Start:
    """A checked live body, and its prepared run once the backend is loaded (None: load in the stream)."""

    body: LiveChat | LiveCompletion
    run: SequenceRun | None


@dataclass(eq=False)
class Reader:
    """One live stream, for the counts: over once it is closed and its job has left the engine."""

    job: Job | None = None
    closed: bool = False

    @property
    def over(self) -> bool:
        return self.closed and (self.job is None or self.job.finished)


def toy_factory():
    from ..models.toy import ToyPair

    return ToyPair()


def real_factory(target: str | None = None, draft: str | None = None, *, device: str = "cpu",
                 dtype: str | None = None, dequantize: bool = False) -> Callable[[], object]:
    """A factory loading the real pair when first called (``session.load``, as the CLI's run does: warmed
    up so timings are fair; ``draft`` a --draft value, no draft model loaded for lookup or n-gram)."""
    settings = load_settings(draft, target=target, device=device, dtype=dtype or "auto",
                             dequantize=dequantize)  # checked now

    def load():
        return load_warm(settings)

    return load


class LiveView:
    """The live view on a backend: ``state`` (the server's, in ``specdec serve``), or one of its own
    whose pair ``factory()`` builds on first use (``specdec explore``), with ``defaults``."""

    def __init__(self, factory: Callable[[], object] | None = toy_factory, label: str = "the toy pair", *,
                 state: ServerState | None = None, defaults: RunSettings = LIVE_DEFAULTS) -> None:
        if (factory is None) == (state is None):
            raise ValueError("a live view needs a pair factory or a server's state, one of the two")
        self.factory, self.label = factory, label
        self.own = state is None  # the explorer's own engine (closed with it)
        self.state = state or ServerState(ServeConfig(model_names=("specdec",), defaults=defaults, grace_seconds=0.0))
        self.slow_load = factory is not None and factory is not toy_factory  # loading is worth a word
        self._load_lock, self._count_lock = threading.Lock(), threading.Lock()
        self._readers: list[Reader] = []
        self._finished = 0

    @property
    def loaded(self) -> bool:
        return self.state.ready

    @property
    def toy(self) -> bool:
        if self.own:
            return self.factory is toy_factory
        from ..models.toy import ToyPair

        return isinstance(self.state.pair, ToyPair)

    def info(self) -> dict:
        return {"label": self.label, "loaded": self.loaded, "toy": self.toy}

    def _count(self) -> tuple[int, int]:
        with self._count_lock:
            over = [r for r in self._readers if r.over]
            self._finished += len(over)
            self._readers = [r for r in self._readers if not r.over]
            return len(self._readers), self._finished

    @property
    def active(self) -> int:
        """Live streams open now (a stream whose reader left counts until its job has left the engine)."""
        return self._count()[0]

    @property
    def finished(self) -> int:
        return self._count()[1]

    def load(self) -> ServerState:
        """The backend, ready: the explorer's own pair is loaded now if not yet (a failure is raised,
        and the next request tries again); the server's answers 503 while it loads."""
        if not self.own:
            if not self.state.ready:
                why = self.state.load_error or "the models are loading"
                raise ApiError(503, f"the live view runs on the server's models: {why}", type="service_unavailable",
                               code="loading", headers={"Retry-After": str(self.state.config.retry_after_seconds)})
            return self.state
        with self._load_lock:
            if not self.state.ready:
                self.state.attach(self.factory())
        return self.state

    def prepare(self, body: LiveChat | LiveCompletion) -> SequenceRun:
        state = self.load()
        return prepare(body, state.engine.slot_pair(), state.texts, state.config.defaults, state.config.model_names)

    def begin(self, data: dict) -> Start:
        """Check a live body (and prepare its run, unless the pair is still to load, which the stream
        then does, saying so first). Blocking: call it off the event loop."""
        body = parse_body(data)
        if self.slow_load and not self.loaded:
            return Start(body, None)
        return Start(body, self.prepare(body))

    async def events(self, start: Start) -> AsyncIterator[tuple[str, dict]]:
        """The stream's events as (name, data); leaving early (the reader hung up) cancels its job."""
        reader = Reader()
        with self._count_lock:
            self._readers.append(reader)
        try:
            run = start.run
            if run is None:
                yield "status", {"message": f"loading {self.label} (the first time takes a while) …"}
                try:
                    run = await asyncio.to_thread(self.prepare, start.body)
                except ApiError as err:
                    yield "error", {"message": err.message}
                    return
                except Exception as err:  # the pair did not load
                    message = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
                    yield "error", {"message": message}
                    return
            ids = list(run.sequence[: run.prompt_length])
            for mode in ("speculative", "plain") if start.body.compare else ("speculative",):
                if mode == "plain":
                    run = PlainSequenceRun(self.state.engine.slot_pair(), ids, run.settings)
                yield "start", {"mode": mode, "prompt_tokens": len(ids), "gamma": run.settings.gamma,
                                "draft": run.settings.draft}
                async for event in self._job(reader, mode, run, start.body):
                    yield event
                    if event[0] == "error":
                        return
            yield "end", {}
        finally:
            if reader.job is not None and not reader.job.finished:
                reader.job.cancelled.set()
            reader.closed = True

    async def _job(self, reader: Reader, mode: str, run, body) -> AsyncIterator[tuple[str, dict]]:
        state, events = self.state, asyncio.Queue()
        job = Job(run, TextTracker(state.texts, body.stop_strings()), post=lambda event: None)
        job.post = poster(asyncio.get_running_loop(), events, job, state)
        job.on_round = pieces = Pieces(mode, run, state.texts, job.post)
        try:
            state.engine.submit(job)
        except (QueueFull, ShuttingDown) as err:
            yield "error", {"message": str(err)}
            return
        reader.job = job
        while True:
            event = await events.get()
            if isinstance(event, Round):
                yield "round", event.payload
            elif isinstance(event, Finished):
                extra = {"drafter": event.figures["drafter"], "gamma_chosen": list(getattr(run.policy, "chosen", ()))
                         } if mode == "speculative" else {}
                yield "done", {"mode": mode, "text": job.tracker.text, "finish_reason": event.reason,
                               **pieces.figures, **extra}
                return
            elif isinstance(event, Failed):
                yield "error", {"message": event.message}
                return

    def close(self) -> None:
        """Shutting down: the explorer's own engine ends its jobs (their streams get an error event);
        the server's engine is the server's to close."""
        if self.own:
            self.state.close()
