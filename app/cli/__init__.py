"""`memchat` command line: serve, migrate, reindex, chat. The process boundary."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from typing import IO, Any, TextIO, cast

import structlog

from app.access.keys import LocalModeRefusedError
from app.cli.backup.commands import add_backup_commands
from app.cli.database import migrate_database
from app.cli.engine import add_engine_commands
from app.cli.keys import add_key_commands
from app.cli.mcp import add_mcp_command
from app.cli.progress import add_progress_option, is_shown, progress_bar
from app.observability.logs import LogStream
from app.settings import Settings
from retrieval.errors import EmbeddingModelMismatchError
from storage.db import Database
from storage.errors import DatabaseUnavailableError
from storage.repositories import Repositories


def configure_logging(
    level: str, *, extra_processors: Sequence[Any] = (), stream: IO[str] | None = None
) -> None:
    """The process's log: structlog's lines and the standard library's, on `stream`
    (standard error by default). A line that cannot be written (a full disk) is dropped
    and counted, never raised into the code that logged (`app.observability.logs`)."""
    target = sys.stderr if stream is None else stream
    logging.basicConfig(level=level.upper(), format="%(message)s", stream=LogStream(target))
    # Alembic names each of its plugins at start-up: seven lines of noise before every
    # command's own output (and before a start-up error's one line).
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    structlog.configure(
        processors=[
            # The request id (and anything else bound for the request) on every line.
            structlog.contextvars.merge_contextvars,
            *extra_processors,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # structlog's type is TextIO; it calls write and flush only.
        logger_factory=structlog.PrintLoggerFactory(cast(TextIO, LogStream(target))),
    )


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    revision = asyncio.run(migrate_database(settings, args.revision))
    print(f"database at revision {revision}")
    return 0


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from app.cli.serving import serving_app
    from app.cli.workers import UnsupportedWorkersError, check_workers, serve_workers

    settings = settings.model_copy(
        update={"host": args.host or settings.host, "port": args.port or settings.port}
    )
    # `memchat mcp --transport http` serves through here too, without --workers.
    num_workers = getattr(args, "workers", 1)
    try:
        check_workers(settings, num_workers)
    except UnsupportedWorkersError as exc:
        print(f"memchat serve: {exc}", file=sys.stderr)
        return 2
    asyncio.run(migrate_database(settings, "head"))
    try:
        asyncio.run(_check_access(settings))
        asyncio.run(_check_stored_vectors(settings))
    except (LocalModeRefusedError, EmbeddingModelMismatchError) as exc:
        print(f"memchat serve: {exc}", file=sys.stderr)
        return 2
    if num_workers > 1:
        serve_workers(settings, num_workers)
        return 0
    uvicorn.run(
        serving_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level
    )
    return 0


async def _check_access(settings: Settings) -> None:
    from app.access.keys import bootstrap_key, check_local_mode
    from storage.access import AccessRepository

    db = Database.open(settings.resolved_database_url())
    try:
        await check_local_mode(
            AccessRepository(db),
            settings.host,
            bootstrap_key(settings),
            allow_after_keys=settings.access.allow_local_mode_after_keys,
        )
    finally:
        await db.dispose()


async def _check_stored_vectors(settings: Settings) -> None:
    """Refuse, before serving, a store whose vectors another embedder (or text recipe)
    made: a plain message instead of a failed start-up's traceback."""
    from app.adapters import load_embedder, load_second_embedder
    from app.runtime import build_memory

    db = Database.open(settings.resolved_database_url())
    try:
        embedder = await load_embedder(settings)
        second = await load_second_embedder(settings)
        await build_memory(settings, Repositories.of(db), embedder, second).check_model()
    finally:
        await db.dispose()


async def _reindex(settings: Settings, show_progress: bool) -> tuple[int, int, str]:
    from app.adapters import load_embedder, load_second_embedder
    from app.runtime import build_knowledge, build_memory

    db = Database.open(settings.resolved_database_url())
    try:
        repositories = Repositories.of(db)
        embedder = await load_embedder(settings)
        second = await load_second_embedder(settings)
        memory = build_memory(settings, repositories, embedder, second)
        counts = await repositories.admin.count_rows()
        with progress_bar(
            "messages", "messages", enabled=show_progress, total=counts["messages"]
        ) as bar:
            num_messages = await memory.reindex_all(bar.advance)
        knowledge = build_knowledge(settings, repositories, embedder)
        with progress_bar(
            "knowledge", "chunks", enabled=show_progress, total=counts["knowledge_chunks"]
        ) as bar:
            num_chunks = await knowledge.rebuild(bar.advance)
        names = embedder.model_name + (f" and {second.model_name}" if second else "")
        return num_messages, num_chunks, names
    finally:
        await db.dispose()


