"""Migrations: upgrade, downgrade, upgrade again, and models match migrations, on both databases."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from storage import migrate
from storage.db import create_engine
from storage.models import Base

TABLES = {
    "users",
    "chat_sessions",
    "messages",
    "message_embeddings",
    "facts",
    "fact_changes",
    "session_summaries",
    "knowledge_documents",
    "knowledge_chunks",
}


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names()) - {"alembic_version"}


def _diff(connection: Connection) -> list:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return compare_metadata(context, Base.metadata)


@pytest.fixture
def sqlite_empty_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"


@pytest.fixture
async def postgres_empty_url(postgres_url: str) -> str:
    engine = create_engine(postgres_url)
    await migrate.downgrade(engine, "base")
    await engine.dispose()
    return postgres_url


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_empty_url"))


async def test_upgrade_downgrade_upgrade_and_models_match(empty_database_url: str) -> None:
    engine = create_engine(empty_database_url)
    try:
        await migrate.upgrade(engine)
        assert await migrate.current_revision(engine) == migrate.head_revision()
        async with engine.connect() as connection:
            assert await connection.run_sync(_tables) == TABLES
            assert await connection.run_sync(_diff) == []

        await migrate.downgrade(engine, "base")
        assert await migrate.current_revision(engine) is None
        async with engine.connect() as connection:
            assert await connection.run_sync(_tables) == set()

        await migrate.upgrade(engine)
        async with engine.connect() as connection:
            assert await connection.run_sync(_tables) == TABLES
            assert await connection.run_sync(_diff) == []
            version = await connection.scalar(text("SELECT version_num FROM alembic_version"))
        assert version == migrate.head_revision()
    finally:
        await engine.dispose()
