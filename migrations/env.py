"""Alembic environment: run by storage.migrate (which passes a connection) or the alembic CLI."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection

from storage.db import create_engine
from storage.models import Base

config = context.config
target_metadata = Base.metadata


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_with_own_engine(url: str) -> None:
    engine = create_engine(url)
    async with engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            # Table rebuilds must not cascade (see storage.migrate._migrate).
            await connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        await connection.run_sync(_configure_and_run)
        await connection.commit()
    await engine.dispose()


connection = config.attributes.get("connection")
if connection is not None:
    _configure_and_run(connection)
elif context.is_offline_mode():
    context.configure(url=os.environ["MEMCHAT_DATABASE_URL"], target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_with_own_engine(os.environ["MEMCHAT_DATABASE_URL"]))
