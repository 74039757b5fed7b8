"""The explorer's JSON and event-stream API, without a browser: a real server on an ephemeral port."""

import argparse
import http.client
import json
import socket
import threading
import time

import pytest
from conftest import start_explorer

from specdec import theory
from specdec.decode import autoregressive_generate, speculative_generate
from specdec.explorer import Explorer, make_explorer
from specdec.models.bigram import BigramModel
from specdec.models.toy import TOY_TARGET, TOY_WORDS, WORKED_TARGET, ToyPair, toy_models
from specdec.sampling import SamplingParams
from specdec.session import RunSettings, generate


def request(srv, method, path, body=None, headers=None, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    hdrs = {"Content-Type": "application/json"} if body is not None or raw is not None else {}
    hdrs.update(headers or {})
    if raw is None and body is not None:
        raw = json.dumps(body)
    conn.request(method, path, body=raw, headers=hdrs)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    kind = response.getheader("Content-Type", "")
    return response.status, (json.loads(data) if kind.startswith("application/json") else data)


def live_events(srv, body, stop_after=None):
    """POST /api/live and parse the event stream into [(event, data)]; optionally hang up early."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.request("POST", "/api/live", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    assert response.getheader("Content-Type").startswith("text/event-stream")
    events, event = [], None
    while True:
        line = response.readline().decode("utf-8")
        if not line:
            break
        if line.startswith("event: "):
            event = line[7:].strip()
        elif line.startswith("data: "):
            events.append((event, json.loads(line[6:])))
            if stop_after is not None and sum(e == stop_after for e, _ in events) >= 1:
                break
    conn.close()
    return events


def text_of(events, mode):
    return "".join(p["text"] for e, d in events if e == "round" and d["mode"] == mode for p in d["pieces"])


# --------------------------------------------------------------------------- page, binding


def test_binds_to_loopback_by_default_and_serves_the_page(server):
    assert server.sock.getsockname()[0] == "127.0.0.1"
    status, page = request(server, "GET", "/")
    assert status == 200 and b"Run one round" in page and b"10,000 draws" in page
    for name in ("app.js", "live.js", "charts.js", "style.css"):
        assert request(server, "GET", f"/static/{name}")[0] == 200
    assert request(server, "GET", "/static/../server.py")[0] == 404
    assert request(server, "GET", "/static/%2e%2e%2fserver.py")[0] == 404


def test_requests_addressed_to_another_host_are_refused(server):
    status, data = request(server, "GET", "/api/info", headers={"Host": "evil.example:80"})
    assert status == 403 and "error" in data
    assert request(server, "GET", "/api/info", headers={"Host": f"localhost:{server.port}"})[0] == 200


# --------------------------------------------------------------------------- figure 1: toy rounds


def test_toy_rounds_count_and_classify_tokens(server):
    status, data = request(server, "POST", "/api/toy/reset", {})
    assert status == 200 and data["words"] == ["the"] and data["target_runs"] == 0
    session, produced = data["session"], 0
    for i in range(1, 13):
        status, r = request(server, "POST", "/api/toy/round", {"session": session, "gamma": 1 + i % 8})
        assert status == 200
        statuses = [d["status"] for d in r["drafts"]]
        n = r["n_accepted"]
        assert len(statuses) == 1 + i % 8
        assert statuses[:n] == ["accepted"] * n
        if r["next"]["kind"] == "bonus":
            assert n == len(statuses)
        else:
            assert statuses[n] == "rejected" and set(statuses[n + 1:]) <= {"unchecked"}
        produced += n + 1
        assert r["target_runs"] == i and r["tokens"] == produced == len(r["words"]) - 1
        assert all(w in TOY_WORDS for w in r["words"])
        for d in r["drafts"]:
            assert 0 <= d["keep"] <= 1


def test_a_toy_round_is_the_engines_round():
    # With the same seed, the server's first round is the first round of speculative_generate.
    srv = start_explorer()
    try:
        for seed in range(5):
            _, data = request(srv, "POST", "/api/toy/reset", {"seed": seed})
            _, r = request(srv, "POST", "/api/toy/round", {"session": data["session"], "gamma": 4})
            target, draft = toy_models()
            gen = speculative_generate(target, draft, [0], max_new_tokens=5, gamma=4, seed=seed)
            first = gen.stats.records[0]
            assert [d["word"] for d in r["drafts"]] == [TOY_WORDS[t] for t in first.drafted]
            assert r["n_accepted"] == first.n_accepted and r["next"]["kind"] == first.kind
            assert r["next"]["word"] == TOY_WORDS[first.next_token]
    finally:
        srv.stop()


def test_toy_pair_is_a_bit_off():
    target, draft = toy_models()
    betas = [theory.beta(target.probs[i].numpy(), draft.probs[i].numpy()) for i in range(len(TOY_WORDS))]
    assert 0.85 <= min(betas) and max(betas) <= 1.0 and min(betas) < 1.0


# --------------------------------------------------------------------------- figures 2 and 3


def test_draws_match_the_target_distribution(server):
    status, data = request(server, "GET", "/api/draws?n=10000&seed=0")
    assert status == 200 and data["words"] == ["cat", "dog", "fish"]
    assert sum(data["accepted"]) + sum(data["recovered"]) == 10_000
    for observed, p in zip(data["observed"], WORKED_TARGET, strict=True):
        assert abs(observed - p) < 0.02
    assert data["recovered"][0] == data["recovered"][2] == 0  # the residual is all on "dog"


@pytest.mark.parametrize("alpha,c", [(0.8, 0.05), (0.4, 0.1), (0.9, 0.0), (0.95, 0.02), (0.3, 0.5)])
def test_plan_follows_theory(server, alpha, c):
    status, data = request(server, "GET", f"/api/plan?alpha={alpha}&c={c}&max_gamma=16")
    assert status == 200
    assert data["best_gamma"] == theory.optimal_gamma(alpha, c, max_gamma=16)
    for row, expected in zip(data["rows"], theory.plan(alpha, c, max_gamma=16), strict=True):
        assert row["speedup"] == pytest.approx(expected.speedup)
        assert row["arithmetic"] == pytest.approx(expected.arithmetic)


# --------------------------------------------------------------------------- malformed requests

BAD = [
    ("POST", "/api/toy/round", None, b"{not json", "application/json"),
    ("POST", "/api/toy/round", None, b"[1, 2]", "application/json"),
    ("POST", "/api/toy/round", None, b'{"gamma": 2}', "text/plain"),
    ("POST", "/api/toy/round", {"session": "x", "gamma": "many"}, None, None),
    ("POST", "/api/toy/round", {"session": "x", "gamma": True}, None, None),
    ("POST", "/api/toy/round", {"session": "x", "gamma": 0}, None, None),
    ("POST", "/api/toy/round", {"gamma": 2}, None, None),
    ("POST", "/api/toy/reset", {"seed": -1}, None, None),
    ("GET", "/api/plan?alpha=nan", None, None, None),
    ("GET", "/api/plan?alpha=1", None, None, None),
    ("GET", "/api/plan?alpha=0.5&c=abc", None, None, None),
    ("GET", "/api/draws?n=0", None, None, None),
    ("GET", "/api/draws?seed=x", None, None, None),
    ("POST", "/api/live", {}, None, None),
    ("POST", "/api/live", {"prompt": "   "}, None, None),
    ("POST", "/api/live", {"messages": []}, None, None),
    ("POST", "/api/live", {"prompt": "the cat", "speculative": {"gamma": 0}}, None, None),
    ("POST", "/api/live", {"prompt": "the cat", "max_tokens": 0}, None, None),
    ("POST", "/api/live", {"prompt": "the cat", "temperature": -1}, None, None),
    ("POST", "/api/live", {"prompt": "the cat", "compare": "maybe"}, None, None),
    ("POST", "/api/live", {"prompt": "the cat", "n": 2}, None, None),
]


@pytest.mark.parametrize("method,path,body,raw,kind", BAD)
def test_malformed_requests_get_400_and_the_server_keeps_serving(server, method, path, body, raw, kind):
    headers = {"Content-Type": kind} if kind else None
    status, data = request(server, method, path, body, headers=headers, raw=raw)
    assert status == 400, data
    assert isinstance(data, dict) and data["error"]
    assert request(server, "GET", "/api/health")[1]["ok"] is True


def test_unknown_toy_word_is_a_400_once_the_pair_is_loaded(server):
    live_events(server, {"prompt": "the cat", "max_tokens": 2})  # loads the toy pair
    status, data = request(server, "POST", "/api/live", {"prompt": "the zebra"})
    assert status == 400 and "zebra" in data["error"]


def test_oversized_and_garbage_requests(server):
    assert request(server, "POST", "/api/toy/reset", headers={"Content-Length": str(10**9)}, raw=b"")[0] == 400
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"NONSENSE\r\n\r\n")
        assert b"400" in sock.recv(200).split(b"\r\n")[0]
    assert request(server, "GET", "/api/nowhere")[0] == 404
    assert request(server, "GET", "/api/health")[0] == 200


# --------------------------------------------------------------------------- live


def test_live_stream_is_the_engines_generation(server):
    body = {"prompt": "the dog", "speculative": {"gamma": 3}, "max_tokens": 20, "seed": 7, "temperature": 1.0,
            "compare": True}
    events = live_events(server, body)
    kinds = [e for e, _ in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and "error" not in kinds
    pair, prompt = ToyPair(), ToyPair().encode("the dog")
    spec = speculative_generate(pair.target, pair.draft, prompt, max_new_tokens=20, gamma=3, seed=7)
    plain = autoregressive_generate(pair.target, prompt, max_new_tokens=20, seed=7)
    assert text_of(events, "speculative") == pair.decode(spec.tokens)
    assert text_of(events, "plain") == pair.decode(plain.tokens)
    done = {d["mode"]: d for e, d in events if e == "done"}
    assert done["speculative"]["tokens"] == 20 and done["speculative"]["target_calls"] == spec.stats.rounds
    assert done["speculative"]["alpha"] == pytest.approx(spec.stats.alpha)
    spec_kinds = {p["kind"] for e, d in events if e == "round" and d["mode"] == "speculative" for p in d["pieces"]}
    assert spec_kinds <= {"accepted", "recovered", "bonus"} and "accepted" in spec_kinds


@pytest.mark.parametrize("draft, gamma", [("lookup", "auto"), ("lookup+model", "heuristic"), ("model", "auto"),
                                          ("lookup", 2)])
def test_live_stream_takes_any_drafter_and_gamma_policy(server, draft, gamma):
    """The live view runs on the server's engine: the same drafter spec and γ policy as the CLI's run path.

    γ auto chooses from measured call times, so the server's run and this one may choose other γ:
    those runs are greedy (the text is then the same whatever γ) and only their text is compared;
    the deterministic policies sample at temperature 1 and must match figure for figure."""
    prompt_text = "the cat sat on the mat. the cat sat on the"
    temperature = 0.0 if gamma == "auto" else 1.0
    body = {"prompt": prompt_text, "speculative": {"draft": draft, "gamma": gamma}, "max_tokens": 24, "seed": 3,
            "temperature": temperature}
    events = live_events(server, body)
    assert [e for e, _ in events][-1] == "end" and "error" not in [e for e, _ in events]
    start = next(d for e, d in events if e == "start")
    assert start["gamma"] == gamma and start["draft"] == draft
    pair = ToyPair()
    settings = RunSettings(gamma=gamma, max_new_tokens=24, sampling=SamplingParams(temperature=temperature), seed=3,
                           draft=draft)
    expected = generate(pair, pair.encode(prompt_text), settings)
    assert text_of(events, "speculative") == pair.decode(expected.generation.tokens)
    done = next(d for e, d in events if e == "done")
    s = expected.generation.stats
    assert done["tokens"] == s.new_tokens == 24 and done["drafter"] == expected.drafter
    if gamma == "auto":
        # the engine prices each step for the whole batch: γ 0 (plainly decoded) is a valid choice there
        assert done["gamma_chosen"] and all(0 <= g <= 16 for g in done["gamma_chosen"])
    else:
        assert done["target_calls"] == s.target_calls
        assert done["alpha"] == s.alpha and done["mean_gamma"] == s.mean_gamma
        assert done["gamma_chosen"] == list(expected.gamma_chosen)
    if draft == "lookup":
        assert done["drafter"].startswith("prompt lookup")


@pytest.fixture(scope="module")
def serve_server():
    """``specdec serve``'s app on the toy pair with the explorer added, as the CLI builds it."""
    from specdec.explorer import add_explorer
    from specdec.server import create_app as create_serve_app
    from specdec.server.runner import ServerThread

    app = create_serve_app(pair=ToyPair())
    add_explorer(app)
    with ServerThread(app) as srv:
        yield srv


@pytest.mark.parametrize("speculative, fragment", [
    ({"gamma": "fast"}, "speculative.gamma='fast'"), ({"gamma": 65}, "speculative.gamma=65"),
    ({"gamma": True}, "speculative.gamma"),
    ({"draft": "ngram:/nonexistent/table.ngram"}, "ngram:/nonexistent/table.ngram"),
    ({"draft": "nonsense:x"}, "nonsense:x"), ({"draft": 5}, "speculative.draft=5"), ({"draft": ""}, "draft=''"),
])
def test_bad_live_draft_or_gamma_is_a_400_naming_it_as_the_openai_routes_do(server, serve_server, speculative,
                                                                             fragment):
    """One validation: the live view's refusal is the OpenAI route's, word for word."""
    body = {"prompt": "the cat", "speculative": speculative}
    status, data = request(server, "POST", "/api/live", body)
    assert status == 400 and fragment in data["error"], data
    status, answer = request(serve_server, "POST", "/v1/completions", body)
    assert status == 400 and answer["error"]["message"] == data["error"]


class DraftlessToyPair(ToyPair):
    """A pair loaded for a model-free drafter (explore --draft lookup): no draft model."""

    def __init__(self):
        super().__init__()
        self.draft = None


def test_a_pair_without_draft_model_serves_lookup_and_refuses_model():
    srv = start_explorer(Explorer(DraftlessToyPair, "a draftless pair"))
    try:
        events = live_events(srv, {"prompt": "the cat sat on the mat. the cat", "speculative": {"draft": "lookup"},
                                   "max_tokens": 8})
        assert events[-1][0] == "end"
        for draft in ("model", "lookup+model"):
            status, data = request(srv, "POST", "/api/live", {"prompt": "the cat", "speculative": {"draft": draft}})
            assert status == 400 and repr(draft) in data["error"] and "draft model" in data["error"], data
    finally:
        srv.stop()


class SlowBigram(BigramModel):
    """A toy target that takes a while per call, so that streams overlap and can be interrupted."""

    calls = 0

    def score(self, tokens):
        SlowBigram.calls += 1
        time.sleep(0.02)
        return super().score(tokens)


class SlowToyPair(ToyPair):
    def __init__(self):
        super().__init__()
        self.target = SlowBigram(TOY_TARGET)


@pytest.fixture
def slow_server():
    srv = start_explorer(Explorer(SlowToyPair, "a slow toy pair"))
    yield srv
    srv.stop()


def wait_idle(srv, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if request(srv, "GET", "/api/health")[1]["live_active"] == 0:
            return True
        time.sleep(0.05)
    return False


def test_two_concurrent_streams_do_not_mix(slow_server):
    bodies = [{"prompt": "the cat", "speculative": {"gamma": 2}, "max_tokens": 24, "seed": 1, "temperature": 1.0},
              {"prompt": "the dog ran", "speculative": {"gamma": 5}, "max_tokens": 30, "seed": 2, "temperature": 1.0,
               "compare": True}]
    results = [None, None]

    def read(i):
        results[i] = live_events(slow_server, bodies[i])

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for body, events in zip(bodies, results, strict=True):
        pair = ToyPair()
        prompt = pair.encode(body["prompt"])
        gamma = body["speculative"]["gamma"]
        spec = speculative_generate(pair.target, pair.draft, prompt, max_new_tokens=body["max_tokens"],
                                    gamma=gamma, seed=body["seed"])
        assert text_of(events, "speculative") == pair.decode(spec.tokens)
        assert {d["gamma"] for e, d in events if e == "start"} == {gamma}
        assert events[-1][0] == "end"
    plain = autoregressive_generate(ToyPair().target, ToyPair().encode("the dog ran"), max_new_tokens=30, seed=2)
    assert text_of(results[1], "plain") == ToyPair().decode(plain.tokens) and not text_of(results[0], "plain")
    assert wait_idle(slow_server) and request(slow_server, "GET", "/api/health")[1]["live_finished"] == 2


def test_a_reader_hanging_up_stops_its_generation(slow_server):
    SlowBigram.calls = 0
    events = live_events(slow_server, {"prompt": "the", "speculative": {"gamma": 1}, "max_tokens": 400, "seed": 0},
                         stop_after="round")
    assert events[-1][0] == "round"
    assert wait_idle(slow_server, timeout=5.0), "the generation went on after the reader left"
    calls = SlowBigram.calls
    assert calls < 100  # a full run needs at least 200 target calls
    time.sleep(0.2)
    assert SlowBigram.calls == calls
    assert request(slow_server, "GET", "/api/health")[1]["live_finished"] == 1


def test_real_pair_is_loaded_lazily_and_its_failure_is_reported():
    srv = start_explorer(make_explorer(toy=False, target="/nonexistent/model.gguf"))
    try:
        assert request(srv, "GET", "/api/info")[1]["live"] == {
            "label": "target /nonexistent/model.gguf with draft default", "loaded": False, "toy": False}
        events = live_events(srv, {"prompt": "hello", "max_tokens": 4})
        assert events[0][0] == "status" and events[-1][0] == "error" and events[-1][1]["message"]
        assert request(srv, "GET", "/api/health")[1]["ok"] is True
    finally:
        srv.stop()


def metric(srv, name):
    """One sample's value from the server's /metrics."""
    _, text = request(srv, "GET", "/metrics")
    line = next(line for line in text.decode().splitlines() if line.startswith(name + " "))
    return float(line.split()[-1])


def test_live_view_in_serve_runs_on_the_servers_engine_and_streams_what_the_api_answers(serve_server):
    """``specdec serve``: the live view is a client of the server's engine, and the same request gives
    the same tokens on both routes (greedy)."""
    assert request(serve_server, "GET", "/api/info")[1]["live"] == {
        "label": "the server's model pair", "loaded": True, "toy": True}
    for body in ({"prompt": "the cat sat", "max_tokens": 30, "temperature": 0,
                  "speculative": {"draft": "lookup+model", "gamma": 3}},
                 {"messages": [{"role": "user", "content": "the dog ran"}], "max_tokens": 17, "temperature": 0,
                  "speculative": {"gamma": "auto"}}):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        status, answer = request(serve_server, "POST", path, body)
        assert status == 200, answer
        choice = answer["choices"][0]
        text = choice["message"]["content"] if "messages" in body else choice["text"]
        tokens_before = metric(serve_server, "specdec_generation_tokens_total")
        events = live_events(serve_server, body)
        assert events[-1][0] == "end" and text_of(events, "speculative") == text
        done = next(d for e, d in events if e == "done")
        assert done["text"] == text and done["tokens"] == answer["usage"]["completion_tokens"]
        # the server's engine ran it: its metrics count the live request's tokens
        assert metric(serve_server, "specdec_generation_tokens_total") == tokens_before + done["tokens"]


def test_live_view_in_serve_refuses_what_the_api_refuses(serve_server):
    for speculative in ({"draft": "ngram:/etc/passwd"}, {"draft": "telepathy"}, {"gamma": 0}):
        body = {"prompt": "the", "speculative": speculative}
        status, data = request(serve_server, "POST", "/api/live", body)
        assert status == 400, data
        assert request(serve_server, "POST", "/v1/completions", body)[1]["error"]["message"] == data["error"]


class ToyTarget:
    """A model pair of one tiny random-weight transformers target (no draft model), for plain runs."""

    def __init__(self):
        from conftest import tiny_qwen

        from specdec.models.hf import HFModel

        self.target, self.draft, self.eos_token_ids = HFModel(tiny_qwen(seed=0)), None, [7]

    def decode(self, ids):
        return " ".join(str(t) for t in ids)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_plain_run_on_the_engine_is_autoregressive_generate_token_for_token(temperature):
    """Compare mode's plain decoding (``PlainSequenceRun``) through the engine, taking turns with a speculative
    job on the same model: greedy, token for token; seeded, draw for draw."""
    import queue

    from specdec.server.engine import Engine, Finished, Job
    from specdec.server.engine.runs import PlainSequenceRun, SequenceRun
    from specdec.server.metrics import Metrics
    from specdec.server.text import Texts, TextTracker

    pair = ToyTarget()
    sampling = SamplingParams(temperature=temperature)
    prompts = [[3, 14, 15, 92, 65], [2, 71, 82]]
    engine = Engine(pair, Metrics()).start()
    try:
        jobs, done = [], queue.Queue()
        for i, ids in enumerate(prompts):
            settings = RunSettings(gamma=3, max_new_tokens=40, sampling=sampling, seed=11 + i, draft="lookup")
            slots = engine.slot_pair()
            run = PlainSequenceRun(slots, ids, settings) if i == 0 else SequenceRun(slots, ids, settings)
            jobs.append(Job(run, TextTracker(Texts(pair), []), post=lambda e: done.put(e) if isinstance(e, Finished)
                            else None))
        for job in jobs:
            engine.submit(job)
        assert [done.get(timeout=30).reason for _ in jobs]
    finally:
        engine.close()
    expected = autoregressive_generate(pair.target, prompts[0], max_new_tokens=40, sampling=sampling, seed=11,
                                       eos_token_id=[7])
    plain = jobs[0].run
    assert plain.new_tokens == expected.tokens and plain.ended_by_eos == (expected.tokens[-1:] == [7])
    assert plain.figures()["target_calls"] == len(expected.tokens) and plain.figures()["drafted"] == 0


# --------------------------------------------------------------------------- CLI


def test_cli_parser_defaults_and_busy_port():
    from specdec.cli import explore

    parser = argparse.ArgumentParser(prog="specdec")
    explore.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["explore", "--toy"])
    assert (args.host, args.port, args.open, args.toy) == ("127.0.0.1", 8765, False, True)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        args = parser.parse_args(["explore", "--toy", "--port", str(busy.getsockname()[1])])
        with pytest.raises(ValueError, match="cannot listen"):
            args.run(args)


def test_unknown_paths_and_methods_answer_in_the_apis_shape(server):
    status, data = request(server, "GET", "/api/nowhere")
    assert status == 404 and data["error"] == "nothing at /api/nowhere"
    status, data = request(server, "GET", "/api/toy/round")
    assert status == 405 and "GET" in data["error"]


def test_specdec_serve_app_serves_the_explorer_too():
    """``specdec serve`` adds the explorer's routes to its OpenAI app: one server, one stack."""
    from specdec.explorer import add_explorer
    from specdec.server import create_app as create_serve_app
    from specdec.server.runner import ServerThread

    app = create_serve_app(pair=ToyPair())
    add_explorer(app)
    with ServerThread(app) as srv:
        status, page = request(srv, "GET", "/explorer")
        assert status == 200 and b"Run one round" in page
        assert request(srv, "GET", "/static/live.js")[0] == 200
        assert request(srv, "GET", "/api/plan?alpha=0.8&c=0.05")[1]["best_gamma"] == theory.optimal_gamma(0.8, 0.05)
        status, data = request(srv, "GET", "/api/plan?alpha=nan")
        assert status == 400 and "alpha" in data["error"]
        assert live_events(srv, {"prompt": "the cat", "max_tokens": 6, "seed": 1})[-1][0] == "end"
        assert request(srv, "GET", "/api/info", headers={"Host": "evil.example"})[0] == 403
        status, data = request(srv, "GET", "/v1/models")
        assert status == 200 and data["data"]


def test_specdec_explore_serves_until_ctrl_c():
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "specdec", "explore", "--toy", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ | {
                                "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("specdec explorer at http://127.0.0.1:"), (line, proc.stderr.read())
        port = int(line.split()[3].rsplit(":", 1)[1].rstrip("/"))
        deadline = time.monotonic() + 20
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/api/health")
                assert json.loads(conn.getresponse().read())["ok"] is True
                conn.close()
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
