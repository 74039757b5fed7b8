"""``specdec serve`` against llama.cpp's ``llama-server`` on what editors and agents send (issue 20's goals).

Both servers run in one run of this script, one after the other on 127.0.0.1 (never at once: they would share
the cores), serving the same target GGUF file, asked the same prompts by the official ``openai`` client
(AsyncOpenAI, streaming chat completions, ``temperature=0``). Every server is stopped at the end (SIGTERM,
then kill), whatever happened; every request is bounded by ``--timeout`` seconds. TTFT: request sent ->
first chunk with content. Completion tokens: the final usage chunk (``include_usage``), else content chunks.

    python benchmarks/serve_compare.py                   # all sections; benchmarks/results/serve-compare.{md,json}
    python benchmarks/serve_compare.py --sections followup cold -- --cache-gb 2 --draft model
    python benchmarks/serve_compare.py --sections structured tools --out benchmarks/results/serve-compare-schema

- ``followup``: a ``--context-tokens`` file of Python's standard library (cut at a line to that many target
  tokens) + a question as one user message, then the same file + ``--followups`` other questions (what every
  editor sends); 32-token answers. Goal: follow-up TTFT <= 1 s and <= 1.5x llama-server's.
- ``cold``: another file of that size (no cache hit), prompt reading included. Goal: <= llama-server's.
- ``concurrency``: N = ``--clients`` clients at once, each sending ``--requests-per-client`` requests in turn
  over serve_load's coding prompts: aggregate tokens/s (completion tokens / the level's wall time), TTFT
  p50/p95, tokens/s per client. Goal: >= 2.5x (N = 4), >= 3x (N = 8) its own N = 1; >= 1.5x llama-server.
- ``long``: TTFT of a cold prompt of each ``--prompt-lengths``; ``llama-bench -p 512,1024 -n 0``.
- ``structured``: ``--schema-prompts`` prompts, each with a JSON schema sent as OpenAI's ``response_format``
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}`` (llama-server turns it into a
  grammar); whole (non-streamed) answers of up to ``--schema-max-tokens`` tokens, greedy, then one sampled run
  (temperature 0.8) per ``--seeds``. End to end: completion tokens (usage) / seconds from request sent to the
  whole answer. Every answer is checked: JSON that validates against its schema (``jsonschema``). Goal (issue
  26): specdec's tokens/s >= 1.5x llama-server's.
- ``tools``: prompts with 1-3 tools each, sent with ``tools`` and each ``--tool-choices`` (``required``,
  ``auto``), the same runs; an answer is a valid call when it finishes with ``tool_calls`` and every call names
  a declared tool with arguments that validate against that tool's ``parameters``. Goal: tokens/s >= 1.5x
  llama-server's (``--jinja``). Each prompt's runs follow one another, so both servers have it cached alike.

llama-server (``$SPECDEC_LLAMA_CPP_TOOLS``, else ``benchmarks/build_llama_cpp_tools.sh``'s folder) runs with
``--host 127.0.0.1 --port P -m TARGET -c N*SLOT --parallel N -t THREADS --cache-reuse 256 --jinja`` (its slots
keep their prompt's KV cache: ``cache_prompt`` is on by default; ``--jinja``, the GGUF's own chat template as
specdec renders it, is this version's default and what its tool calls need), one start per N; the
``--parallel 1`` start also serves the other sections.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import platform
import shlex
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from serve_compare_report import goals, level_summary, markdown
from serve_load import CODING_PROMPTS
from servers import OWN_SERVER_ARGS, Server, llama_server, option_value, running, specdec_server, write_atomic

SECTIONS = ("followup", "cold", "concurrency", "long", "structured", "tools")
QUESTIONS = (
    "In one sentence, what does this module do?",
    "Which function in this file would you test first, and why? Answer in one sentence.",
    "Name one public function defined in this file and say what it returns.",
    "What would you simplify in this file? Answer in one sentence.",
)
LONG_QUESTION = "Summarize this file in one sentence."
WARMUP_PROMPT = "Write a Python function that adds two numbers."
ANSWER_TOKENS = 32  # max_tokens of the follow-up, cold and long-prompt answers (their figure is the TTFT)
SOURCES = ("textwrap.py", "argparse.py", "inspect.py", "typing.py", "subprocess.py", "tarfile.py", "pydoc.py",
           "difflib.py", "enum.py", "pickle.py", "ast.py", "dataclasses.py", "shutil.py")  # in the stdlib folder
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "amx_tile")
SAMPLED_TEMPERATURE = 0.8  # the structured and tools sections' seeded runs
TOOL_CHOICES = ("required", "auto")


@dataclass
class Answer:
    server: str  # "specdec" or "llama-server"
    section: str
    label: str  # e.g. "cold", "follow-up 2", "N=4", "4096 tokens"
    client: int = 0
    index: int = 0  # this client's n-th request
    ok: bool = False
    error: str | None = None
    ttft: float | None = None  # seconds, request sent -> first content chunk
    total: float | None = None  # seconds, request sent -> end of stream
    tokens: int | None = None  # completion tokens (usage), else content chunks
    prompt_tokens: int | None = None  # the server's usage
    chunks: int = 0
    finish_reason: str | None = None
    text: str = ""
    extra: dict | None = None  # the server's own figures: specdec's "specdec" field, llama-server's "timings"
    run: str = ""  # structured and tools: "greedy", "seed 1", "required greedy", ...
    valid: bool | None = None  # structured: JSON matching the schema; tools: valid calls (None: not checked)
    invalid: str | None = None  # why not valid
    tool_calls: list[dict] | None = None  # [{"name", "arguments"}] as the server returned them


# ---------------------------------------------------------------------------------------------- prompts


def cut_to_tokens(text: str, limit: int, count: Callable[[str], int]) -> str:
    """The longest run of ``text``'s first whole lines that ``count`` says has at most ``limit`` tokens."""
    lines = text.splitlines(keepends=True)
    lo, hi = 0, len(lines)  # lines[:lo] fits; find the largest such lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count("".join(lines[:mid])) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return "".join(lines[:lo])


