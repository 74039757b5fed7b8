"""The request bodies the server accepts, as pydantic models: the OpenAI fields we honour, plus ours.

Terms: a *request body* is the JSON a client POSTs. Every field the official openai SDK can send is in
``FIELDS``, as one of three kinds (docs/request-fields.md is that table in words, with the test of each;
tests/test_request_fields.py holds the SDK's list, the doc and the server to it):

- *honoured*: done as OpenAI does, within the limits ``ACCEPTED`` states (a value outside them is a 400 naming
  the field);
- *ignored*: accepted and without effect, because it changes nothing in the answer (who asks, how OpenAI would
  bill, cache or keep it: ``user``, ``metadata``, ``prompt_cache_key``, ...); a value that asks for more than
  this server does (``store`` true, ``service_tier`` flex) is refused as below;
- *refused*: not implemented; any value but the one that asks for nothing (``NEUTRAL``: ``n`` 1, a penalty 0, no
  ``audio``, ...) is a 400 naming the field, code ``unsupported``: a client never gets silently other behaviour.

Other servers' request fields (vLLM's, llama.cpp's ``llama-server``'s) that would change the answer there are
``OTHER_SERVERS``: refused as a refused field is (a 400 naming it, code ``unsupported``, the message saying what to
send instead), but for the value that asks for nothing (``repetition_penalty`` 1, ``ignore_eos`` false, ...).
Fields in neither table are ignored, as some clients send a few of their own.
``speculative`` (``{"draft": "lookup+model", "gamma": "auto"}``), ``top_k`` and ``min_p`` are our extra fields.

Tool calls (chat only): ``tools`` (functions: a name matching ``TOOL_NAME``, unique, at most ``MAX_TOOLS``; a
``parameters`` JSON schema of at most ``MAX_SCHEMA_BYTES`` bytes and ``MAX_SCHEMA_DEPTH`` levels, all of them
``MAX_TOOLS_BYTES``),
``tool_choice`` (``none``, ``auto``, ``required`` or ``{"type": "function", "function": {"name": ...}}``),
``parallel_tool_calls``; in the history an assistant message's ``tool_calls`` (``function.arguments`` a JSON
string) and a ``tool`` message's ``tool_call_id``. The deprecated ``functions`` / ``function_call`` are refused
(use ``tools``). What is done with them: ``specdec.server.tools``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictInt, field_validator, model_validator

from ..choices import MAX_GAMMA

MAX_STOPS = 4
MAX_TOOLS = 128
TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
MAX_SCHEMA_BYTES = 32_768  # one tool's parameters schema, as compact JSON
MAX_SCHEMA_DEPTH = 16  # objects and arrays inside one another in a parameters schema
MAX_TOOLS_BYTES = 128_000  # all the tools' parameters schemas together (their call grammar stays small)
TOOL_CHOICES = ("none", "auto", "required")
# What each bounded field accepts, in words: the error message for a bad value quotes it.
ACCEPTED = {
    "max_tokens": "an integer >= 1",
    "max_completion_tokens": "an integer >= 1",
    "temperature": "a number >= 0 (0 = greedy)",
    "top_p": "a number in (0, 1] (1 = off)",
    "top_k": "an integer >= 0 (0 or -1 = off)",
    "min_p": "a number in [0, 1) (0 = off)",
    "n": "1 (one choice per request)",
    "seed": "an integer in [-2**63, 2**64 - 1]",
    "stop": "a string or a list of at most 4 non-empty strings",
    "messages": "a non-empty list of {role, content} objects",
    "prompt": "a string, a list of one string, or a list of token ids",
    "gamma": f"an integer in [1, {MAX_GAMMA}], 'auto' or 'heuristic'",
    "stream": "true or false",
    "tools": f"a list of at most {MAX_TOOLS} {{type: function, function: {{name, description, parameters}}}} "
             f"objects, names unique and matching {TOOL_NAME}",
    "tool_choice": "'none', 'auto', 'required' or {type: function, function: {name}} naming a declared tool",
    "parallel_tool_calls": "true or false",
    "logprobs": "true or false (chat); an integer in [0, 5] (completions: alternatives per token)",
    "top_logprobs": "an integer in [0, 20], with logprobs true",
    "user": "a string (ignored: it changes nothing in the answer)",
    "safety_identifier": "a string (ignored: it changes nothing in the answer)",
    "prompt_cache_key": "a string (ignored: the prefix cache needs no key)",
    "prompt_cache_retention": "a string (ignored: the prefix cache keeps entries as its byte budget allows)",
    "prompt_cache_options": "an object (ignored: the prefix cache needs no options)",
    "metadata": "an object of string values (ignored: nothing is stored)",
    "prediction": "an object {type: content, content} (ignored: a predicted output changes only the time taken)",
    "service_tier": "'auto' or 'default' (this server has one tier)",
    "store": "false (this server stores no answers)",
    "logit_bias": "{} (no bias)",
    "echo": "false",
    "suffix": "an empty string or null (no insertion)",
    "best_of": "1",
    "presence_penalty": "0",
    "frequency_penalty": "0",
}
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs (decode.MAX_TOP_LOGPROBS)
MAX_LEGACY_LOGPROBS = 5  # completions' logprobs

HONOURED, IGNORED, REFUSED = "honoured", "ignored", "refused"
EXTRAS = ("speculative", "top_k", "min_p")  # ours: no OpenAI SDK sends them but through extra_body
# Every field of a request body, per route, by kind (the module's docstring says what each kind means). The keys
# are exactly the fields of ChatRequest and CompletionRequest; docs/request-fields.md lists the same, with the test
# that holds each one (tests/test_request_fields.py checks both, and fails on a field a newer SDK sends that is
# not here).
_SHARED = {
    "model": HONOURED, "max_tokens": HONOURED, "temperature": HONOURED, "top_p": HONOURED, "seed": HONOURED,
    "stop": HONOURED, "stream": HONOURED, "stream_options": HONOURED, "logprobs": HONOURED,
    "n": REFUSED, "presence_penalty": REFUSED, "frequency_penalty": REFUSED, "logit_bias": REFUSED,
    "user": IGNORED,
    "speculative": HONOURED, "top_k": HONOURED, "min_p": HONOURED,
}
FIELDS = {
    "chat": _SHARED | {
        "messages": HONOURED, "max_completion_tokens": HONOURED, "top_logprobs": HONOURED,
        "response_format": HONOURED, "tools": HONOURED, "tool_choice": HONOURED, "parallel_tool_calls": HONOURED,
        "functions": REFUSED, "function_call": REFUSED, "audio": REFUSED, "modalities": REFUSED,
        "moderation": REFUSED, "reasoning_effort": REFUSED, "verbosity": REFUSED, "web_search_options": REFUSED,
        "metadata": IGNORED, "prediction": IGNORED, "prompt_cache_key": IGNORED, "prompt_cache_options": IGNORED,
        "prompt_cache_retention": IGNORED, "safety_identifier": IGNORED, "service_tier": IGNORED, "store": IGNORED,
    },
    "completions": _SHARED | {
        "prompt": HONOURED, "response_format": HONOURED,  # response_format: ours here (the SDK sends it for chat)
        "echo": REFUSED, "suffix": REFUSED, "best_of": REFUSED,
    },
}


def _absent(value) -> bool:
    return value is None


def _zero(value) -> bool:
    return value is None or (not isinstance(value, bool) and value == 0)


# A refused field (and an ignored one that could ask for more): (is this value the one that asks for nothing,
# the value accepted in words, why no other is). Checked in this order; the first found is the 400's param.
NEUTRAL: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "functions": (_absent, "null", "deprecated by OpenAI; declare tools and use tool_choice"),
    "function_call": (_absent, "null", "deprecated by OpenAI; declare tools and use tool_choice"),
    "n": (lambda v: v in (None, 1), "1", "one choice per request (send n requests, each with its own seed)"),
    "presence_penalty": (_zero, "0", "penalties are not implemented (they would change the target's distribution)"),
    "frequency_penalty": (_zero, "0", "penalties are not implemented (they would change the target's distribution)"),
    "logit_bias": (lambda v: not v, "{} or null", "logit biases are not implemented (they would change the target's "
                   "distribution)"),
    "audio": (_absent, "null", "this server writes text only, no audio"),
    "modalities": (lambda v: v is None or v == ["text"], '["text"] or null', "this server writes text only"),
    "moderation": (_absent, "null", "this server runs no moderation"),
    "reasoning_effort": (_absent, "null", "this server cannot steer a model's reasoning"),
    "verbosity": (_absent, "null", "this server cannot steer a model's verbosity"),
    "web_search_options": (_absent, "null", "this server searches no web"),
    "service_tier": (lambda v: v in (None, "auto", "default"), "'auto', 'default' or null",
                     "this server has one tier"),
    "store": (lambda v: v is not True, "false or null", "this server stores no answers"),
    "echo": (lambda v: v is not True, "false or null", "echoing the prompt is not implemented"),
    "suffix": (lambda v: not v, "an empty string or null", "suffix (insertion) is not implemented"),
    "best_of": (lambda v: v in (None, 1), "1 or null", "one candidate per request"),
}


def _one(value) -> bool:
    return value is None or (not isinstance(value, bool) and value == 1)


def _false(value) -> bool:
    return value is None or value is False


def _true(value) -> bool:
    return value is None or value is True


def _empty(value) -> bool:
    return value is None or (isinstance(value, list | dict | str) and not value)


def _equals(*values) -> Callable[[Any], bool]:
    """None, or one of ``values`` (numbers compared as numbers, never a bool)."""
    return lambda v: v is None or (not isinstance(v, bool) and any(v == x for x in values))


class Other(NamedTuple):
    """A field of another server's API: whose, the values that ask for nothing (in words too), what to do instead.
    ``tunes``: the fields it only tunes (a sampler's parameter): when the body sends them and they ask for
    nothing, any value of this one is accepted as well (it changes nothing there either)."""

    server: str
    neutral: Callable[[Any], bool]
    accepted: str
    why: str
    tunes: tuple[str, ...] = ()


VLLM, LLAMA, BOTH = "vLLM", "llama.cpp", "vLLM and llama.cpp"
_PENALTY = "repetition penalties are not implemented (they would change the target's distribution)"
_SAMPLER = "is not implemented (the sampler here: temperature, top_k, top_p, min_p)"
_GRAMMAR = ("a grammar is not accepted over this API (the server builds its own from response_format and tools); "
            "for JSON send response_format {type: json_schema, json_schema: {name, schema}} or {type: json_object}")
_JSON = "send response_format {type: json_schema, json_schema: {name, schema}} instead"
# Another server's request field that would change the answer there, by name: a 400 naming it unless its value asks
# for nothing (tests/test_request_fields.py sends each, and each neutral value; docs/request-fields.md lists them).
# A field of our own request models (echo on completions, logit_bias) is checked by NEUTRAL instead.
OTHER_SERVERS: dict[str, Other] = {
    # what the answer is made of: other servers' grammars
    "guided_json": Other(VLLM, _absent, "null", _JSON),
    "guided_regex": Other(VLLM, _absent, "null", "regular-expression constraints are not accepted over this API; "
                          "send response_format json_schema {type: string, pattern} (the answer is then a JSON "
                          "string matching it)"),
    "guided_choice": Other(VLLM, _absent, "null", "send response_format json_schema with {\"enum\": [...]} "
                           "(the answer is then one of them, as a JSON string)"),
    "guided_grammar": Other(VLLM, _absent, "null", _GRAMMAR),
    "guided_decoding_backend": Other(VLLM, _absent, "null", "constraints here are llguidance's only: leave it out"),
    "guided_whitespace_pattern": Other(VLLM, _absent, "null", "JSON here is laid out as json.dumps writes it "
                                       "(\", \" and \": \"): leave it out"),
    "structured_outputs": Other(VLLM, _absent, "null", _JSON),
    "grammar": Other(LLAMA, _empty, "null or an empty string", _GRAMMAR),
    "json_schema": Other(LLAMA, _absent, "null", _JSON),
    # how long the answer is, where it ends
    "n_predict": Other(LLAMA, _absent, "null", "send max_tokens instead"),
    "min_tokens": Other(VLLM, _equals(0), "0 or null", "a minimum length is not implemented: the answer ends where "
                        "the model ends it (or at max_tokens)"),
    "ignore_eos": Other(BOTH, _false, "false or null", "the answer always ends at the model's end of generation; "
                        "set max_tokens for its length"),
    "stop_token_ids": Other(VLLM, _empty, "[] or null", "send stop strings (stop) instead"),
    "include_stop_str_in_output": Other(VLLM, _false, "false or null", "a stop string is cut from the answer, as "
                                        "OpenAI does"),
    "t_max_predict_ms": Other(LLAMA, _equals(0), "0 or null", "an answer is not cut by time: set max_tokens"),
    "n_indent": Other(LLAMA, _equals(0), "0 or null", "a minimum indentation is not implemented"),
    # how the next token is drawn
    "repetition_penalty": Other(VLLM, _one, "1 or null", _PENALTY),
    "repeat_penalty": Other(LLAMA, _one, "1 or null", _PENALTY),
    "repeat_last_n": Other(LLAMA, _equals(0, 64), "0, 64 or null (or any with repeat_penalty 1)", _PENALTY,
                           ("repeat_penalty",)),
    "penalty_last_n": Other(LLAMA, _equals(0, 64), "0, 64 or null (or any with repeat_penalty 1)", _PENALTY,
                            ("repeat_penalty",)),
    "penalize_nl": Other(LLAMA, _false, "false or null (or any with repeat_penalty 1)", _PENALTY,
                        ("repeat_penalty",)),
    "dry_multiplier": Other(LLAMA, _equals(0), "0 or null", "DRY " + _SAMPLER),
    "dry_base": Other(LLAMA, _equals(1.75), "1.75 or null (or any with dry_multiplier 0)", "DRY " + _SAMPLER,
                      ("dry_multiplier",)),
    "dry_allowed_length": Other(LLAMA, _equals(2), "2 or null (or any with dry_multiplier 0)", "DRY " + _SAMPLER,
                                ("dry_multiplier",)),
    "dry_penalty_last_n": Other(LLAMA, _equals(-1, 0, 64), "-1, 0, 64 or null (or any with dry_multiplier 0)",
                                "DRY " + _SAMPLER, ("dry_multiplier",)),
    "dry_sequence_breakers": Other(LLAMA, lambda v: v is None or v == ["\n", ":", '"', "*"],
                                   'null or ["\\n", ":", "\\"", "*"] (or any with dry_multiplier 0)',
                                   "DRY " + _SAMPLER, ("dry_multiplier",)),
    "xtc_probability": Other(LLAMA, _equals(0), "0 or null", "XTC " + _SAMPLER),
    "xtc_threshold": Other(LLAMA, _equals(0.1), "0.1 or null (or any with xtc_probability 0)", "XTC " + _SAMPLER,
                           ("xtc_probability",)),
    "mirostat": Other(LLAMA, _equals(0), "0 or null", "Mirostat " + _SAMPLER),
    "mirostat_tau": Other(LLAMA, _equals(5), "5 or null (or any with mirostat 0)", "Mirostat " + _SAMPLER,
                          ("mirostat",)),
    "mirostat_eta": Other(LLAMA, _equals(0.1), "0.1 or null (or any with mirostat 0)", "Mirostat " + _SAMPLER,
                          ("mirostat",)),
    "typical_p": Other(LLAMA, _one, "1 or null", "locally typical sampling " + _SAMPLER),
    "tfs_z": Other(LLAMA, _one, "1 or null", "tail-free sampling " + _SAMPLER),
    "top_n_sigma": Other(LLAMA, lambda v: v is None or (not isinstance(v, bool) and isinstance(v, int | float)
                                                        and v <= 0), "a number <= 0 or null",
                         "top-n-sigma " + _SAMPLER),
    "dynatemp_range": Other(LLAMA, _equals(0), "0 or null", "dynamic temperature " + _SAMPLER),
    "dynatemp_exponent": Other(LLAMA, _one, "1 or null (or any with dynatemp_range 0)",
                               "dynamic temperature " + _SAMPLER, ("dynatemp_range",)),
    "min_keep": Other(LLAMA, _equals(0), "0 or null", "a sampler's minimum of tokens kept is not implemented"),
    "samplers": Other(LLAMA, _absent, "null", "the sampler chain here is fixed (top_k, top_p, min_p, temperature)"),
    "use_beam_search": Other(VLLM, _false, "false or null", "beam search is not implemented"),
    "length_penalty": Other(VLLM, _one, "1 or null (or any with use_beam_search false)",
                            "beam search is not implemented", ("use_beam_search",)),
    "early_stopping": Other(VLLM, _false, "false or null (or any with use_beam_search false)",
                            "beam search is not implemented", ("use_beam_search",)),
    "bad_words": Other(VLLM, _empty, "[] or null", "banned words are not implemented"),
    "allowed_token_ids": Other(VLLM, _absent, "null", "a token allow-list is not implemented; for a fixed set of "
                               "answers send response_format json_schema with an enum"),
    "logits_processors": Other(VLLM, _empty, "[] or null", "logits processors are not implemented"),
    "lora": Other(LLAMA, _empty, "[] or null", "LoRA adapters are not implemented"),
    "n_cmpl": Other(LLAMA, _one, "1 or null", "one choice per request (send several requests, each with its own "
                    "seed)"),
    # what the answer carries beside its text
    "n_probs": Other(LLAMA, _equals(0), "0 or null", "send logprobs (chat: logprobs true and top_logprobs; "
                     "completions: logprobs, the alternatives per token) instead"),
    "post_sampling_probs": Other(LLAMA, _false, "false or null", "log-probabilities here are the target's raw ones "
                                 "(logprobs)"),
    "prompt_logprobs": Other(VLLM, _absent, "null", "the prompt's log-probabilities are not returned"),
    "return_tokens_as_token_ids": Other(VLLM, _false, "false or null", "tokens are returned as text"),
    "skip_special_tokens": Other(VLLM, _true, "true or null", "special tokens are always left out of the text"),
    "spaces_between_special_tokens": Other(VLLM, _true, "true or null (or any with skip_special_tokens true)",
                                           "special tokens are left out of the text", ("skip_special_tokens",)),
    "reasoning_format": Other(LLAMA, lambda v: v is None or v == "none", "'none' or null",
                              "the reply's reasoning is not split out: it stays in the text (as 'none')"),
    # what the prompt is
    "truncate_prompt_tokens": Other(VLLM, _absent, "null", "a prompt is never cut: one longer than the context is a "
                                    "400"),
    "chat_template": Other(VLLM, _absent, "null", "the model's own chat template renders every conversation"),
    "chat_template_kwargs": Other(BOTH, _empty, "{} or null", "the chat template gets no variables but the "
                                  "messages and tools"),
    "add_generation_prompt": Other(VLLM, _true, "true or null", "the reply always starts a new assistant turn"),
    "continue_final_message": Other(VLLM, _false, "false or null", "continuing the last assistant message is not "
                                    "implemented: the reply starts a new assistant turn"),
    "echo": Other(VLLM, _false, "false or null", "echoing the prompt is not implemented"),
    "documents": Other(BOTH, _empty, "[] or null", "documents are not rendered into the prompt: put them in the "
                       "messages"),
}


def _shown(value) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:80] + "…"


class Strict(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(Strict):
    include_usage: StrictBool = False
    include_obfuscation: StrictBool | None = None  # ignored: OpenAI's padding of stream events, no content


class Speculative(Strict):
    """Our extra field: how this request drafts (a ``--draft`` form without a file) and its γ."""

    draft: str | None = None
    gamma: StrictInt | str | None = None


class TextPart(Strict):
    type: Literal["text"]
    text: str


def json_depth(value) -> int:
    """How many objects and arrays are nested in ``value`` at its deepest (iteratively: no recursion limit)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            todo += [(child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return deepest


class FunctionDef(Strict):
    name: Annotated[str, Field(pattern=TOOL_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None

    @field_validator("parameters")
    @classmethod
    def _bounded(cls, value):
        if value is None:
            return value
        size = len(json.dumps(value, separators=(",", ":")))
        if size > MAX_SCHEMA_BYTES:
            raise ValueError(f"the schema is {size} bytes of JSON: at most {MAX_SCHEMA_BYTES} are accepted")
        depth = json_depth(value)
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"the schema nests {depth} levels of objects and arrays: at most {MAX_SCHEMA_DEPTH}")
        return value


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class CalledFunction(Strict):
    name: str
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _json(cls, value: str) -> str:
        try:
            json.loads(value)
        except ValueError as err:
            raise ValueError(f"must be a JSON string (the arguments as JSON): {err}") from None
        return value


class ToolCall(Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def for_template(self) -> dict:
        """The message as chat templates take it: developer is system, contents text, calls' arguments parsed."""
        out = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": json.loads(c.function.arguments)}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class JsonSchemaFormat(Strict):
    """``response_format.json_schema``: the schema the answer must match (``strict`` or not, it is enforced)."""

    name: Annotated[str, Field(pattern=TOOL_NAME)] = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: StrictBool | None = None

    @field_validator("schema_")
    @classmethod
    def _bounded(cls, value):
        return FunctionDef._bounded(value)


class ResponseFormat(Strict):
    """OpenAI's ``response_format``: ``text`` (no constraint), ``json_object`` (any JSON object) or
    ``json_schema`` (JSON matching ``json_schema.schema``), enforced by constrained decoding (``specdec.grammar``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(Strict):
    """The fields both endpoints share: length, sampling, stop strings, streaming, ours."""

    model: str | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    n: Annotated[StrictInt, Field(ge=1)] | None = None  # refused but 1
    seed: Annotated[StrictInt, Field(ge=-(2**63), le=2**64 - 1)] | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    speculative: Speculative | None = None
    response_format: ResponseFormat | None = None
    presence_penalty: float | None = None  # refused but 0
    frequency_penalty: float | None = None  # refused but 0
    logit_bias: dict[str, Any] | list | None = None  # refused but {} (or llama.cpp's [[token, bias], ...] form: [])
    user: str | None = None  # ignored
    _others: dict[str, Any] = PrivateAttr(default_factory=dict)  # the OTHER_SERVERS fields the body sends

    @model_validator(mode="wrap")
    @classmethod
    def _keep_others(cls, data, handler):
        """Keeps the body's ``OTHER_SERVERS`` fields (``extra="ignore"`` would drop them) for :meth:`unsupported`."""
        model = handler(data)
        if isinstance(data, dict) and isinstance(model, SamplingFields):
            model._others = {k: data[k] for k in OTHER_SERVERS if k in data and k not in type(model).model_fields}
        return model

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value):
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOPS or any(not s for s in stops):
            raise ValueError(f"must be {ACCEPTED['stop']}")
        return value

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def unsupported(self) -> tuple[str, str] | None:
        """(field, why) for the first field set to something we cannot honour (``NEUTRAL``, then another server's
        field of ``OTHER_SERVERS``), else None."""
        fields = type(self).model_fields
        for name, (neutral, accepted, why) in NEUTRAL.items():
            value = getattr(self, name) if name in fields else None
            if not neutral(value):
                return name, f"{name}={_shown(value)} is not supported: {why}; accepted: {accepted}"
        others = self._others
        for name, other in OTHER_SERVERS.items():  # in the table's order: a sampler before its parameters
            if name not in others:
                continue
            value = others[name]
            moot = other.tunes and all(t in others and OTHER_SERVERS[t].neutral(others[t]) for t in other.tunes)
            if not (other.neutral(value) or moot):
                return name, (f"{name}={_shown(value)} ({other.server}'s field) is not supported: {other.why}; "
                              f"accepted: {other.accepted}")
        return None


class ChatRequest(SamplingFields):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Any = None  # one of TOOL_CHOICES or {"type": "function", "function": {"name": ...}}
    parallel_tool_calls: StrictBool | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    functions: Any = None  # deprecated by OpenAI: refused
    function_call: Any = None
    audio: Any = None  # refused, as the rest of NEUTRAL: a 400 but for the value that asks for nothing
    modalities: Any = None
    moderation: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    service_tier: str | None = None  # ignored: 'auto' or 'default' (others refused)
    store: StrictBool | None = None  # ignored: false (true refused)
    metadata: dict[str, str] | None = None  # ignored, as below: none changes the answer
    prediction: dict[str, Any] | None = None  # a predicted output only saves OpenAI time: the answer is the same
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, value):
        seen: dict[str, int] = {}
        for i, tool in enumerate(value or []):
            if tool.function.name in seen:
                raise ValueError(f"the function name {tool.function.name!r} is declared twice "
                                 f"(tools[{seen[tool.function.name]}] and tools[{i}]): names must be unique")
            seen[tool.function.name] = i
        size = sum(len(json.dumps(t.function.parameters or {}, separators=(",", ":"))) for t in value or [])
        if size > MAX_TOOLS_BYTES:
            raise ValueError(f"the tools' parameters schemas are {size} bytes of JSON together: at most "
                             f"{MAX_TOOLS_BYTES} are accepted")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _choice(cls, value):
        if value is None or value in TOOL_CHOICES:
            return value
        named = isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict)
        name = value["function"].get("name") if named else None
        if not isinstance(name, str):
            raise ValueError(f"must be {ACCEPTED['tool_choice']}")
        return {"type": "function", "function": {"name": name}}

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprob_count(self) -> int | None:
        """The alternatives per token asked (``top_logprobs``, 0 by default) when ``logprobs`` is true, else None."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self) -> list[dict]:
        return [m.for_template() for m in self.messages]


class CompletionRequest(SamplingFields):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[
        list[StrictInt], Field(min_length=1)]
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LEGACY_LOGPROBS)] | None = None
    echo: StrictBool | None = None  # refused but false
    suffix: str | None = None  # refused but ""
    best_of: StrictInt | None = None  # refused but 1

    def limit(self) -> int | None:
        return self.max_tokens

    def logprob_count(self) -> int | None:
        return self.logprobs
