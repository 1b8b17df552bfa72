"""MCP over streamable HTTP, mounted in the app at `/mcp`: the REST API's base URL, keys,
rate limits and host checks.

The mount is an ordinary route of the app, so `AccessMiddleware` has resolved the
request's Bearer key (or local mode) to a `Principal` in `scope["user"]` before the SDK
sees it, and a missing or bad key is the REST API's 401 problem. The SDK's own
DNS-rebinding check is off: `RequestGuard` checks every request's Host and Origin, this
one included.

The session manager is stateless and answers in JSON: every request stands alone, so
several API processes behind one address serve MCP without sticky sessions, and no
session outlives its request (the tools never call back to the client). It runs in the
app's lifespan (`McpEndpoint.lifespan`). So the server has nothing to send of its own:
`GET /mcp`, which would open an event stream for that and hold it open for ever, is
answered 405, as the transport allows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Litestar, asgi
from litestar.handlers import ASGIRouteHandler
from litestar.types import Receive, Scope, Send
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings

from app.access.keys import Principal
from app.api.errors import PROBLEM_JSON, problem_body
from app.mcp.server import build_server
from app.mcp.tools import MemoryTools
from app.runtime import Runtime

MCP_PATH = "/mcp"
NO_STREAM = (
    "this MCP server sends nothing but answers: POST each message (it opens no event stream on GET)"
)


async def send_problem(send: Send, status: int, detail: str, headers: dict[str, str]) -> None:
    """A problem document, sent as is: inside the mount the request's path is no longer
    /mcp, which an exception's answer would name."""
    body = msgspec.json.encode(problem_body(status, detail, MCP_PATH))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
                *((k.lower().encode(), v.encode()) for k, v in headers.items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def principal_of_request(ctx: Context) -> Principal:
    """The principal `AccessMiddleware` found for the HTTP request that carries the call."""
    request = ctx.request_context.request
    principal = getattr(request, "scope", {}).get("user")
    if not isinstance(principal, Principal):
        raise ToolError("this request carries no API key")
    return principal


@dataclass(frozen=True, slots=True)
class McpEndpoint:
    route: ASGIRouteHandler
    lifespan: Callable[[Litestar], AbstractAsyncContextManager[None]]


def mcp_endpoint(runtime: Callable[[], Runtime]) -> McpEndpoint:
    """The `/mcp` route and the lifespan that runs its session manager."""
    server = build_server(MemoryTools(runtime), principal_of_request)
    # Builds the session manager; the Starlette app it returns is not used.
    server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    manager = server.session_manager

    # The scope is not copied: the route's name, set here, is what the request metrics
    # label it with (Litestar leaves mounts unnamed); the SDK writes nothing to it.
    @asgi(MCP_PATH, is_mount=True, copy_scope=False)
    async def mcp(scope: Scope, receive: Receive, send: Send) -> None:
        scope["path_template"] = MCP_PATH
        if scope.get("method") == "GET":
            await send_problem(send, 405, NO_STREAM, headers={"Allow": "POST"})
            return
        # Litestar's and Starlette's ASGI types spell the same dicts differently.
        handle: Any = manager.handle_request
        await handle(scope, receive, send)

    @asynccontextmanager
    async def lifespan(_app: Litestar) -> AsyncIterator[None]:
        async with manager.run():
            yield

    return McpEndpoint(mcp, lifespan)
