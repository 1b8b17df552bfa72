"""A session's lock across every process on one PostgreSQL database.

A session-level advisory lock, `pg_advisory_lock(hashtextextended('session:' || id, 0))`,
taken and released on a connection of its own that lives exactly as long as the hold:

- Its own engine without a pool (`NullPool`): a waiting or holding turn never takes one
  of the main pool's connections (5, plus 10 overflow, by SQLAlchemy's defaults), which
  the holder's own queries need, and no connection that may still hold a lock is ever
  handed to other work. The cost is one PostgreSQL connection per session with a turn
  running or waiting in this process (the in-process lock lets one hold per session
  wait here), and one connection set-up per hold.
- Autocommit: the connection is idle between the lock and the unlock, not idle in a
  transaction (no snapshot held, no `idle_in_transaction_session_timeout` to end it).
- The wait is bounded by the server (`lock_timeout`): past it the statement fails with
  SQLSTATE 55P03 and the hold raises `LockTimeoutError`, the connection is closed.
- A connection's end releases its session-level locks: a killed process, a broken
  network connection, or a hold cancelled before its unlock ran (the connection is then
  closed, or terminated where the close itself is cancelled) leaves nothing held.

Two sessions whose keys collide (64-bit hashes) only wait for each other.
SQLite has none of this: one process by design, whose in-process lock is enough.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from storage.db import connect, create_lock_engine_or_none
from storage.errors import DatabaseUnavailableError, LockTimeoutError

_SET_LOCK_TIMEOUT = text("SELECT set_config('lock_timeout', :timeout, false)")
_LOCK = text("SELECT pg_advisory_lock(hashtextextended(:key, 0))")
_UNLOCK = text("SELECT pg_advisory_unlock(hashtextextended(:key, 0))")
_LOCK_NOT_AVAILABLE = "55P03"


def _sqlstate(exc: DBAPIError) -> str | None:
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return sqlstate if isinstance(sqlstate, str) else None


class SessionLockRepository:
    """One holder at a time per session id, across processes; a hold waits at most
    `timeout_s` for the lock (then `LockTimeoutError`)."""

    def __init__(self, engine: AsyncEngine, *, timeout_s: float) -> None:
        self._engine = engine
        self._timeout_s = timeout_s

    @classmethod
    def open_or_none(
        cls, url: str, *, timeout_s: float, connect_timeout_s: float
    ) -> SessionLockRepository | None:
        """The locks of the PostgreSQL database at `url`; None for any other database.

        asyncpg also bounds every statement by the lock wait plus `connect_timeout_s`: a
        server that stops answering cannot keep a hold's unlock waiting for ever.
        """
        engine = create_lock_engine_or_none(
            url,
            connect_timeout_s=connect_timeout_s,
            command_timeout_s=timeout_s + connect_timeout_s,
        )
        if engine is None:
            return None
        return cls(engine, timeout_s=timeout_s)

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """Hold the session's lock for the body; released however the body ends."""
        key = f"session:{session_id}"
        connection = await connect(self._engine)
        try:
            await self._lock(connection, key)
            try:
                yield
            finally:
                await self._unlock(connection, key)
        finally:
            await connection.close()

    async def dispose(self) -> None:
        await self._engine.dispose()

    async def _lock(self, connection: AsyncConnection, key: str) -> None:
        timeout = f"{max(1, round(self._timeout_s * 1000))}ms"
        try:
            await connection.execute(_SET_LOCK_TIMEOUT, {"timeout": timeout})
            await connection.execute(_LOCK, {"key": key})
        except DBAPIError as exc:
            if _sqlstate(exc) == _LOCK_NOT_AVAILABLE:
                raise LockTimeoutError(key, self._timeout_s) from exc
            raise DatabaseUnavailableError(str(exc)) from exc
        except OSError as exc:  # asyncpg's statement timeout is a TimeoutError
            raise DatabaseUnavailableError(str(exc)) from exc

    async def _unlock(self, connection: AsyncConnection, key: str) -> None:
        # Where the connection broke, its end released the lock; the body's own outcome
        # (a stored turn, or its error) is what the caller gets.
        with suppress(DBAPIError, OSError):
            await connection.execute(_UNLOCK, {"key": key})
