"""MCP over stdio: one client (the agent that started `memchat mcp`), one API key.

The key comes from `MEMCHAT_API_KEY` and is checked like a Bearer key on every tool call,
so a revoked key stops at once and the key's rate limit holds. Without any key in the
database the service is in local mode, as the REST API is: every call runs in tenant
`default` as an administrator. Standard output is the protocol's wire: the SDK points
file descriptor 1 at standard error while it serves, and the runtime (models included)
loads inside the server's lifespan, so nothing the models print can reach the wire.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from app.access.keys import AccessGate, Principal, bootstrap_key, check_local_mode
from app.mcp.server import build_server
from app.mcp.tools import MemoryTools
from app.runtime import Runtime, build_runtime, close_runtime
from app.settings import Settings
from storage.access import AccessRepository
from storage.db import Database

# Standard input and output reach only the parent process: local mode is never refused
# for the bind address, whatever MEMCHAT_HOST says for the HTTP server.
STDIO_HOST = "127.0.0.1"


async def open_gate(gate: AccessGate, access: AccessRepository, settings: Settings) -> None:
    local_mode = await check_local_mode(
        access,
        STDIO_HOST,
        bootstrap_key(settings),
        allow_after_keys=settings.access.allow_local_mode_after_keys,
    )
    gate.open(access, local_mode=local_mode)


async def check_api_key(settings: Settings, secret: str | None) -> Principal:
    """The key's principal, before any model loads: a bad key stops `memchat mcp` with
    the REST API's 401 message (`NotAuthorizedException`)."""
    db = Database.open(settings.resolved_database_url())
    try:
        gate = AccessGate(default_requests_per_minute=0)
        await open_gate(gate, AccessRepository(db), settings)
        return await gate.authenticate(secret)
    finally:
        await db.dispose()


async def serve_stdio(settings: Settings, secret: str | None) -> None:
    """Serve until the client closes standard input."""
    gate = AccessGate(settings.access.requests_per_minute)
    loaded: list[Runtime] = []

    def runtime() -> Runtime:
        if not loaded:
            raise ToolError("memchat is starting; retry in a moment")
        return loaded[0]

    async def principal_of(_ctx: Context) -> Principal:
        return await gate.authenticate(secret)

    @asynccontextmanager
    async def lifespan(_server: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        started = await build_runtime(settings)
        try:
            await open_gate(gate, started.repositories.access, settings)
            loaded.append(started)
            yield {}
        finally:
            gate.close()
            await close_runtime(started)

    server = build_server(MemoryTools(runtime), principal_of, lifespan=lifespan)
    await server.run_stdio_async()
