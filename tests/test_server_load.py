"""Load and faults, bounded in time, loopback only: 8 concurrent streaming clients × several requests of
mixed lengths, some hanging up mid-stream, malformed requests interleaved.

Asserts that every well-formed request got its complete answer (greedy: exactly ``session.generate``'s
text) or a clear 4xx error, that nothing was answered 5xx, that the server stays healthy with no
job left behind, and that the process's memory (RSS) is back within ±10% of its level before.
"""

import gc
import json
import pathlib
import threading
import time

import httpx
import pytest

from specdec.models.bigram import BigramModel
from specdec.models.toy import TOY_TARGET, ToyPair
from specdec.sampling import SamplingParams
from specdec.server import ServeConfig, create_app
from specdec.server.runner import ServerThread
from specdec.session import RunSettings, generate

CLIENTS, REQUESTS = 8, 4
PROMPTS = ("the", "the dog", "the cat sat", "on the mat", ". the dog ran")
LENGTHS = (5, 60, 200, 20, 120)
MALFORMED = (b"{oops", b'{"prompt": "the", "max_tokens": -1}', b'{"prompt": "the", "top_p": 2}',
             b'{"prompt": "unicorn"}', b'{"prompt": "the", "n": 3}', b"[]")
SETTINGS = RunSettings(gamma=3, max_new_tokens=16, sampling=SamplingParams(temperature=0.0), seed=None)


class SlowTarget(BigramModel):
    """The toy target at 2 ms a call, so that the clients' requests really overlap."""

    def score(self, tokens):
        time.sleep(0.002)
        return super().score(tokens)


def slow_pair() -> ToyPair:
    pair = ToyPair()
    pair.target = SlowTarget(TOY_TARGET)
    return pair


def rss_bytes() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def expected(prompt: str, n: int) -> str:
    pair = ToyPair()
    settings = RunSettings(gamma=3, max_new_tokens=n, sampling=SamplingParams(temperature=0.0))
    return pair.decode(generate(pair, pair.encode(prompt), settings).generation.tokens)


def plan(client: int, j: int) -> str:
    k = client * REQUESTS + j
    return "malformed" if k % 5 == 3 else "drop" if k % 7 == 2 else "full"


def one_client(url: str, client: int, outcomes: list, wanted: dict) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        for j in range(REQUESTS):
            k = client * REQUESTS + j
            prompt, n = PROMPTS[k % len(PROMPTS)], LENGTHS[k % len(LENGTHS)]
            kind = plan(client, j)
            try:
                outcomes.append((kind, *run_one(http, kind, prompt, n, k, wanted)))
            except Exception as err:  # a lost or malformed response
                outcomes.append((kind, "exception", repr(err)))


def run_one(http: httpx.Client, kind: str, prompt: str, n: int, k: int, wanted: dict) -> tuple:
    if kind == "malformed":
        r = http.post("/v1/completions", content=MALFORMED[k % len(MALFORMED)],
                      headers={"Content-Type": "application/json"})
        error = r.json().get("error", {})
        return r.status_code, set(error) == {"message", "type", "param", "code"}
    body = {"prompt": prompt, "max_tokens": n, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, "error" in r.json()
        text, finish, usage, done, chunks = [], None, None, False, 0
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            chunks += 1
            if kind == "drop" and chunks == 2:
                return 200, True  # hang up mid-stream
            for choice in chunk.get("choices", []):
                text.append(choice["text"])
                finish = choice["finish_reason"] or finish
            usage = chunk.get("usage") or usage
    complete = done and finish == "length" and usage["completion_tokens"] == n and "".join(text) == wanted[prompt, n]
    return 200, complete


def load(url: str, wanted: dict) -> list:
    outcomes: list = []
    threads = [threading.Thread(target=one_client, args=(url, c, outcomes, wanted), daemon=True)
               for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(45)
    assert not any(t.is_alive() for t in threads), "a client hung"
    return outcomes


@pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_load_and_faults():
    start = time.monotonic()
    wanted = {(p, n): expected(p, n) for p in PROMPTS for n in LENGTHS}
    app = create_app(ServeConfig(model_names=("specdec-toy",), defaults=SETTINGS, max_active=8, max_waiting=16),
                     pair=slow_pair())
    with ServerThread(app) as srv:
        load(srv.url, wanted)  # warm-up: first-use allocations don't count as growth
        gc.collect()
        before = rss_bytes()
        outcomes = load(srv.url, wanted)
        engine = app.state.specdec.engine
        deadline = time.monotonic() + 10
        while engine.queue != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.queue == (0, 0), "a dropped client's job was left behind"
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        metrics = httpx.get(srv.url + "/metrics", timeout=5).text
        gc.collect()
        after = rss_bytes()
    assert len(outcomes) == CLIENTS * REQUESTS
    assert not [o for o in outcomes if o[1] == "exception" or (isinstance(o[1], int) and o[1] >= 500)], outcomes
    for kind, status, ok in outcomes:
        if kind == "malformed":
            assert 400 <= status < 500 and ok, (kind, status)
        elif kind == "full":
            assert (status == 200 and ok) or (status == 429 and ok), (kind, status, ok)
    assert sum(kind == "full" and status == 200 for kind, status, _ in outcomes) >= CLIENTS * REQUESTS // 2
    assert "specdec_spec_decode_num_draft_tokens_total" in metrics
    assert abs(after - before) <= 0.10 * before, f"RSS {before / 2**20:.0f} MiB → {after / 2**20:.0f} MiB"
    assert time.monotonic() - start < 60
