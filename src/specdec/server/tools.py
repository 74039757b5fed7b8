"""Tool calls on ``/v1/chat/completions``: the models' call formats, the grammar of a call, a request's plan.

Terms:

- a *format* is how a model family writes a tool call, one row of :data:`FORMATS`: its *style* and *marker*
  (how ``tool_parser`` reads it), the key its arguments go under, the template text that names it, and its
  grammar. ``hermes`` (Qwen2.5, the default pair; Qwen3; Hermes 2 Pro): ``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>``, several calls one per line; ``llama3_json`` (Llama 3.1–3.3): ``{"name": ..., "parameters":
  {...}}`` at the start of the reply (optionally after ``<|python_tag|>``), one call (Llama's template refuses more);
- a model's format is chosen from its chat template (:func:`tool_format_of`): a template that renders the same
  with and without tools has none, and ``tools`` sent to it are a 400 naming the model;
- the *call grammar* (:func:`call_grammar`) is an llguidance Lark grammar of the reply: for ``required`` or a named
  function the whole reply is the call(s); for ``auto`` free text, or text up to the marker and then calls (run
  lazily: free until the marker token, ``grammar.LazyGrammar``), or with ``response_format`` beside the tools
  either the answer's JSON or calls. Each call is ``%json`` with the declared tool's name as a constant and its
  ``parameters`` schema, written as the template writes calls in the history (``", "`` and ``": "``, no other
  whitespace);
- a request's *plan* (:class:`ToolPlan`, from :func:`tool_plan`): its format, tools, choice and ``parallel`` —
  what renders the prompt (``tools``), constrains the reply (``grammar``) and reads it (``parser()``).
  ``tool_choice`` ``none`` (and no tools) has no plan: the tools are not rendered and the reply is text as it is.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, unquote

from ..grammar import GrammarError, check_ends
from ..loading.chat import render
from .errors import ApiError
from .schema import ChatRequest
from .tool_parser import CallParser

# Calls as chat templates write them in the history (Python's json.dumps / Jinja's tojson): no other whitespace.
SEPARATORS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
PROBE_TOOL = {"type": "function", "function": {"name": "specdec_probe", "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}


def function_of(tool) -> dict:
    """The ``function`` object of an OpenAI tool (a dict, or the schema's ``Tool``)."""
    tool = tool if isinstance(tool, dict) else tool.model_dump(exclude_none=True)
    return tool.get("function", tool)


DEF_KEYS = ("$defs", "definitions")  # where a schema keeps the subschemas its "$ref"s name (2019-09+, draft 7)
DATA_KEYS = frozenset({"const", "enum", "default", "examples"})  # values, not schemas: a "$ref" in them is data
NAMED = frozenset({"properties", "patternProperties", "dependentSchemas", "dependencies", *DEF_KEYS})  # name → schema


def _pointer(tokens) -> str:
    """The "$ref" of the JSON pointer ``tokens`` (RFC 6901 escapes, then percent-encoded as a URI fragment)."""
    return "#" + "".join("/" + quote(t.replace("~", "~0").replace("/", "~1"), safe="$!&'()*+,;=:@")
                         for t in tokens)


def _fresh(name: str, defs: dict) -> str:
    """``name``, or it with a suffix, not yet a key of ``defs`` (reserved there)."""
    fresh, n = name, 1
    while fresh in defs:
        n += 1
        fresh = f"{name}_{n}"
    defs[fresh] = None
    return fresh


def lift_defs(name: str, schema, defs: dict):
    """``schema`` (tool ``name``'s parameters) to nest in a call's schema, its ``$defs`` / ``definitions`` moved
    into ``defs`` (the root ``$defs`` of the calls' schema) as ``<name>__<def>``, every root-relative ``$ref`` of it
    rewritten to where its target now is: ``#/$defs/X...`` to ``#/$defs/<name>__X...``; any other (``#`` itself,
    ``#/properties/...``) into the parameters themselves, then moved into ``defs`` as ``<name>__parameters`` (and
    referenced from the call). A ``$ref`` to a def the tool lacks is a :class:`GrammarError`; other references
    (anchors, other documents) are left as they are."""
    if not isinstance(schema, dict):
        return schema
    renamed = {}  # (def key, def name) -> its name in defs
    for key in DEF_KEYS:
        if isinstance(schema.get(key), dict):
            renamed |= {(key, d): _fresh(f"{name}__{d}", defs) for d in schema[key]}
    root = []  # the name the parameters get in defs, once a reference needs it

    def target(ref: str) -> str:
        if not ref.startswith("#"):
            return ref
        fragment = unquote(ref[1:])
        if fragment and not fragment.startswith("/"):
            return ref  # an anchor: document-wide, wherever its schema is
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in fragment.split("/")[1:]]
        if len(tokens) >= 2 and tokens[0] in DEF_KEYS:
            if (tokens[0], tokens[1]) not in renamed:
                raise GrammarError(f"the parameters of {name!r} refer to {ref!r}, which they do not define")
            return _pointer(["$defs", renamed[(tokens[0], tokens[1])], *tokens[2:]])
        if not root:
            root.append(_fresh(f"{name}__parameters", defs))
        return _pointer(["$defs", root[0], *tokens])

    def rewrite(node):  # a schema (or a list of them): its "$ref"s, and its subschemas'
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                out[key] = target(value)
            elif key in DATA_KEYS:
                out[key] = value
            elif key in NAMED and isinstance(value, dict):  # a property named "default" is still a schema
                out[key] = {n: rewrite(sub) for n, sub in value.items()}
            else:
                out[key] = rewrite(value)
        return out

    own = rewrite({k: v for k, v in schema.items() if not (k in DEF_KEYS and isinstance(v, dict))})
    for key in DEF_KEYS:
        if isinstance(schema.get(key), dict):
            defs |= {renamed[(key, d)]: rewrite(sub) for d, sub in schema[key].items()}
    if not root:
        return own
    defs[root[0]] = own
    return {"$ref": _pointer(["$defs", root[0]])}