async def _complete_second(settings: Settings, show_progress: bool) -> tuple[int, int, str]:
    """Give the second dense list's vector to the turns that lack it, as a running server
    does in the background: (turns embedded here, turns still missing, the model)."""
    from app.adapters import load_embedder, load_second_embedder
    from app.runtime import build_memory
    from retrieval.search.backfill import SecondListBackfill
    from storage.claims import JobClaimRepository

    second = await load_second_embedder(settings)
    if second is None:
        raise SystemExit("memchat reindex --missing: MEMCHAT_SECOND_EMBEDDER__KIND is none")
    db = Database.open(settings.resolved_database_url())
    try:
        memory = build_memory(settings, Repositories.of(db), await load_embedder(settings), second)
        await memory.check_model()
        claims = JobClaimRepository.open_or_none(
            settings.resolved_database_url(), timeout_s=settings.database_timeout_s
        )
        backfill = SecondListBackfill(memory, claims)
        progress = await memory.second_progress()
        done, total = progress or (0, 0)
        try:
            with progress_bar(
                "second list", "turns", enabled=show_progress, total=max(total - done, 0)
            ) as bar:
                num_embedded = await memory.backfill_second(backfill.hold, bar.advance)
            await memory.save()
        finally:
            await backfill.stop()
        done, total = await memory.second_progress() or (0, 0)
        return num_embedded, max(total - done, 0), second.model_name
    finally:
        await db.dispose()


def cmd_reindex(settings: Settings, args: argparse.Namespace) -> int:
    asyncio.run(migrate_database(settings, "head"))
    if args.missing:
        num_turns, num_left, model_name = asyncio.run(_complete_second(settings, is_shown(args)))
        print(f"gave {num_turns} messages their {model_name} vector", end="")
        print(f"; {num_left} more are being embedded by another process" if num_left else "")
        return 0
    num_messages, num_chunks, model_name = asyncio.run(_reindex(settings, is_shown(args)))
    print(
        f"re-embedded and indexed {num_messages} messages and {num_chunks} knowledge chunks"
        f" with {model_name}"
    )
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
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes on one socket (more than 1 needs PostgreSQL and a Chroma"
        " server for the turn vectors)",
    )
    serve.set_defaults(run=cmd_serve)
    migrate = commands.add_parser("migrate", help="apply database migrations")
    migrate.add_argument("--revision", default="head")
    migrate.set_defaults(run=cmd_migrate)
    reindex = commands.add_parser(
        "reindex",
        help="re-embed every stored turn and knowledge chunk and rebuild the vector indexes"
        " (server stopped)",
    )
    reindex.add_argument(
        "--missing",
        action="store_true",
        help="only give the turns that lack it the second dense list's vector (what a"
        " running server also does in the background; safe beside running servers)",
    )
    reindex.set_defaults(run=cmd_reindex)
    add_progress_option(reindex)
    add_backup_commands(commands)
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
    add_mcp_command(commands)
    add_key_commands(commands)
    return parser


def database_problem(settings: Settings, exc: DatabaseUnavailableError) -> str:
    """One line for a database that cannot be used: which, what is wrong, what to do."""
    url = settings.resolved_database_url()
    reason = (str(exc).strip().splitlines() or ["no reason given"])[0]
    if url.startswith("sqlite"):
        path = url.partition(":///")[2]
        return (
            f"the database file {path} cannot be used: {reason}. If it is damaged, restore "
            "it from a backup, or move it away to start with an empty database"
        )
    return (
        f"the database cannot be used: {reason}. Check that the server is running and "
        "that MEMCHAT_DATABASE_URL names it"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings()
    configure_logging(settings.log_level)
    try:
        return int(args.run(settings, args))
    except DatabaseUnavailableError as exc:
        # Process boundary: a store that cannot be opened is one line, not a traceback.
        print(f"memchat {args.command}: {database_problem(settings, exc)}", file=sys.stderr)
        return 2
