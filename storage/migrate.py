"""Apply the Alembic migrations programmatically, on an engine the caller already holds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DatabaseError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations
from storage.errors import DatabaseUnavailableError

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


# What a database that cannot be used at all raises: SQLAlchemy's plain DatabaseError is
# SQLite's "file is not a database" and "database disk image is malformed".
_UNUSABLE = (OperationalError, InterfaceError, DatabaseError)


@asynccontextmanager
async def _opened() -> AsyncIterator[None]:
    """A database that cannot be used at all (a file that is not a SQLite database or is
    damaged, a server that is down or refuses the connection) is DatabaseUnavailableError
    with the driver's own reason in one line. Other errors (a constraint a migration
    breaks) are the migration's and pass as they are."""
    try:
        yield
    except DBAPIError as exc:
        if type(exc) not in _UNUSABLE:
            raise
        lines = str(exc.orig).strip().splitlines() or [str(exc)]
        raise DatabaseUnavailableError(lines[0]) from exc
    except OSError as exc:
        raise DatabaseUnavailableError(str(exc)) from exc


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    async with _opened():
        await _migrate(engine, "upgrade", revision)


async def downgrade(engine: AsyncEngine, revision: str = "base") -> None:
    async with _opened():
        await _migrate(engine, "downgrade", revision)


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def current_revision(engine: AsyncEngine) -> str | None:
    async with _opened(), engine.connect() as connection:
        return await connection.run_sync(_current)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()
