"""Who may talk to a server: the Host allow-list, the Origin check, CORS and the API key (ASGI middleware).

Both apps (``specdec serve``'s and ``specdec explore``'s) run every HTTP request through :class:`Guard`
before any route sees it, in this order:

1. **Host** (DNS rebinding: a page on evil.example that makes its name resolve to 127.0.0.1 sends
   ``Host: evil.example``): the name in the Host header (any port) must be in the allow-list, else 403.
   Bound to a loopback address the list is 127.0.0.1, localhost and ::1 (plus any ``--allowed-host``
   the operator names, e.g. for a reverse proxy); bound to another address it also holds that address,
   and bound to every interface (0.0.0.0, ::) the address the connection reached.
2. **Origin** (a cross-site ``text/plain`` POST needs no preflight, so CORS alone does not stop it): a
   request carrying an Origin header is answered only when that origin is this server's own (the scheme
   and Host the request is addressed to) or one of ``--allow-origin``, else 403.
3. **CORS** is off (no Access-Control-* header) unless origins are allowed; then Starlette's
   ``CORSMiddleware`` answers their preflights and marks their answers.
4. **API key**: with a key set, every path but :data:`PUBLIC_PATHS` (``/health`` and the explorer's
   page and static files, which hold nothing and do nothing; the page's script then sends the key)
   needs ``Authorization: Bearer KEY``, compared in constant time; else 401 with ``WWW-Authenticate``.
   Several keys may be set (one per client): the key a request came with names its *tenant*
   (``scope["specdec.tenant"]``, :func:`~specdec.drafters.history_table.tenant_id` of the key; "" without
   keys), and the history drafter drafts for a tenant from that tenant's texts only.

Refusals come in the OpenAI error shape on the OpenAI paths (:func:`openai_path`) and in the explorer's
``{"error": message}`` shape elsewhere.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.middleware.cors import CORSMiddleware

from ..drafters.history_table import tenant_id

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
ANY_ADDRESS = frozenset({"0.0.0.0", "::", ""})
PUBLIC_PATHS = frozenset({"/health", "/", "/index.html", "/explorer"})  # and /static/…
PUBLIC_PREFIXES = ("/static/",)
TENANT = "specdec.tenant"  # the ASGI scope's key for the tenant of a request (its API key's tenant_id)
DEFAULT_PORTS = {"http": 80, "https": 443}


def is_loopback(host: str) -> bool:
    """True for localhost and loopback address literals (127.0.0.0/8, ::1)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def normal_origin(origin: str) -> str:
    """``scheme://host[:port]`` lower-cased, or ValueError naming the accepted form."""
    value = origin.strip().rstrip("/").lower()
    parts = urlsplit(value)
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path or parts.query or parts.fragment \
            or "@" in parts.netloc or port_of(parts) is None:
        raise ValueError(f"--allow-origin {origin!r} is invalid: must be an origin such as "
                         "http://localhost:3000 (http or https, a host, an optional port, no path)")
    return value


def port_of(parts) -> int | None:
    """The port of a split URL, its scheme's default when it names none; None when it is not a port."""
    try:
        port = parts.port
    except ValueError:
        return None
    return port if port is not None else DEFAULT_PORTS.get(parts.scheme)


@dataclass(frozen=True)
class GuardSettings:
    """``allowed_hosts``: the Host names answered (any port); ``any_interface``: also the address a
    connection reached (the server listens on 0.0.0.0 or ::); ``allowed_origins``: other origins whose
    requests are answered, with CORS; ``api_key``: the key every non-public path needs (None: none);
    ``api_keys``: more keys, any of which will do (each a tenant of its own)."""

    allowed_hosts: frozenset[str] = LOOPBACK_NAMES
    allowed_origins: tuple[str, ...] = ()
    api_key: str | None = None
    any_interface: bool = False
    api_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in (self.api_key, *self.api_keys):
            if key is not None and (not isinstance(key, str) or not key.strip()):
                raise ValueError("--api-key is empty: give a key, or leave the option (and SPECDEC_API_KEY) out")
        object.__setattr__(self, "api_keys", tuple(self.api_keys))
        object.__setattr__(self, "allowed_hosts", frozenset(name.strip("[]").lower() for name in self.allowed_hosts))
        object.__setattr__(self, "allowed_origins", tuple(normal_origin(o) for o in self.allowed_origins))

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key that opens the non-public paths (none: no key is asked for)."""
        return tuple(dict.fromkeys(k for k in (self.api_key, *self.api_keys) if k is not None))

    @classmethod
    def for_bind(cls, host: str, *, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = (),
                 api_key: str | None = None, api_keys: Iterable[str] = ()) -> GuardSettings:
        """The settings of a server listening on ``host``, with the operator's extra names and origins."""
        names = set(LOOPBACK_NAMES) | {name for name in allowed_hosts}
        bound = host.strip().strip("[]").lower()
        if not is_loopback(bound) and bound not in ANY_ADDRESS:
            names.add(bound)
        return cls(frozenset(names), tuple(allowed_origins), api_key, any_interface=bound in ANY_ADDRESS,
                   api_keys=tuple(api_keys))


