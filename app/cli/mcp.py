"""`memchat mcp`: the Model Context Protocol server (see app/mcp and docs/mcp.md).

stdio (the default) serves the agent that started the command, with the API key in
`MEMCHAT_API_KEY`. `--transport http` serves the whole service, as `memchat serve` does,
with MCP at `/mcp`: the HTTP transport is a route of the app, so that it shares the REST
API's keys, rate limits and host checks rather than having a second copy of them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from litestar.exceptions import NotAuthorizedException

from app.access.keys import LocalModeRefusedError
from app.cli.database import migrate_database
from app.settings import Settings


def cmd_mcp(settings: Settings, args: argparse.Namespace) -> int:
    if args.transport == "http":
        from app.cli.serve import cmd_serve

        host, port = args.host or settings.host, args.port or settings.port
        print(f"memchat mcp: MCP at http://{host}:{port}/mcp", file=sys.stderr)
        return cmd_serve(settings, args)
    from app.mcp.stdio import check_api_key, serve_stdio

    asyncio.run(migrate_database(settings, "head"))
    secret = os.environ.get("MEMCHAT_API_KEY") or None
    try:
        asyncio.run(check_api_key(settings, secret))
    except NotAuthorizedException as exc:
        print(f"memchat mcp: {exc.detail} (in MEMCHAT_API_KEY)", file=sys.stderr)
        return 2
    except LocalModeRefusedError as exc:
        print(f"memchat mcp: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve_stdio(settings, secret))
    return 0


def add_mcp_command(commands: Any) -> None:
    mcp = commands.add_parser(
        "mcp",
        help="serve memory to MCP agents: stdio (API key from $MEMCHAT_API_KEY) or HTTP at /mcp",
    )
    mcp.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    mcp.add_argument("--host", default=None, help="http: bind address (default MEMCHAT_HOST)")
    mcp.add_argument("--port", type=int, default=None, help="http: port (default MEMCHAT_PORT)")
    mcp.set_defaults(run=cmd_mcp)
