"""Running the app under uvicorn: in the foreground with graceful shutdown, or on a thread (tests).

Terms: *graceful shutdown* (SIGTERM or Ctrl-C): the server stops accepting connections and new
requests, open requests may finish for ``grace_seconds``, and any still open then end with an error
event (a stream) or a 503 (a waiting answer), before the process exits.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


class GracefulServer(uvicorn.Server):
    """uvicorn's server, which on the first signal also closes the engine (``ServerState.close``)."""

    def __init__(self, config: uvicorn.Config, state) -> None:
        super().__init__(config)
        self.state, self._closing = state, False

    def handle_exit(self, sig, frame) -> None:
        if not self._closing and self.state is not None:
            self._closing = True
            threading.Thread(target=self.state.close, name="specdec-close", daemon=True).start()
        super().handle_exit(sig, frame)


def uvicorn_config(app, host: str, port: int, *, log_level: str = "warning") -> uvicorn.Config:
    grace = app.state.specdec.config.grace_seconds
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          timeout_graceful_shutdown=int(grace) + 2, access_log=log_level in ("info", "debug"))


def serve(app, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "warning") -> None:
    """Serve ``app`` until SIGTERM / Ctrl-C (blocking)."""
    GracefulServer(uvicorn_config(app, host, port, log_level=log_level), app.state.specdec).run()


class ServerThread:
    """``app`` served on a daemon thread at ``host`` and an ephemeral port; ``stop()`` ends it.

    >>> with ServerThread(create_app(pair=ToyPair())) as server:   # doctest: +SKIP
    ...     server.url   # 'http://127.0.0.1:41623'
    """

    def __init__(self, app, host: str = "127.0.0.1", *, wait_ready: bool = True, timeout: float = 20.0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = GracefulServer(uvicorn_config(app, host, self.port), app.state.specdec)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="specdec-uvicorn")
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            raise RuntimeError(f"the server did not start within {timeout} s")
        state = app.state.specdec
        while wait_ready and not state.ready and state.load_error is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
