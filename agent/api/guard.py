"""The ASGI layer in front of the API: Host check, authentication and body limits, before any handler.

FastAPI reads and parses a request's body before it runs the route's dependencies, so a token check
written as a dependency comes too late: a 300 MB body without a token would be read in full to be
refused. `HttpGuard` is a pure ASGI middleware (no `BaseHTTPMiddleware`, which buffers) that, in
order and each with its own status:

1. refuses a Host header that does not name this agent (421): a DNS-rebinding page cannot read the API;
2. on routes guarded by `agent.api.auth.TokenGuard`, checks the token (401/403) before the body is read;
3. refuses a Content-Length above the route's limit (413), before reading a byte of the body;
4. counts a chunked body while it streams and stops at the limit (413).

Every refusal that leaves a body unread closes the connection (`Connection: close`), so the rest of
the body is never read either. `json_too_deep` bounds the nesting of a JSON body before it is parsed.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from agent.api.auth import TokenGuard
from agent.core.figures import decimal

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY = 64 * 1024  # control endpoints take a reason and a few fields
MAX_JSON_DEPTH = 32
CLOSE = {"Connection": "close"}
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


class BodyTooLarge(HTTPException):
    """Raised from `receive` when a streaming body passes its limit; answered with 413 and a close."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413, f"the request body exceeds the {limit} bytes this endpoint accepts", headers=CLOSE
        )


# ----------------------------------------------------------------------------- hosts
def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`: addresses only this machine can reach."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts(listen_host: str, configured: Iterable[str] | None = None) -> frozenset[str]:
    """The Host names the API answers to: the listen host and loopback, plus `agent.allowed_hosts`.

    Listening on every address (0.0.0.0, ::) without `allowed_hosts` also allows this machine's
    names and interface addresses, which a rebinding attacker's domain is not.
    """
    names = {listen_host.strip("[]").lower(), *LOOPBACK_NAMES}
    if configured is not None:
        names.update(h.strip().lower() for h in configured)
    elif listen_host.strip("[]") in ("0.0.0.0", "::", ""):
        names.update(_local_names())
    names.discard("")
    return frozenset(names)


def _local_names() -> set[str]:
    import psutil  # type: ignore[import-untyped]  # psutil ships no type information (no stubs among the lint tools)

    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                names.add(address.address.split("%")[0].lower())
    return names


def split_host(value: str) -> tuple[str, int | None] | None:
    """`name[:port]` or `[v6]:port` from a Host header; None when it is not one."""
    value = value.strip().lower()
    match = re.fullmatch(r"\[([0-9a-f:.]+)\](?::(\d{1,5}))?|([^:\[\]]+?)\.?(?::(\d{1,5}))?", value)
    if match is None:
        return None
    name = match.group(1) or match.group(3)
    port = match.group(2) or match.group(4)
    return name, int(port) if port else None


def host_allowed(header: str | None, allowed: frozenset[str], bound_port: int | None) -> bool:
    """Whether a Host header names this agent: an allowed name on the bound port (or an allowed `name:port`)."""
    if "*" in allowed:
        return True
    if not header:
        return False
    parsed = split_host(header)
    if parsed is None:
        return False
    name, port = parsed
    if port is not None and f"{name}:{port}" in allowed:
        return True
    return name in allowed and (port is None or bound_port is None or port == bound_port)


# ----------------------------------------------------------------------------- JSON depth
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def content_length(header: str) -> int | None:
    """A Content-Length header's byte count, or None when it is not one (ASCII digits only: `int()`
    would take '²' or 5000 digits and raise)."""
    return decimal(header.strip(), 10**18)


def json_too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `body` nests arrays/objects deeper than `limit` (strings skipped): checked before parsing,
    so a deep payload gets a 400 rather than a RecursionError."""
    depth = 0
    for match in _BRACKET.finditer(_STRING.sub(b'""', body)):
        if match.group() in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


# ----------------------------------------------------------------------------- routes
@dataclass(frozen=True)
class RoutePolicy:
    """What the guard enforces for one route: its body limit and, when guarded, its token check."""

    path_regex: re.Pattern[str]
    methods: frozenset[str]
    max_body: int
    guard: TokenGuard | None


def api_routes(routes: Iterable[Any]) -> Iterator[Any]:
    """Every API route (path, methods, path_regex, dependant), included routers flattened: recent
    FastAPI keeps an included router as one lazy entry of `app.routes`."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # FastAPI before lazy inclusion: app.routes is flat
        yield from (route for route in routes if isinstance(route, APIRoute))
        return
    for context in iter_route_contexts(list(routes)):
        if isinstance(context.original_route, APIRoute):
            yield context


def route_policies(
    routes: Iterable[Any], limits: Mapping[str, int] | None = None, default: int = DEFAULT_MAX_BODY
) -> list[RoutePolicy]:
    """One policy per API route: `limits` by path template override `default`; the token check is
    the route's own TokenGuard dependency, found in its dependency tree."""
    limits = limits or {}
    found = []
    for route in api_routes(routes):
        found.append(
            RoutePolicy(
                route.path_regex,
                frozenset(route.methods or ()),
                limits.get(route.path, default),
                _token_guard(route.dependant),
            )
        )
    return found


def _token_guard(dependant: Any) -> TokenGuard | None:
    if isinstance(dependant.call, TokenGuard):
        return dependant.call
    for sub in dependant.dependencies:
        guard = _token_guard(sub)
        if guard is not None:
            return guard
    return None


# ----------------------------------------------------------------------------- middleware
class HttpGuard:
    """Pure ASGI middleware: Host check, up-front length check, token check, streaming body count."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        policies: Callable[[], list[RoutePolicy]],
        allowed: frozenset[str],
        default_max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.app = app
        self._policies = policies
        self._table: list[RoutePolicy] | None = None
        self.allowed = allowed
        self.default_max_body = default_max_body

    def policy(self, method: str, path: str) -> tuple[int, TokenGuard | None]:
        if self._table is None:
            self._table = self._policies()  # after every router is included
        for entry in self._table:
            if method in entry.methods and entry.path_regex.match(path):
                return entry.max_body, entry.guard
        return self.default_max_body, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        server = scope.get("server")
        bound_port = server[1] if server and len(server) > 1 else None
        if not host_allowed(headers.get("host"), self.allowed, bound_port):
            host = (headers.get("host") or "")[:100]
            await _answer(
                send,
                421,
                f"this agent does not answer to Host {host!r}; add the name to agent.allowed_hosts "
                "if it is yours",
            )
            return
        limit, guard = self.policy(scope["method"], scope["path"])
        if guard is not None:
            refused = guard.check(headers.get("authorization", ""))
            if refused is not None:
                await _answer(send, *refused)
                return
        length = headers.get("content-length")
        if length is not None:
            size = content_length(length)
            if size is None:
                await _answer(send, 400, f"invalid Content-Length {length[:20]!r}")
                return
            if size > limit:
                await _answer(send, 413, f"the request body has {size} bytes; this endpoint accepts {limit}")
                return
        await self._run(scope, receive, send, limit)

    async def _run(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge as exc:  # when no exception handler turned it into the response
            if started:
                raise
            await _answer(send, exc.status_code, str(exc.detail))


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


async def _answer(send: Send, status: int, message: str) -> None:
    """A JSON error that closes the connection: the unread body is never read."""
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