def exposure_warning(host: str, settings: GuardSettings) -> str | None:
    """The warning line for a server other machines can reach, or None (loopback only)."""
    if is_loopback(host):
        return None
    if not settings.keys:
        return (f"warning: listening on {host} without an API key: anyone who can reach this port can use "
                "this server (set --api-key or SPECDEC_API_KEY)")
    return f"warning: listening on {host}: other machines on the network can reach this server (API key required)"


def host_name(host: str) -> str:
    """The name of a Host header value, without its port: ``[::1]:8000`` → ``::1``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def origin_key(scheme: str, host: str) -> tuple[str, str, int | None]:
    """(scheme, name, port) of ``scheme://host``, the default port filled in."""
    parts = urlsplit(f"{scheme}://{host.strip().lower()}")
    return parts.scheme, parts.hostname or "", port_of(parts)


def openai_path(path: str) -> bool:
    """Paths answered in the OpenAI error shape (the rest are the explorer's)."""
    return path == "/v1" or path.startswith("/v1/") or path in ("/health", "/metrics")


class Guard:
    """ASGI middleware applying :class:`GuardSettings` to every HTTP request (see the module docstring)."""

    def __init__(self, app, settings: GuardSettings | None = None) -> None:
        self.settings = settings = settings or GuardSettings()
        self.keys = [(key.encode("utf-8"), tenant_id(key)) for key in settings.keys]
        self.app = app
        self.inner = self.keyed
        if settings.allowed_origins:
            self.inner = CORSMiddleware(self.keyed, allow_origins=list(settings.allowed_origins),
                                        allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"],
                                        max_age=600)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or ()}
        refusal = self.refusal(scope, headers)
        if refusal is not None:
            await respond(send, scope["path"], 403, refusal, "forbidden", "permission_error")
            return
        await self.inner(scope, receive, send)

    def refusal(self, scope, headers: dict[str, str]) -> str | None:
        """Why the Host or Origin of this request is refused, or None."""
        host = headers.get("host")
        if not host:
            return "this server only answers requests with a Host header"
        name = host_name(host)
        local = (scope.get("server") or ("",))[0]
        if name not in self.settings.allowed_hosts and not (self.settings.any_interface and name == local):
            return (f"this server only answers requests addressed to it by an allowed name, not {name!r} "
                    "(the operator may add one with --allowed-host)")
        origin = headers.get("origin")
        if origin is None:
            return None
        own = origin_key(scope.get("scheme", "http"), host)
        if origin.strip().rstrip("/").lower() in self.settings.allowed_origins:
            return None
        parts = urlsplit(origin.strip().lower())
        theirs = (parts.scheme, parts.hostname or "", port_of(parts))
        if theirs == own and own[2] is not None and not parts.path.strip("/"):
            return None
        return (f"this server does not answer requests from pages of origin {origin!r} "
                "(the operator may allow one with --allow-origin)")

    async def keyed(self, scope, receive, send) -> None:
        """The API key check, inside CORS (its 401 answers carry the CORS headers)."""
        path = scope["path"]
        if not self.keys or path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            await self.app(scope, receive, send)
            return
        given = None
        for key, value in scope.get("headers") or ():
            if key == b"authorization":
                scheme, _, token = value.partition(b" ")
                given = token.strip() if scheme.lower() == b"bearer" else b""
        # Every key compared, in constant time each: which one matched (if any) shows in no timing.
        matched = [tenant for key, tenant in self.keys if given is not None and hmac.compare_digest(given, key)]
        if matched:
            scope[TENANT] = matched[0]
            await self.app(scope, receive, send)
            return
        message = ("this server needs an API key: send the header Authorization: Bearer <key>" if given is None
                   else "the API key given in the Authorization header is not valid")
        await respond(send, path, 401, message, "invalid_api_key", "invalid_request_error",
                      extra={b"www-authenticate": b"Bearer"})


async def respond(send, path: str, status: int, message: str, code: str, type: str,
                  extra: dict[bytes, bytes] | None = None) -> None:
    """A refusal in the shape of ``path``'s routes, sent without reading the request's body."""
    shaped = ({"error": {"message": message, "type": type, "param": None, "code": code}} if openai_path(path)
              else {"error": message})
    body = json.dumps(shaped).encode()
    headers = {b"content-type": b"application/json", b"content-length": str(len(body)).encode(),
               b"cache-control": b"no-store", b"x-content-type-options": b"nosniff"} | (extra or {})
    await send({"type": "http.response.start", "status": status, "headers": list(headers.items())})
    await send({"type": "http.response.body", "body": body})