def call_schema(tool, args_key: str, defs: dict | None = None) -> dict:
    """The JSON schema of one call of ``tool``: its name a constant, its arguments its parameters schema. ``defs``:
    the root ``$defs`` of the schema the call is nested in, where the parameters' own ``$defs`` go
    (:func:`lift_defs`: their references are root-relative); without, the call's own root ``$defs``."""
    function = function_of(tool)
    check_ends(function.get("parameters"), f"the parameters schema of {function['name']!r}")
    own = {} if defs is None else defs
    arguments = lift_defs(function["name"], function.get("parameters") or {"type": "object"}, own)
    schema = {"type": "object", "properties": {"name": {"const": function["name"]}, args_key: arguments},
              "required": ["name", args_key], "additionalProperties": False}
    return schema if defs is not None or not own else {"$defs": own} | schema


def laid_out(schema: dict, defs: dict | None = None) -> str:
    """``schema`` (with ``defs`` as its root ``$defs``) as JSON for ``%json``, laid out as the template writes calls."""
    return json.dumps({"x-guidance": SEPARATORS} | ({"$defs": defs} if defs else {}) | schema, ensure_ascii=True)


def calls_json(tools, args_key: str) -> str:
    """The schema of one call of any of ``tools`` (as JSON for ``%json``), their parameters' ``$defs`` at its root;
    laid out as the template writes calls."""
    defs: dict = {}
    schemas = [call_schema(t, args_key, defs) for t in tools]
    return laid_out(schemas[0] if len(schemas) == 1 else {"anyOf": schemas}, defs)


