"""specdec on Ray Serve: N replicas, each one engine with its own models, threads and prefix cache,
behind one HTTP ingress that routes by prefix affinity and load (the ``ray`` extra).

Terms: a *replica* is one Ray Serve actor running specdec's whole app (:func:`specdec.server.create_app`:
guard, routes, engine, metrics) in process, called over ASGI with each request's method, path, headers
and body; the *ingress* is the deployment Ray's HTTP proxy calls, which forwards every request to one
replica through a deployment handle and relays its answer, streamed or whole. The handle's *router*
picks the replica: ``prefix`` is Ray's ``PrefixCacheAffinityRouter`` (a prefix tree of the prompts
each replica was sent; when the replicas' queues differ by more than ``imbalance`` it falls back to
the power of two choices), ``pow2`` Ray's default (two random replicas, the shorter queue), i.e. routing
that ignores prefixes. The prompt text the router matches is the request's ``prompt``, or its messages'
contents in order (:func:`routing_text`).

Faults: a replica that dies mid-answer ends its streams with an error event and ``data: [DONE]`` (a whole
answer: a 503 with the reason); a request whose replica died before its first byte is sent again to
another (``RETRIES``). Ray restarts dead replicas (``num_replicas`` stays); a replica's health is its
app's ``GET /health`` (Ray's ``check_health``). Each answer names its replica in ``x-specdec-replica``.
"""

# no ``from __future__ import annotations``: Serve's ingress reads the route's annotations (Request) at run time
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from .app import ServeConfig, create_app
from .errors import error_body
from .responses import DONE, sse

ROUTERS = ("prefix", "pow2")
# Ray's PrefixCacheAffinityRouter where it is defined: its public name (ray.serve.llm.request_router) imports
# ray.serve.llm, which needs the ray[llm] extra (pyarrow, vLLM, ...); this module needs only ray[serve]
PREFIX_ROUTER = "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router.PrefixCacheAffinityRouter"
REPLICA_HEADER = "x-specdec-replica"
RETRIES = 3  # tries of a request whose replica failed before answering anything
METHODS = ["GET", "POST", "OPTIONS", "HEAD", "PUT", "DELETE", "PATCH"]


@dataclass(frozen=True)
class ReplicaSettings:
    """What each replica loads and serves."""

    config: ServeConfig = field(default_factory=ServeConfig)
    load: object = None  # a session.LoadSettings; None: the toy pair
    threads: int | None = None  # torch's CPU threads in each replica (None: as they are)
    make_pair: Callable[[], object] | None = None  # builds the pair in the replica in place of ``load`` (tests)


@dataclass(frozen=True)
class RaySettings:
    """How many replicas, how requests reach them, and how Ray checks them."""

    replicas: int = 2
    router: str = "prefix"  # one of ROUTERS
    imbalance: int = 1  # prefix router: queue lengths further apart than this route by load alone (see the docs)
    cpus_per_replica: float = 1.0  # Ray's CPU reservation per replica (the ingress reserves none)
    health_period_s: float = 2.0
    health_timeout_s: float = 10.0
    name: str = "specdec"  # the Serve application's name

    def validate(self) -> "RaySettings":
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"replicas={self.replicas!r} is invalid: must be an integer >= 1")
        if self.router not in ROUTERS:
            raise ValueError(f"router={self.router!r} is invalid: must be one of {', '.join(ROUTERS)}")
        if not isinstance(self.imbalance, int) or self.imbalance < 0:
            raise ValueError(f"imbalance={self.imbalance!r} is invalid: must be an integer >= 0")
        if not self.cpus_per_replica >= 0:
            raise ValueError(f"cpus_per_replica={self.cpus_per_replica!r} is invalid: must be a number >= 0")
        for name in ("health_period_s", "health_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: must be a number > 0")
        return self


@dataclass(frozen=True)
class Routed:
    """One HTTP request as the ingress hands it to a replica; ``prompt`` is what the router matches."""

    method: str
    path: str
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    prompt: str


def routing_text(path: str, body: bytes) -> str:
    """The request's prompt, or its messages' text contents joined; else ``path`` (never empty: Ray's
    router divides by its length)."""
    try:
        data = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        data = None
    text = ""
    if isinstance(data, dict):
        prompt, messages = data.get("prompt"), data.get("messages")
        if isinstance(prompt, str):
            text = prompt
        elif isinstance(prompt, list):
            text = "".join(p for p in prompt if isinstance(p, str))
        elif isinstance(messages, list):
            text = "".join(content_text(m.get("content")) for m in messages if isinstance(m, dict))
    return text or path


def content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and isinstance(part.get("text", ""), str))
    return ""


async def call_asgi(app, routed: Routed) -> AsyncIterator[dict]:
    """``app``'s ASGI messages for ``routed``, as they are sent. Closing the iterator early tells the app
    that the client is gone (``http.disconnect``), as a closed connection would."""
    messages: asyncio.Queue = asyncio.Queue()
    gone, body_sent = asyncio.Event(), False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": routed.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await messages.put(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": routed.method,
             "scheme": "http", "path": routed.path, "raw_path": routed.path.encode(), "root_path": "",
             "query_string": routed.query, "headers": list(routed.headers), "client": ("127.0.0.1", 0),
             "server": ("127.0.0.1", 80)}
    task = asyncio.create_task(app(scope, receive, send))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    try:
        while (message := await messages.get()) is not None:
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                return
        task.result()  # the app ended without a whole answer: its error, if any
        raise RuntimeError("the app ended without answering")
    finally:
        gone.set()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), 5.0)


