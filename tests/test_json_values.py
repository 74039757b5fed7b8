"""specdec.json_values: reference loops with no way out are found before generation (llguidance compiles them,
and generation would then dead-end inside the loop: hypothesis found ``{"$ref": "#/$defs/x", "$defs": {"x":
{"$ref": "#/$defs/x"}}}`` answering a 500 in test_edges). Hand-built schemas with known answers, then the
server's answer to each (a 400 naming the field, or an answer)."""

import pytest
from starlette.testclient import TestClient

from specdec.grammar import GrammarError, check_ends, json_schema_grammar
from specdec.json_values import unending_reference

LOOP = {"$ref": "#/$defs/x", "$defs": {"x": {"$ref": "#/$defs/x"}}}
STUCK = {
    "self": LOOP,
    "mutual": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},
    "required property": {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "required": ["a"],
                          "$defs": {"x": {"$ref": "#/$defs/x"}}},
    "object needs itself": {"$ref": "#/$defs/a", "$defs": {"a": {"type": "object", "properties": {
        "n": {"$ref": "#/$defs/a"}}, "required": ["n"]}}},
    "root needs itself": {"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]},
    "only alternative": {"$ref": "#/$defs/a", "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}},
    "allOf": {"$ref": "#/$defs/a", "$defs": {"a": {"allOf": [{"type": "object"}, {"$ref": "#/$defs/a"}]}}},
    "non-empty array": {"$ref": "#/$defs/a", "$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"},
                                                            "minItems": 1}}},
    "optional but looping": {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}},  # the model could enter it
                             "$defs": {"x": {"$ref": "#/$defs/x"}}},
    "definitions": {"$ref": "#/definitions/x", "definitions": {"x": {"$ref": "#/definitions/x"}}},
}
ENDING = {
    "no references": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
    "tree": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array",
                                                                                  "items": {"$ref": "#"}}},
             "required": ["v"]},
    "list ending in null": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
                            "required": ["next"]},
    "empty array allowed": {"$ref": "#/$defs/a", "$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}}}},
    "chain to a string": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "string"}}},
    "an anchor": {"$ref": "#thing", "$defs": {"t": {"$anchor": "thing", "type": "string"}}},
    "a ref inside const": {"const": {"$ref": "#/nowhere"}},
}


@pytest.mark.parametrize("name", STUCK)
def test_a_loop_with_no_way_out_is_found(name):
    ref = unending_reference(STUCK[name])
    assert ref is not None and ref.startswith("#"), name
    with pytest.raises(GrammarError, match="allows no value: its reference .* can only lead back to itself"):
        json_schema_grammar(STUCK[name])


@pytest.mark.parametrize("name", ENDING)
def test_schemas_whose_references_end_pass(name):
    assert unending_reference(ENDING[name]) is None, name
    check_ends(ENDING[name])


def test_the_first_stuck_reference_is_named_and_the_field_said():
    assert unending_reference(STUCK["mutual"]) == "#/$defs/a"
    with pytest.raises(GrammarError, match=r"^the parameters schema of 'f' allows no value: its reference "
                                           r"'#/\$defs/x'"):
        check_ends(LOOP, "the parameters schema of 'f'")


def test_a_schema_too_deep_to_walk_is_a_grammar_error_not_a_crash():
    deep: dict = {"type": "string"}
    for _ in range(5000):
        deep = {"anyOf": [deep]}
    deep["$defs"] = {"x": {"$ref": "#/$defs/x"}}
    with pytest.raises(GrammarError, match="nested too deeply"):
        check_ends(deep)


@pytest.fixture(scope="module")
def client():
    from tool_pair import scripted_pair

    from specdec.sampling import SamplingParams
    from specdec.server import ServeConfig, create_app
    from specdec.session import RunSettings

    pair = scripted_pair(lambda prompt: '{"city": "Lisbon"}')
    defaults = RunSettings(gamma=3, max_new_tokens=12, sampling=SamplingParams(temperature=0.0), seed=None)
    app = create_app(ServeConfig(model_names=("specdec-toy",), defaults=defaults), pair=pair)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("name", ["self", "required property", "object needs itself", "optional but looping"])
def test_the_server_answers_400_naming_the_field(client, name):
    schema = STUCK[name]
    r = client.post("/v1/completions", json={"prompt": "the weather in", "max_tokens": 8, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format" and "allows no value" in r.json()["error"]["message"]
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                                                  "tools": [tool], "tool_choice": "required"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tools" and "the parameters schema of 'f'" in r.json()["error"]["message"]


def test_a_recursive_schema_that_ends_still_answers(client):
    r = client.post("/v1/completions", json={"prompt": "the weather in", "max_tokens": 8, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": ENDING["tree"]}}})
    assert r.status_code == 200, r.text
