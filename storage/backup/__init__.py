"""Bulk copies of a user's or a tenant's rows, for export and import (`memchat export`).

`snapshot()` reads pages of every kind of row in one transaction (on PostgreSQL one
REPEATABLE READ snapshot, so a running service's writes during an export are not half
seen); `batch()` restores rows in one transaction per batch (see `restoring`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from storage.backup.reading import NUM_ROWS_TABLES, BackupReader, MessageKey
from storage.backup.restored import (
    RestoredChange,
    RestoredDocument,
    RestoredFact,
    RestoredMessage,
)
from storage.backup.restoring import RestoreBatch
from storage.db import Database, create_sessionmaker, transaction

__all__ = [
    "NUM_ROWS_TABLES",
    "BackupReader",
    "BackupRepository",
    "MessageKey",
    "RestoreBatch",
    "RestoredChange",
    "RestoredDocument",
    "RestoredFact",
    "RestoredMessage",
]


class BackupRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[BackupReader]:
        """A reader of one consistent state of the database (SQLite: of the rows as each
        page is read, unless nothing writes meanwhile)."""
        engine = self._db.engine
        if engine.dialect.name == "postgresql":
            engine = engine.execution_options(isolation_level="REPEATABLE READ")
        async with transaction(create_sessionmaker(engine)) as session:
            yield BackupReader(session)

    @asynccontextmanager
    async def batch(self) -> AsyncIterator[RestoreBatch]:
        """One batch of restored rows: written together, or (on any error) not at all."""
        async with self._db.transaction() as session:
            yield RestoreBatch(session)
