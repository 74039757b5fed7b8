"""The explorer's routes on the ASGI stack: the page, its static files, and a JSON + event-stream API.

    GET  / , /explorer        the page            GET  /static/<file>   its script and style
    GET  /api/info            what the page needs to know (vocabulary, live pair, limits)
    GET  /api/health          {"ok": true, "live_active": n, "live_finished": n}
    POST /api/toy/reset       {seed?}              → a new toy session
    POST /api/toy/round       {session, gamma}     → one speculative round on the toy pair
    GET  /api/draws?n&seed    the rule run n times on the worked example (cat / dog / fish)
    GET  /api/plan?alpha&c    speed-up and extra arithmetic for γ = 1..16, and the best γ
    POST /api/live            a /v1/completions body ({prompt, max_tokens, temperature, seed, speculative:
                              {draft, gamma}, ...}) or a /v1/chat/completions one ({messages, ...}), + compare
                              → text/event-stream: status, start, round…, done, end | error
                              (checked and run as the OpenAI routes do: ``live``)

Every answer of these routes is made here, whichever app includes them (``specdec explore`` or
``specdec serve``): a request the API cannot use gets HTTP 400 and {"error": message}, one whose
body does not arrive in full within ``BODY_TIMEOUT_SECONDS`` 408. Who may ask at all (the Host
allow-list against DNS rebinding, the Origin check, the API key) is decided before any route, by the
app's guard (``server.guard``), on every path.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from collections.abc import AsyncIterator, Callable
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute

from ..server.errors import ApiError
from ..strict_json import dumps
from . import api
from .live import LiveView, Start

STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
MAX_BODY = 64 * 1024
BODY_TIMEOUT_SECONDS = 10.0  # a request body not in full by then is answered 408
# Nothing on the page may reach beyond this server (no CDN, no fonts, no analytics).
CSP = "default-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer"}
PAGE_PATHS = ("/", "/index.html", "/explorer")


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers={"Cache-Control": "no-store"})


class SlowBody(Exception):
    """The request's body did not arrive in full in time (answered 408)."""


def guarded_route() -> type[APIRoute]:
    """A route class answering every explorer route's errors itself: BadRequest → 400, NotFound → 404,
    SlowBody → 408, a bug → 500; and the page's security headers. (The Host, Origin and key checks
    come before, in the app's ``server.guard.Guard``.)"""

    class ExplorerRoute(APIRoute):
        def get_route_handler(self) -> Callable:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                try:
                    response = await handler(request)
                except api.BadRequest as err:
                    response = error(400, str(err))
                except api.NotFound as err:
                    response = error(404, str(err))
                except SlowBody as err:
                    response = error(408, str(err))
                    response.headers["Connection"] = "close"
                except Exception as err:  # a bug: answer 500, keep serving, show it on the console
                    traceback.print_exc(file=sys.stderr)
                    response = error(500, f"internal error: {type(err).__name__}: {err}")
                response.headers.update(SECURITY_HEADERS)
                return response

            return guarded

    return ExplorerRoute


async def read_json(request: Request) -> dict:
    """The request's JSON object body (at most MAX_BODY bytes, in full within BODY_TIMEOUT_SECONDS), or
    BadRequest (SlowBody) saying what is wrong."""
    kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise api.BadRequest("the request body must be JSON (Content-Type: application/json)")
    declared = request.headers.get("content-length")
    if declared is not None and not declared.strip().isdigit():
        raise api.BadRequest(f"Content-Length {declared!r} is not a number")
    if declared is not None and int(declared) > MAX_BODY:
        raise api.BadRequest(f"the request body is {int(declared)} bytes: at most {MAX_BODY} are accepted")
    raw = bytearray()

    async def receive_all() -> None:
        async for chunk in request.stream():
            raw.extend(chunk)
            if len(raw) > MAX_BODY:
                raise api.BadRequest(f"the request body is over {MAX_BODY} bytes: at most {MAX_BODY} are accepted")

    try:
        await asyncio.wait_for(receive_all(), BODY_TIMEOUT_SECONDS)
    except asyncio.TimeoutError:
        of = f" of the {int(declared)} its Content-Length announced" if declared is not None else ""
        raise SlowBody(f"the request body did not arrive within {BODY_TIMEOUT_SECONDS:g} s: "
                       f"{len(raw)} bytes came{of}") from None
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
    return f"event: {event}\ndata: {dumps(payload)}\n\n".encode()


async def live_events(live: LiveView, start: Start) -> AsyncIterator[bytes]:
    """The live stream's events as server-sent events; closing it (the reader hung up, or pressed
    Stop) cancels its job on the engine."""
    async for event, payload in live.events(start):
        yield sse(event, payload)


def explorer_router(explorer) -> APIRouter:
    """The explorer's routes for ``explorer`` (an ``app.Explorer``); the app they are added to guards
    them (``server.guard``)."""
    router = APIRouter(route_class=guarded_route(), include_in_schema=False)
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
    async def live(request: Request) -> Response:
        data = await read_json(request)
        try:  # the OpenAI routes' checks; a refusal comes before the stream starts, with their message
            start = await run_in_threadpool(explorer.live.begin, data)
        except ApiError as err:
            response = error(err.status, err.message)
            response.headers.update(err.headers)
            return response
        return StreamingResponse(live_events(explorer.live, start), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return router
