"""Claims of background jobs across every API process on one PostgreSQL database.

A job (a user's pending fact extraction, a knowledge document's processing, a user's
turns given the second dense list's vectors) is claimed
with a PostgreSQL advisory lock in the two-int key space, `(class id, key)`: the class id
names the kind of job, so these locks never meet each other or the single-bigint locks
of chat sessions (storage/locks.py). Claims are only ever tried, never waited for: a
process that finds a job claimed skips it, and the holder does it.

- `claim_in_transaction`: `pg_try_advisory_xact_lock`, held until the transaction ends.
  A job done in one transaction (one batch of fact extraction, whose facts and watermark
  are written in it) is claimed by the transaction that writes it.
- `JobClaimRepository.try_hold`: `pg_try_advisory_lock` on a connection of its own
  (no pool, autocommit: idle, not idle in a transaction), for a job of many
  transactions; released by the unlock or by the connection's end.

Either way a killed process, or a broken connection, leaves nothing claimed: the job is
found again by another process's sweep. SQLite (one process by design) has no claims:
every claim is granted.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from storage.db import connect, create_lock_engine_or_none
from storage.errors import DatabaseUnavailableError

# Class ids of the two-int advisory lock key space (int4; "mc" and a job kind).
FACT_EXTRACTION = 0x6D63_0001
KNOWLEDGE_PROCESSING = 0x6D63_0002
SECOND_VECTORS = 0x6D63_0003

_TRY_XACT_LOCK = text("SELECT pg_try_advisory_xact_lock(CAST(:class_id AS int), CAST(:key AS int))")
_TRY_LOCK = text("SELECT pg_try_advisory_lock(CAST(:class_id AS int), CAST(:key AS int))")
_UNLOCK = text("SELECT pg_advisory_unlock(CAST(:class_id AS int), CAST(:key AS int))")


def int4_key(value: int) -> int:
    """A row id as the int4 second half of a key: itself below 2**31; larger ids wrap, and
    two ids 2**32 apart share a claim (one waits for the other's sweep)."""
    return (value + 2**31) % 2**32 - 2**31


def document_key(document_id: str) -> int:
    """A document's UUID as an int4 key (colliding documents share a claim)."""
    return int4_key(uuid.UUID(document_id).int % 2**32)


async def claim_in_transaction(session: AsyncSession, class_id: int, key: int) -> bool:
    """Claim the job `(class_id, key)` until the session's transaction ends; False when
    another transaction holds it. Always True on SQLite."""
    if session.get_bind().dialect.name != "postgresql":
        return True
    granted = await session.scalar(_TRY_XACT_LOCK, {"class_id": class_id, "key": key})
    return bool(granted)


class JobClaimRepository:
    """Claims held across transactions, each on a PostgreSQL connection of its own that
    lives exactly as long as the hold (one connection set-up per hold)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @classmethod
    def open_or_none(cls, url: str, *, timeout_s: float) -> JobClaimRepository | None:
        """The claims of the PostgreSQL database at `url`; None for any other database.
        A try never waits for a lock: `timeout_s` bounds the connection and each statement."""
        engine = create_lock_engine_or_none(
            url, connect_timeout_s=timeout_s, command_timeout_s=timeout_s
        )
        if engine is None:
            return None
        return cls(engine)

    @asynccontextmanager
    async def try_hold(self, class_id: int, key: int) -> AsyncIterator[bool]:
        """Whether this hold got the job `(class_id, key)`; held for the body if so."""
        params = {"class_id": class_id, "key": key}
        connection = await connect(self._engine)
        try:
            try:
                granted = bool(await connection.scalar(_TRY_LOCK, params))
            except (DBAPIError, OSError) as exc:
                raise DatabaseUnavailableError(str(exc)) from exc
            try:
                yield granted
            finally:
                if granted:
                    # Where the connection broke, its end released the claim already.
                    with suppress(DBAPIError, OSError):
                        await connection.execute(_UNLOCK, params)
        finally:
            await connection.close()

    async def dispose(self) -> None:
        await self._engine.dispose()
