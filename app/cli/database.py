"""Bringing the database to a schema revision, for every command that opens it."""

from __future__ import annotations

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