def leading_grammar(tools, args_key: str, fenced: bool) -> str:
    """A call that opens the reply without a marker (Llama 3's; Qwen2.5-Coder's bare JSON, maybe in a ```json
    block): one call, nothing after it. The call's own object takes any whitespace (the model may have
    pretty-printed its opening before the call was recognised, :func:`commit_pattern`); its arguments are laid
    out as the template writes them, so their keys and punctuation are forced tokens (drafts that cost nothing)."""
    fence, close = ("(FENCE WS?)? ", ' (WS? "```")?') if fenced else ("", "")
    rules = [f'start: WS? {fence}fcall{close}', 'WS: /[ \\t\\n]+/', 'FENCE: "```json"',
             "fcall: " + " | ".join(f"fcall_{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        defs: dict = {}
        arguments = call_schema(tool, args_key, defs)["properties"][args_key]
        key, name, args = (json.dumps(json.dumps(v)) for v in ("name", function_of(tool)["name"], args_key))
        rules.append(f'fcall_{i}: "{{" WS? {key} WS? ":" WS? {name} WS? "," WS? {args} WS? ":" WS? args_{i} WS? "}}"')
        rules.append(f"args_{i}: %json {laid_out(arguments, defs)}")
    return "\n".join(rules) + "\n"


def commit_pattern(tools, fenced: bool) -> str:
    """The text from the reply's start by which a leading call is recognised: its opening and a declared name."""
    names = "|".join(re.escape(function_of(t)["name"]) for t in tools)
    fence = r"(?:```json\s*)?" if fenced else ""
    return rf'\s*{fence}\{{\s*"name"\s*:\s*"(?:{names})"'


def answer_json(answer: dict) -> str:
    """``answer`` (a JSON schema) for ``%json``, laid out as every JSON here is (its own ``x-guidance`` wins)."""
    return laid_out(answer)


def hermes_grammar(tools, required: bool, parallel: bool, answer: dict | None = None) -> str:
    """``<tool_call>`` and ``</tool_call>`` are tokens of their own in Qwen's and Hermes' tokenizers (llguidance
    reads every added token as a special token, never as its text): the grammar names them as tokens. With an
    ``answer`` schema (``response_format`` beside tools) the reply is either that JSON or calls."""
    calls = 'call ("\\n" call)*' if parallel else "call"
    if required:
        start = f"start: {calls}"
    elif answer is not None:
        start = f"start: answer | {calls}\nanswer: %json {answer_json(answer)}"
    else:
        start = f"start: TEXT | TEXT {calls}\nTEXT: /(.|\\n)*/"
    return (f'{start}\ncall: <tool_call> "\\n" fcall "\\n" </tool_call>\n'
            f"fcall: %json {calls_json(tools, 'arguments')}\n")


def llama3_grammar(tools, required: bool, parallel: bool, answer: dict | None = None) -> str:
    if required:
        start = "start: fcall"
    elif answer is not None:
        start = f"start: answer | fcall\nanswer: %json {answer_json(answer)}"
    else:
        start = "start: TEXT | fcall\nTEXT: /([^{](.|\\n)*)?/"
    return f"{start}\nfcall: %json {calls_json(tools, 'parameters')}\n"


def mentions_hermes(template: str) -> bool:
    return "<tool_call>" in template


def mentions_llama3(template: str) -> bool:
    return "<|start_header_id|>" in template and ('"parameters"' in template or "<|python_tag|>" in template)


@dataclass(frozen=True)
class ToolFormat:
    name: str
    style: str  # tool_parser's: "tagged" (marker ... end, anywhere) or "leading" (JSON objects at the start)
    marker: str  # the text that starts a call ("tagged")
    end: str  # the text that ends it ("tagged")
    args_key: str  # the key of a call's arguments in the model's JSON
    mentioned: Callable[[str], bool]  # the chat template's text names this format
    grammar: Callable[..., str]  # (tools, required, parallel, answer=None) → Lark
    fenced: bool = False  # a leading call may come in a ```json block (Qwen2.5-Coder's bare calls)
    openers: tuple[str, ...] = ()  # tokens the reply may start with before a leading call

    def parser(self, names=None, max_calls: int | None = None) -> CallParser:
        return CallParser(self.style, self.marker, self.end, names=names, max_calls=max_calls)


HERMES = ToolFormat("hermes", "tagged", "<tool_call>", "</tool_call>", "arguments", mentions_hermes, hermes_grammar,
                    fenced=True)
LLAMA3 = ToolFormat("llama3_json", "leading", "", "", "parameters", mentions_llama3, llama3_grammar,
                    openers=("<|python_tag|>",))
FORMATS = {f.name: f for f in (HERMES, LLAMA3)}


def call_grammar(tools, tool_choice, parallel: bool = True, format: str = "hermes",
                 answer: dict | None = None) -> str | None:
    """The llguidance Lark grammar of a reply to ``tools`` (OpenAI tool dicts) under ``tool_choice`` (``none``,
    ``auto``, ``required`` or ``{"type": "function", "function": {"name": ...}}``) in ``format``; None when
    the reply is free text (``none``, no tools). A named function is one call of it; ``parallel`` False one call.
    ``answer``: the JSON schema a reply that calls nothing must match under ``auto`` (``response_format``)."""
    tools = list(tools or [])
    if tool_choice is None:
        tool_choice = "auto"
    if not tools or tool_choice == "none":
        return None
    if tool_choice not in ("auto", "required"):
        name = tool_choice["function"]["name"]
        tools = [t for t in tools if function_of(t)["name"] == name]
        if not tools:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
        return FORMATS[format].grammar(tools, True, False)
    return FORMATS[format].grammar(tools, tool_choice == "required", parallel, answer)


def template_text(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "\n".join(template.values()) if isinstance(template, dict) else str(template)


def tool_format_of(tokenizer) -> tuple[ToolFormat | None, str]:
    """The tool format of ``tokenizer``'s chat template, or None and why not (said after the model's name)."""
    template = template_text(tokenizer)
    if not template:
        return None, "it has no chat template"
    probe = [{"role": "user", "content": "hi"}]
    try:
        same = render(tokenizer, probe, True, [PROBE_TOOL]) == render(tokenizer, probe, True, None)
    except Exception as err:  # a template that fails on tools
        return None, f"its chat template fails when given tools ({type(err).__name__}: {err})"
    if same:
        return None, "its chat template has no tool format (it renders the same with and without tools)"
    found = next((f for f in FORMATS.values() if f.mentioned(template)), None)
    if found is None:
        return None, ("its chat template writes tool calls in a format this server does not read (it reads "
                      "Qwen's <tool_call> and Llama 3's JSON)")
    return found, ""


@dataclass(frozen=True)
class ToolPlan:
    """What a request with tools needs: the prompt's tools, its reply's grammar, and how to read the reply."""

    format: ToolFormat
    tools: tuple  # OpenAI tool dicts, as the template renders them
    choice: object  # "auto", "required" or {"type": "function", "function": {"name": ...}}
    parallel: bool

    @property
    def names(self) -> list[str]:
        return [function_of(t)["name"] for t in self.tools]

    @property
    def max_calls(self) -> int | None:
        return None if self.parallel and self.choice in ("auto", "required") else 1

    @functools.cached_property
    def grammar(self) -> str | None:
        """The llguidance Lark grammar of the whole reply (:func:`call_grammar`; for ``auto``: free text, then
        calls); None: free text."""
        return call_grammar(self.tools, self.choice, self.parallel, self.format.name)

    @functools.cached_property
    def calls(self) -> str:
        """The Lark grammar of a reply that is only calls (``required``'s): what a lazy ``auto`` grammar follows
        from its trigger on."""
        return call_grammar(self.tools, "required", self.parallel, self.format.name)

    @functools.cached_property
    def leading(self) -> str:
        """The Lark grammar of a call that opens the reply without a marker (:func:`leading_grammar`)."""
        return leading_grammar(self.tools, self.format.args_key, self.format.fenced)

    @property
    def commit(self) -> str:
        """The regular expression by which a leading call is recognised (:func:`commit_pattern`)."""
        return commit_pattern(self.tools, self.format.fenced)

    def with_answer(self, answer: dict) -> str:
        """The Lark grammar of an ``auto`` reply that is either calls or JSON matching ``answer``."""
        return call_grammar(self.tools, self.choice, self.parallel, self.format.name, answer)

    def parser(self) -> CallParser:
        return self.format.parser(self.names, self.max_calls)


def tool_plan(body, texts, model: str) -> ToolPlan | None:
    """The plan of a chat request with tools (None without, or with ``tool_choice`` none); an ApiError names
    a choice without tools or naming no declared tool, a model without a tool format, a tool holding special-token
    text or a lone surrogate (``"\\ud800"``: JSON can carry it, no tokenizer can)."""
    if not isinstance(body, ChatRequest):
        return None
    tools = body.tools or []
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    if choice == "none" or (choice == "auto" and not tools):
        return None
    if not tools:
        raise ApiError(400, f"tool_choice={json.dumps(choice)} needs tools to choose from: declare them in tools",
                       param="tool_choice", code="invalid_value")
    names = [t.function.name for t in tools]
    if isinstance(choice, dict) and choice["function"]["name"] not in names:
        raise ApiError(400, f"tool_choice names the function {choice['function']['name']!r}, which is not declared "
                       f"in tools (declared: {', '.join(map(repr, names))})", param="tool_choice",
                       code="invalid_value")
    found, why = texts.tool_format
    if found is None:
        raise ApiError(400, f"model {model!r} cannot take tools: {why}; leave tools out, or send tool_choice "
                       "'none'", param="tools", code="tools_unsupported")
    dicts = tuple(t.model_dump(exclude_none=True, exclude={"function": {"strict"}}) for t in tools)
    for i, tool in enumerate(dicts):
        text = json.dumps(tool, ensure_ascii=False)
        surrogate = next((c for c in text if "\ud800" <= c <= "\udfff"), None)
        if surrogate is not None:  # a lone one (a pair is one character): no text, so no tokenizer takes it
            raise ApiError(400, f"tools[{i}] holds the lone surrogate {surrogate!r}, which is not text (it has no "
                           "UTF-8 form); remove it, or send the character it was half of whole",
                           param=f"tools[{i}]", code="invalid_value")
        special = next((s for s in texts.specials if s in text), None)
        if special is not None:
            raise ApiError(400, f"tools[{i}] holds the special-token text {special!r}, which the chat template "
                           "would render as a marker; remove it", param=f"tools[{i}]", code="invalid_value")
    # Unset is one call, as llama-server's default (OpenAI's is several): a small model given the room repeats its
    # call until max_tokens under tool_choice required (benchmarks/serve_compare.py's tools section did, 12 of 12).
    return ToolPlan(found, dicts, choice, body.parallel_tool_calls is True)
