"""Who may ask the servers (``server.guard``) and how they hold up against clients that misbehave.

Host allow-list (DNS rebinding), Origin check (cross-site ``text/plain`` POSTs), CORS only for
``--allow-origin``, the API key; a body shorter than its Content-Length (408), a stream whose reader
stops reading (its job cancelled), SIGTERM (exit 0). Every server runs on an ephemeral 127.0.0.1 port;
every request has a timeout.
"""

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from conftest import start_explorer

from specdec.cli import main
from specdec.explorer import Explorer, add_explorer
from specdec.explorer import create_app as create_explorer_app
from specdec.explorer import routes as explorer_routes
from specdec.models.toy import ToyPair
from specdec.sampling import SamplingParams
from specdec.server import GuardSettings, ServeConfig, create_app
from specdec.server.guard import exposure_warning, host_name
from specdec.server.runner import ServerThread
from specdec.session import RunSettings

MODEL = "specdec-toy"
KEY = "s3cret-key"
DEFAULTS = RunSettings(gamma=3, max_new_tokens=8, sampling=SamplingParams(temperature=0.0), seed=None)
COMPLETION = {"model": MODEL, "prompt": "the", "max_tokens": 4}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "the"}], "max_tokens": 4}


def serve_app(guard: GuardSettings | None = None, **kw):
    """``specdec serve``'s app on the toy pair, with the explorer added as the CLI adds it."""
    app = create_app(ServeConfig(model_names=(MODEL,), defaults=DEFAULTS, guard=guard or GuardSettings(), **kw),
                     pair=ToyPair())
    add_explorer(app)
    return app


@pytest.fixture(scope="module")
def server():
    with ServerThread(serve_app()) as srv:
        yield srv


@pytest.fixture(scope="module")
def keyed():
    with ServerThread(serve_app(GuardSettings(api_key=KEY))) as srv:
        yield srv


@pytest.fixture(scope="module")
def explorer_server():
    srv = start_explorer()
    yield srv
    srv.stop()


def call(srv, method, path, body=None, headers=None, content=None):
    hdrs = {"Content-Type": "application/json"} if body is not None else {}
    with httpx.Client(base_url=srv.url, timeout=20) as http:
        return http.request(method, path, content=json.dumps(body) if body is not None else content,
                            headers=hdrs | (headers or {}))


# ----------------------------------------------------------------------------- Host allow-list

ROUTES = [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", CHAT), ("POST", "/v1/completions", COMPLETION),
          ("GET", "/explorer", None), ("GET", "/api/info", None), ("POST", "/api/toy/reset", {}),
          ("GET", "/metrics", None)]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[p for _, p, _ in ROUTES])
@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example", "localhost.",
                                  "[::2]:{port}"])
def test_a_host_not_allowed_is_403_on_every_route(server, method, path, body, host):
    response = call(server, method, path, body, headers={"Host": host.format(port=server.port)})
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    message = error["message"] if path.startswith("/v1") or path == "/metrics" else error
    assert "allowed name" in message


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[p for _, p, _ in ROUTES])
@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LOCALHOST", "127.0.0.1"])
def test_loopback_names_are_answered(server, method, path, body, host):
    response = call(server, method, path, body, headers={"Host": host.format(port=server.port)})
    assert response.status_code == 200, response.text


def test_the_explorer_app_has_the_same_host_rule(explorer_server):
    for path in ("/", "/api/info", "/api/health"):
        assert call(explorer_server, "GET", path, headers={"Host": "evil.example"}).status_code == 403
        assert call(explorer_server, "GET", path).status_code == 200


