"""The OpenAI response objects: whole completions, stream chunks, and server-sent event framing.

Terms: a *kind* is ``chat`` (``chat.completion`` objects, text in ``message.content`` or
``delta.content``) or ``text`` (``text_completion`` objects, text in ``choices[].text``). A stream
is a series of *chunks*, each one SSE event ``data: {json}\\n\\n``, ending with ``data: [DONE]``.
Our figures ride in the extra field ``specdec``, which OpenAI clients ignore. Every object is
strict JSON: a figure without a value (α of a request that drafted nothing) is ``null``, never
``NaN`` (``specdec.strict_json``).

A chat request with tools (``tools.ToolPlan``) reads its reply with the plan's parser (``tool_parser``): the
whole answer's ``message`` has ``tool_calls`` and ``content`` null when the reply is only calls; a stream sends
each call as deltas (its index, id, type and name first, then its arguments' fragments); a reply with calls
finishes with ``tool_calls`` (``length`` when cut).

With ``logprobs`` asked (``logprobs``: k alternatives per token), ``choices[0].logprobs`` carries the returned text's
tokens' entries (``server.logprobs``: chat's ``content`` list, completions' legacy lists); a stream's chunk carries
those its text completes (entries the tool parser's held text leaves without a chunk ride on the next one, at the
latest the finishing chunk). A reply with tool calls carries the entries of all its tokens, the calls' too.
"""

from __future__ import annotations

import time
import uuid

from .. import strict_json
from .logprobs import chat_logprobs, legacy_logprobs
from .tool_parser import openai_deltas, read_calls

DONE = "data: [DONE]\n\n"


class Shaper:
    """Builds one request's response objects, all with the same id, creation time and model."""

    def __init__(self, kind: str, model: str, tools=None, logprobs: int | None = None) -> None:
        self.kind, self.model, self.tools = kind, model, tools  # tools: a tools.ToolPlan, or None
        self.logprobs = logprobs  # the alternatives per token asked for, or None: no logprobs
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.parser = tools.parser() if tools is not None else None  # a stream's
        self.called = False  # the stream sent a call
        self.pending: list = []  # a stream's entries not yet sent (their text gave no chunk yet)

    def _logprobs(self, entries) -> dict | None:
        if self.logprobs is None or entries is None:
            return None
        return chat_logprobs(entries) if self.kind == "chat" else legacy_logprobs(entries, self.logprobs)

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def completion(self, text: str, reason: str, usage: dict, figures: dict, entries=()) -> dict:
        if self.kind == "chat":
            message = {"role": "assistant", "content": text}
            if self.tools is not None:
                content, calls = read_calls(self.tools.parser(), text)
                message = {"role": "assistant", "content": content} | ({"tool_calls": calls} if calls else {})
                reason = "tool_calls" if calls and reason == "stop" else reason
            choice = {"index": 0, "message": message, "logprobs": self._logprobs(entries), "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": self._logprobs(entries), "finish_reason": reason}
        return strict_json.finite(self._head(False) | {"choices": [choice], "usage": usage, "specdec": figures})

    def chunk(self, text: str | None, reason: str | None = None, *, role: bool = False,
              usage_field: bool = False, figures: dict | None = None, entries=None) -> dict:
        if self.kind == "chat":
            delta = ({"role": "assistant", "content": ""} if role else {}) | (
                {"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "logprobs": self._logprobs(entries), "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": self._logprobs(entries), "finish_reason": reason}
        out = self._head(True) | {"choices": [choice]}
        if usage_field:
            out["usage"] = None
        if figures is not None:
            out["specdec"] = figures
        return out

    def delta_chunks(self, text: str, *, usage_field: bool = False, final: bool = False, entries=()) -> list[dict]:
        """The chunks of a stream's new ``text`` (``final``: and of what the tool parser still held); the first
        carries ``entries`` and those pending (none: they stay pending)."""
        self.pending += entries
        if self.parser is None:
            chunks = [self.chunk(text, usage_field=usage_field)] if text else []
        else:
            events = self.parser.feed(text) + (self.parser.close() if final else [])
            deltas = openai_deltas(events)
            self.called = self.called or any("tool_calls" in d for d in deltas)
            chunks = [self._with_delta(d, usage_field) for d in deltas]
        if chunks and self.logprobs is not None:
            chunks[0]["choices"][0]["logprobs"] = self._logprobs(self.take_pending() or None)
        return chunks

    def take_pending(self) -> list:
        """The entries no chunk carried yet (the finishing chunk takes them), and none left pending."""
        out, self.pending = self.pending, []
        return out

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.called and reason == "stop" else reason

    def _with_delta(self, delta: dict, usage_field: bool) -> dict:
        out = self.chunk(None, usage_field=usage_field)
        out["choices"][0]["delta"] = delta
        return out

    def usage_chunk(self, usage: dict) -> dict:
        """The last chunk when the client asked for ``stream_options.include_usage``: no choices."""
        return self._head(True) | {"choices": [], "usage": usage}


def sse(payload: dict) -> str:
    return f"data: {strict_json.dumps(payload, ensure_ascii=False)}\n\n"
