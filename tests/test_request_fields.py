"""Every request field the official openai SDK can send is honoured, ignored (changing nothing) or a 400 naming it.

``schema.FIELDS`` classifies the fields of both routes; ``docs/request-fields.md`` is that table in words. Here:
the installed SDK's fields are all classified (a new SDK release with a new field fails until it is), the doc's
tables are ``FIELDS`` and the tests they name exist, every refused field sent through the official client is a
400 whose ``param`` names it (code ``unsupported``, the message naming the value accepted), every ignored field
(and every refused field's accepted value) leaves the greedy answer as it is without it, and the honoured fields
that no other file tests through the server (``max_completion_tokens``, ``top_p`` / ``top_k`` / ``min_p``,
``stream_options.include_obfuscation``, several prompts, ``response_format`` on completions) are tested here.
Servers: the toy pair (and a scripted pair with a tokenizer, for a grammar) in-process on 127.0.0.1.
"""

import inspect
import json
import re
from pathlib import Path

import openai
import pytest

from specdec.models.toy import ToyPair
from specdec.sampling import SamplingParams
from specdec.server import ServeConfig, create_app
from specdec.server.runner import ServerThread
from specdec.server.schema import EXTRAS, FIELDS, HONOURED, IGNORED, NEUTRAL, REFUSED, ChatRequest, CompletionRequest
from specdec.session import RunSettings

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "request-fields.md"
MODEL = "specdec-toy"
DEFAULTS = RunSettings(gamma=3, max_new_tokens=16, sampling=SamplingParams(temperature=0.0), seed=None)
ROUTES = {"chat": ChatRequest, "completions": CompletionRequest}
REQUEST_OPTIONS = {"self", "extra_headers", "extra_query", "extra_body", "timeout"}  # the SDK's, not body fields


def sdk_fields(route: str) -> set[str]:
    """The body fields the installed openai SDK can send on ``route``: its TypedDicts' keys and ``create``'s args."""
    if route == "chat":
        from openai.resources.chat.completions import Completions
        from openai.types.chat import completion_create_params as params
    else:
        from openai.resources.completions import Completions
        from openai.types import completion_create_params as params
    keys = set()
    for name in ("CompletionCreateParamsBase", "CompletionCreateParamsStreaming", "CompletionCreateParamsNonStreaming"):
        typed = getattr(params, name, None)
        if typed is not None:
            keys |= set(typed.__required_keys__) | set(typed.__optional_keys__)
    return keys | (set(inspect.signature(Completions.create).parameters) - REQUEST_OPTIONS)


# ----------------------------------------------------------------------------- the table is whole


@pytest.mark.parametrize("route", ROUTES)
def test_every_field_the_sdk_can_send_is_classified(route):
    sdk = sdk_fields(route)
    assert {"model", "stream", "temperature", "seed"} <= sdk  # the SDK was read
    missing = sorted(sdk - set(FIELDS[route]))
    assert not missing, (f"the openai SDK {openai.__version__} can send {missing} to {route}: classify each in "
                         "specdec.server.schema.FIELDS (honoured with a test, ignored only if it changes nothing in "
                         "the answer, else refused with a NEUTRAL entry) and add it to docs/request-fields.md")
    extra = sorted(set(FIELDS[route]) - sdk - set(EXTRAS) - {"response_format"})
    assert not extra, f"FIELDS[{route!r}] names {extra}, which the SDK does not send and which are not ours"


@pytest.mark.parametrize("route", ROUTES)
def test_the_classified_fields_are_the_request_models_fields(route):
    assert set(FIELDS[route]) == set(ROUTES[route].model_fields)
    assert set(FIELDS[route].values()) <= {HONOURED, IGNORED, REFUSED}
    for name, kind in FIELDS[route].items():
        if kind == REFUSED:
            assert name in NEUTRAL, f"{name} is refused: NEUTRAL must say which value is accepted"
    unknown = set(NEUTRAL) - set(FIELDS["chat"]) - set(FIELDS["completions"])
    assert not unknown


def doc_tables() -> dict[str, dict[str, tuple[str, str]]]:
    """``{route: {field: (kind, tests cell)}}`` read from the markdown tables under each route's heading."""
    tables, route = {}, None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            route = "chat" if "/v1/chat/completions" in line else "completions" if "/v1/completions" in line else None
            if route:
                tables[route] = {}
        elif route and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            name = cells[0].strip("`")
            assert name not in tables[route], f"{name} is listed twice for {route}"
            tables[route][name] = (cells[1], cells[-1])
    return tables


