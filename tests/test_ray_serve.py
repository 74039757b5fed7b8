"""specdec on Ray Serve (``server.replicas``): two replicas of the toy pair (its target slowed to 40 ms a
call, so streams overlap) behind Ray's HTTP proxy on 127.0.0.1, one local Ray instance for the module.

Asserts answers equal ``session.generate``'s (whole and streamed), that follow-ups sharing a prompt's start
land on the replica that read it (Ray's prefix router), and the faults: a replica killed mid-stream ends its
streams with an error event and ``[DONE]`` while the other's finish, new requests are answered, and Ray
starts a replica in its place. Bounded: a few dozen requests, every wait with a deadline.
"""

import json
import random
import socket
import sys
import threading
import time

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from specdec.models.bigram import BigramModel  # noqa: E402
from specdec.models.toy import TOY_TARGET, ToyPair  # noqa: E402
from specdec.sampling import SamplingParams  # noqa: E402
from specdec.server import ServeConfig  # noqa: E402
from specdec.server.replicas import REPLICA_HEADER, RaySettings, ReplicaSettings, routing_text, start  # noqa: E402
from specdec.session import RunSettings, generate  # noqa: E402

DELAY = 0.04  # seconds per target call in the replicas
DEFAULTS = RunSettings(gamma=3, max_new_tokens=16, sampling=SamplingParams(temperature=0.0))


class SlowTarget(BigramModel):
    def score(self, tokens):
        time.sleep(DELAY)
        return super().score(tokens)


def slow_pair() -> ToyPair:
    pair = ToyPair()
    pair.target = SlowTarget(TOY_TARGET)
    return pair


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the replicas build slow_pair
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        settings = ReplicaSettings(ServeConfig(model_names=("specdec",), defaults=DEFAULTS), make_pair=slow_pair)
        start(settings, RaySettings(replicas=2, cpus_per_replica=1.0, health_period_s=1.0), port=port)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def expected(prompt: str, n: int) -> str:
    pair = ToyPair()
    settings = RunSettings(gamma=3, max_new_tokens=n, sampling=SamplingParams(temperature=0.0))
    return pair.decode(generate(pair, pair.encode(prompt), settings).generation.tokens)


def events(lines) -> list:
    return [line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]) for line in lines if line.startswith("data: ")]