def document_needs(args) -> dict[str, int]:
    """{document: tokens} for the sections asked for: the follow-up file, the cold one, one per long prompt."""
    needs = {k: args.context_tokens for k in ("followup", "cold") if k in args.sections}
    return needs | ({f"long-{n}": n for n in args.prompt_lengths} if "long" in args.sections else {})


def pick_documents(needs: dict[str, int], sources: dict[str, str],
                   count: Callable[[str], int]) -> dict[str, tuple[str, str]]:
    """For each need, (source name, its text cut to that many tokens) from the next unused source long enough,
    so that no two prompts share a file; ValueError naming the need when no source left is that long."""
    left, out = dict(sources), {}
    for key, need in needs.items():
        name = next((n for n, text in left.items() if count(text) >= need), None)
        if name is None:
            raise ValueError(f"{key}: no unused source file has {need} tokens (left: {', '.join(left) or 'none'})")
        out[key] = (name, cut_to_tokens(left.pop(name), need, count))
    return out


def file_prompt(code: str, question: str) -> str:
    """One user message: the file first (the shared prefix), the question last."""
    return f"Here is a Python file:\n\n```python\n{code}```\n\n{question}"


def stdlib_sources() -> dict[str, str]:
    folder = pathlib.Path(sysconfig.get_paths()["stdlib"])
    return {n: (folder / n).read_text(encoding="utf-8") for n in SOURCES if (folder / n).is_file()}


# ---------------------------------------------------------------------------------------- structured, tools


@dataclass(frozen=True)
class SchemaPrompt:
    name: str  # also the response_format's json_schema.name
    prompt: str
    schema: dict


@dataclass(frozen=True)
class ToolPrompt:
    name: str
    prompt: str
    tools: tuple[str, ...]  # names in TOOLS


def string(max_length: int) -> dict:
    return {"type": "string", "maxLength": max_length}


def record(properties: dict) -> dict:
    """An object schema with these properties, all required, no others (what OpenAI's strict mode asks)."""
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