class SpecdecReplica:
    """One replica: the pair, its engine, and the app serving it. Yields ``("start", status, headers)``
    then ``("body", bytes)`` items for each request."""

    def __init__(self, settings: ReplicaSettings) -> None:
        from .. import session

        session.set_threads(settings.threads)
        if settings.make_pair is not None:
            pair = settings.make_pair()
        elif settings.load is None:
            from ..models.toy import ToyPair

            pair = ToyPair()
        else:
            pair = session.load(settings.load)
        self.app = create_app(settings.config)
        self.app.state.specdec.attach(pair)
        self.name = serve.get_replica_context().replica_id.unique_id

    async def handle(self, routed: Routed):
        async for message in call_asgi(self.app, routed):
            if message["type"] == "http.response.start":
                headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]
                yield ("start", message["status"], headers + [(REPLICA_HEADER, self.name)])
            elif message["type"] == "http.response.body" and message.get("body"):
                yield ("body", message["body"])

    def queue(self) -> tuple[int, int]:
        """Requests generating and waiting in this replica's engine."""
        return self.app.state.specdec.engine.queue

    async def check_health(self) -> None:
        """Ray's health check: the app's ``GET /health`` must say 200."""
        routed = Routed("GET", "/health", b"", ((b"host", b"127.0.0.1"),), b"", "/health")
        async for message in call_asgi(self.app, routed):
            if message["type"] == "http.response.start" and message["status"] != 200:
                raise RuntimeError(f"GET /health answered {message['status']}")

    def __del__(self) -> None:
        state = getattr(getattr(getattr(self, "app", None), "state", None), "specdec", None)
        if state is not None:
            state.close()


def unavailable(why: str) -> JSONResponse:
    return JSONResponse(error_body(why, "service_unavailable", None, "replica_failed"), status_code=503,
                        headers={"Retry-After": "1"})


async def relay(answer) -> AsyncIterator[bytes]:
    """A replica's event stream; if the replica fails mid-stream, an error event and ``[DONE]`` end it."""
    done = False
    try:
        async for item in answer:
            done = done or item[1].rstrip().endswith(DONE.strip().encode())
            yield item[1]
    except Exception as err:
        if not done:
            message = f"the replica serving this stream failed: {type(err).__name__}"
            yield sse(error_body(message, "service_unavailable", None, "replica_failed")).encode()
            yield DONE.encode()
    finally:
        with contextlib.suppress(Exception):
            answer.cancel()


# Serve copies the ingress class with the module globals defined before it: what it calls comes first
ingress_app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


@serve.ingress(ingress_app)
class Ingress:
    """Ray's HTTP proxy calls this; every request goes on to one replica, its answer comes back."""

    def __init__(self, replicas: DeploymentHandle) -> None:
        self.replicas = replicas.options(stream=True)

    @ingress_app.api_route("/{path:path}", methods=METHODS)
    async def forward(self, path: str, request: Request):
        body = await request.body()
        routed = Routed(request.method, request.url.path, request.url.query.encode(),
                        tuple(request.headers.raw), body, routing_text(request.url.path, body))
        failure: BaseException | None = None
        for attempt in range(RETRIES):
            answer = self.replicas.handle.remote(routed)
            try:
                start = await answer.__anext__()
                break
            except Exception as err:  # the replica died or could not be reached: nothing was answered yet
                failure = err
                await asyncio.sleep(0.5 * (attempt + 1))
        else:
            return unavailable(f"no replica answered after {RETRIES} tries: {type(failure).__name__}")
        _, status, headers = start
        headers = {k: v for k, v in headers if k.lower() != "content-length"}
        if headers.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(relay(answer), status_code=status, headers=headers)
        try:
            chunks = [item[1] async for item in answer]
        except Exception as err:
            return unavailable(f"the replica failed while answering: {type(err).__name__}")
        return Response(b"".join(chunks), status_code=status, headers=headers)


def application(replica: ReplicaSettings, ray_settings: RaySettings):
    """The Serve application: the ingress over ``ray_settings.replicas`` replicas of ``replica``."""
    r = ray_settings.validate()
    router = (RequestRouterConfig(request_router_class=PREFIX_ROUTER,
                                  request_router_kwargs={"imbalanced_threshold": r.imbalance})
              if r.router == "prefix" else RequestRouterConfig())
    cfg = replica.config
    replicas = serve.deployment(SpecdecReplica).options(
        name="SpecdecReplica", num_replicas=r.replicas, ray_actor_options={"num_cpus": r.cpus_per_replica},
        max_ongoing_requests=cfg.max_active + cfg.max_waiting, request_router_config=router,
        health_check_period_s=r.health_period_s, health_check_timeout_s=r.health_timeout_s)
    ingress = serve.deployment(Ingress).options(name="Ingress", ray_actor_options={"num_cpus": 0},
                                                max_ongoing_requests=1000)
    return ingress.bind(replicas.bind(replica))


def start(replica: ReplicaSettings, ray_settings: RaySettings, host: str = "127.0.0.1", port: int = 8000):
    """Start Serve's HTTP proxy on ``host:port`` (Ray must be initialised) and the application on it."""
    serve.start(http_options={"host": host, "port": port})
    return serve.run(application(replica, ray_settings), name=ray_settings.name, route_prefix="/")
