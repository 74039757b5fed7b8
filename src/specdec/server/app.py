"""The OpenAI-compatible ASGI app: routes, the models' loading, and each request's way through the engine.

Terms: the app *serves* a pair once it is *loaded* (``/health`` answers 503 before, 200 after); a
request is *prepared* on the event loop (every check, no model touched), then *submitted* to the
engine, whose events the handler turns into one JSON answer or a stream of server-sent events.
A handler whose client has gone cancels its job, which the engine drops at its next call; so does
a stream whose client stops reading (its events would pile up: at most ``max_stream_events`` wait).
Every request first passes the guard (``guard``: Host, Origin, CORS, API key), then the body limits.

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /health``, ``GET /metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from ..drafters.history_table import HistoryTable
from ..drafters.model import DEFAULT_CALL_DRAFT_WINDOW
from ..session import RunSettings, prefix_cache_of
from . import errors
from .engine import Delta, Engine, Failed, Finished, Job, QueueFull, ShuttingDown
from .errors import ApiError, error_body
from .guard import TENANT, Guard, GuardSettings
from .metrics import Metrics
from .prepare import prepare
from .responses import DONE, Shaper, sse
from .schema import ChatRequest, CompletionRequest
from .text import Texts, TextTracker
from .tools import tool_plan

POLL_SECONDS = 0.25  # how often a non-streamed request checks that its client is still there


@dataclass
class ServeConfig:
    model_names: tuple[str, ...] = ("specdec",)  # what /v1/models lists and requests may name
    defaults: RunSettings = field(default_factory=RunSettings)  # for fields a request leaves out
    max_active: int = 8  # requests generating at once (one round each per engine step)
    max_waiting: int = 16  # requests queued beyond those; one more is answered 429
    max_body_bytes: int = 1_000_000
    retry_after_seconds: int = 1
    grace_seconds: float = 5.0  # on shutdown, how long open requests may still finish
    body_timeout_seconds: float = 10.0  # a request body not in full by then is answered 408
    max_stream_events: int = 256  # events a stream's reader may leave unread before its job is cancelled
    guard: GuardSettings = field(default_factory=GuardSettings)  # who may ask (Host, Origin, API key)
    log_steps: bool = False  # print each engine step's plan to stderr (``engine.plan.StepPlan.line``)
    history_tokens: int = 0  # the history table's budget: earlier requests' texts kept, in tokens (0: no table)
    history_file: str | None = None  # the table is read from here at start (if it exists) and written at stop
    call_draft_window: int | None = DEFAULT_CALL_DRAFT_WINDOW  # prompt tokens a draft model reads when the reply
    # must be tool calls (tool_choice required or named; never more than defaults.draft_window; None: that one)


class ServerState:
    """What the routes share: configuration, metrics, and once loaded the pair and its engine."""

    def __init__(self, config: ServeConfig) -> None:
        self.config, self.metrics = config, Metrics()
        self.pair = self.texts = self.engine = None
        self.history: HistoryTable | None = None  # earlier requests' texts, per tenant (``history`` drafts)
        self.load_error: str | None = None

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def attach(self, pair) -> None:
        self.history = open_history(self.config, pair.target.vocab_size)
        self.texts = Texts(pair)
        on_step = (lambda plan: print(plan.line(), file=sys.stderr, flush=True)) if self.config.log_steps else None
        self.engine = Engine(pair, self.metrics, max_active=self.config.max_active,
                             max_waiting=self.config.max_waiting, on_step=on_step).start()
        self.pair = pair

    def load_in_background(self, load: Callable[[], object]) -> threading.Thread:
        def work():
            try:
                self.attach(load())
            except Exception as err:  # shown by /health and every request's 503
                self.load_error = f"{type(err).__name__}: {err}"

        thread = threading.Thread(target=work, name="specdec-load", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close(self.config.grace_seconds)
        if self.history is not None and self.config.history_file is not None:
            self.history.save(self.config.history_file)


def open_history(config: ServeConfig, vocab_size: int) -> HistoryTable | None:
    """The server's history table: ``config.history_file``'s when it exists, else an empty one; None when
    ``history_tokens`` is 0. A bad file is a ``HistoryFileError`` naming it."""
    if config.history_tokens <= 0:
        return None
    path = config.history_file
    if path is not None and os.path.exists(path):
        return HistoryTable.load(path, vocab_size=vocab_size, budget=config.history_tokens)
    return HistoryTable(vocab_size, config.history_tokens)


def create_app(config: ServeConfig | None = None, *, pair=None, load: Callable[[], object] | None = None) -> FastAPI:
    """The app serving ``pair``, or the pair ``load()`` returns (loaded on a thread at start-up)."""
    state = ServerState(config or ServeConfig())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if pair is not None:
            state.attach(pair)
        elif load is not None:
            state.load_in_background(load)
        yield
        await asyncio.to_thread(state.close)

    app = FastAPI(title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.specdec = state
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(HTTPException, errors.on_http_error)
    app.add_exception_handler(Exception, _on_unexpected_error)
    app.add_middleware(errors.BodyLimit, limit=state.config.max_body_bytes, timeout=state.config.body_timeout_seconds)
    app.add_middleware(Guard, settings=state.config.guard)  # added last: runs first
    add_routes(app, state)
    return app


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    response = await errors.on_validation_error(request, exc)
    request.app.state.specdec.metrics.errors.labels(kind="invalid_request").inc()
    return response


async def _on_api_error(request: Request, exc: ApiError) -> JSONResponse:
    request.app.state.specdec.metrics.errors.labels(kind=exc.code or exc.type).inc()
    return exc.response()


async def _on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """A bug, not the user's mistake: 500, still in the OpenAI shape."""
    request.app.state.specdec.metrics.errors.labels(kind="server_error").inc()
    return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"), status_code=500)