SCHEMA_PROMPTS = (
    SchemaPrompt("person", "Extract the person described here as JSON: \"Dr. Maria Santos, 42, is a structural "
                 "engineer in Porto. Write to maria.santos@example.pt; she speaks Portuguese, English and Spanish.\"",
                 record({"name": string(40), "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "email": string(60), "city": string(30),
                         "languages": {"type": "array", "items": string(20), "maxItems": 5}})),
    SchemaPrompt("order", "List the items of this order as JSON, with quantities, unit prices and the total: two "
                 "notebooks at 3.50 EUR each, one pen at 1.20 EUR and a backpack at 24.99 EUR.",
                 record({"items": {"type": "array", "maxItems": 6, "items": record({
                             "item": string(30), "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
                             "unit_price": {"type": "number", "minimum": 0}})},
                         "currency": {"enum": ["EUR", "USD", "GBP"]}, "total": {"type": "number", "minimum": 0}})),
    SchemaPrompt("config", "Write the configuration of a web service as JSON: it listens on port 8080 on all "
                 "interfaces with 4 workers, logs at info level to /var/log/app.log and serves TLS with the "
                 "certificate /etc/ssl/app.pem.",
                 record({"host": string(40), "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                         "workers": {"type": "integer", "minimum": 1, "maximum": 64},
                         "log": record({"level": {"enum": ["debug", "info", "warning", "error"]}, "file": string(60)}),
                         "tls": record({"enabled": {"type": "boolean"}, "certificate": string(60)})})),
    SchemaPrompt("review", "Review this Python function and answer as JSON: a verdict, a severity, the line of the "
                 "problem and a one-sentence comment.\n\n```python\ndef average(xs):\n    total = sum(xs)\n"
                 "    return total / len(xs)\n```",
                 record({"verdict": {"enum": ["approve", "request_changes", "comment"]},
                         "severity": {"enum": ["none", "low", "medium", "high"]},
                         "line": {"type": "integer", "minimum": 1, "maximum": 100}, "comment": string(160)})),
    SchemaPrompt("function", "Describe, as JSON, a Python function that merges two sorted lists: its name, its "
                 "parameters with their types, its return type and a docstring.",
                 record({"name": {"type": "string", "pattern": "^[a-z_][a-z0-9_]{0,30}$"},
                         "parameters": {"type": "array", "maxItems": 4, "items": record({
                             "name": string(20), "type": {"enum": ["int", "str", "float", "list", "dict"]}})},
                         "returns": {"enum": ["int", "str", "float", "list", "dict", "None"]},
                         "docstring": string(120)})),
    SchemaPrompt("event", "Turn this into a calendar event as JSON: \"Design review with Ana and Tom "
                 "(ana@example.com, tom@example.com) on 2025-03-14 from 14:30, one hour, in room B2.\"",
                 record({"title": string(60), "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                         "start": {"type": "string", "pattern": "^[0-9]{2}:[0-9]{2}$"},
                         "duration_minutes": {"type": "integer", "minimum": 1, "maximum": 1440},
                         "attendees": {"type": "array", "items": string(60), "maxItems": 6},
                         "location": string(40)})),
)


WARMUP_SCHEMA = SchemaPrompt("warmup", "Is 2 + 2 = 4? Answer as JSON.", record({"answer": {"type": "boolean"}}))


def tool(name: str, description: str, properties: dict, required: tuple[str, ...]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(required), "additionalProperties": False}}}


TOOLS = {t["function"]["name"]: t for t in (
    tool("get_weather", "Get the current weather in a city.",
         {"city": {"type": "string", "description": "The city's name"},
          "unit": {"enum": ["celsius", "fahrenheit"]}}, ("city",)),
    tool("search_files", "Search the repository's files for a text pattern.",
         {"pattern": {"type": "string", "description": "A regular expression"},
          "path": {"type": "string", "description": "The folder to search, default the repository root"},
          "max_results": {"type": "integer", "minimum": 1, "maximum": 100}}, ("pattern",)),
    tool("read_file", "Read lines of a file of the repository.",
         {"path": {"type": "string"}, "start_line": {"type": "integer", "minimum": 1},
          "end_line": {"type": "integer", "minimum": 1}}, ("path",)),
    tool("run_tests", "Run the test suite, or part of it, with pytest.",
         {"path": {"type": "string", "description": "A test file or folder"},
          "keyword": {"type": "string", "description": "Only the tests whose name matches (pytest -k)"},
          "verbose": {"type": "boolean"}}, ("path",)),
    tool("convert_currency", "Convert an amount of money from one currency to another.",
         {"amount": {"type": "number"}, "source": {"enum": ["USD", "EUR", "GBP", "JPY"]},
          "target": {"enum": ["USD", "EUR", "GBP", "JPY"]}}, ("amount", "source", "target")),
    tool("create_issue", "Open an issue in the project's tracker.",
         {"title": {"type": "string", "maxLength": 80}, "body": {"type": "string", "maxLength": 400},
          "labels": {"type": "array", "items": {"enum": ["bug", "feature", "docs"]}}}, ("title",)),
    tool("git_commit", "Commit the staged changes.",
         {"message": {"type": "string", "maxLength": 72}, "files": {"type": "array", "items": {"type": "string"}}},
         ("message",)),
)}

