"""`memchat` command line: serve, migrate, reindex, chat. The process boundary."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

import structlog

from app.access.keys import LocalModeRefusedError
from app.cli.database import migrate_database
from app.cli.engine import add_engine_commands
from app.cli.keys import add_key_commands
from app.settings import Settings
from storage.db import Database
from storage.repositories import Repositories


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(message)s", stream=sys.stderr)
    structlog.configure(
        processors=[
            # The request id (and anything else bound for the request) on every line.
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    revision = asyncio.run(migrate_database(settings, args.revision))
    print(f"database at revision {revision}")
    return 0


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from app.factory import create_app

    settings = settings.model_copy(
        update={"host": args.host or settings.host, "port": args.port or settings.port}
    )
    asyncio.run(migrate_database(settings, "head"))
    try:
        asyncio.run(_check_access(settings))
    except LocalModeRefusedError as exc:
        print(f"memchat serve: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(
        create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level
    )
    return 0


async def _check_access(settings: Settings) -> None:
    from app.access.keys import bootstrap_key, check_local_mode
    from storage.access import AccessRepository

    db = Database.open(settings.resolved_database_url())
    try:
        await check_local_mode(AccessRepository(db), settings.host, bootstrap_key(settings))
    finally:
        await db.dispose()


async def _reindex(settings: Settings) -> tuple[int, int]:
    from app.adapters import load_embedder
    from app.runtime import build_knowledge, build_memory

    db = Database.open(settings.resolved_database_url())
    try:
        repositories = Repositories.of(db)
        embedder = await load_embedder(settings)
        memory = build_memory(settings, repositories, embedder)
        num_messages = await memory.reindex_all()
        num_chunks = await build_knowledge(settings, repositories, embedder).rebuild()
        return num_messages, num_chunks
    finally:
        await db.dispose()


def cmd_reindex(settings: Settings, args: argparse.Namespace) -> int:
    asyncio.run(migrate_database(settings, "head"))
    num_messages, num_chunks = asyncio.run(_reindex(settings))
    print(
        f"re-embedded and indexed {num_messages} messages and {num_chunks} knowledge chunks"
        f" with {settings.embedder.model_name}"
    )
    return 0


async def _export(settings: Settings, user_id: str, tenant_name: str, output: str) -> int:
    from app.cli.backup import export_user

    db = Database.open(settings.resolved_database_url())
    try:
        repositories = Repositories.of(db)
        tenant = await repositories.access.get_tenant(tenant_name)
        lines = list(await export_user(repositories.sessions, user_id, tenant.id))
    finally:
        await db.dispose()
    if output == "-":
        sys.stdout.buffer.writelines(lines)
    else:
        with open(output, "wb") as handle:
            handle.writelines(lines)
    return len(lines) - 1


def cmd_export(settings: Settings, args: argparse.Namespace) -> int:
    asyncio.run(migrate_database(settings, "head"))
    num_records = asyncio.run(_export(settings, args.user_id, args.tenant, args.output))
    print(f"exported {num_records} records of user {args.user_id!r}", file=sys.stderr)
    return 0


async def _import(settings: Settings, lines: list[bytes], tenant_name: str) -> tuple[int, int, int]:
    from app.adapters import load_embedder
    from app.cli.backup import import_user
    from app.runtime import build_memory

    db = Database.open(settings.resolved_database_url())
    try:
        repositories = Repositories.of(db)
        tenant = await repositories.access.ensure_tenant(tenant_name)
        memory = build_memory(settings, repositories, await load_embedder(settings))
        await memory.check_model()
        return await import_user(repositories.sessions, memory, lines, tenant.id)
    finally:
        await db.dispose()


def cmd_import(settings: Settings, args: argparse.Namespace) -> int:
    from app.cli.backup import BackupFormatError

    source = sys.stdin.buffer if args.path == "-" else open(args.path, "rb")  # noqa: SIM115
    with source:
        lines = source.readlines()
    asyncio.run(migrate_database(settings, "head"))
    try:
        sessions, messages, skipped = asyncio.run(_import(settings, lines, args.tenant))
    except BackupFormatError as exc:
        print(f"memchat import: {exc}", file=sys.stderr)
        return 2
    print(f"imported {sessions} sessions, {messages} messages; skipped {skipped} existing sessions")
    return 0


def cmd_chat(settings: Settings, args: argparse.Namespace) -> int:
    from app.cli.chat import run_chat

    url = args.url or f"http://{settings.host}:{settings.port}"
    api_key = os.environ.get("MEMCHAT_API_KEY") or None
    return run_chat(url, args.user_id, args.session_id, max_tokens=args.max_tokens, api_key=api_key)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memchat", description="Conversational memory service")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="apply migrations and serve the HTTP API")
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.set_defaults(run=cmd_serve)
    migrate = commands.add_parser("migrate", help="apply database migrations")
    migrate.add_argument("--revision", default="head")
    migrate.set_defaults(run=cmd_migrate)
    reindex = commands.add_parser(
        "reindex",
        help="re-embed every stored turn and knowledge chunk and rebuild the vector indexes"
        " (server stopped)",
    )
    reindex.set_defaults(run=cmd_reindex)
    export = commands.add_parser("export", help="write one user's memory as JSON Lines")
    export.add_argument("--user-id", required=True)
    export.add_argument("--tenant", default="default", help="the user's tenant")
    export.add_argument("--output", default="-", help="file (default: standard output)")
    export.set_defaults(run=cmd_export)
    restore = commands.add_parser("import", help="restore an export (server stopped)")
    restore.add_argument("path", help="export file, or - for standard input")
    restore.add_argument("--tenant", default="default", help="restore into this tenant")
    restore.set_defaults(run=cmd_import)
    chat = commands.add_parser(
        "chat",
        help="chat in the terminal with a running server (API key from $MEMCHAT_API_KEY)",
    )
    chat.add_argument("--url", default=None, help="server URL (default from MEMCHAT_HOST/PORT)")
    chat.add_argument("--user-id", default="me")
    chat.add_argument("--session-id", default=None, help="continue this session")
    chat.add_argument("--max-tokens", type=int, default=None)
    chat.set_defaults(run=cmd_chat)
    add_engine_commands(commands)
    add_key_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings()
    configure_logging(settings.log_level)
    return int(args.run(settings, args))
