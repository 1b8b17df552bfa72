"""Database engine creation: one async engine per process, SQLite or PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
import msgspec
from sqlalchemy import Engine, event, text, update
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, CursorResult, Result, make_url
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from storage.errors import ConflictError, DatabaseUnavailableError, InvalidDataError
from storage.models import ReadinessProbe, utc_now

T = TypeVar("T")


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite+aiosqlite:///{data_dir / 'memchat.db'}"


def json_loads(text: str | bytes) -> Any:
    """A JSON column's value: decoded by msgspec (several times as fast as the standard
    library, and a turn reads hundreds: its window's and its memories' id lists), or by
    the standard library where msgspec refuses what it wrote (NaN, Infinity)."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return json.loads(text)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets readers proceed during a write; foreign keys make deletes cascade; deleted
    # content is overwritten with zeros, so that the text of a deleted session or user
    # does not stay readable in the file's free pages (`docs/api.md`).
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA secure_delete=ON")
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
        engine = create_async_engine(
            url, echo=echo, connect_args={"timeout": timeout_s}, json_deserializer=json_loads
        )
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    connect_args = {}
    if parsed.get_driver_name() == "asyncpg":
        connect_args = {"timeout": timeout_s, "command_timeout": timeout_s}
    return create_async_engine(
        url,
        echo=echo,
        pool_pre_ping=True,
        pool_timeout=timeout_s,
        connect_args=connect_args,
        json_deserializer=json_loads,
    )


def sqlite_reader_or_none(url: URL) -> Engine | None:
    """For a SQLite file, a sync engine over it for `Database.read` (None for any other
    database): connections taken by worker threads, the same pragmas and JSON decoding."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    engine = create_sync_engine(
        url.set(drivername="sqlite+pysqlite"),
        connect_args={"check_same_thread": False},
        json_deserializer=json_loads,
    )
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def create_lock_engine_or_none(
    url: str, *, connect_timeout_s: float, command_timeout_s: float
) -> AsyncEngine | None:
    """An engine for advisory locks held across transactions on PostgreSQL (None for any
    other database): no pool, so a connection that may hold a lock is never handed to
    other work, and autocommit, so it idles between lock and unlock rather than idling
    in a transaction. asyncpg bounds its connection set-up and every statement."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return None
    connect_args: dict[str, Any] = {}
    if parsed.get_driver_name() == "asyncpg":
        connect_args = {"timeout": connect_timeout_s, "command_timeout": command_timeout_s}
    return create_async_engine(
        parsed, poolclass=NullPool, isolation_level="AUTOCOMMIT", connect_args=connect_args
    )


async def connect(engine: AsyncEngine) -> AsyncConnection:
    """A started connection of `engine`; an unreachable server is DatabaseUnavailableError."""
    connection = engine.connect()
    try:
        return await connection.start()
    except (DBAPIError, OSError) as exc:
        raise DatabaseUnavailableError(str(exc)) from exc


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def insert_or_skip(session: AsyncSession, table: Any, keys: Sequence[str]) -> Any:
    """An INSERT of `table` that skips the rows whose `keys` are taken already (SQLite's
    and PostgreSQL's ON CONFLICT DO NOTHING): for derived rows another process may have
    written meanwhile, from the same source."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    return dialect.insert(table).on_conflict_do_nothing(index_elements=list(keys))


def rows_affected(result: Result[Any]) -> int:
    """How many rows an UPDATE or DELETE touched (SQLAlchemy answers them with a cursor
    result, which its `execute` signature does not say)."""
    return cast("CursorResult[Any]", result).rowcount


class Database:
    """One database of the process: its engine and its transactions. Every repository is
    built on one and opens a transaction per public call."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._sessionmaker = create_sessionmaker(engine)
        # A SQLite file's reads of several statements (`read`): a sync engine of their own.
        self.reader_engine = sqlite_reader_or_none(engine.url)
        self._reader = (
            sessionmaker(self.reader_engine, expire_on_commit=False)
            if self.reader_engine is not None
            else None
        )

    @classmethod
    def open(cls, url: str, *, timeout_s: float = 30.0) -> Database:
        return cls(create_engine(url, timeout_s=timeout_s))

    def transaction(self) -> AbstractAsyncContextManager[AsyncSession]:
        return transaction(self._sessionmaker)

    async def read(self, work: Callable[[Session], T]) -> T:
        """Read-only work of several statements in one transaction, given a sync session.
        On a SQLite file it runs in a worker thread over a connection of its own: one hop
        to the thread, where aiosqlite makes one per cursor call (creation, execution,
        rows, closing), so a turn's reads take about half the time. Elsewhere it runs in
        an async transaction (`run_sync`). Driver errors leave as storage errors."""
        if self._reader is None:
            async with self.transaction() as session:
                return await session.run_sync(work)
        return await anyio.to_thread.run_sync(self._read_now, work)

    def _read_now(self, work: Callable[[Session], T]) -> T:
        assert self._reader is not None
        try:
            with self._reader() as session, session.begin():
                return work(session)
        except (DBAPIError, OSError) as exc:
            raise storage_error(exc) from exc

    async def ping(self) -> None:
        async with self.transaction() as session:
            await session.execute(text("SELECT 1"))

    async def check_writable(self) -> None:
        """Rewrite the readiness row and commit: raises where the database answers reads
        but takes no writes (a full disk, a read-only replica)."""
        async with self.transaction() as session:
            await session.execute(
                update(ReadinessProbe).where(ReadinessProbe.id == 1).values(checked_at=utc_now())
            )

    async def size_bytes(self) -> int | None:
        """The database's size on disk, where the backend can tell."""
        async with self.transaction() as session:
            dialect = session.get_bind().dialect.name
            if dialect == "postgresql":
                size = await session.scalar(text("SELECT pg_database_size(current_database())"))
                return int(size)
            if dialect == "sqlite":
                pages = await session.scalar(text("PRAGMA page_count"))
                page = await session.scalar(text("PRAGMA page_size"))
                return int(pages) * int(page)
        return None

    async def dispose(self) -> None:
        await self.engine.dispose()
        if self.reader_engine is not None:
            self.reader_engine.dispose()


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
    except (DBAPIError, OSError) as exc:
        raise storage_error(exc) from exc


def storage_error(exc: DBAPIError | OSError) -> Exception:
    """The storage error a driver's error means: a conflict, a value refused, or the
    database unavailable."""
    if isinstance(exc, IntegrityError):
        return ConflictError(str(exc.orig))
    if isinstance(exc, DataError):
        return InvalidDataError(str(exc.orig))
    if isinstance(exc, OperationalError | OSError):
        return DatabaseUnavailableError(str(exc))
    if _is_data_exception(exc):
        return InvalidDataError(str(exc.orig))
    return DatabaseUnavailableError(str(exc))
