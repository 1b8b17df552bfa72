"""`memchat serve`: the checks a store must pass before it is served, then one process of
the service or several workers on one socket (`app.cli.workers`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from app.access.keys import LocalModeRefusedError
from app.cli.database import migrate_database
from app.settings import Settings
from retrieval.errors import EmbeddingModelMismatchError
from storage.db import Database
from storage.repositories import Repositories


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


def add_serve_command(commands: Any) -> None:
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