TOOL_PROMPTS = (
    ToolPrompt("weather", "What is the weather like in Lisbon right now, in celsius?", ("get_weather",)),
    ToolPrompt("search", "Find the Python files under src/ that mention TODO.", ("search_files", "read_file")),
    ToolPrompt("tests", "Run the tests in tests/test_server.py whose name contains 'stream'.",
               ("run_tests", "search_files", "read_file")),
    ToolPrompt("read", "Show me lines 10 to 40 of src/specdec/cli.py.", ("read_file", "search_files")),
    ToolPrompt("currency", "How much is 250 US dollars in euros?", ("convert_currency", "get_weather")),
    ToolPrompt("issue", "Open a bug report titled 'Crash on empty prompt': the server answers 500 when the prompt "
               "is empty.", ("create_issue", "run_tests", "git_commit")),
)


def runs(seeds: list[int]) -> list[tuple[str, float, int | None]]:
    """(name, temperature, seed) of the structured and tools sections' runs: greedy, then one per seed."""
    return [("greedy", 0.0, None), *((f"seed {s}", SAMPLED_TEMPERATURE, s) for s in seeds)]


def sampling(temperature: float, seed: int | None) -> dict:
    return {"temperature": temperature} | ({} if seed is None else {"seed": seed})


def schema_request(p: SchemaPrompt, max_tokens: int, temperature: float, seed: int | None) -> dict:
    """The chat request of a structured prompt: its schema as OpenAI's strict ``json_schema`` response_format."""
    return {"messages": [{"role": "user", "content": p.prompt}], "max_tokens": max_tokens,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": p.name, "schema": p.schema, "strict": True}},
            **sampling(temperature, seed)}


def tool_request(p: ToolPrompt, choice: str, max_tokens: int, temperature: float, seed: int | None,
                 parallel: bool | None = None) -> dict:
    """The chat request of a tools prompt; ``parallel_tool_calls`` only when ``parallel`` is not None (what an
    agent sends by default: nothing, each server's own default)."""
    return {"messages": [{"role": "user", "content": p.prompt}], "max_tokens": max_tokens,
            "tools": [TOOLS[n] for n in p.tools], "tool_choice": choice, **sampling(temperature, seed)} \
        | ({} if parallel is None else {"parallel_tool_calls": parallel})


def schema_error(value, schema: dict) -> str | None:
    """Why ``value`` does not validate against ``schema`` (the first error, with where), None when it does."""
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(k) for k in error.absolute_path)
    return f"{where or 'the value'}: {error.message}"[:200]


def check_structured(content: str | None, finish_reason: str | None, schema: dict) -> str | None:
    """Why a structured answer is not valid (not JSON, or not matching ``schema``), None when it is."""
    cut = " (cut at max_tokens)" if finish_reason == "length" else ""
    try:
        value = strict_loads(content or "")
    except ValueError as err:
        return f"not JSON{cut}: {err}"[:200]
    return None if (why := schema_error(value, schema)) is None else why + cut


def strict_loads(text: str):
    """``json.loads`` without Python's NaN and Infinity, which are not JSON."""
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def check_tool_calls(finish_reason: str | None, calls: list[dict] | None, tools: list[dict]) -> str | None:
    """Why an answer to ``tools`` is not valid calls, None when it is: it finishes with ``tool_calls`` and every
    call ({"name", "arguments": a JSON string}) names a declared tool, its arguments validating against that
    tool's ``parameters``."""
    declared = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    if not calls:
        return f"no tool call (finish_reason {finish_reason})"
    if finish_reason != "tool_calls":
        return f"finish_reason {finish_reason}, not tool_calls"
    for i, call in enumerate(calls):
        name = call.get("name")
        if name not in declared:
            return f"call {i}: {name!r} is not a declared tool"
        try:
            arguments = strict_loads(call.get("arguments") or "")
        except ValueError as err:
            return f"call {i} ({name}): arguments not JSON: {err}"[:200]
        why = schema_error(arguments, declared[name])
        if why is not None:
            return f"call {i} ({name}): {why}"
    return None


# ---------------------------------------------------------------------------------------------- clients


