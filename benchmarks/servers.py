"""Pieces shared by the serving benchmarks (``serve_load.py``, ``serve_compare.py``): a server subprocess on
127.0.0.1 that is waited for (``GET /health`` 200) and always stopped (SIGTERM, then kill): ``specdec serve``
or llama.cpp's ``llama-server``; a free port, quantiles, atomic report files, an option's value in a command line.

Imported as ``from servers import ...``: the scripts run as ``python benchmarks/<script>.py``, which puts
this folder first on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import httpx

OWN_SERVER_ARGS = ("--host", "--port")  # chosen by the scripts
STOP_SECONDS = 20.0  # after SIGTERM, how long a server may take (specdec's own grace is 5 s) before it is killed


def quantile(values: list[float], q: float) -> float | None:
    """Linear-interpolated quantile (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_atomic(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Server:
    """A server subprocess listening on 127.0.0.1:``port``; its output goes to a temporary log file."""

    def __init__(self, command: list[str], port: int, name: str = "server") -> None:
        self.port, self.name, self.command = port, name, command
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"{name}-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def log_tail(self, lines: int = 20) -> str:
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until GET /health answered 200; RuntimeError if the server died or took too long."""
        start = time.monotonic()
        with httpx.Client(timeout=5.0) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with status {self.proc.returncode} before it was "
                                       f"ready:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    response = client.get(self.url + "/health")
                    if response.status_code == 200:
                        return time.monotonic() - start
                    if "failed" in response.text:  # loading failed: it will never be ready
                        raise RuntimeError(f"{self.name} cannot serve: {response.text}")
                if time.monotonic() - start > timeout:
                    raise RuntimeError(f"{self.name} was not ready within {timeout:.0f} s:\n{self.log_tail()}")
                time.sleep(0.2 if time.monotonic() - start < 10 else 1.0)

    def model_names(self) -> list[str]:
        response = httpx.get(self.url + "/v1/models", timeout=10.0)
        response.raise_for_status()
        return [m["id"] for m in response.json()["data"]]

    def stop(self) -> None:
        """SIGTERM, then kill after STOP_SECONDS; the log file is removed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


def specdec_server(server_args: list[str]) -> Server:
    """``specdec serve`` (this Python's specdec) on 127.0.0.1 and a free port, with ``server_args``."""
    port = free_port()
    return Server([sys.executable, "-m", "specdec", "serve", "--host", "127.0.0.1", "--port", str(port),
                   *server_args], port, "specdec-serve")


def llama_server(binary: str, model: str, *, context: int, parallel: int, threads: int,
                 extra: list[str] = ()) -> Server:
    """llama.cpp's ``llama-server`` on 127.0.0.1 and a free port: ``parallel`` slots sharing ``context``
    tokens of KV cache, ``threads`` threads, reusing cached prompt chunks of >= 256 tokens, the GGUF's own chat
    template run by its Jinja engine (``--jinja``: already the default of the vendored version, as
    ``llama-server --help`` says; given so that any build does the same, and its tool calls need it)."""
    port = free_port()
    return Server([binary, "--host", "127.0.0.1", "--port", str(port), "-m", model, "-c", str(context),
                   "--parallel", str(parallel), "-t", str(threads), "--cache-reuse", "256", "--jinja", *extra],
                  port, f"llama-server-np{parallel}")


@contextlib.contextmanager
def running(server: Server, startup_timeout: float, log: Callable[[str], object]) -> Iterator[tuple[str, float]]:
    """Start ``server`` and wait for /health; yields (its first model name, seconds it took to be ready) and
    stops it at the end, whatever happens."""
    try:
        log(f"starting: {shlex.join(server.command)}")
        server.start()
        ready = server.wait_healthy(startup_timeout)
        model = server.model_names()[0]
        log(f"{server.name} ready after {ready:.1f} s at {server.url} (model {model})")
        yield model, ready
    finally:
        server.stop()


def option_value(argv: list[str], name: str) -> str | None:
    """The value of ``name V`` / ``name=V`` in a command line (the last one given), else None."""
    value = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value
