"""`specdec serve` on the toy pair: the official openai client, streaming, errors, queueing, turn-taking.

Every server here runs in-process on an ephemeral 127.0.0.1 port; every request has a timeout.
"""

import json
import threading
import time

import httpx
import openai
import pytest

from specdec.cli import build_parser, main
from specdec.models.bigram import BigramModel
from specdec.models.toy import TOY_TARGET, ToyPair
from specdec.sampling import SamplingParams
from specdec.server import ServeConfig, create_app
from specdec.server.runner import ServerThread
from specdec.session import RunSettings, generate

MODEL = "specdec-toy"
DEFAULTS = RunSettings(gamma=3, max_new_tokens=16, sampling=SamplingParams(temperature=0.0), seed=None)


class SlowModel(BigramModel):
    """The toy target, taking ``delay`` seconds per call: rounds long enough to watch turns."""

    def __init__(self, probs, delay: float) -> None:
        super().__init__(probs)
        self.delay = delay

    def score(self, tokens):
        time.sleep(self.delay)
        return super().score(tokens)


def slow_pair(delay: float = 0.004) -> ToyPair:
    pair = ToyPair()
    pair.target = SlowModel(TOY_TARGET, delay)
    return pair


def config(**kw) -> ServeConfig:
    return ServeConfig(model_names=(MODEL,), defaults=kw.pop("defaults", DEFAULTS), **kw)


@pytest.fixture(scope="module")
def server():
    with ServerThread(create_app(config(), pair=ToyPair())) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=20, max_retries=0)


def post(url, path, body=None, raw=None, timeout=20):
    content = raw if raw is not None else json.dumps(body)
    return httpx.post(url + path, content=content, headers={"Content-Type": "application/json"}, timeout=timeout)


def expected_text(prompt: str, max_tokens: int) -> str:
    pair = ToyPair()
    settings = RunSettings(gamma=3, max_new_tokens=max_tokens, sampling=SamplingParams(temperature=0.0))
    return pair.decode(generate(pair, pair.encode(prompt), settings).generation.tokens)


