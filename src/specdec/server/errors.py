"""Errors as the OpenAI API shapes them, and the guards that turn bad input into them.

Every error answer is ``{"error": {"message", "type", "param", "code"}}``: ``param`` names the
field at fault (None when no one field is), ``message`` says what was wrong and what is accepted.
A user's mistake is a 4xx, never a 5xx: FastAPI's 422 validation answer becomes this shape with
status 400, malformed JSON likewise, an oversized body is refused with 413 before it is read
to the end, and a body that does not arrive in full within its time (shorter than its
Content-Length, or trickled) with 408 (:class:`BodyLimit`).
"""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from .schema import ACCEPTED


class ApiError(Exception):
    """An answer other than success: HTTP status and the OpenAI error fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def describe_validation(errors: list[dict]) -> tuple[str, str | None, str]:
    """(message, param, code) for pydantic's first error: the field, what came, what is accepted."""
    if not errors:
        return "invalid request body", None, "invalid_request"
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return f"the request body is not valid JSON ({detail})".replace(" ()", ""), None, "invalid_json"
    if not loc:
        return f"the request body must be a JSON object ({first.get('msg', '')})", None, "invalid_request"
    param = _param_name(loc)
    field = loc[0] if loc[0] in ACCEPTED else (loc[-1] if loc[-1] in ACCEPTED else None)
    accepted = f"; accepted: {ACCEPTED[field]}" if field else ""
    if first.get("type") == "missing":
        return f"{param} is required{accepted}", param, "missing_field"
    got = first.get("input")
    shown = json.dumps(got)[:80] if _jsonable(got) else repr(got)[:80]
    return f"{param}={shown} is invalid: {first.get('msg', 'invalid value')}{accepted}", param, "invalid_value"


UNION_BRANCHES = {"str", "int", "float", "bool", "dict", "none"}


def _param_name(loc: list[str]) -> str:
    """``["messages", "0", "role"]`` → ``messages[0].role``; pydantic's union branch names dropped."""
    out = ""
    for part in loc:
        if part.isdigit():
            out += f"[{part}]"
        elif part in UNION_BRANCHES or part.startswith(("list[", "function-", "constrained-", "json-or-python")):
            continue
        else:
            out += ("." if out else "") + part
    return out


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param, code = describe_validation(list(exc.errors()))
    return JSONResponse(error_body(message, param=param, code=code), status_code=400)


async def on_http_error(request: Request, exc) -> JSONResponse:
    """Starlette's own errors (404 unknown path, 405 wrong method) in the OpenAI shape."""
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", "") or "error"
    code = {404: "not_found", 405: "method_not_allowed"}.get(status)
    return JSONResponse(error_body(f"{request.method} {request.url.path}: {detail}", param=None, code=code),
                        status_code=status, headers=getattr(exc, "headers", None))


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413 without being kept, one not
    received in full within ``timeout`` seconds 408; a body is read as JSON whatever its Content-Type
    says (``curl -d`` sends a form type)."""

    def __init__(self, app, limit: int, timeout: float = 10.0) -> None:
        self.app, self.limit, self.timeout = app, limit, timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(send)
            return
        chunks, size, more = [], 0, True
        deadline = asyncio.get_running_loop().time() + self.timeout
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except asyncio.TimeoutError:
                await self._too_slow(send, size, declared)
                return
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                await self._refuse(send)
                return
        body, sent = b"".join(chunks), False
        scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
                     + [(b"content-type", b"application/json")])

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send) -> None:
        error = ApiError(413, f"the request body is larger than this server accepts: at most {self.limit} bytes",
                         code="body_too_large")
        await error.response()({"type": "http"}, _nothing, send)

    async def _too_slow(self, send, size: int, declared: bytes | None) -> None:
        of = f" of the {int(declared)} its Content-Length announced" if declared else ""
        error = ApiError(408, f"the request body did not arrive within {self.timeout:g} s: {size} bytes came{of}",
                         code="body_timeout", headers={"Connection": "close"})
        await error.response()({"type": "http"}, _nothing, send)


async def _nothing():
    return {"type": "http.disconnect"}
