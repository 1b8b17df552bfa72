"""Database engine creation: one async engine per process, SQLite or PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from storage.errors import ConflictError, DatabaseUnavailableError, InvalidDataError


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite+aiosqlite:///{data_dir / 'memchat.db'}"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets readers proceed during a write; foreign keys make deletes cascade.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def create_engine(url: str, *, timeout_s: float = 30.0, echo: bool = False) -> AsyncEngine:
    """Create the async engine; every connection and statement is bounded by `timeout_s`.

    SQLite gets its pragmas (its lock wait is its timeout) and its directory created.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, echo=echo, connect_args={"timeout": timeout_s})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    connect_args = {}
    if parsed.get_driver_name() == "asyncpg":
        connect_args = {"timeout": timeout_s, "command_timeout": timeout_s}
    return create_async_engine(
        url, echo=echo, pool_pre_ping=True, pool_timeout=timeout_s, connect_args=connect_args
    )


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker:
    return async_sessionmaker(engine, expire_on_commit=False)


def _is_data_exception(exc: DBAPIError) -> bool:
    """A value the database refuses (SQLSTATE class 22, "data exception": text with NUL,
    a timestamp out of range, a number too large), whether the server or the driver found
    it: bad input, not an outage."""
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if isinstance(sqlstate, str) and sqlstate.startswith("22"):
        return True
    # asyncpg refuses some values before they reach the server ("invalid input for query
    # argument $1"), as its own DataError, which SQLAlchemy passes on as a DBAPIError.
    return type(orig).__name__ in ("DataError", "ValueError", "OverflowError") or any(
        type(cause).__name__ in ("DataError", "OverflowError")
        for cause in (getattr(orig, "__cause__", None), getattr(orig, "__context__", None))
        if cause is not None
    )


@asynccontextmanager
async def transaction(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> AsyncIterator[AsyncSession]:
    """One transaction; driver errors leave as storage errors."""
    try:
        async with sessionmaker() as session, session.begin():
            yield session
    except IntegrityError as exc:
        raise ConflictError(str(exc.orig)) from exc
    except DataError as exc:
        raise InvalidDataError(str(exc.orig)) from exc
    except (OperationalError, OSError) as exc:
        raise DatabaseUnavailableError(str(exc)) from exc
    except DBAPIError as exc:
        if _is_data_exception(exc):
            raise InvalidDataError(str(exc.orig)) from exc
        raise DatabaseUnavailableError(str(exc)) from exc
