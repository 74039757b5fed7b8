"""Running an app under uvicorn: in the foreground with graceful shutdown, or on a thread (tests).

The app is ``specdec serve``'s (``app.create_app``, maybe with the explorer added) or ``specdec
explore``'s (``explorer.create_app``); on shutdown the runner closes whichever parts it has.

Terms: *graceful shutdown* (SIGTERM or Ctrl-C): the server stops accepting connections and new
requests, open requests may finish for ``grace_seconds``, and any still open then end with an error
event (a stream) or a 503 (a waiting answer), before the process exits, with status 0 after a
SIGTERM (uvicorn raises the signal again once it has shut down, which would end the process with
status 143: ``serve`` answers that second one itself, see :func:`sigterm_ends_gracefully`).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time

import uvicorn

DEFAULT_GRACE_SECONDS = 5.0  # an app without the OpenAI routes (the explorer alone)


def closers(app) -> list:
    """What the first signal closes: the OpenAI routes' engine (``app.state.specdec``, a ``ServerState``)
    and the explorer's live view (``app.state.explorer``), whichever the app has."""
    return [part for part in (getattr(app.state, "specdec", None), getattr(app.state, "explorer", None))
            if part is not None]


class GracefulServer(uvicorn.Server):
    """uvicorn's server, which on the first signal also closes the app's parts (``closers``)."""

    def __init__(self, config: uvicorn.Config, parts: list) -> None:
        super().__init__(config)
        self.parts, self._closing = parts, False

    def handle_exit(self, sig, frame) -> None:
        if not self._closing:
            self._closing = True
            for part in self.parts:
                threading.Thread(target=part.close, name="specdec-close", daemon=True).start()
        super().handle_exit(sig, frame)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: any free port); an OSError if it is taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def uvicorn_config(app, host: str, port: int, *, log_level: str = "warning") -> uvicorn.Config:
    state = getattr(app.state, "specdec", None)
    grace = state.config.grace_seconds if state is not None else DEFAULT_GRACE_SECONDS
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          timeout_graceful_shutdown=int(grace) + 2, access_log=log_level in ("info", "debug"))


def serve(app, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "warning",
          sock: socket.socket | None = None) -> None:
    """Serve ``app`` until SIGTERM / Ctrl-C (blocking), on ``sock`` if given (from ``listen``)."""
    server = GracefulServer(uvicorn_config(app, host, port, log_level=log_level), closers(app))
    with sigterm_ends_gracefully(server):
        server.run(sockets=[sock] if sock is not None else None)


@contextlib.contextmanager
def sigterm_ends_gracefully(server: uvicorn.Server):
    """While ``server`` runs: a SIGTERM outside uvicorn's own handling (before it starts handling
    signals, or the one it raises again after its graceful shutdown) starts the shutdown if none has
    begun, and does not end the process; so ``serve`` returns and the command exits 0."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def on_sigterm(sig, frame) -> None:
        if not server.should_exit:
            server.handle_exit(sig, frame)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class ServerThread:
    """``app`` served on a daemon thread at ``host`` and an ephemeral port; ``stop()`` ends it.

    >>> with ServerThread(create_app(pair=ToyPair())) as server:   # doctest: +SKIP
    ...     server.url   # 'http://127.0.0.1:41623'
    """

    def __init__(self, app, host: str = "127.0.0.1", *, wait_ready: bool = True, timeout: float = 20.0) -> None:
        self.app, self.sock = app, listen(host, 0)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = GracefulServer(uvicorn_config(app, host, self.port), closers(app))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="specdec-uvicorn")
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            raise RuntimeError(f"the server did not start within {timeout} s")
        state = getattr(app.state, "specdec", None)
        loading = lambda: state is not None and not state.ready and state.load_error is None  # noqa: E731
        while wait_ready and loading() and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self, timeout: float = 15.0) -> None:
        explorer = getattr(self.app.state, "explorer", None)
        if explorer is not None:
            explorer.close()  # its live generations end at their next round, so their streams end
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
