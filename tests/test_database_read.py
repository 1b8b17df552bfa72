"""`Database.read`: several statements in one read transaction, on SQLite over a sync
connection in a worker thread, on PostgreSQL through the async session; it sees what a
transaction committed just before, and a driver's error leaves as a storage error."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from storage.db import Database, create_engine
from storage.errors import DatabaseUnavailableError, NotFoundError
from storage.messages import MessageRepository
from storage.models import DEFAULT_TENANT_ID
from storage.records import NewTurn
from storage.sessions import SessionRepository


@pytest.fixture
async def db(database_url: str):
    database = Database(create_engine(database_url))
    yield database
    await database.dispose()


async def test_a_read_sees_what_was_just_committed(db: Database, database_url: str) -> None:
    assert (db.reader_engine is not None) == database_url.startswith("sqlite")
    sessions, messages = SessionRepository(db), MessageRepository(db)
    chat, user = await sessions.create_session("alice", None, {}, tenant_id=DEFAULT_TENANT_ID)
    stored = await messages.append(
        chat, [NewTurn(role="user", content="I am allergic to peanuts.", token_count=7)]
    )
    state = await sessions.get_turn_state(chat.id)
    assert (state.session.id, state.user.id) == (chat.id, user.id)
    assert [t.content for t in state.window] == ["I am allergic to peanuts."]
    found = await messages.list_messages_by_id(user.id, [t.id for t in stored.turns])
    assert [t.id for t in found] == [t.id for t in stored.turns]


async def test_a_missing_session_is_not_found(db: Database) -> None:
    with pytest.raises(NotFoundError):
        await SessionRepository(db).get_turn_state("6f1b1a52-60c2-4c1f-9d4e-5b8f1d9a0c11")


async def test_a_driver_error_in_a_read_is_a_storage_error(db: Database) -> None:
    with pytest.raises(DatabaseUnavailableError):
        await db.read(lambda session: session.execute(text("SELECT * FROM no_such_table")))
