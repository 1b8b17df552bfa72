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
    "fact_embeddings",
    "session_summaries",
    "knowledge_documents",
    "knowledge_chunks",
    "tenants",
    "api_keys",
    "audit_log",
    "admin_sessions",
    "readiness_probe",
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


async def test_tenants_arrive_without_losing_stored_memory(empty_database_url: str) -> None:
    """0007 rebuilds `users` and `knowledge_documents` (on SQLite by copying the table):
    every row that references them must survive, owned by the tenant `default`."""
    engine = create_engine(empty_database_url)
    try:
        await migrate.upgrade(engine, "0006")
        async with engine.begin() as connection:
            for statement in (
                "INSERT INTO users (id, external_id, created_at, facts_through_message_id)"
                " VALUES (1, 'alice', '2026-01-01 00:00:00', 0)",
                "INSERT INTO chat_sessions (id, user_pk, metadata, created_at)"
                " VALUES ('s1', 1, '{}', '2026-01-01 00:00:00')",
                "INSERT INTO messages (id, session_id, user_pk, seq, role, content, created_at,"
                " token_count, context_note_tokens) VALUES"
                " (1, 's1', 1, 1, 'user', '我对花生过敏', '2026-01-01 00:00:00', 5, 0)",
                "INSERT INTO message_embeddings (message_id, user_pk, model, dimension, vector)"
                " VALUES (1, 1, 'm', 1, :vector)",
                "INSERT INTO knowledge_documents (id, user_pk, scope, title, metadata, source,"
                " content, content_hash, status, num_chars, num_chunks, num_chunks_indexed,"
                " created_at, updated_at) VALUES ('d1', NULL, 'shared', 't', '{}', 'text', 'x',"
                " 'h', 'ready', 1, 0, 0, '2026-01-01 00:00:00', '2026-01-01 00:00:00')",
            ):
                params = {"vector": b"\x00\x00\x80?"} if ":vector" in statement else {}
                await connection.execute(text(statement), params)
        await migrate.upgrade(engine)
        async with engine.connect() as connection:
            users = (await connection.execute(text("SELECT id, tenant_id FROM users"))).all()
            counts = [
                await connection.scalar(text(f"SELECT count(*) FROM {table}"))
                for table in ("chat_sessions", "messages", "message_embeddings")
            ]
            documents = (
                await connection.execute(text("SELECT tenant_id, scope FROM knowledge_documents"))
            ).all()
            tenants = (await connection.execute(text("SELECT id, name FROM tenants"))).all()
        assert [tuple(u) for u in users] == [(1, 1)]
        assert counts == [1, 1, 1]
        assert [tuple(d) for d in documents] == [(1, "tenant:1")]
        assert [tuple(t) for t in tenants] == [(1, "default")]
        # A second tenant gets the next id, and may have its own "alice".
        async with engine.begin() as connection:
            await connection.execute(
                text("INSERT INTO tenants (name, created_at) VALUES ('acme', '2026-01-02')")
            )
            new_id = await connection.scalar(text("SELECT id FROM tenants WHERE name = 'acme'"))
            await connection.execute(
                text(
                    "INSERT INTO users (id, tenant_id, external_id, created_at,"
                    " facts_through_message_id) VALUES (2, :t, 'alice', '2026-01-02', 0)"
                ),
                {"t": new_id},
            )
        assert new_id == 2
    finally:
        await engine.dispose()