def test_the_doc_lists_exactly_the_classified_fields():
    tables = doc_tables()
    assert set(tables) == set(ROUTES)
    for route in ROUTES:
        assert {name: kind for name, (kind, _) in tables[route].items()} == FIELDS[route], route


def test_the_tests_the_doc_names_exist():
    named = set()
    for table in doc_tables().values():
        for name, (_, tests) in table.items():
            found = re.findall(r"`(test_\w+\.py)::(test_\w+)`", tests)
            assert found, f"{name}: no test named"
            named |= set(found)
    for file, test in sorted(named):
        source = (ROOT / "tests" / file).read_text(encoding="utf-8")
        assert re.search(rf"^def {test}\(", source, re.M), f"tests/{file} has no {test}"


# ----------------------------------------------------------------------------- through the official client


@pytest.fixture(scope="module")
def server():
    with ServerThread(create_app(ServeConfig(model_names=(MODEL,), defaults=DEFAULTS), pair=ToyPair())) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=20, max_retries=0)


def create(client, route: str, **fields):
    """One greedy request through the official client; a field ``create`` has no argument for goes in extra_body."""
    method = client.chat.completions.create if route == "chat" else client.completions.create
    known = inspect.signature(method).parameters
    base = {"model": MODEL, "max_tokens": 12, "temperature": 0}
    base |= {"messages": [{"role": "user", "content": "the cat"}]} if route == "chat" else {"prompt": "the cat"}
    typed = {k: v for k, v in fields.items() if k in known}
    extra = {k: v for k, v in fields.items() if k not in known}
    return method(**base | typed, **({"extra_body": extra} if extra else {}))


def text(route: str, answer) -> str:
    return answer.choices[0].message.content if route == "chat" else answer.choices[0].text


# A value of each refused field that asks for something, and the value that asks for nothing (accepted); the ignored
# fields that can ask for more have one of each too.
ASKING = {
    "n": (2, 1), "presence_penalty": (0.5, 0), "frequency_penalty": (-1.0, 0.0), "logit_bias": ({"1": 5}, {}),
    "functions": ([{"name": "f", "parameters": {"type": "object"}}], None), "function_call": ("auto", None),
    "audio": ({"voice": "alloy", "format": "wav"}, None), "modalities": (["text", "audio"], ["text"]),
    "moderation": ({"model": "omni-moderation-latest"}, None), "reasoning_effort": ("low", None),
    "verbosity": ("low", None), "web_search_options": ({}, None), "service_tier": ("flex", "default"),
    "store": (True, False), "echo": (True, False), "suffix": ("the", ""), "best_of": (2, 1),
}
# A value of each ignored field (informational: it changes nothing in the answer).
INFORMATIONAL = {
    "user": "alice", "safety_identifier": "5f1e2d", "metadata": {"team": "editors"}, "prompt_cache_key": "repo-42",
    "prompt_cache_options": {"mode": "explicit", "ttl": "30m"}, "prompt_cache_retention": "24h",
    "prediction": {"type": "content", "content": "the cat sat on the mat"}, "service_tier": "auto", "store": False,
}
REFUSALS = [(route, name) for route in ROUTES for name in FIELDS[route] if name in NEUTRAL]
IGNORED_FIELDS = [(route, name) for route in ROUTES for name, kind in FIELDS[route].items() if kind == IGNORED]


@pytest.mark.parametrize("route, name", REFUSALS, ids=[f"{r}-{n}" for r, n in REFUSALS])
def test_a_refused_field_is_a_400_naming_it(client, route, name):
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, route, **{name: ASKING[name][0]})
    error = refused.value.body
    assert error["param"] == name and error["code"] == "unsupported", error
    assert name in error["message"] and NEUTRAL[name][1] in error["message"], error


@pytest.fixture(scope="module")
def plain(client):
    return {route: text(route, create(client, route)) for route in ROUTES}


@pytest.mark.parametrize("route, name", IGNORED_FIELDS, ids=[f"{r}-{n}" for r, n in IGNORED_FIELDS])
def test_an_ignored_field_changes_nothing(client, plain, route, name):
    assert text(route, create(client, route, **{name: INFORMATIONAL[name]})) == plain[route] != ""


