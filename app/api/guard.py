"""Requests a browser may have been made to send, refused before they reach a route.

A web page the operator opens can make the browser send requests to the service: form
posts and other "simple" requests go out without asking, carrying the page's cookies.
In local mode (no keys: every request is an administrator) that is all an attacker
needs, and the admin page's cookie sessions are exposed the same way. So:

- In local mode the `Host` header must name this machine (`localhost`, a loopback
  address, the bind address, or a name in `MEMCHAT_ACCESS__LOCAL_HOSTS`): a page on
  `attacker.example` whose name resolves to 127.0.0.1 (DNS rebinding) is refused.
- Unsafe methods (POST, PUT, PATCH, DELETE) in local mode, and on the admin page in any
  mode, are refused when the browser says they come from another site or another origin
  (`Sec-Fetch-Site: cross-site` or `same-site`, which includes another port of
  127.0.0.1) or when their `Origin` is not the service's own. Clients that are not
  browsers send neither header and pass.

- In local mode a request that came through a reverse proxy (it carries `Forwarded`,
  `X-Forwarded-For` or another proxy's header) is refused: a proxy on this machine
  passes the Host check (nginx sends the upstream's `127.0.0.1:PORT`) while its clients
  may be anywhere. Local mode is for this machine's own clients only.
- MCP (`/mcp`), in any mode and for every method, refuses requests from another site
  or origin by the same rule (the MCP transport requires servers to check `Origin`).
- Every answer under /admin (the page and the admin API, refusals included) tells the
  browser not to frame, sniff, cache or refer it on, with a Content-Security-Policy
  that lets only the page's own style and script run (their nonce is made here, per
  request, in `scope["state"]`).

Bodies of JSON operations must be sent as JSON (`app.api.requests`), which a page cannot
do across origins without a CORS preflight that this service never grants; admin forms
carry a token tied to the session (`app.api.admin_page`).
"""

from __future__ import annotations

import secrets
from collections.abc import Collection
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import msgspec
from litestar.enums import ScopeType

from app.access.keys import AccessGate, is_admin_page, is_loopback
from app.api.errors import PROBLEM_JSON, problem_body

if TYPE_CHECKING:
    from litestar.types import (
        ASGIApp,
        HTTPResponseBodyEvent,
        HTTPResponseStartEvent,
        HTTPScope,
        Message,
        Receive,
        Scope,
        Send,
    )

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CROSS_SITE = frozenset({"cross-site", "same-site"})
# Headers a reverse proxy adds (RFC 7239's, the de facto X-Forwarded-*, nginx's and
# Apache's): none comes from a client on this machine talking to the service directly.
PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-real-ip", "via")
CSP_NONCE = "memchat_csp_nonce"


def content_security_policy(nonce: str) -> str:
    return (
        f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; "
        "img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    )


def admin_headers(nonce: str) -> list[tuple[bytes, bytes]]:
    """What every /admin answer carries: its page runs nothing but its own nonce's style
    and script, in no frame, is kept by no cache, and its address is sent to no other
    site."""
    return [
        (b"content-security-policy", content_security_policy(nonce).encode()),
        (b"x-frame-options", b"DENY"),
        (b"x-content-type-options", b"nosniff"),
        # Not no-referrer: under it Chrome sends `Origin: null` with the page's own form
        # posts, which the cross-origin check above refuses.
        (b"referrer-policy", b"same-origin"),
        (b"cache-control", b"no-store"),
    ]


def is_admin_area(path: str) -> bool:
    """The admin page and the admin API."""
    return path == "/admin" or path.startswith("/admin/")


def is_mcp(path: str) -> bool:
    return path == "/mcp" or path.startswith("/mcp/")


def host_name(host: str) -> str:
    """The name or address of a `Host` header value, without its port."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_same_origin(origin: str, host: str) -> bool:
    """Whether an `Origin` names the host (and port) the request was sent to."""
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and bool(host) and parts.netloc.lower() == host.lower()


class RequestGuard:
    """ASGI wrapper, outside routing, so that unmatched paths are guarded as well."""

    def __init__(self, app: ASGIApp, gate: AccessGate, local_hosts: Collection[str]) -> None:
        self._app = app
        self._gate = gate
        self._local_hosts = frozenset(h.lower() for h in local_hosts)

    def _is_local_host(self, host: str) -> bool:
        name = host_name(host)
        return is_loopback(name) or name in self._local_hosts

    def _refusal(self, scope: HTTPScope) -> str | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        local = self._gate.is_local_mode
        if local and not self._is_local_host(host):
            return (
                f"the Host {host!r} is not this machine: in local mode the service answers "
                "only requests addressed to localhost or a loopback address"
            )
        if local and any(name in headers for name in PROXY_HEADERS):
            return (
                "a request through a proxy is refused: in local mode (no API keys) the "
                "service answers only clients on this machine; create a key "
                "(`memchat keys create --tenant NAME`) to serve behind a proxy"
            )
        path = scope["path"]
        unsafe = scope["method"] in UNSAFE_METHODS
        if not (is_mcp(path) or (unsafe and (local or is_admin_page(path)))):
            return None
        if headers.get("sec-fetch-site") in CROSS_SITE:
            return "a request from another site or origin is refused"
        origin = headers.get("origin")
        if origin is not None and not is_same_origin(origin, host):
            return f"a request from the origin {origin!r} is refused"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self._app(scope, receive, send)
            return
        if is_admin_area(scope["path"]):
            send = self._with_admin_headers(scope, send)
        reason = self._refusal(scope)
        if reason is None:
            await self._app(scope, receive, send)
            return
        body = msgspec.json.encode(problem_body(403, reason, scope["path"]))
        start: HTTPResponseStartEvent = {
            "type": "http.response.start",
            "status": 403,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
        end: HTTPResponseBodyEvent = {
            "type": "http.response.body",
            "body": body,
            "more_body": False,
        }
        await send(start)
        await send(end)

    @staticmethod
    def _with_admin_headers(scope: Scope, send: Send) -> Send:
        nonce = secrets.token_urlsafe(16)
        scope.setdefault("state", {})[CSP_NONCE] = nonce
        added = admin_headers(nonce)
        replaced = {name for name, _ in added}

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in replaced]
                message["headers"] = [*kept, *added]
            await send(message)

        return send_with_headers