def test_no_host_header_is_403(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.0\r\n\r\n")
        assert recv_all(sock).startswith(b"HTTP/1.1 403")


def test_allowed_hosts_and_the_reached_address():
    guard = GuardSettings(allowed_hosts=frozenset({"gpu-box.lan"}), any_interface=True)
    with ServerThread(serve_app(guard)) as srv:
        assert call(srv, "GET", "/v1/models", headers={"Host": "GPU-box.lan:8000"}).status_code == 200
        assert call(srv, "GET", "/v1/models").status_code == 200  # 127.0.0.1: the address the connection reached
        assert call(srv, "GET", "/v1/models", headers={"Host": "localhost"}).status_code == 403
        assert call(srv, "GET", "/v1/models", headers={"Host": "other.lan"}).status_code == 403


@pytest.mark.parametrize(("bind", "extra", "allowed", "refused", "anywhere"), [
    ("127.0.0.1", (), {"127.0.0.1", "localhost", "::1"}, {"192.168.1.5", "evil.example"}, False),
    ("localhost", (), {"127.0.0.1", "localhost", "::1"}, {"192.168.1.5"}, False),
    ("::1", (), {"::1", "localhost"}, {"192.168.1.5"}, False),
    ("192.168.1.5", ("Box.LAN",), {"127.0.0.1", "192.168.1.5", "box.lan"}, {"evil.example"}, False),
    ("0.0.0.0", (), {"localhost"}, {"0.0.0.0", "evil.example"}, True),
    ("::", (), {"::1"}, {"::", "evil.example"}, True),
])
def test_settings_for_a_bind_address(bind, extra, allowed, refused, anywhere):
    settings = GuardSettings.for_bind(bind, allowed_hosts=extra)
    assert allowed <= settings.allowed_hosts and not refused & settings.allowed_hosts
    assert settings.any_interface is anywhere


@pytest.mark.parametrize(("header", "name"), [("127.0.0.1:8000", "127.0.0.1"), ("[::1]:80", "::1"), ("[::1]", "::1"),
                                              ("LocalHost", "localhost"), ("::1", "::1"), ("a.b:1:2", "a.b:1:2")])
def test_host_name(header, name):
    assert host_name(header) == name


# ----------------------------------------------------------------------------- Origin and CORS

ORIGIN_CASES = [
    ("http://evil.example", 403), ("null", 403), ("http://127.0.0.1.evil.example:{port}", 403),
    ("http://127.0.0.1:1", 403), ("https://127.0.0.1:{port}", 403), ("http://localhost:{port}", 403),
    ("http://127.0.0.1:{port}", 200), ("HTTP://127.0.0.1:{port}/", 200),
]


@pytest.mark.parametrize(("origin", "status"), ORIGIN_CASES, ids=[o for o, _ in ORIGIN_CASES])
@pytest.mark.parametrize("path", ["/v1/completions", "/api/toy/reset"])
def test_cross_site_text_plain_posts_are_refused(server, path, origin, status):
    """A page of another origin may POST text/plain without a preflight: the Origin header stops it."""
    body = json.dumps(COMPLETION if path.startswith("/v1") else {})
    response = call(server, "POST", path, content=body,
                    headers={"Content-Type": "text/plain", "Origin": origin.format(port=server.port)})
    assert response.status_code == status, response.text
    assert not [h for h in response.headers if h.lower().startswith("access-control-")]


def test_cors_is_off_by_default(server):
    own = f"http://127.0.0.1:{server.port}"
    for response in (call(server, "GET", "/v1/models", headers={"Origin": own}),
                     call(server, "OPTIONS", "/v1/completions", headers={
                         "Origin": own, "Access-Control-Request-Method": "POST"})):
        assert not [h for h in response.headers if h.lower().startswith("access-control-")], response.headers


def test_allow_origin_turns_cors_on_for_those_origins_only():
    page = "http://localhost:3000"
    with ServerThread(serve_app(GuardSettings(allowed_origins=(page + "/",), api_key=KEY))) as srv:
        preflight = call(srv, "OPTIONS", "/v1/chat/completions", headers={
            "Origin": page, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == page
        assert "POST" in preflight.headers["access-control-allow-methods"]
        answer = call(srv, "POST", "/v1/completions", COMPLETION, headers={
            "Origin": page, "Authorization": f"Bearer {KEY}"})
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == page
        refused = call(srv, "GET", "/v1/models", headers={"Origin": page})  # no key: 401 the page can read
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == page
        other = call(srv, "OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize("origin", ["*", "localhost:3000", "ftp://x.example", "http://x.example/path",
                                    "http://x.example:99999", "http://user@x.example"])
def test_a_bad_allow_origin_is_one_error_line(origin, capsys):
    assert main(["serve", "--toy", "--port", "0", "--allow-origin", origin]) == 2
    assert f"--allow-origin {origin!r} is invalid" in capsys.readouterr().err


# ----------------------------------------------------------------------------- API key

KEY_CASES = [
    ("GET", "/v1/models", None, 401, "missing"),
    ("GET", "/v1/models", f"Bearer {KEY}x", 401, "wrong"),
    ("GET", "/v1/models", f"Basic {KEY}", 401, "wrong"),
    ("GET", "/v1/models", f"Bearer {KEY[:-1]}", 401, "wrong"),
    ("GET", "/v1/models", f"Bearer {KEY}", 200, None),
    ("GET", "/v1/models", f"bearer  {KEY}", 200, None),
    ("POST", "/v1/completions", None, 401, "missing"),
    ("POST", "/v1/completions", f"Bearer {KEY}", 200, None),
    ("GET", "/metrics", None, 401, "missing"),
    ("GET", "/health", None, 200, None),
    ("GET", "/api/info", None, 401, "missing"),
    ("GET", "/api/info", f"Bearer {KEY}", 200, None),
    ("POST", "/api/toy/reset", "Bearer nope", 401, "wrong"),
    ("GET", "/explorer", None, 200, None),  # the page and its scripts: nothing secret; the page asks for the key
    ("GET", "/static/app.js", None, 200, None),
]


@pytest.mark.parametrize(("method", "path", "auth", "status", "why"), KEY_CASES,
                         ids=[f"{m} {p} {why or 'ok'}" for m, p, _, _, why in KEY_CASES])
def test_api_key(keyed, method, path, auth, status, why):
    body = COMPLETION if path == "/v1/completions" else {} if method == "POST" else None
    response = call(keyed, method, path, body, headers={"Authorization": auth} if auth else {})
    assert response.status_code == status, response.text
    if status != 401:
        return
    assert response.headers["www-authenticate"] == "Bearer"
    if path.startswith("/v1") or path == "/metrics":
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
        assert error["param"] is None
        assert ("needs an API key" if why == "missing" else "not valid") in error["message"]
    else:
        assert isinstance(response.json()["error"], str)


def test_the_openai_client_with_a_key(keyed):
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, timeout=20, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    out = client.chat.completions.create(model=MODEL, messages=CHAT["messages"], max_tokens=5, temperature=0)
    assert out.usage.completion_tokens == 5
    streamed = list(client.completions.create(model=MODEL, prompt="the", max_tokens=5, stream=True))
    assert streamed and "".join(c.choices[0].text for c in streamed)
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", timeout=20, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.models.list()
    assert caught.value.code == "invalid_api_key"


def test_api_key_from_the_environment_and_the_exposure_warning(monkeypatch):
    from specdec.cli import build_parser
    from specdec.cli.serve import guard_settings

    monkeypatch.setenv("SPECDEC_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "--toy", "--host", "0.0.0.0"])
    assert guard_settings(args).api_key == "from-env"
    args = build_parser().parse_args(["explore", "--toy", "--api-key", "flag"])
    assert guard_settings(args).api_key == "flag"
    monkeypatch.setenv("SPECDEC_API_KEY", "")
    assert guard_settings(build_parser().parse_args(["serve", "--toy"])).api_key is None
    assert "without an API key" in exposure_warning("0.0.0.0", GuardSettings.for_bind("0.0.0.0"))
    assert "without" not in exposure_warning("10.0.0.2", GuardSettings.for_bind("10.0.0.2", api_key="k"))
    assert exposure_warning("127.0.0.1", GuardSettings()) is None
    assert exposure_warning("localhost", GuardSettings()) is None
    with pytest.raises(ValueError, match="--api-key is empty"):
        GuardSettings(api_key="  ")


NODE_SCRIPT = r"""
const fs = require("fs"), vm = require("vm");
const store = {}; let prompts = 0; const seen = [];
const ctx = { console, Headers, Response, JSON, Promise, Error, Number, Math,
  document: { addEventListener() {}, getElementById() { return null; } },
  sessionStorage: { getItem: (k) => (k in store ? store[k] : null), setItem: (k, v) => { store[k] = String(v); } },
  fetch: async (path, init) => {
    const auth = new Headers(init.headers || {}).get("Authorization");
    seen.push(auth);
    const ok = auth === "Bearer KEY";
    return new Response(JSON.stringify(ok ? { path } : { error: "key" }),
      { status: ok ? 200 : 401, headers: { "Content-Type": "application/json" } });
  },
};
ctx.window = { prompt: () => { prompts += 1; return " KEY "; } };
vm.createContext(ctx);
vm.runInContext(fs.readFileSync(process.argv[2], "utf8"), ctx);
(async () => {
  const first = await Promise.all(["/a", "/b", "/c"].map((p) => ctx.window.App.api(p)));
  const later = await ctx.window.App.fetch("/d", { method: "POST", body: "{}" });
  console.log(JSON.stringify({ first, later: later.status, prompts, seen, stored: store["specdec-api-key"] }));
})();
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="no node to run the page's script")
def test_the_page_asks_for_the_key_once_and_sends_it(tmp_path):
    script = tmp_path / "run.js"
    script.write_text(NODE_SCRIPT.replace("KEY", KEY))
    app_js = os.path.join(os.path.dirname(explorer_routes.__file__), "static", "app.js")
    out = subprocess.run(["node", str(script), app_js], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert [r["path"] for r in result["first"]] == ["/a", "/b", "/c"] and result["later"] == 200
    assert result["prompts"] == 1 and result["stored"] == KEY
    assert result["seen"][:3] == [None] * 3 and result["seen"][3:] == [f"Bearer {KEY}"] * 4


# ----------------------------------------------------------------------------- bodies that never come


def recv_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def short_body(port: int, path: str, announced: int = 100, sent: bytes = b'{"prompt":') -> tuple[bytes, float]:
    """POST a body shorter than its Content-Length; (the whole answer, seconds until it came)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {announced}\r\n\r\n".encode() + sent)
        answer = recv_all(sock)  # the server closes the connection after its 408
        return answer, time.monotonic() - start


def test_a_short_body_is_408_within_the_timeout():
    with ServerThread(serve_app(body_timeout_seconds=0.5)) as srv:
        for path in ("/v1/completions", "/api/toy/reset"):
            answer, seconds = short_body(srv.port, path)
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert 0.4 < seconds < 5
            error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
            assert error["code"] == "body_timeout" and "10 bytes came of the 100" in error["message"]
        assert call(srv, "POST", "/v1/completions", COMPLETION).status_code == 200  # still serving


def test_the_explorer_app_times_out_a_short_body_too(monkeypatch):
    monkeypatch.setattr(explorer_routes, "BODY_TIMEOUT_SECONDS", 0.5)
    with ServerThread(create_explorer_app(Explorer())) as srv:
        answer, seconds = short_body(srv.port, "/api/toy/reset", sent=b"{")
        assert answer.startswith(b"HTTP/1.1 408") and 0.4 < seconds < 5, answer
        assert b"1 bytes came of the 100" in answer


# ----------------------------------------------------------------------------- a reader that stops reading


def test_a_stream_whose_reader_stops_reading_has_its_job_cancelled():
    """The ASGI app driven directly: ``send`` blocks after the first chunks, as it does for a client
    that stops reading but keeps its connection; the job must end, not generate into memory."""
    app = serve_app(max_stream_events=8)
    state = app.state.specdec

    async def drive():
        startup_in, startup_out = asyncio.Queue(), asyncio.Queue()
        await startup_in.put({"type": "lifespan.startup"})
        lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                           startup_in.get, startup_out.put))
        assert (await asyncio.wait_for(startup_out.get(), 10))["type"] == "lifespan.startup.complete"
        body = json.dumps(COMPLETION | {"max_tokens": 100_000, "stream": True}).encode()
        parts, reading, forever = [body], asyncio.Event(), asyncio.Event()

        async def receive():
            if parts:
                return {"type": "http.request", "body": parts.pop(), "more_body": False}
            await forever.wait()

        chunks = []

        async def send(message):
            if message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if len(chunks) == 2:
                    await reading.wait()  # the reader stops here

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
                 "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
                 "server": ("127.0.0.1", 8000), "headers": [(b"host", b"127.0.0.1:8000"),
                 (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
        request = asyncio.create_task(app(scope, receive, send))
        deadline = time.monotonic() + 15
        while 'kind="slow_client"' not in state.metrics.exposition().decode() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        while state.engine.queue != (0, 0) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        dropped = state.engine.queue
        reading.set()  # the reader comes back: it gets what was queued, an error event, and the end
        await asyncio.wait_for(request, 10)
        await startup_in.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(lifespan, 15)
        return dropped, b"".join(chunks).decode()

    dropped, text = asyncio.run(drive())
    assert dropped == (0, 0)
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "slow_client"
    assert len(events) <= 8 + 4  # what was queued when it overflowed, no more
    assert 'specdec_request_errors_total{kind="slow_client"} 1.0' in state.metrics.exposition().decode()


# ----------------------------------------------------------------------------- SIGTERM


@pytest.mark.parametrize("command", [["serve", "--toy"], ["explore", "--toy"]])
def test_sigterm_is_a_graceful_exit_with_status_0(command):
    proc = subprocess.Popen([sys.executable, "-m", "specdec", *command, "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        lines = []
        while not any("http://127.0.0.1:" in line for line in lines):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        url = next(word for line in lines for word in line.split() if word.startswith("http://127.0.0.1:"))
        base = url.split("/v1")[0].split("/explorer")[0].rstrip("/")
        path = "/health" if command[0] == "serve" else "/api/health"
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(base + path, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
