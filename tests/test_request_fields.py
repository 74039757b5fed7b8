"""Every request field the official openai SDK can send is honoured, ignored (changing nothing) or a 400 naming it.

``fields.FIELDS`` classifies the fields of both routes; ``docs/request-fields.md`` is that table in words. Here:
the installed SDK's fields are all classified (a new SDK release with a new field fails until it is), the doc's
tables are ``FIELDS`` and the tests they name exist, every refused field sent through the official client is a
400 whose ``param`` names it (code ``unsupported``, the message naming the value accepted), every ignored field
(and every refused field's accepted value) leaves the greedy answer as it is without it, and the honoured fields
that no other file tests through the server (``max_completion_tokens``, ``top_p`` / ``top_k`` / ``min_p``,
``stream_options.include_obfuscation``, several prompts, ``response_format`` on completions) are tested here.
Other servers' fields (``fields.OTHER_SERVERS``: vLLM's, llama.cpp's) likewise: each a 400 naming it but for the
value that asks for nothing, the doc's table of them the same; fields in no table still ignored.
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
from specdec.server.fields import EXTRAS, FIELDS, HONOURED, IGNORED, NEUTRAL, OTHER_SERVERS, REFUSED
from specdec.server.runner import ServerThread
from specdec.server.schema import ChatRequest, CompletionRequest
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
                         "specdec.server.fields.FIELDS (honoured with a test, ignored only if it changes nothing in "
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


# ----------------------------------------------------------------------------- other servers' fields

# A value of each OTHER_SERVERS field that asks for something there, and one that asks for nothing (accepted).
ELSEWHERE = {
    "guided_json": ({"type": "object"}, None), "guided_regex": ("[a-z]+", None),
    "guided_choice": (["yes", "no"], None), "guided_grammar": ('root ::= "a"', None),
    "guided_decoding_backend": ("xgrammar", None), "guided_whitespace_pattern": (r"[\n ]*", None),
    "structured_outputs": ({"json": {"type": "object"}}, None), "grammar": ('root ::= "a"', ""),
    "json_schema": ({}, None), "n_predict": (8, None), "min_tokens": (4, 0), "ignore_eos": (True, False),
    "stop_token_ids": ([2], []), "include_stop_str_in_output": (True, False), "t_max_predict_ms": (50, 0),
    "n_indent": (4, 0), "repetition_penalty": (1.2, 1.0), "repeat_penalty": (1.1, 1), "repeat_last_n": (128, 64),
    "penalty_last_n": (-1, 0), "penalize_nl": (True, False), "dry_multiplier": (0.8, 0.0), "dry_base": (2.0, 1.75),
    "dry_allowed_length": (3, 2), "dry_penalty_last_n": (128, -1), "dry_sequence_breakers": (["\n"], None),
    "xtc_probability": (0.5, 0), "xtc_threshold": (0.2, 0.1), "mirostat": (2, 0), "mirostat_tau": (3.0, 5.0),
    "mirostat_eta": (0.2, 0.1), "typical_p": (0.9, 1.0), "tfs_z": (0.9, 1), "top_n_sigma": (1.5, -1.0),
    "dynatemp_range": (0.5, 0), "dynatemp_exponent": (2.0, 1.0), "min_keep": (2, 0), "samplers": (["top_k"], None),
    "use_beam_search": (True, False), "length_penalty": (0.5, 1.0), "early_stopping": (True, False),
    "bad_words": (["mat"], []), "allowed_token_ids": ([1, 2], None), "logits_processors": (["my.proc"], []),
    "lora": ([{"id": 0, "scale": 0.5}], []), "n_cmpl": (2, 1), "n_probs": (3, 0),
    "post_sampling_probs": (True, False), "prompt_logprobs": (0, None), "return_tokens_as_token_ids": (True, False),
    "skip_special_tokens": (False, True), "spaces_between_special_tokens": (False, True),
    "reasoning_format": ("deepseek", "none"), "truncate_prompt_tokens": (4, None),
    "chat_template": ("{{ messages[0].content }}", None), "chat_template_kwargs": ({"enable_thinking": False}, {}),
    "add_generation_prompt": (False, True), "continue_final_message": (True, False), "echo": (True, False),
    "documents": ([{"title": "t", "text": "x"}], []),
}
ELSEWHERE_CASES = [(route, name) for route in ROUTES for name in OTHER_SERVERS]


def test_every_other_server_s_field_has_a_test_value():
    assert set(ELSEWHERE) == set(OTHER_SERVERS)
    for name, (asking, neutral) in ELSEWHERE.items():
        assert not OTHER_SERVERS[name].neutral(asking) and OTHER_SERVERS[name].neutral(neutral), name
    for route in ROUTES:  # ours (echo on completions) is NEUTRAL's; no other one is a field of ours
        assert set(OTHER_SERVERS) & set(FIELDS[route]) <= set(NEUTRAL), route
    for other in OTHER_SERVERS.values():
        assert set(other.tunes) <= set(OTHER_SERVERS) and other.server in ("vLLM", "llama.cpp", "vLLM and llama.cpp")


@pytest.mark.parametrize("route, name", ELSEWHERE_CASES, ids=[f"{r}-{n}" for r, n in ELSEWHERE_CASES])
def test_another_server_s_field_is_a_400_naming_it(client, route, name):
    """Sent as such a server's client sends it (through the official client: extra_body), a vLLM or llama.cpp
    field that would change the answer there is refused, naming it and what is accepted, never silently dropped."""
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, route, **{name: ELSEWHERE[name][0]})
    error = refused.value.body
    ours = name in ROUTES[route].model_fields
    accepted = NEUTRAL[name][1] if ours else OTHER_SERVERS[name].accepted
    assert error["param"] == name and error["code"] == "unsupported", error
    assert error["message"].startswith(f"{name}=") and accepted in error["message"], error
    assert ours or OTHER_SERVERS[name].server in error["message"]


@pytest.mark.parametrize("route, name", ELSEWHERE_CASES, ids=[f"{r}-{n}" for r, n in ELSEWHERE_CASES])
def test_another_server_s_field_asking_nothing_changes_nothing(client, plain, route, name):
    assert text(route, create(client, route, **{name: ELSEWHERE[name][1]})) == plain[route]


def test_the_refusals_say_what_to_send_instead(client):
    said = {"n_predict": "max_tokens", "guided_json": "response_format", "json_schema": "response_format",
            "grammar": "not accepted over this API", "guided_choice": "enum", "n_probs": "logprobs",
            "stop_token_ids": "stop strings", "repeat_penalty": "not implemented"}
    for name, words in said.items():
        with pytest.raises(openai.BadRequestError) as refused:
            create(client, "chat", **{name: ELSEWHERE[name][0]})
        assert words in refused.value.body["message"], refused.value.body


def test_a_sampler_s_parameter_is_accepted_with_the_sampler_off_and_named_with_it_on(client, plain):
    """llama.cpp's clients send whole presets: a sampler's parameters beside it. With the sampler sent and off,
    any value of its parameters changes nothing (there either); with it on, the sampler is the field named."""
    for switch, tuned in (("mirostat", "mirostat_tau"), ("repeat_penalty", "repeat_last_n"),
                          ("dry_multiplier", "dry_base"), ("use_beam_search", "length_penalty")):
        assert OTHER_SERVERS[tuned].tunes == (switch,)
        off = {switch: ELSEWHERE[switch][1], tuned: ELSEWHERE[tuned][0]}
        assert text("chat", create(client, "chat", **off)) == plain["chat"]
        with pytest.raises(openai.BadRequestError) as refused:
            create(client, "chat", **{tuned: ELSEWHERE[tuned][0], switch: ELSEWHERE[switch][0]})
        assert refused.value.body["param"] == switch, refused.value.body
    preset = {"repeat_penalty": 1.0, "repeat_last_n": 256, "mirostat": 0, "mirostat_tau": 5, "mirostat_eta": 0.1,
              "typical_p": 1, "tfs_z": 1, "dry_multiplier": 0, "xtc_probability": 0, "n_probs": 0, "min_keep": 0}
    assert text("completions", create(client, "completions", **preset)) == plain["completions"]


@pytest.mark.parametrize("route", ROUTES)
def test_llama_cpp_s_logit_bias_list_is_refused_as_the_object_is(client, plain, route):
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, route, logit_bias=[[1, 5.0]])
    assert refused.value.body["param"] == "logit_bias" and refused.value.body["code"] == "unsupported"
    assert text(route, create(client, route, logit_bias=[])) == plain[route]


@pytest.mark.parametrize("route", ROUTES)
def test_fields_no_table_names_are_still_ignored(client, plain, route):
    """Clients send a few of their own (llama.cpp's cache_prompt, vLLM's priority, ...): none changes the answer."""
    own = {"cache_prompt": True, "id_slot": -1, "priority": 3, "request_id": "r-1", "timings_per_token": True,
           "x_client_trace": {"a": 1}}
    assert text(route, create(client, route, **own)) == plain[route]


def test_the_doc_lists_every_other_server_s_field():
    """docs/request-fields.md's table under "Other servers' fields" names exactly OTHER_SERVERS, each with its
    server and the value accepted."""
    rows, inside = {}, False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            inside = line.startswith("## Other servers' fields")
        elif inside and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for name in re.findall(r"`(\w+)`", cells[0]):
                rows[name] = cells[1]
    assert set(rows) == set(OTHER_SERVERS)
    for name, server in rows.items():
        assert server == OTHER_SERVERS[name].server, name