def sse_events(response) -> list:
    """The data of each event of a streamed response, ``[DONE]`` kept as a string."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            out.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return out


# ----------------------------------------------------------------------------- the openai client


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200


def test_greedy_chat_streamed_equals_whole_equals_generate(client):
    messages = [{"role": "user", "content": "the dog"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content == streamed == expected_text("the dog", 20)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == 2 and whole.usage.completion_tokens == 20 and whole.usage.total_tokens == 22
    assert chunks[-1].usage.completion_tokens == 20 and not chunks[-1].choices
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_text_completion_and_figures(client):
    whole = client.completions.create(model=MODEL, prompt="the cat", max_tokens=12, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="the cat", max_tokens=12, temperature=0, stream=True))
    assert whole.choices[0].text == streamed == expected_text("the cat", 12)
    figures = whole.model_extra["specdec"]
    assert figures["gamma"] == 3 and figures["drafted"] >= figures["accepted"] >= 0
    assert figures["target_calls"] >= 12 / 4 and 0 <= figures["alpha"] <= 1
    assert whole.usage.completion_tokens == 12


def test_stop_strings_are_cut(client):
    full = expected_text("the", 16)  # "cat sat on the cat sat on ..."
    out = client.completions.create(model=MODEL, prompt="the", max_tokens=16, temperature=0, stop=["on", "zzz"])
    assert out.choices[0].text == full[: full.index("on")] and out.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "the"}],
                                                 max_tokens=16, temperature=0, stop="on", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full[: full.index("on")]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_same_seed_same_text(client):
    def sample(seed):
        return client.completions.create(model=MODEL, prompt="the", max_tokens=30, temperature=1.0, seed=seed,
                                         extra_body={"speculative": {"gamma": 2}}).choices[0].text

    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(6)}) > 1


def test_speculative_field_chooses_drafter_and_gamma(client):
    out = client.completions.create(model=MODEL, prompt="the cat", max_tokens=12, temperature=0,
                                    extra_body={"speculative": {"draft": "lookup", "gamma": 2}, "top_k": 3})
    figures = out.model_extra["specdec"]
    assert figures["draft"] == "lookup" and figures["gamma"] == 2
    assert out.choices[0].text == expected_text("the cat", 12)  # exact whoever drafts


# ----------------------------------------------------------------------------- bad input: 4xx, error object

BAD = [
    ({"prompt": "the", "max_tokens": -3}, 400, "max_tokens"),
    ({"prompt": "the", "max_tokens": "ten"}, 400, "max_tokens"),
    ({"prompt": "the", "temperature": -0.5}, 400, "temperature"),
    ({"prompt": "the", "top_p": 0}, 400, "top_p"),
    ({"prompt": "the", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "the", "min_p": 1}, 400, "min_p"),
    ({"prompt": "the", "n": 2}, 400, "n"),
    ({"prompt": "the", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"prompt": "the", "model": "gpt-4o"}, 404, "model"),
    ({"prompt": "the", "logprobs": 6}, 400, "logprobs"),
    ({"prompt": "the", "stream": "yes"}, 400, "stream"),
    ({"prompt": "zebra"}, 400, "prompt"),
    ({"prompt": [99]}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
    ({"max_tokens": 3}, 400, "prompt"),
    ({"prompt": "the", "speculative": {"draft": "ngram:/etc/passwd"}}, 400, "speculative.draft"),
    ({"prompt": "the", "speculative": {"draft": "telepathy"}}, 400, "speculative.draft"),
    ({"prompt": "the", "speculative": {"gamma": 0}}, 400, "speculative.gamma"),
    ({"prompt": "the", "speculative": {"gamma": 10**9}}, 400, "speculative.gamma"),
    ({"prompt": "the", "seed": 2**70}, 400, "seed"),
    ({"prompt": "the", "temperature": float("nan")}, 400, "temperature"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD, ids=[p for _, _, p in BAD])
def test_bad_completion_fields(server, body, status, param):
    response = post(server.url, "/v1/completions", body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] and "code" in error


@pytest.mark.parametrize("body", [{"messages": []}, {"messages": "hi"}, {"messages": [{"role": "user"}]},
                                  {"messages": [{"role": "robot", "content": "the"}]}, {}])
def test_bad_chat_fields(server, body):
    response = post(server.url, "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith("messages")


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b"null", b'{"prompt": "the",}'])
def test_malformed_json(server, raw):
    response = post(server.url, "/v1/completions", raw=raw)
    assert response.status_code == 400 and set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_oversized_body_is_413(server):
    response = post(server.url, "/v1/completions", {"prompt": "the " * 400_000})
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"


def test_prompt_longer_than_context():
    pair = ToyPair()
    pair.target.max_length = 8
    with ServerThread(create_app(config(), pair=pair)) as srv:
        response = post(srv.url, "/v1/completions", {"prompt": "the cat sat on the mat .", "max_tokens": 5})
        assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
        assert "8" in response.json()["error"]["message"]
        ok = post(srv.url, "/v1/completions", {"prompt": "the cat sat on the mat ."})  # budget cut to fit
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1


def test_health_is_503_until_loaded():
    loaded = threading.Event()

    def load():
        assert loaded.wait(20)
        return ToyPair()

    with ServerThread(create_app(config(), load=load), wait_ready=False) as srv:
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 503
        early = post(srv.url, "/v1/completions", {"prompt": "the"})
        assert early.status_code == 503 and early.json()["error"]["code"] == "loading"
        loaded.set()
        deadline = time.monotonic() + 10
        while httpx.get(srv.url + "/health", timeout=5).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert post(srv.url, "/v1/completions", {"prompt": "the"}).status_code == 200


# ----------------------------------------------------------------------------- queueing and turn-taking


def open_stream(http: httpx.Client, body: dict):
    request = http.build_request("POST", "/v1/completions", json=body | {"stream": True})
    return http.send(request, stream=True)


def test_full_queue_answers_429():
    with ServerThread(create_app(config(max_active=1, max_waiting=1), pair=slow_pair())) as srv, \
            httpx.Client(base_url=srv.url, timeout=20) as http:
        first = open_stream(http, {"prompt": "the", "max_tokens": 3000})
        second = open_stream(http, {"prompt": "the", "max_tokens": 3000})
        third = post(srv.url, "/v1/completions", {"prompt": "the", "max_tokens": 3})
        assert third.status_code == 429 and third.headers["Retry-After"] == "1"
        assert third.json()["error"]["code"] == "queue_full"
        first.close()
        second.close()
        engine = srv.server.config.app.state.specdec.engine
        deadline = time.monotonic() + 10
        while engine.queue != (0, 0) and time.monotonic() < deadline:  # the hung-up jobs are dropped
            time.sleep(0.02)
        assert engine.queue == (0, 0)
        assert post(srv.url, "/v1/completions", {"prompt": "the", "max_tokens": 3}).status_code == 200


def test_short_request_overtakes_long_one_and_streams_interleave():
    with ServerThread(create_app(config(), pair=slow_pair())) as srv, \
            httpx.Client(base_url=srv.url, timeout=20) as http:
        long = open_stream(http, {"prompt": "the", "max_tokens": 1200})
        lines = long.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # the long one is generating
        short = post(srv.url, "/v1/completions", {"prompt": "the dog", "max_tokens": 8})
        assert short.status_code == 200 and short.json()["choices"][0]["finish_reason"] == "length"
        rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and len(rest) > 5  # the long one went on after the short one ended

        a, b = open_stream(http, {"prompt": "the", "max_tokens": 300}), open_stream(http, {"prompt": "the cat",
                                                                                           "max_tokens": 300})
        seen_a = [json.loads(line[6:]) for line in a.iter_lines() if line.startswith("data: {")][:3]
        seen_b = [json.loads(line[6:]) for line in b.iter_lines() if line.startswith("data: {")][:3]
        assert all(c["choices"][0]["finish_reason"] is None for c in seen_a + seen_b)  # both under way at once
        a.close()
        b.close()


def test_a_client_that_leaves_a_whole_answer_is_dropped():
    with ServerThread(create_app(config(), pair=slow_pair())) as srv:
        with pytest.raises(httpx.ReadTimeout):
            post(srv.url, "/v1/completions", {"prompt": "the", "max_tokens": 100000}, timeout=0.5)
        engine = srv.server.config.app.state.specdec.engine
        deadline = time.monotonic() + 5
        while engine.queue != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.queue == (0, 0)
        assert 'kind="client_disconnected"' in httpx.get(srv.url + "/metrics", timeout=5).text


def test_graceful_shutdown_ends_open_streams_with_an_error_event():
    srv = ServerThread(create_app(config(grace_seconds=0.3), pair=slow_pair()))
    with httpx.Client(base_url=srv.url, timeout=20) as http:
        stream = open_stream(http, {"prompt": "the", "max_tokens": 100000})
        lines = stream.iter_lines()
        next(lines)
        srv.server.handle_exit(15, None)  # as SIGTERM does
        rest = [line[6:] for line in lines if line.startswith("data: ")]
        assert rest[-1] == "[DONE]" and json.loads(rest[-2])["error"]["code"] == "shutting_down"
    srv.thread.join(15)
    assert not srv.thread.is_alive()
    srv.sock.close()


def test_metrics(server, client):
    client.completions.create(model=MODEL, prompt="the", max_tokens=8, temperature=0)
    post(server.url, "/v1/completions", {"prompt": "the", "top_p": 7})
    text = httpx.get(server.url + "/metrics", timeout=5).text
    for name in ("specdec_requests_total", "specdec_spec_decode_num_draft_tokens_total",
                 "specdec_spec_decode_num_accepted_tokens_total",
                 'specdec_spec_decode_num_accepted_tokens_per_pos_total{position="0"}',
                 "specdec_target_calls_total", "specdec_generation_tokens_total",
                 "specdec_time_to_first_token_seconds_bucket", "specdec_time_per_output_token_seconds_bucket",
                 'specdec_request_errors_total{kind="invalid_value"}'):
        assert name in text, name


def test_cli_registers_serve_and_refuses_a_bad_port(capsys):
    args = build_parser().parse_args(["serve", "--toy", "--port", "0", "--gamma", "4", "--temperature", "0.5"])
    assert args.gamma == 4 and args.temperature == 0.5 and args.host == "127.0.0.1" and args.seed is None
    assert main(["serve", "--toy", "--port", "70000"]) == 2
    assert "--port 70000 is invalid" in capsys.readouterr().err
