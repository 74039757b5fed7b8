"""The request bodies the server accepts, as pydantic models: the OpenAI fields we honour, plus ours.

Which fields there are, and what is done with each (honoured, ignored, refused; other servers' fields):
``specdec.server.fields``. Here: their types and bounds, ``ACCEPTED`` stating each bound in words (a value outside
it is a 400 naming the field and quoting it).
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
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictInt, field_validator, model_validator

from ..choices import MAX_GAMMA
from .fields import NEUTRAL, OTHER_SERVERS, unsupported

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
    "parallel_tool_calls": "true or false (unset: false, one call a reply)",
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
        return unsupported({name: getattr(self, name) for name in NEUTRAL if name in fields}, self._others)


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
