"""The explorer's HTTP server: one page, its static files, and a small JSON + event-stream API.

Standard library only (``http.server.ThreadingHTTPServer``): one thread per connection, so a live
generation streaming to one reader never blocks another reader's requests.

    GET  /                    the page            GET  /static/<file>   its script and style
    GET  /api/info            what the page needs to know (vocabulary, live pair, limits)
    GET  /api/health          {"ok": true, "live_active": n}
    POST /api/toy/reset       {seed?}              → a new toy session
    POST /api/toy/round       {session, gamma}     → one speculative round on the toy pair
    GET  /api/draws?n&seed    the rule run n times on the worked example (cat / dog / fish)
    GET  /api/plan?alpha&c    speed-up and extra arithmetic for γ = 1..16, and the best γ
    POST /api/live            {prompt, draft, gamma, max_new_tokens, temperature, compare, chat, seed}
                              (draft: a --draft spec, default model; gamma: 1..16, auto or heuristic)
                              → text/event-stream: status, start, round…, done, end | error

A request the API cannot use gets HTTP 400 and {"error": message}; the server keeps serving.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qsl, urlsplit

from . import api
from .live import LivePair, LiveRequest, LiveRunner, toy_factory

STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
MAX_BODY = 64 * 1024
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}
# Nothing on the page may reach beyond this server (no CDN, no fonts, no analytics).
CSP = "default-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"


class ExplorerServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 pair_factory: Callable[[], LivePair] = toy_factory, pair_label: str = "the toy pair",
                 verbose: bool = False) -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.host, self.verbose = host, verbose
        self.toy = api.ToySessions()
        self.draws = api.DrawCache()
        self.live = LiveRunner(pair_factory, pair_label, slow_load=pair_factory is not toy_factory)
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__((host, port), Handler)  # binds: an OSError if the port is taken

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def shutdown(self) -> None:
        self.live.stopping.set()  # running generations stop at their next round
        super().shutdown()

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a reader that went away: nothing to report
        super().handle_error(request, client_address)

    def track(self, connection: socket.socket, add: bool) -> None:
        with self._connections_lock:
            (self._connections.add if add else self._connections.discard)(connection)

    def server_close(self, wait: float = 5.0) -> None:
        """Close the listening socket, hang up on every open connection, wait for their threads."""
        self.live.stopping.set()
        super().server_close()
        with self._connections_lock:
            open_now = list(self._connections)
        for connection in open_now:  # idle keep-alive or pre-connected sockets, streams
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while self._connections and time.monotonic() < deadline:
            time.sleep(0.01)

    def info(self) -> dict:
        return {
            "toy": api.toy_info(),
            "plan_max_gamma": api.PLAN_MAX_GAMMA,
            "live": {"label": self.live.label, "loaded": self.live.loaded,
                     "toy": self.live.factory is toy_factory},
        }


class Handler(BaseHTTPRequestHandler):
    server: ExplorerServer
    server_version = "specdec-explorer"
    protocol_version = "HTTP/1.0"  # one request per connection: an event stream ends by closing
    timeout = 60  # seconds a socket may sit idle in a read or a write before it is dropped

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, add=False)

    # ----------------------------------------------------------------------------- routing

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        try:
            if not self._host_allowed():
                return self._json(403, {"error": "this server only answers requests addressed to itself"})
            url = urlsplit(self.path)
            query = dict(parse_qsl(url.query, keep_blank_values=True))
            route = (method, url.path)
            if route == ("GET", "/") or route == ("GET", "/index.html"):
                return self._static("index.html")
            if method == "GET" and url.path.startswith("/static/"):
                return self._static(url.path[len("/static/"):])
            if route == ("GET", "/api/info"):
                return self._json(200, self.server.info())
            if route == ("GET", "/api/health"):
                return self._json(200, {"ok": True, "live_active": self.server.live.active,
                                        "live_finished": self.server.live.finished})
            if route == ("GET", "/api/draws"):
                return self._json(200, self.server.draws.draws(query))
            if route == ("GET", "/api/plan"):
                return self._json(200, api.plan(query))
            if route == ("POST", "/api/toy/reset"):
                return self._json(200, self.server.toy.reset(self._body()))
            if route == ("POST", "/api/toy/round"):
                return self._json(200, self.server.toy.round(self._body()))
            if route == ("POST", "/api/live"):
                return self._live(self._body())
            if url.path.startswith("/api/"):
                known = url.path in {"/api/info", "/api/health", "/api/draws", "/api/plan",
                                     "/api/toy/reset", "/api/toy/round", "/api/live"}
                if known:
                    return self._json(405, {"error": f"{method} is not allowed on {url.path}"})
            return self._json(404, {"error": f"nothing at {url.path}"})
        except api.BadRequest as err:
            self._json(400, {"error": str(err)})
        except api.NotFound as err:
            self._json(404, {"error": str(err)})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as err:  # a bug: answer 500, keep serving, show it on the console
            traceback.print_exc(file=sys.stderr)
            self._json(500, {"error": f"internal error: {type(err).__name__}: {err}"})

    def _host_allowed(self) -> bool:
        """Refuse requests addressed to another name (DNS rebinding from a web page)."""
        if self.server.host not in LOOPBACK_NAMES:
            return True  # bound to a chosen address on purpose: any name the user gave it
        host = (self.headers.get("Host") or "").strip()
        name = host[1:].split("]")[0] if host.startswith("[") else host.rsplit(":", 1)[0]
        return name in LOOPBACK_NAMES

    def _body(self) -> dict:
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise api.BadRequest("the request body must be JSON (Content-Type: application/json)")
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            raise api.BadRequest("Content-Length is missing or not a number") from None
        if not 0 <= length <= MAX_BODY:
            raise api.BadRequest(f"the request body is {length} bytes: at most {MAX_BODY} are accepted")
        raw = self.rfile.read(length)
        try:
            data = json.loads(raw.decode("utf-8")) if raw.strip() else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise api.BadRequest(f"the request body is not valid JSON: {err}") from None
        return api.as_dict(data)

    # ----------------------------------------------------------------------------- responses

    def _common_headers(self) -> None:
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")

    def _json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self._common_headers()
        self.end_headers()
        self.wfile.write(body)

    def _static(self, name: str) -> None:
        suffix = name[name.rfind("."):] if "." in name else ""
        if "/" in name or "\\" in name or name.startswith(".") or suffix not in STATIC_TYPES:
            return self._json(404, {"error": f"no static file {name!r}"})
        path = resources.files("specdec.explorer").joinpath("static", name)
        if not path.is_file():
            return self._json(404, {"error": f"no static file {name!r}"})
        body = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", STATIC_TYPES[suffix])
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache")
        self._common_headers()
        self.end_headers()
        self.wfile.write(body)

    def _live(self, data: dict) -> None:
        request = LiveRequest.parse(data)  # BadRequest → 400 before the stream starts
        ids = self.server.live.encode_now(request)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Accel-Buffering", "no")
        self._common_headers()
        self.end_headers()
        self.wfile.flush()

        def send(event: str, payload: dict) -> None:
            self.wfile.write(f"event: {event}\ndata: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        self.server.live.stream(request, ids, send, self._client_gone)

    def _client_gone(self) -> bool:
        """True once the reader has closed its end (a readable socket with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        if self.server.verbose:
            super().log_message(format, *args)


def make_server(host: str = "127.0.0.1", port: int = 0, *, toy: bool = True,
                target: str | None = None, draft: str | None = None, device: str = "cpu",
                dtype: str | None = None, verbose: bool = False) -> ExplorerServer:
    """A server whose live view runs the toy pair, or (toy=False) the real pair, loaded on first use."""
    if toy:
        return ExplorerServer(host, port, verbose=verbose)
    from .live import real_factory

    label = ("the default model pair" if target is None and draft is None
             else f"target {target or 'default'} with draft {draft or 'default'}")
    return ExplorerServer(host, port, pair_factory=real_factory(target, draft, device=device, dtype=dtype),
                          pair_label=label, verbose=verbose)
