"""The OpenAI response objects: whole completions, stream chunks, and server-sent event framing.

Terms: a *kind* is ``chat`` (``chat.completion`` objects, text in ``message.content`` or
``delta.content``) or ``text`` (``text_completion`` objects, text in ``choices[].text``). A stream
is a series of *chunks*, each one SSE event ``data: {json}\\n\\n``, ending with ``data: [DONE]``.
Our figures ride in the extra field ``specdec``, which OpenAI clients ignore. Every object is
strict JSON: a figure without a value (α of a request that drafted nothing) is ``null``, never
``NaN`` (``specdec.strict_json``).
"""

from __future__ import annotations

import time
import uuid

from .. import strict_json

DONE = "data: [DONE]\n\n"


class Shaper:
    """Builds one request's response objects, all with the same id, creation time and model."""

    def __init__(self, kind: str, model: str) -> None:
        self.kind, self.model = kind, model
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def completion(self, text: str, reason: str, usage: dict, figures: dict) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return strict_json.finite(self._head(False) | {"choices": [choice], "usage": usage, "specdec": figures})

    def chunk(self, text: str | None, reason: str | None = None, *, role: bool = False,
              usage_field: bool = False, figures: dict | None = None) -> dict:
        if self.kind == "chat":
            delta = ({"role": "assistant", "content": ""} if role else {}) | (
                {"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        out = self._head(True) | {"choices": [choice]}
        if usage_field:
            out["usage"] = None
        if figures is not None:
            out["specdec"] = figures
        return out

    def usage_chunk(self, usage: dict) -> dict:
        """The last chunk when the client asked for ``stream_options.include_usage``: no choices."""
        return self._head(True) | {"choices": [], "usage": usage}


def sse(payload: dict) -> str:
    return f"data: {strict_json.dumps(payload, ensure_ascii=False)}\n\n"