def add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health():
        if state.ready:
            return {"status": "ok"}
        why = f"loading the models failed: {state.load_error}" if state.load_error else "the models are loading"
        return JSONResponse(error_body(why, "service_unavailable", None, "loading") | {"status": "loading"},
                            status_code=503)

    @app.get("/metrics")
    async def metrics():
        if state.engine is not None:
            active, waiting = state.engine.queue
            state.metrics.running.set(active)
            state.metrics.waiting.set(waiting)
            state.metrics.sample_prefix_cache(prefix_cache_of(state.pair))
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "specdec"}
                                           for name in state.config.model_names]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        return await complete(state, request, body, "chat")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await complete(state, request, body, "text")


async def complete(state: ServerState, request: Request, body, kind: str):
    """Prepare, submit, then answer: one JSON object, or an event stream when ``body.stream``."""
    state.metrics.requests.labels(endpoint=request.url.path).inc()
    if not state.ready:
        why = f"loading the models failed: {state.load_error}" if state.load_error else "the models are loading"
        raise ApiError(503, why, type="service_unavailable", code="loading",
                       headers={"Retry-After": str(state.config.retry_after_seconds)})
    # Off the event loop: tokenizing a long prompt takes a while (no model is touched here).
    history = None if state.history is None else state.history.view(request.scope.get(TENANT, ""))
    run = await run_in_threadpool(prepare, body, state.engine.slot_pair(), state.texts, state.config.defaults,
                                  state.config.model_names, history, state.config.call_draft_window)
    events: asyncio.Queue = asyncio.Queue()
    job = Job(run, TextTracker(state.texts, body.stop_strings()), post=lambda event: None)
    job.post = poster(asyncio.get_running_loop(), events, job, state)
    try:
        state.engine.submit(job)
    except QueueFull as err:
        raise ApiError(429, str(err), type="rate_limit_error", code="queue_full",
                       headers={"Retry-After": str(state.config.retry_after_seconds)}) from None
    except ShuttingDown as err:
        raise ApiError(503, str(err), type="service_unavailable", code="shutting_down") from None
    model = body.model or state.config.model_names[0]
    shaper = Shaper(kind, model, tools=tool_plan(body, state.texts, model),  # prepare checked it: no error here
                    logprobs=run.logprobs)
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(stream(job, events, shaper, usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await answer(job, events, shaper, request)


def poster(loop: asyncio.AbstractEventLoop, events: asyncio.Queue, job: Job, state: ServerState
           ) -> Callable[[object], None]:
    """A thread-safe ``post(event)`` onto ``events``; a no-op once the loop is closed. When the reader
    leaves ``max_stream_events`` unread (a client that stopped reading but keeps its connection), the
    job is cancelled, counted as a slow client, and its reader gets an error event in place of the rest."""
    limit, overflowed = state.config.max_stream_events, False

    def put(event) -> None:
        nonlocal overflowed
        if overflowed:
            return
        if events.qsize() >= limit:
            overflowed = True
            job.cancelled.set()
            state.metrics.errors.labels(kind="slow_client").inc()
            event = Failed(503, f"the client left {limit} events unread: this request was ended",
                           "service_unavailable", "slow_client")
        events.put_nowait(event)

    def post(event) -> None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(put, event)

    return post


async def answer(job: Job, events: asyncio.Queue, shaper: Shaper, request: Request):
    """Wait for the whole completion (checking that the client is still there) and return it."""
    try:
        return await collect(job, events, shaper, request)
    finally:
        if not job.finished:  # the client left, or the server is stopping: free the job's place
            job.cancelled.set()


async def collect(job: Job, events: asyncio.Queue, shaper: Shaper, request: Request):
    text, entries, checked = [], [], asyncio.get_running_loop().time()
    while True:
        try:
            event = await asyncio.wait_for(events.get(), POLL_SECONDS)
        except asyncio.TimeoutError:
            event = None
        if asyncio.get_running_loop().time() - checked >= POLL_SECONDS:
            checked = asyncio.get_running_loop().time()
            if await request.is_disconnected():
                job.cancelled.set()
                return Response(status_code=499)
        if isinstance(event, Delta):
            text.append(event.text)
            entries += event.logprobs
        elif isinstance(event, Finished):
            return JSONResponse(shaper.completion("".join(text), event.reason, event.usage, event.figures,
                                                  entries + list(event.logprobs)))
        elif isinstance(event, Failed):
            return JSONResponse(error_body(event.message, event.type, None, event.code), status_code=event.status)


async def stream(job: Job, events: asyncio.Queue, shaper: Shaper, include_usage: bool):
    """The server-sent events of one completion, ending in ``data: [DONE]``; leaving early (the
    client hung up) cancels the job."""
    try:
        if shaper.kind == "chat":
            yield sse(shaper.chunk(None, role=True, usage_field=include_usage))
        while True:
            event = await events.get()
            if isinstance(event, Delta):
                for chunk in shaper.delta_chunks(event.text, usage_field=include_usage, entries=event.logprobs):
                    yield sse(chunk)
            elif isinstance(event, Finished):
                for chunk in shaper.delta_chunks("", usage_field=include_usage, final=True, entries=event.logprobs):
                    yield sse(chunk)
                rest = shaper.take_pending()
                yield sse(shaper.chunk(None, shaper.finish_reason(event.reason), usage_field=include_usage,
                                       figures=event.figures, entries=rest or None))
                if include_usage:
                    yield sse(shaper.usage_chunk(event.usage))
                break
            elif isinstance(event, Failed):
                yield sse(error_body(event.message, event.type, None, event.code))
                break
        yield DONE
    finally:
        if not job.finished:
            job.cancelled.set()
