"""Apply the Alembic migrations programmatically, on an engine the caller already holds."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).parent


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def _run(connection: Connection, action: str, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    getattr(command, action)(config, revision)


async def _migrate(engine: AsyncEngine, action: str, revision: str) -> None:
    """Run the migrations in one transaction.

    On SQLite, Alembic changes a table by copying it and dropping the old one; with foreign
    keys on, that drop would cascade into every referencing row (dropping `users` deletes
    all messages). SQLite ignores the pragma inside a transaction, so it is switched off
    before the first statement and on again after, and the references are checked before
    the commit.
    """
    sqlite = engine.dialect.name == "sqlite"
    async with engine.connect() as connection:
        if sqlite:
            await connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        try:
            await connection.run_sync(_run, action, revision)
            if sqlite:
                broken = (await connection.exec_driver_sql("PRAGMA foreign_key_check")).all()
                if broken:
                    raise RuntimeError(f"migration left dangling references: {broken[:5]}")
            await connection.commit()
        finally:
            if sqlite:
                await connection.rollback()
                await connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                await connection.commit()


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    await _migrate(engine, "upgrade", revision)


async def downgrade(engine: AsyncEngine, revision: str = "base") -> None:
    await _migrate(engine, "downgrade", revision)


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as connection:
        return await connection.run_sync(_current)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()
