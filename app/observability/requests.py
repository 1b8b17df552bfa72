"""Every HTTP request gets an id, one log line and a count, whatever answers it.

The id comes from the client's `X-Request-ID` when it is 1 to 128 characters of
`[A-Za-z0-9._-]` (so it can be logged and echoed safely), else it is a new uuid4 in hex.
It is bound in structlog's context variables for the whole request, streamed bodies
included, so every log line of the request carries it, and it is returned in the
`X-Request-ID` response header, on errors and Server-Sent Events too.

Litestar runs its middleware per route, so requests that match no route (404, 405)
would pass it by; this wraps the app's whole ASGI handler instead, outside routing and
exception handling, and so sees every response.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import TYPE_CHECKING

import structlog
from litestar import Litestar
from litestar.enums import ScopeType

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

    from app.observability.metrics import ServiceMetrics

log = structlog.get_logger(__name__)

HEADER = b"x-request-id"
_VALID_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
# Any other method is counted as "OTHER": a client cannot grow the label set.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"


def request_id_from(scope: Scope) -> str:
    """The client's id when it is well formed, else a new one."""
    for name, value in scope["headers"]:
        if name.lower() == HEADER:
            candidate = value.decode("latin-1")
            if _VALID_ID.fullmatch(candidate):
                return candidate
            break
    return uuid.uuid4().hex


class RequestContext:
    """ASGI wrapper: request id, one `http_request` log line and the request counter."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self._app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self._app(scope, receive, send)
            return
        request_id = request_id_from(scope)
        method = scope["method"] if scope["method"] in METHODS else "OTHER"
        path = scope["path"]  # before routing rewrites it
        status = 500  # what the client sees when the app fails before answering
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), (HEADER, request_id.encode())]
                message = {**message, "headers": headers}
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=request_id):
            try:
                await self._app(scope, receive, send_with_id)
            finally:
                route = scope.get("path_template") or UNMATCHED
                self._metrics.count_request(method, route, status)
                log.info(
                    "http_request",
                    method=scope["method"],
                    path=path,
                    route=route,
                    status=status,
                    duration_ms=round((time.perf_counter() - started) * 1000, 1),
                )


def observe_requests(app: Litestar, metrics: ServiceMetrics) -> Litestar:
    """Wrap `app`'s ASGI handler (the router inside its exception handling) in place."""
    app.asgi_handler = RequestContext(app.asgi_handler, metrics)
    return app
