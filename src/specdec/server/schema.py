"""The request bodies the server accepts, as pydantic models: the OpenAI fields we honour, plus ours.

Terms: a *request body* is the JSON a client POSTs; a field the OpenAI API defines but we cannot
honour (``n`` > 1, ``logprobs``, penalties) is refused with a 400 naming it rather than ignored, so
a client never gets silently different behaviour. Unknown extra fields are ignored, as OpenAI
clients send a few of their own. ``speculative`` (``{"draft": "lookup+model", "gamma": "auto"}``)
is our extra field: the drafter and γ of this request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from ..choices import MAX_GAMMA

MAX_STOPS = 4
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
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(Strict):
    include_usage: StrictBool = False


class Speculative(Strict):
    """Our extra field: how this request drafts (a ``--draft`` form without a file) and its γ."""

    draft: str | None = None
    gamma: StrictInt | str | None = None


class TextPart(Strict):
    type: Literal["text"]
    text: str


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class SamplingFields(Strict):
    """The fields both endpoints share: length, sampling, stop strings, streaming, ours."""

    model: str | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] | None = None
    seed: Annotated[StrictInt, Field(ge=-(2**63), le=2**64 - 1)] | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    speculative: Speculative | None = None
    logprobs: Any = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

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
        """(field, why) for a field set to something we cannot honour, else None."""
        if self.logprobs not in (None, False, 0):
            return "logprobs", "log-probabilities are not returned by this server; leave logprobs unset"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                return name, f"{name} is not supported (it would change the target's distribution); use 0"
        return None


class ChatRequest(SamplingFields):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[
        list[StrictInt], Field(min_length=1)]
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = None

    def limit(self) -> int | None:
        return self.max_tokens

    def unsupported(self) -> tuple[str, str] | None:
        if self.echo:
            return "echo", "echo is not supported; leave it false"
        if self.suffix:
            return "suffix", "suffix (insertion) is not supported"
        if self.best_of not in (None, 1):
            return "best_of", "best_of must be 1"
        return super().unsupported()