@pytest.mark.parametrize("route, name", REFUSALS, ids=[f"{r}-{n}" for r, n in REFUSALS])
def test_a_refused_field_s_accepted_value_changes_nothing(client, plain, route, name):
    assert text(route, create(client, route, **{name: ASKING[name][1]})) == plain[route]


def test_service_tier_default_changes_nothing_either(client, plain):
    assert text("chat", create(client, "chat", service_tier="default")) == plain["chat"]


# ----------------------------------------------------------------------------- honoured, tested nowhere else


def test_max_completion_tokens_bounds_the_answer_and_wins_over_max_tokens(client):
    for limit in (1, 5):
        answer = create(client, "chat", max_completion_tokens=limit)
        assert answer.usage.completion_tokens == limit and answer.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, "chat", max_completion_tokens=0)
    assert refused.value.body["param"] == "max_completion_tokens"


@pytest.mark.parametrize("route", ROUTES)
def test_top_p_top_k_min_p_reach_the_sampler(client, route):
    """At temperature 2 each of them, tight, keeps only the likeliest token (the toy pair has no ties on the
    greedy path): the sampled answer is the greedy one, for every seed; without them some seed strays."""
    greedy = text(route, create(client, route, max_tokens=16))
    loose = {text(route, create(client, route, max_tokens=16, temperature=2, seed=s)) for s in range(8)}
    assert loose != {greedy}
    for tight in ({"top_p": 0.01}, {"top_k": 1}, {"min_p": 0.99}):
        for seed in range(4):
            assert text(route, create(client, route, max_tokens=16, temperature=2, seed=seed, **tight)) == greedy


@pytest.mark.parametrize("route", ROUTES)
def test_include_obfuscation_changes_no_stream(client, route):
    def streamed(options):
        method = client.chat.completions.create if route == "chat" else client.completions.create
        body = {"messages": [{"role": "user", "content": "the"}]} if route == "chat" else {"prompt": "the"}
        chunks = list(method(model=MODEL, max_tokens=10, temperature=0, stream=True, stream_options=options, **body))
        pieces = [(c.choices[0].delta.content or "") if route == "chat" else c.choices[0].text
                  for c in chunks if c.choices]
        return "".join(pieces), chunks[-1].usage.completion_tokens

    plain = streamed({"include_usage": True})
    assert plain[1] == 10
    assert streamed({"include_usage": True, "include_obfuscation": True}) == plain
    assert streamed({"include_usage": True, "include_obfuscation": False}) == plain


@pytest.mark.parametrize("prompt", [["the", "the cat"], [[0, 1], [2]]])
def test_several_prompts_are_a_400_naming_prompt(client, prompt):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=4)
    assert refused.value.body["param"] == "prompt", refused.value.body


def test_response_format_holds_on_completions():
    """A scripted model that would write prose writes JSON matching the schema when response_format asks for it."""
    import jsonschema
    from tool_pair import CHATML_OPENING, scripted_pair

    pair = scripted_pair(lambda prompt: "It is 18 degrees in Lisbon.")
    schema = {"type": "object", "properties": {"celsius": {"enum": [17, 18, 19]}}, "required": ["celsius"],
              "additionalProperties": False}
    ids = pair.tokenizer(CHATML_OPENING, add_special_tokens=False)["input_ids"]
    with ServerThread(create_app(ServeConfig(model_names=(MODEL,), defaults=DEFAULTS), pair=pair)) as srv:
        scripted = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", timeout=20, max_retries=0)
        free = scripted.completions.create(model=MODEL, prompt=ids, max_tokens=32, temperature=0)
        assert free.choices[0].text == "It is 18 degrees in Lisbon."
        fmt = {"type": "json_schema", "json_schema": {"name": "reading", "schema": schema}}
        answer = scripted.completions.create(model=MODEL, prompt=ids, max_tokens=32, temperature=0,
                                             extra_body={"response_format": fmt})
        jsonschema.validate(json.loads(answer.choices[0].text), schema)
        assert answer.choices[0].finish_reason == "stop"
        # Any object: off its script the model writes one key forever, but it is an object's start.
        anyobject = scripted.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0,
                                                extra_body={"response_format": {"type": "json_object"}})
        assert anyobject.choices[0].text.startswith('{"')
        with pytest.raises(openai.BadRequestError) as refused:
            scripted.completions.create(model=MODEL, prompt=ids, max_tokens=8, extra_body={
                "response_format": {"type": "json_schema", "json_schema": {"schema": {"properties": 3}}}})
        assert refused.value.body["param"] == "response_format", refused.value.body