def test_whole_and_streamed_answers_equal_generate(url):
    assert httpx.get(url + "/health", timeout=10).json() == {"status": "ok"}
    r = httpx.post(url + "/v1/completions", json={"prompt": "the dog", "max_tokens": 12}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected("the dog", 12)
    assert r.headers[REPLICA_HEADER]
    body = {"prompt": "the cat sat", "max_tokens": 12, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as s:
        got = events(s.iter_lines())
    assert got[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in got[:-1]) == expected("the cat sat", 12)
    bad = httpx.post(url + "/v1/completions", json={"prompt": "the", "top_p": 7}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_p"  # the replica's own checks
    assert "specdec_num_requests_waiting" in httpx.get(url + "/metrics", timeout=10).text


def test_follow_ups_land_on_the_replica_that_read_the_prefix(url):
    """All contexts first, then their follow-ups: random routing (``pow2``) misses about half of them."""
    words = ("the", "cat", "dog", "sat", "ran", "on", "mat", ".")
    rng = random.Random(7)
    contexts = [" ".join(rng.choice(words) for _ in range(40)) + " " for _ in range(6)]
    with httpx.Client(base_url=url, timeout=30) as http:
        homes = [http.post("/v1/completions", json={"prompt": c, "max_tokens": 2}).headers[REPLICA_HEADER]
                 for c in contexts]
        assert len(set(homes)) == 2, f"every context went to {set(homes)}"
        hits = tries = 0
        for follow in ("the dog", "on the mat"):
            for context, home in zip(contexts, homes, strict=True):
                r = http.post("/v1/completions", json={"prompt": context + follow, "max_tokens": 2})
                assert r.status_code == 200, r.text
                hits, tries = hits + (r.headers[REPLICA_HEADER] == home), tries + 1
    assert hits == tries, f"{hits} of {tries} follow-ups reached the replica holding their prefix"


def test_routing_text_is_the_prompt_or_the_messages():
    assert routing_text("/v1/completions", b'{"prompt": "abc"}') == "abc"
    messages = [{"role": "system", "content": "sys "}, {"role": "user", "content": [{"type": "text", "text": "q"}]}]
    assert routing_text("/v1/chat/completions", json.dumps({"messages": messages}).encode()) == "sys q"
    assert routing_text("/v1/models", b"") == "/v1/models"
    assert routing_text("/v1/completions", b"{oops") == "/v1/completions"


def open_stream(url: str, prompt: str, out: dict, key: int) -> None:
    """One long stream, read to its end (or its error); what came back in ``out[key]``."""
    body = {"prompt": prompt, "max_tokens": 150, "stream": True}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=20)) as s:
            out[key] = {"replica": s.headers.get(REPLICA_HEADER), "events": []}
            for line in s.iter_lines():
                if line.startswith("data: "):
                    out[key]["events"].append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    except Exception as err:  # a hang ends in a read timeout: the test fails on it below
        out.setdefault(key, {"replica": None, "events": []})["exception"] = repr(err)


def ray_replica_ids() -> set[str]:
    return {a["name"].rsplit("#", 1)[-1] for a in ray.util.list_named_actors(all_namespaces=True)
            if "SpecdecReplica#" in a["name"]}


def kill_replica(rid: str) -> None:
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["name"].endswith(f"SpecdecReplica#{rid}"):
            ray.kill(ray.get_actor(a["name"], namespace=a["namespace"]), no_restart=True)
            return
    raise AssertionError(f"no actor for replica {rid}")


def test_a_replica_killed_mid_stream(url):
    before = ray_replica_ids()
    assert len(before) == 2
    prompts = ["the dog", "cat", "on the mat", "the cat sat", ". the dog ran", "sat on the"]
    out: dict = {}
    threads = [threading.Thread(target=open_stream, args=(url, p, out, i), daemon=True) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
        time.sleep(0.1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (len(out) == len(prompts) and all(o["events"] for o in out.values())):
        time.sleep(0.05)
    on = {o["replica"] for o in out.values()}
    assert len(on) == 2, f"the streams all went to {on}: cannot kill one replica of two"
    victim = sorted(on)[0]
    # a whole answer asked of the victim (its prefix) just before it dies: sent again to the live one
    whole_prompt = next(prompts[i] for i, o in out.items() if o["replica"] == victim) + " the"
    whole: dict = {}

    def ask_whole() -> None:
        whole["r"] = httpx.post(url + "/v1/completions", json={"prompt": whole_prompt, "max_tokens": 150}, timeout=40)

    asker = threading.Thread(target=ask_whole, daemon=True)
    asker.start()
    time.sleep(0.3)
    kill_replica(victim)
    for t in [*threads, asker]:
        t.join(40)
    assert not any(t.is_alive() for t in [*threads, asker]), "a request hung"
    assert whole["r"].status_code == 200, whole["r"].text
    assert whole["r"].json()["choices"][0]["text"] == expected(whole_prompt, 150)
    for i, o in out.items():
        assert "exception" not in o, (prompts[i], o)
        assert o["events"][-1] == "[DONE]", (prompts[i], o["events"][-2:])
        last = o["events"][-2]
        if o["replica"] == victim:
            assert last["error"]["code"] == "replica_failed", last
        else:
            assert last["choices"][0]["finish_reason"] == "length", last
            assert "".join(e["choices"][0]["text"] for e in o["events"][:-1]) == expected(prompts[i], 150)
    with httpx.Client(base_url=url, timeout=30) as http:  # new requests: answered, by live replicas
        for prompt in prompts:
            r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 3})
            assert r.status_code == 200, r.text
            assert r.headers[REPLICA_HEADER] != victim
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = ray_replica_ids()
        if len(now) == 2 and victim not in now and serve.status().applications["specdec"].status == "RUNNING":
            break
        time.sleep(0.5)
    now = ray_replica_ids()
    assert len(now) == 2 and victim not in now, f"Ray did not replace {victim}: {now}"


# ----------------------------------------------------------------------------- without a Ray cluster


def routed(path: str, payload: dict | None = None):
    from specdec.server.replicas import Routed

    body = json.dumps(payload).encode() if payload is not None else b""
    return Routed("POST" if payload is not None else "GET", path, b"",
                  ((b"host", b"127.0.0.1"), (b"content-type", b"application/json")), body, path)


def test_a_replica_whose_caller_leaves_mid_stream_drops_the_job():
    import asyncio

    from specdec.server import create_app
    from specdec.server.replicas import call_asgi

    app = create_app(ServeConfig(model_names=("specdec",), defaults=DEFAULTS))
    app.state.specdec.attach(slow_pair())

    async def leave_after_two_events():
        stream = call_asgi(app, routed("/v1/completions", {"prompt": "the", "max_tokens": 1000, "stream": True}))
        got = []
        async for message in stream:
            got.append(message)
            if sum(m["type"] == "http.response.body" and bool(m.get("body")) for m in got) >= 2:
                break
        await stream.aclose()
        deadline = time.monotonic() + 3  # it would take ~15 s to finish; the loop lives on, as a replica's does
        while app.state.specdec.engine.queue != (0, 0) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return got, app.state.specdec.engine.queue

    try:
        got, queue = asyncio.run(leave_after_two_events())
        assert got[0]["type"] == "http.response.start" and got[0]["status"] == 200
        assert queue == (0, 0), "the job of a caller that left is still there"
    finally:
        app.state.specdec.close()


def test_health_check_fails_until_the_pair_is_loaded():
    import asyncio

    from specdec.server import create_app
    from specdec.server.replicas import SpecdecReplica

    replica = object.__new__(SpecdecReplica)  # its __init__ asks Ray which replica it is
    replica.app = create_app(ServeConfig(model_names=("specdec",)))
    with pytest.raises(RuntimeError, match="GET /health answered 503"):
        asyncio.run(replica.check_health())
    replica.app.state.specdec.attach(ToyPair())
    try:
        asyncio.run(replica.check_health())
    finally:
        replica.app.state.specdec.close()


def test_relay_ends_a_broken_stream_with_an_error_event_and_done():
    import asyncio

    from specdec.server.replicas import relay

    class Broken:
        def __init__(self, items, error):
            self.items, self.error, self.cancelled = list(items), error, False

        def __aiter__(self):
            return self

        async def __anext__(self):
            if self.items:
                return self.items.pop(0)
            if self.error:
                raise self.error
            raise StopAsyncIteration

        def cancel(self):
            self.cancelled = True

    async def collect(answer):
        return [chunk async for chunk in relay(answer)]

    broken = Broken([("body", b'data: {"x": 1}\n\n')], ConnectionError("gone"))
    chunks = asyncio.run(collect(broken))
    assert chunks[0] == b'data: {"x": 1}\n\n' and chunks[-1] == b"data: [DONE]\n\n"
    assert json.loads(chunks[1][6:])["error"]["code"] == "replica_failed" and broken.cancelled
    whole = Broken([("body", b'data: {"x": 1}\n\n'), ("body", b"data: [DONE]\n\n")], None)
    assert asyncio.run(collect(whole)) == [b'data: {"x": 1}\n\n', b"data: [DONE]\n\n"]  # nothing added
