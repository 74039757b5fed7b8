"""The explorer as an ASGI app (FastAPI, served by uvicorn), or as routes added to another app.

``Explorer`` holds what the routes share (toy sessions, the draws cache, the live view, which runs
on the server's engine when added to ``specdec serve``'s app, else on an engine of its own);
``create_app`` is ``specdec explore``'s app; ``add_explorer`` puts the same page and API on
``specdec serve``'s app (at /explorer). ``server.runner`` serves either; ``server.guard`` decides
who may ask either (Host allow-list, Origin, API key), before any route.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..server.guard import Guard, GuardSettings
from . import api
from .live import LIVE_DEFAULTS, LiveView, toy_factory
from .routes import SECURITY_HEADERS, explorer_router


class Explorer:
    """The explorer's state: its live view runs on ``state`` (a ``server.app.ServerState``: the
    server's pair and engine), or else on an engine of its own over ``pair_factory()``'s pair, built
    on first use, with ``defaults`` for what a live request leaves out."""

    def __init__(self, pair_factory: Callable[[], object] = toy_factory, pair_label: str = "the toy pair", *,
                 state=None, defaults=LIVE_DEFAULTS) -> None:
        self.toy = api.ToySessions()
        self.draws = api.DrawCache()
        if state is not None:
            self.live = LiveView(None, "the server's model pair", state=state)
        else:
            self.live = LiveView(pair_factory, pair_label, defaults=defaults)

    def info(self) -> dict:
        return {"toy": api.toy_info(), "plan_max_gamma": api.PLAN_MAX_GAMMA, "live": self.live.info()}

    def health(self) -> dict:
        return {"ok": True, "live_active": self.live.active, "live_finished": self.live.finished}

    def close(self) -> None:
        """Shutting down: the live view's own engine ends its jobs, so their streams end."""
        self.live.close()


def make_explorer(*, toy: bool = True, target: str | None = None, draft: str | None = None, device: str = "cpu",
                  dtype: str | None = None, dequantize: bool = False) -> Explorer:
    """An explorer whose live view runs the toy pair, or (toy=False) the real pair, loaded on first use
    (``dequantize``: ``LoadSettings.dequantize``)."""
    if toy:
        return Explorer()
    from .live import real_factory

    label = ("the default model pair" if target is None and draft is None
             else f"target {target or 'default'} with draft {draft or 'default'}")
    return Explorer(real_factory(target, draft, device=device, dtype=dtype, dequantize=dequantize), label,
                    defaults=dataclasses.replace(LIVE_DEFAULTS, draft=draft or "model"))


async def on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """No route (404) or a method a route does not take (405): the API's {"error": message} shape."""
    message = (f"{request.method} is not allowed on {request.url.path}" if exc.status_code == 405
               else f"nothing at {request.url.path}" if exc.status_code == 404 else str(exc.detail))
    return JSONResponse({"error": message}, status_code=exc.status_code, headers=(exc.headers or {}) | SECURITY_HEADERS)


def create_app(explorer: Explorer | None = None, *, guard: GuardSettings | None = None) -> FastAPI:
    """``specdec explore``'s app: the explorer's page and API for ``explorer`` (default: the toy pair),
    answering whom ``guard`` allows (default: requests addressed to the loopback address, no key)."""
    explorer = explorer or Explorer()
    app = FastAPI(title="specdec explorer", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_middleware(Guard, settings=guard or GuardSettings())
    add_explorer(app, explorer)
    return app


def add_explorer(app: FastAPI, explorer: Explorer | None = None) -> Explorer:
    """Add the explorer's page (/, /explorer) and API (/api/…, /static/…) to ``app``, which the
    server's runner then also closes on shutdown (``app.state.explorer``). An app without a guard
    gets the default one (loopback only), so these routes are never unguarded. Without ``explorer``,
    the live view of an app with the OpenAI routes (``app.state.specdec``) runs on their engine."""
    server = getattr(app.state, "specdec", None)
    explorer = explorer or (Explorer(state=server) if server is not None else Explorer())
    if not any(middleware.cls is Guard for middleware in app.user_middleware):
        app.add_middleware(Guard, settings=GuardSettings())
    app.include_router(explorer_router(explorer))
    app.state.explorer = explorer
    return explorer
