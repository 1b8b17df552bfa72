"""Bringing the database to a schema revision, for every command that opens it, and
`memchat migrate`."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from app.settings import Settings


async def migrate_database(settings: Settings, revision: str) -> str | None:
    from storage import migrate
    from storage.db import create_engine

    engine = create_engine(settings.resolved_database_url())
    try:
        await migrate.upgrade(engine, revision)
        return await migrate.current_revision(engine)
    finally:
        await engine.dispose()


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    revision = asyncio.run(migrate_database(settings, args.revision))
    print(f"database at revision {revision}")
    return 0


def add_migrate_command(commands: Any) -> None:
    migrate = commands.add_parser("migrate", help="apply database migrations")
    migrate.add_argument("--revision", default="head")
    migrate.set_defaults(run=cmd_migrate)