async def ask(client, model: str, prompt: str, max_tokens: int, timeout: float, answer: Answer, log) -> Answer:
    """One greedy streaming chat request through the openai client, filling ``answer``; a progress line."""
    import openai

    async def go() -> None:
        sent = time.perf_counter()
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True})
        parts = []
        async for chunk in stream:
            extra = {k: v for k, v in (chunk.model_extra or {}).items() if k in ("specdec", "timings") and v}
            if extra:
                answer.extra = (answer.extra or {}) | extra
            if chunk.usage is not None:
                answer.tokens, answer.prompt_tokens = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
            for choice in chunk.choices:
                if choice.delta is not None and choice.delta.content:
                    if answer.ttft is None:
                        answer.ttft = time.perf_counter() - sent
                    parts.append(choice.delta.content)
                    answer.chunks += 1
                if choice.finish_reason:
                    answer.finish_reason = choice.finish_reason
        answer.total = time.perf_counter() - sent
        answer.text = "".join(parts)
        answer.tokens = answer.tokens if answer.tokens is not None else answer.chunks
        answer.ok = answer.ttft is not None and answer.finish_reason is not None
        if not answer.ok:
            answer.error = "incomplete answer: " + ("no content" if answer.ttft is None else "no finish_reason")

    try:
        await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        answer.ok, answer.error = False, f"timeout: no complete answer within {timeout:g} s"
    except (openai.OpenAIError, OSError, ValueError) as err:
        answer.ok, answer.error = False, f"{type(err).__name__}: {err}"
    ttft = "–" if answer.ttft is None else f"{answer.ttft:.2f} s"
    log(f"[{answer.server}] {answer.section} {answer.label}"
        + (f" client {answer.client} #{answer.index}" if answer.section == "concurrency" else "")
        + f": TTFT {ttft}, {answer.tokens} tokens, prompt {answer.prompt_tokens}"
        + ("" if answer.ok else f", ERROR {answer.error}"))
    return answer


async def ask_whole(client, model: str, request: dict, timeout: float, answer: Answer) -> Answer:
    """One non-streamed chat request (``request``: the create() arguments but the model) through the openai
    client, filling ``answer``: seconds from sent to the whole answer, usage, content, tool calls."""
    import openai

    async def go() -> None:
        sent = time.perf_counter()
        response = await client.chat.completions.create(model=model, **request)
        answer.total = time.perf_counter() - sent
        extra = {k: v for k, v in (response.model_extra or {}).items() if k in ("specdec", "timings") and v}
        answer.extra = extra or None
        if response.usage is not None:
            answer.tokens, answer.prompt_tokens = response.usage.completion_tokens, response.usage.prompt_tokens
        if not response.choices:
            answer.error = "no choices in the answer"
            return
        choice = response.choices[0]
        answer.finish_reason, answer.text = choice.finish_reason, choice.message.content or ""
        calls = choice.message.tool_calls
        answer.tool_calls = None if calls is None else [
            {"name": c.function.name, "arguments": c.function.arguments} for c in calls]
        answer.ok = answer.finish_reason is not None and answer.tokens is not None
        if not answer.ok:
            answer.error = "incomplete answer: " + ("no usage" if answer.tokens is None else "no finish_reason")

    try:
        await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        answer.ok, answer.error = False, f"timeout: no complete answer within {timeout:g} s"
    except (openai.OpenAIError, OSError, ValueError) as err:
        answer.ok, answer.error = False, f"{type(err).__name__}: {err}"
    return answer


async def run_schema_sections(client, name: str, model: str, args, log) -> list[dict]:
    """The structured and tools sections (those asked for) on one server, each prompt's runs in a row; every
    answer checked (``valid``, ``invalid``)."""
    out = []

    async def one(section: str, label: str, run: str, request: dict, check: Callable[[Answer], str | None]):
        answer = await ask_whole(client, model, request, args.timeout, Answer(name, section, label, run=run))
        if answer.ok:
            answer.invalid = check(answer)
            answer.valid = answer.invalid is None
        seconds = "–" if answer.total is None else f"{answer.total:.2f} s"
        log(f"[{name}] {section} {label}: {seconds}, {answer.tokens} tokens, prompt {answer.prompt_tokens}, "
            + (f"ERROR {answer.error}" if not answer.ok else "valid" if answer.valid else f"INVALID {answer.invalid}"))
        out.append(asdict(answer))

    todo = runs(args.seeds)
    if "structured" in args.sections:
        for p in SCHEMA_PROMPTS[:args.schema_prompts]:
            for run, temperature, seed in todo:
                await one("structured", f"{p.name} {run}", run,
                          schema_request(p, args.schema_max_tokens, temperature, seed),
                          lambda a, p=p: check_structured(a.text, a.finish_reason, p.schema))
    if "tools" in args.sections:
        for p in TOOL_PROMPTS[:args.schema_prompts]:
            tools = [TOOLS[n] for n in p.tools]
            for choice in args.tool_choices:
                for run, temperature, seed in todo:
                    await one("tools", f"{p.name} {choice} {run}", f"{choice} {run}",
                              tool_request(p, choice, args.schema_max_tokens, temperature, seed,
                                           False if args.no_parallel_tool_calls else None),
                              lambda a, tools=tools: check_tool_calls(a.finish_reason, a.tool_calls, tools))
    return out


def openai_client(url: str, api_key: str, timeout: float):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=url + "/v1", api_key=api_key, timeout=timeout, max_retries=0)


