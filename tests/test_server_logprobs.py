"""``logprobs`` / ``top_logprobs`` through the server, with the official openai client (issue 26, part 3).

Pair: a tiny random-weight Qwen2 GGUF pair on the native backend with an id-per-character 'tokenizer'
(``test_batched_engine.TinyPair``: each token's text is one letter, so the tokens' texts join to the content).
Checked: the whole answer and the stream carry the same entries; greedy: each token is its own top-1; the values are
plain decoding's (``autoregressive_generate(..., logprobs=k)``) bit for bit; a stop string cuts them with the text;
completions' legacy shape; the 400s.
"""

from __future__ import annotations

import openai
import pytest
from test_batched_engine import TinyPair
from tiny_qwen2 import write_tiny_qwen2

from specdec.decode import autoregressive_generate
from specdec.models.native import NativeModel, NativeSettings
from specdec.sampling import SamplingParams
from specdec.server import ServeConfig, create_app
from specdec.server.runner import ServerThread
from specdec.session import RunSettings

MODEL = "tiny"
BUDGET = 16
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("server-logprobs")
    return str(write_tiny_qwen2(folder / "t.gguf", seed=0)), str(write_tiny_qwen2(folder / "d.gguf", seed=0))


@pytest.fixture(scope="module")
def server(files):
    pair = TinyPair(*files)  # the draft: the same weights, so its drafts are accepted (entries from block rows)
    defaults = RunSettings(gamma=3, max_new_tokens=BUDGET, sampling=GREEDY, seed=None, draft="model")
    with ServerThread(create_app(ServeConfig(model_names=(MODEL,), defaults=defaults), pair=pair)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=60, max_retries=0)


@pytest.fixture(scope="module")
def plain(files):
    """Plain decoding's figures on a model of its own (the same file): (tokens, TokenLogprobs) of ``ids``."""
    model = NativeModel(files[0], NativeSettings(threads=2))

    def run(ids, k):
        gen = autoregressive_generate(model, ids, max_new_tokens=BUDGET, sampling=GREEDY, logprobs=k)
        return gen.tokens, [lp for r in gen.stats.records for lp in r.logprobs][: len(gen.tokens)]

    return run


PROMPT = "speculative decoding"
MESSAGES = [{"role": "user", "content": PROMPT}]


def entries(content) -> list[tuple]:
    return [(e.token, e.logprob, bytes(e.bytes), tuple((t.token, t.logprob, bytes(t.bytes)) for t in e.top_logprobs))
            for e in content]


def streamed_chat(client, **kw):
    text, content, reason = "", [], None
    for chunk in client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, **kw):
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        if choice.logprobs is not None:
            content += choice.logprobs.content or []
        reason = choice.finish_reason or reason
    return text, content, reason


def test_chat_logprobs_whole_and_streamed_are_plain_decoding_s(client, plain):
    pair_ids = TinyPair.encode(None, PROMPT)
    tokens, want = plain(pair_ids, 5)
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=5)
    choice = whole.choices[0]
    got = choice.logprobs.content
    assert choice.logprobs.refusal is None
    assert "".join(e.token for e in got) == choice.message.content and len(got) == BUDGET
    assert [e.logprob for e in got] == [lp.logprob for lp in want]  # bit for bit (JSON keeps a double exactly)
    letter = lambda t: chr(65 + t % 26)  # noqa: E731  TinyPair's text of one id
    assert [[(t.token, t.logprob) for t in e.top_logprobs] for e in got] == [
        [(letter(t), v) for t, v in lp.top] for lp in want]
    for e in got:  # greedy: each token is the most likely one
        assert len(e.top_logprobs) == 5 and e.logprob == e.top_logprobs[0].logprob
        assert e.bytes == list(e.token.encode())
    text, streamed, reason = streamed_chat(client, logprobs=True, top_logprobs=5)
    assert text == choice.message.content and reason == choice.finish_reason == "length"
    assert entries(streamed) == entries(got)


def test_chat_logprobs_true_alone_gives_no_alternatives(client):
    choice = client.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, max_tokens=5).choices[0]
    assert len(choice.logprobs.content) == 5 and all(e.top_logprobs == [] for e in choice.logprobs.content)
    assert client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3).choices[0].logprobs is None


def test_a_stop_string_cuts_the_logprobs_with_the_text(client):
    full = client.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message.content
    stop = full[6:8]
    cut = full[: full.index(stop)]
    choice = client.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=2,
                                            stop=[stop]).choices[0]
    assert choice.message.content == cut and "".join(e.token for e in choice.logprobs.content) == cut
    text, streamed, _ = streamed_chat(client, logprobs=True, top_logprobs=2, stop=[stop])
    assert text == cut and entries(streamed) == entries(choice.logprobs.content)


def test_completions_legacy_shape_whole_and_streamed(client, plain):
    ids = [5, 17, 3, 60, 2, 9]
    tokens, want = plain(ids, 3)
    choice = client.completions.create(model=MODEL, prompt=ids, logprobs=3).choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text and len(lp.tokens) == BUDGET
    assert lp.token_logprobs == [w.logprob for w in want]
    assert lp.text_offset == list(range(BUDGET))  # one character a token
    for top, w in zip(lp.top_logprobs, want, strict=True):
        assert max(top.values()) == w.logprob and len(top) <= 3  # two ids of one letter: one key
    chunks = list(client.completions.create(model=MODEL, prompt=ids, logprobs=3, stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs is not None]
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert sum((p.tokens for p in parts), []) == lp.tokens
    assert sum((p.token_logprobs for p in parts), []) == lp.token_logprobs
    assert sum((p.text_offset for p in parts), []) == lp.text_offset
    assert sum((p.top_logprobs for p in parts), []) == lp.top_logprobs
    zero = client.completions.create(model=MODEL, prompt=ids, logprobs=0, max_tokens=4).choices[0].logprobs
    assert zero.top_logprobs is None and zero.token_logprobs == lp.token_logprobs[:4]


@pytest.mark.parametrize("path, body, param", [
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("chat", {"top_logprobs": 3}, "top_logprobs"),
    ("chat", {"logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    ("chat", {"logprobs": "yes"}, "logprobs"),
    ("text", {"logprobs": 6}, "logprobs"),
    ("text", {"logprobs": -1}, "logprobs"),
    ("text", {"logprobs": True}, "logprobs"),
])
def test_bad_logprobs_fields_are_400s_naming_them(client, path, body, param):
    with pytest.raises(openai.BadRequestError) as caught:
        if path == "chat":
            client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=body)
        else:
            client.completions.create(model=MODEL, prompt=[1, 2], extra_body=body)
    assert caught.value.status_code == 400 and caught.value.body["param"] == param


@pytest.mark.parametrize("bad", [-1, 21, True, 2.0, "3"])
def test_run_settings_refuse_bad_logprobs(bad):
    with pytest.raises(ValueError, match="logprobs"):
        RunSettings(logprobs=bad).validate()
    RunSettings(logprobs=20).validate()
