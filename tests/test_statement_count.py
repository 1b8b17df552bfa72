"""How much SQL one steady-state chat turn costs: statements counted with SQLAlchemy's
cursor events while the turn runs, on SQLite and PostgreSQL.

The turn is the sixth of a session whose user has an older session (memories to
retrieve) and pinned facts, with knowledge off (no documents) and fact extraction off
(it runs after the turn, off its path; the one deviation from the default settings,
so that only the turn's own statements are counted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event

from app.factory import create_app
from app.settings import FactSettings, Settings
from storage.db import Database
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine

# Reads: whether an API key exists yet (local mode ends at the first), the session with
# its user, summary and knowledge flags, the window, the pinned facts, the sessions of the
# search's best candidates (the session prior), the retrieved turns. Writes: the message
# with its context note, its vector; the reply, its vector; with each vector the user's
# change count (other processes catch up by it). After the message's insert, the turns
# its context shows are read again, held until commit, so that a session deleted
# meanwhile leaves no stored context quoting it. No row is read twice otherwise (the
# turn ran 19 statements before it read each row once).
MAX_STATEMENTS = 13


@contextmanager
def counting(db: Database) -> Iterator[Counter[str]]:
    """Statements run on the database's engines: the async one, and on SQLite the sync
    one its reads of several statements take (`Database.read`)."""
    counts: Counter[str] = Counter()

    def count(_conn, _cursor, statement: str, *_args: object) -> None:
        counts[statement.split(None, 1)[0].upper()] += 1

    engines = [db.engine.sync_engine, *([db.reader_engine] if db.reader_engine else [])]
    for engine in engines:
        event.listen(engine, "before_cursor_execute", count)
    try:
        yield counts
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", count)


async def test_a_steady_state_turn_runs_few_statements(settings: Settings) -> None:
    quiet = settings.model_copy(update={"facts": FactSettings(extractor="none")})
    app = create_app(quiet, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted, thanks."]))
    async with local_client(app) as client:
        old = (await client.post("/v1/sessions", json={"user_id": "alice"})).json()
        # Enough turns that the five turns before leave this one memories to show (none is
        # shown twice in a session, and a session's first turn shows up to `retrieval_k`).
        history = [
            {"role": "user", "content": f"I like hiking trail number {i}"} for i in range(400)
        ]
        await client.post(f"/v1/sessions/{old['id']}/history", json={"messages": history})
        for text in ("I am allergic to peanuts.", "I live in Lyon."):
            await client.post("/v1/users/alice/facts", json={"text": text, "pinned": True})
        session = (await client.post("/v1/sessions", json={"user_id": "alice"})).json()
        path = f"/v1/sessions/{session['id']}/messages"
        for i in range(5):
            assert (
                await client.post(path, json={"content": f"Tell me about trail {i}"})
            ).is_success
        with counting(app.state.runtime.db) as counts:
            response = await client.post(path, json={"content": "Which trail did I like?"})
        assert response.status_code == 200, response.text
        assert response.json()["context"]["memories"]
    total = sum(counts[k] for k in counts if k not in ("BEGIN", "COMMIT", "ROLLBACK"))
    print(f"\nstatements in one steady-state turn: {total} {dict(counts)}")
    assert total <= MAX_STATEMENTS, dict(counts)