async def run_level(url, api_key, server_name, model, clients, requests, max_tokens, timeout, log) -> dict:
    """``clients`` clients at once, each sending ``requests`` requests in turn; the level's summary."""
    async with openai_client(url, api_key, timeout) as client:
        async def one_client(c: int) -> tuple[list[Answer], float]:
            start, out = time.perf_counter(), []
            for j in range(requests):
                answer = Answer(server_name, "concurrency", f"N={clients}", c, j)
                out.append(await ask(client, model, CODING_PROMPTS[(c + j) % len(CODING_PROMPTS)], max_tokens,
                                     timeout, answer, log))
            return out, time.perf_counter() - start

        start = time.perf_counter()
        per_client = await asyncio.gather(*(one_client(c) for c in range(clients)))
        wall = time.perf_counter() - start
    return level_summary(clients, [([asdict(a) for a in rs], s) for rs, s in per_client], wall)


async def run_sections(url, api_key, name, model, args, docs, levels, log) -> dict:
    """The sections asked for on one server: {"answers": [...], "levels": [...]} ("levels" only with N in
    ``levels``)."""
    out: dict = {"answers": [], "levels": []}
    async with openai_client(url, api_key, args.timeout) as client:
        async def one(section, label, prompt):
            answer = await ask(client, model, prompt, ANSWER_TOKENS, args.timeout, Answer(name, section, label), log)
            out["answers"].append(asdict(answer))

        for i in range(args.warmup):
            await ask(client, model, WARMUP_PROMPT, 8, args.timeout, Answer(name, "warmup", str(i)), log)
            if {"structured", "tools"} & set(args.sections):  # a first grammar's one-time costs (a tokenizer index)
                answer = await ask_whole(client, model, schema_request(WARMUP_SCHEMA, 8, 0.0, None), args.timeout,
                                         Answer(name, "warmup", f"{i} json_schema"))
                log(f"[{name}] warmup {i} json_schema: " + ("–" if answer.total is None else f"{answer.total:.2f} s")
                    + ("" if answer.ok else f", ERROR {answer.error}"))
        if "followup" in args.sections:
            for i, question in enumerate(QUESTIONS[:args.followups + 1]):
                await one("followup", "cold" if i == 0 else f"follow-up {i}", file_prompt(docs["followup"], question))
        if "cold" in args.sections:
            await one("cold", "cold", file_prompt(docs["cold"], QUESTIONS[0]))
        if "long" in args.sections:
            for length in args.prompt_lengths:
                await one("long", f"{length} tokens", file_prompt(docs[f"long-{length}"], LONG_QUESTION))
        out["answers"] += await run_schema_sections(client, name, model, args, log)
    for n in levels:
        out["levels"].append(await run_level(url, api_key, name, model, n, args.requests_per_client,
                                             args.max_tokens, args.timeout, log))
    return out


# ---------------------------------------------------------------------------------------------- servers


def llama_bench(binary: pathlib.Path, model: str, threads: int, timeout: float) -> dict:
    """llama-bench's prompt reading (-p 512,1024 -n 0): {"command", "tokens_per_s": {n_prompt: avg t/s}}."""
    command = [str(binary), "-m", model, "-p", "512,1024", "-n", "0", "-t", str(threads), "-r", "3", "-o", "json"]
    out = {"command": shlex.join(command), "tokens_per_s": None, "error": None}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return out | {"error": f"no answer within {timeout:g} s"}
    try:
        out["tokens_per_s"] = parse_llama_bench(done.stdout)
    except (ValueError, KeyError, TypeError) as err:
        out["error"] = f"exit {done.returncode}: {err}: {done.stderr[-500:]}"
    return out


def parse_llama_bench(text: str) -> dict[int, float]:
    """{n_prompt: avg_ts} of llama-bench's ``-o json`` prompt-only tests."""
    return {int(t["n_prompt"]): float(t["avg_ts"]) for t in json.loads(text) if int(t["n_gen"]) == 0}


