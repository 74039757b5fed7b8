"""The explorer as an ASGI app (FastAPI, served by uvicorn), or as routes added to another app.

``Explorer`` holds what the routes share (toy sessions, the draws cache, the live view's runner);
``create_app`` is ``specdec explore``'s app; ``add_explorer`` puts the same page and API on
``specdec serve``'s app (at /explorer). ``server.runner`` serves either.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from . import api
from .live import LivePair, LiveRunner, toy_factory
from .routes import SECURITY_HEADERS, explorer_router


class Explorer:
    """The explorer's state: its live view runs ``pair_factory()``'s pair, built on first use."""

    def __init__(self, pair_factory: Callable[[], LivePair] = toy_factory, pair_label: str = "the toy pair") -> None:
        self.toy = api.ToySessions()
        self.draws = api.DrawCache()
        self.live = LiveRunner(pair_factory, pair_label, slow_load=pair_factory is not toy_factory)

    def info(self) -> dict:
        return {
            "toy": api.toy_info(),
            "plan_max_gamma": api.PLAN_MAX_GAMMA,
            "live": {"label": self.live.label, "loaded": self.live.loaded,
                     "toy": self.live.factory is toy_factory},
        }

    def health(self) -> dict:
        return {"ok": True, "live_active": self.live.active, "live_finished": self.live.finished}

    def close(self) -> None:
        """Shutting down: running generations stop at their next round, so their streams end."""
        self.live.stopping.set()


def make_explorer(*, toy: bool = True, target: str | None = None, draft: str | None = None, device: str = "cpu",
                  dtype: str | None = None) -> Explorer:
    """An explorer whose live view runs the toy pair, or (toy=False) the real pair, loaded on first use."""
    if toy:
        return Explorer()
    from .live import real_factory

    label = ("the default model pair" if target is None and draft is None
             else f"target {target or 'default'} with draft {draft or 'default'}")
    return Explorer(real_factory(target, draft, device=device, dtype=dtype), label)


async def on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """No route (404) or a method a route does not take (405): the API's {"error": message} shape."""
    message = (f"{request.method} is not allowed on {request.url.path}" if exc.status_code == 405
               else f"nothing at {request.url.path}" if exc.status_code == 404 else str(exc.detail))
    return JSONResponse({"error": message}, status_code=exc.status_code, headers=(exc.headers or {}) | SECURITY_HEADERS)


def create_app(explorer: Explorer | None = None, *, host: str = "127.0.0.1") -> FastAPI:
    """``specdec explore``'s app: the explorer's page and API for ``explorer`` (default: the toy pair),
    to be served on ``host``."""
    explorer = explorer or Explorer()
    app = FastAPI(title="specdec explorer", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(HTTPException, on_http_error)
    add_explorer(app, explorer, host=host)
    return app


def add_explorer(app: FastAPI, explorer: Explorer | None = None, *, host: str = "127.0.0.1") -> Explorer:
    """Add the explorer's page (/, /explorer) and API (/api/…, /static/…) to ``app``, which the
    server's runner then also closes on shutdown (``app.state.explorer``)."""
    explorer = explorer or Explorer()
    app.include_router(explorer_router(explorer, host))
    app.state.explorer = explorer
    return explorer
