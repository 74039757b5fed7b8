"""The explorer's routes on the ASGI stack: the page, its static files, and a JSON + event-stream API.

    GET  / , /explorer        the page            GET  /static/<file>   its script and style
    GET  /api/info            what the page needs to know (vocabulary, live pair, limits)
    GET  /api/health          {"ok": true, "live_active": n, "live_finished": n}
    POST /api/toy/reset       {seed?}              → a new toy session
    POST /api/toy/round       {session, gamma}     → one speculative round on the toy pair
    GET  /api/draws?n&seed    the rule run n times on the worked example (cat / dog / fish)
    GET  /api/plan?alpha&c    speed-up and extra arithmetic for γ = 1..16, and the best γ
    POST /api/live            {prompt, draft, gamma, max_new_tokens, temperature, compare, chat, seed}
                              (draft: a --draft spec, default model; gamma: 1..16, auto or heuristic)
                              → text/event-stream: status, start, round…, done, end | error

Every answer of these routes is made here, whichever app includes them (``specdec explore`` or
``specdec serve``): a request the API cannot use gets HTTP 400 and {"error": message}; a request
addressed to another host name than the loopback one the server listens on gets 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Callable
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute

from . import api
from .live import LiveRequest, LiveRunner

STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
MAX_BODY = 64 * 1024
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}
# Nothing on the page may reach beyond this server (no CDN, no fonts, no analytics).
CSP = "default-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer"}
PAGE_PATHS = ("/", "/index.html", "/explorer")


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers={"Cache-Control": "no-store"})


def addressed_to_loopback(request: Request) -> bool:
    """True when the Host header names the loopback address (not a name a web page made point at it)."""
    host = (request.headers.get("host") or "").strip()
    name = host[1:].split("]")[0] if host.startswith("[") else host.rsplit(":", 1)[0]
    return name in LOOPBACK_NAMES


def guarded_route(loopback_only: bool) -> type[APIRoute]:
    """A route class answering every explorer route's errors itself: the host check (DNS rebinding
    from a web page), BadRequest → 400, NotFound → 404, a bug → 500; and the page's security headers."""

    class ExplorerRoute(APIRoute):
        def get_route_handler(self) -> Callable:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                if loopback_only and not addressed_to_loopback(request):
                    response = error(403, "this server only answers requests addressed to itself")
                else:
                    try:
                        response = await handler(request)
                    except api.BadRequest as err:
                        response = error(400, str(err))
                    except api.NotFound as err:
                        response = error(404, str(err))
                    except Exception as err:  # a bug: answer 500, keep serving, show it on the console
                        traceback.print_exc(file=sys.stderr)
                        response = error(500, f"internal error: {type(err).__name__}: {err}")
                response.headers.update(SECURITY_HEADERS)
                return response

            return guarded

    return ExplorerRoute


async def read_json(request: Request) -> dict:
    """The request's JSON object body (at most MAX_BODY bytes), or BadRequest saying what is wrong."""
    kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise api.BadRequest("the request body must be JSON (Content-Type: application/json)")
    declared = request.headers.get("content-length")
    if declared is not None and not declared.strip().isdigit():
        raise api.BadRequest(f"Content-Length {declared!r} is not a number")
    if declared is not None and int(declared) > MAX_BODY:
        raise api.BadRequest(f"the request body is {int(declared)} bytes: at most {MAX_BODY} are accepted")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise api.BadRequest(f"the request body is over {MAX_BODY} bytes: at most {MAX_BODY} are accepted")
    try:
        data = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise api.BadRequest(f"the request body is not valid JSON: {err}") from None
    return api.as_dict(data)


def static_file(name: str) -> Response:
    suffix = name[name.rfind("."):] if "." in name else ""
    if "/" in name or "\\" in name or name.startswith(".") or suffix not in STATIC_TYPES:
        return error(404, f"no static file {name!r}")
    path = resources.files("specdec.explorer").joinpath("static", name)
    if not path.is_file():
        return error(404, f"no static file {name!r}")
    return Response(path.read_bytes(), media_type=STATIC_TYPES[suffix], headers={"Cache-Control": "no-cache"})


def sse(event: str, payload: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(payload)}\n\n".encode()


async def live_events(runner: LiveRunner, request: LiveRequest, ids: list[int] | None) -> AsyncIterator[bytes]:
    """The live generation's events as they come: it runs on its own thread, which stops at its next
    round once this stream is closed (the reader hung up, or pressed Stop)."""
    loop, queue, gone = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()

    def post(item: bytes | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is reading
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def work() -> None:
        try:
            runner.stream(request, ids, lambda event, payload: post(sse(event, payload)), gone.is_set)
        finally:
            post(None)

    threading.Thread(target=work, name="specdec-live", daemon=True).start()
    try:
        while (chunk := await queue.get()) is not None:
            yield chunk
    finally:
        gone.set()


def explorer_router(explorer, host: str = "127.0.0.1") -> APIRouter:
    """The explorer's routes for ``explorer`` (an ``app.Explorer``), served on ``host``: bound to a
    loopback address, they answer only requests addressed to it."""
    router = APIRouter(route_class=guarded_route(host in LOOPBACK_NAMES), include_in_schema=False)
    json_headers = {"Cache-Control": "no-store"}

    def answer(payload: dict) -> JSONResponse:
        return JSONResponse(payload, headers=json_headers)

    async def page() -> Response:
        return static_file("index.html")

    for path in PAGE_PATHS:
        router.add_api_route(path, page, methods=["GET"])

    @router.get("/static/{name:path}")
    async def static(name: str) -> Response:
        return static_file(name)

    @router.get("/api/info")
    async def info() -> JSONResponse:
        return answer(explorer.info())

    @router.get("/api/health")
    async def health() -> JSONResponse:
        return answer(explorer.health())

    @router.get("/api/draws")
    async def draws(request: Request) -> JSONResponse:
        return answer(await run_in_threadpool(explorer.draws.draws, dict(request.query_params)))

    @router.get("/api/plan")
    async def plan(request: Request) -> JSONResponse:
        return answer(api.plan(dict(request.query_params)))

    @router.post("/api/toy/reset")
    async def toy_reset(request: Request) -> JSONResponse:
        return answer(await run_in_threadpool(explorer.toy.reset, await read_json(request)))

    @router.post("/api/toy/round")
    async def toy_round(request: Request) -> JSONResponse:
        return answer(await run_in_threadpool(explorer.toy.round, await read_json(request)))

    @router.post("/api/live")
    async def live(request: Request) -> StreamingResponse:
        wanted = LiveRequest.parse(await read_json(request))  # BadRequest → 400 before the stream starts
        ids = await run_in_threadpool(explorer.live.encode_now, wanted)
        return StreamingResponse(live_events(explorer.live, wanted, ids), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return router