def slot_context(args) -> int:
    """Tokens of KV cache per llama-server slot: the longest prompt asked for + room, rounded up to 1024."""
    if args.slot_context:
        return args.slot_context
    longest = max(document_needs(args).values(), default=0)
    need = longest + 256 + max(ANSWER_TOKENS, args.max_tokens)
    return max(4096, -(-need // 1024) * 1024)


# ---------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, server_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="%(prog)s [options] [-- specdec serve options]")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), metavar="NAME",
                   help=f"which to run, of {' '.join(SECTIONS)} (default: all)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8], metavar="N",
                   help="concurrency levels (default: 1 4 8)")
    p.add_argument("--requests-per-client", type=int, default=2, metavar="R", help="default: %(default)s")
    p.add_argument("--max-tokens", type=int, default=64, metavar="N",
                   help="max_tokens of the concurrency requests (default: %(default)s)")
    p.add_argument("--context-tokens", type=int, default=3000, metavar="N",
                   help="tokens of the file in the follow-up and cold sections (default: %(default)s)")
    p.add_argument("--followups", type=int, default=3, metavar="K", choices=range(1, len(QUESTIONS)),
                   help=f"follow-up questions after the cold one, 1..{len(QUESTIONS) - 1} (default: %(default)s)")
    p.add_argument("--prompt-lengths", type=int, nargs="+", default=[1024, 4096, 8192], metavar="N",
                   help="the long section's prompt lengths in tokens (default: 1024 4096 8192)")
    p.add_argument("--no-llama-bench", action="store_true", help="skip llama-bench in the long section")
    p.add_argument("--schema-prompts", type=int, default=len(SCHEMA_PROMPTS), metavar="K",
                   choices=range(1, min(len(SCHEMA_PROMPTS), len(TOOL_PROMPTS)) + 1),
                   help="the first K prompts of the structured and tools sections (default: all %(default)s)")
    p.add_argument("--schema-max-tokens", type=int, default=192, metavar="N",
                   help="max_tokens of the structured and tools answers (default: %(default)s, room for "
                   "llama-server's indented JSON)")
    p.add_argument("--seeds", type=int, nargs="*", default=[1], metavar="S",
                   help=f"one sampled run (temperature {SAMPLED_TEMPERATURE}) per seed after the greedy one, "
                   "structured and tools sections (default: 1; none: greedy only)")
    p.add_argument("--no-parallel-tool-calls", action="store_true",
                   help="send parallel_tool_calls false with the tools (default: not sent, each server's default)")
    p.add_argument("--tool-choices", nargs="+", choices=TOOL_CHOICES, default=list(TOOL_CHOICES), metavar="C",
                   help="the tools section's tool_choice passes, of required auto (default: both)")
    p.add_argument("--threads", type=int, default=2, metavar="N",
                   help="llama-server's and llama-bench's -t (default: %(default)s)")
    p.add_argument("--slot-context", type=int, default=0, metavar="N",
                   help="llama-server's KV tokens per slot, -c = N x slots (default: the longest prompt + room)")
    p.add_argument("--model", metavar="GGUF", help="the target GGUF file (default: specdec serve's --target when "
                   "it names a .gguf file, else the default pair's target)")
    p.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="short requests sent (not counted) after each server start (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="seconds a request may take (default: %(default)s)")
    p.add_argument("--startup-timeout", type=float, default=600.0, metavar="S",
                   help="seconds a server may take to answer /health 200 (default: %(default)s)")
    p.add_argument("--out", default="benchmarks/results/serve-compare", metavar="STEM",
                   help="writes STEM.md and STEM.json (default: %(default)s)")
    args = p.parse_args(own)
    counts = [*args.clients, *args.prompt_lengths, args.requests_per_client, args.max_tokens, args.threads,
              args.context_tokens, args.schema_max_tokens]
    if min(counts) < 1 or args.warmup < 0 or args.slot_context < 0:
        p.error("--clients, --prompt-lengths, --requests-per-client, --max-tokens, --threads, --context-tokens and "
                "--schema-max-tokens must be >= 1, --warmup and --slot-context >= 0")
    clash = [a for a in server_args if a.split("=")[0] in OWN_SERVER_ARGS]
    if clash:
        p.error(f"{', '.join(clash)}: this script chooses the servers' host and port itself")
    args.sections = [s for s in SECTIONS if s in args.sections]
    args.clients = sorted(set(args.clients))
    args.prompt_lengths = list(dict.fromkeys(args.prompt_lengths))
    args.seeds = list(dict.fromkeys(args.seeds))
    args.tool_choices = [c for c in TOOL_CHOICES if c in args.tool_choices]
    return args, server_args


def schema_prompts_record(args) -> dict:
    """The structured and tools sections' prompts, as sent (for the report's JSON)."""
    out = {}
    if "structured" in args.sections:
        out["structured"] = [asdict(p) for p in SCHEMA_PROMPTS[:args.schema_prompts]]
    if "tools" in args.sections:
        out["tools"] = [{"name": p.name, "prompt": p.prompt, "tools": [TOOLS[n] for n in p.tools]}
                        for p in TOOL_PROMPTS[:args.schema_prompts]]
    return out


def machine() -> dict:
    from specdec.machine import all_cpu_flags, describe_cpu

    have = all_cpu_flags()
    return {"cpu": describe_cpu(), "flags": [f for f in CPU_FLAGS if f in have], "cores": os.cpu_count(),
            "python": platform.python_version(), "platform": platform.platform()}


def target_gguf(args, server_args) -> str:
    given = args.model or option_value(server_args, "--target")
    if given and given.endswith(".gguf"):
        return str(pathlib.Path(given).expanduser())
    if given:
        raise ValueError(f"--target {given} is not a .gguf file: give llama-server's file with --model")
    from specdec.loading.defaults import default_paths

    return str(default_paths(progress=False)[0])


def run(args, server_args, argv, log) -> int:
    from specdec import strict_json
    from specdec.bench.llamacpp_cli import find_tool
    from specdec.loading.tokenizer import gguf_tokenizer

    binary = find_tool("llama-server")
    bench = None if args.no_llama_bench or "long" not in args.sections else find_tool("llama-bench")
    model = target_gguf(args, server_args)
    tokenizer = gguf_tokenizer(model)
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    picked = pick_documents(document_needs(args), stdlib_sources(), count)
    docs = {k: text for k, (_, text) in picked.items()}
    api_key = option_value(server_args, "--api-key") or os.environ.get("SPECDEC_API_KEY") or "none"
    levels = args.clients if "concurrency" in args.sections else []
    slot = slot_context(args)
    log(f"CPU flags: {' '.join(machine()['flags']) or 'none'}; model {model}")
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    report = {
        "command": shlex.join([os.path.relpath(sys.argv[0]) if sys.argv[0] else "serve_compare.py", *argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "model": model, "complete": False,
        "llama_server": {"binary": str(binary), "version": (version.stdout + version.stderr).strip()[-300:],
                         "slot_context": slot, "threads": args.threads},
        "settings": {k: getattr(args, k) for k in ("sections", "clients", "requests_per_client", "max_tokens",
                                                   "context_tokens", "followups", "prompt_lengths", "warmup",
                                                   "timeout", "schema_prompts", "schema_max_tokens", "seeds",
                                                   "tool_choices", "no_parallel_tool_calls")}
        | {"answer_tokens": ANSWER_TOKENS, "sampled_temperature": SAMPLED_TEMPERATURE},
        "documents": {k: {"file": n, "tokens": count(t)} for k, (n, t) in picked.items()},
        "questions": list(QUESTIONS[:args.followups + 1]), "prompts": schema_prompts_record(args), "servers": {},
    }

    def save() -> None:
        report["goals"] = goals(report)
        write_atomic(args.out + ".json", strict_json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        write_atomic(args.out + ".md", markdown(report))

    def phase(name: str, server: Server, levels_here: list[int], sections: bool) -> None:
        here = argparse.Namespace(**vars(args) | ({} if sections else {"sections": []}))
        with running(server, args.startup_timeout, log) as (model_name, ready):
            result = asyncio.run(run_sections(server.url, api_key, name, model_name, here, docs, levels_here, log))
        entry = report["servers"].setdefault(name, {"commands": [], "ready_s": [], "answers": [], "levels": []})
        entry["commands"].append(shlex.join(server.command))
        entry["ready_s"].append(ready)
        entry["answers"] += result["answers"]
        entry["levels"] += result["levels"]
        save()

    phase("specdec", specdec_server(server_args), levels, True)
    if set(args.sections) - {"concurrency"} or 1 in levels:  # one slot: the sections and N = 1
        phase("llama-server", llama_server(str(binary), model, context=slot, parallel=1, threads=args.threads),
              [n for n in levels if n == 1], True)
    for n in (n for n in levels if n != 1):
        phase("llama-server", llama_server(str(binary), model, context=n * slot, parallel=n, threads=args.threads),
              [n], False)
    if bench is not None:
        log(f"running llama-bench: {bench}")
        report["llama_bench"] = llama_bench(bench, model, args.threads, args.timeout)
    report["complete"] = True
    save()
    print(markdown(report), flush=True)
    log(f"wrote {args.out}.md and {args.out}.json")
    errors = [a for s in report["servers"].values() for a in s["answers"] + [x for lv in s["levels"]
                                                                           for x in lv["answers"]] if not a["ok"]]
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, server_args = parse_args(argv)

    def on_term(signum, frame):  # so that `finally` stops the servers when this script is terminated
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        return run(args, server_args, argv, lambda msg: print(msg, file=sys.stderr, flush=True))
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as err:
        print(f"serve_compare: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
