"""A whole tenant exported from SQLite and imported into PostgreSQL loses nothing: every
table compares equal column by column, surrogate ids mapped through natural keys and
derived vectors left out; a second import changes nothing; the target exports the same
bytes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from app.cli.backup import import_lines
from app.factory import create_app
from app.settings import ChatSettings, Settings
from retrieval.dense import DenseQuery
from storage.db import create_engine
from storage.models import Base
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_api_sessions import create_session
from tests.test_backup import (
    added,
    export_bytes,
    import_target,
    open_store,
    served_memory,
    wait_for_extraction,
)

# Operator data, not a user's memory: not exported.
NOT_EXPORTED = {"tenants", "api_keys", "audit_log", "admin_sessions", "readiness_probe"}
GUIDE = "# Garden\n\nWater the roses at dawn.\n\n## Pests\n\nAphids hate garlic spray."


async def say(client: AsyncTestClient, session_id: str, content: str) -> dict[str, Any]:
    response = await client.post(f"/v1/sessions/{session_id}/messages", json={"content": content})
    assert response.status_code == 200, response.text
    return dict(response.json())


async def fill_source(client: AsyncTestClient, source_url: str) -> None:
    """Two users with everything a store holds: facts stated, superseded, corrected and
    deleted; summaries of several versions; turns with context notes; knowledge."""
    repos, engine = await open_store(source_url)
    home = await create_session(client, title="home", metadata={"channel": "app"})
    await say(client, home["id"], "I live in Paris.")
    await wait_for_extraction(repos)
    for content in [
        "My daughter Mia turns 7 on 3 June.",
        "What a day.",
        "I am allergic to peanuts.",
        "Big news: I moved to Berlin.",
        "Tell me a story.",
        "I like kites.",
    ]:
        await say(client, home["id"], content)
        await wait_for_extraction(repos)
    stated = await client.post(
        "/v1/users/alice/facts", json={"text": "Alice is vegetarian.", "pinned": True}
    )
    fact_id = stated.json()["id"]
    corrected = await client.patch(f"/v1/facts/{fact_id}", json={"text": "Alice is vegan."})
    assert corrected.status_code == 200, corrected.text
    dropped = await client.post("/v1/users/alice/facts", json={"text": "Alice hates tea."})
    assert (await client.delete(f"/v1/facts/{dropped.json()['id']}")).status_code == 204
    later = await create_session(client)
    await client.post(
        f"/v1/sessions/{later['id']}/history",
        json={
            "messages": [
                {"role": "user", "content": "Look at my kite", "external_id": "k1",
                 "image_caption": "a red kite", "created_at": "2026-01-05T10:00:00+05:00"},
                {"role": "assistant", "content": "Lovely!", "name": "bot"},
            ]
        },
    )  # fmt: skip
    await say(client, later["id"], "Where do I live now, and what about Mia?")
    other = await create_session(client, user_id="bob")
    await say(client, other["id"], "I live in Oslo.")
    for body in (
        {"title": "Garden guide", "text": GUIDE, "metadata": {"lang": "en"}},
        {"title": "Alice's notes", "text": "Mia likes owls.", "user_id": "alice"},
    ):
        response = await client.post("/v1/knowledge", json=body)
        assert response.status_code == 201, response.text
    await wait_for_extraction(repos)
    await engine.dispose()


Rows = list[dict[str, Any]]
KEYS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "users": lambda r: r["external_id"],
    "chat_sessions": lambda r: r["id"],
    "messages": lambda r: (r["session_id"], r["seq"]),
    "facts": lambda r: (r["user_pk"], r["created_at"], r["valid_from"]),
    "fact_changes": lambda r: (r["fact_id"], r["action"], r["changed_at"]),
    "session_summaries": lambda r: (r["session_id"], r["version"]),
    "knowledge_documents": lambda r: r["id"],
    "knowledge_chunks": lambda r: (r["document_id"], r["ordinal"]),
}
# Surrogate ids, which the target renumbers (sessions and documents keep theirs: UUIDs).
RENUMBERED = ("users", "messages", "facts", "fact_changes", "session_summaries", "knowledge_chunks")


async def read_tables(url: str) -> dict[str, Rows]:
    engine = create_engine(url)
    async with engine.connect() as connection:
        tables = {
            name: [dict(r) for r in (await connection.execute(select(table))).mappings().all()]
            for name, table in Base.metadata.tables.items()
            if name not in NOT_EXPORTED
        }
    await engine.dispose()
    return tables


class Names:
    """The natural key of each row an id names, in one database."""

    def __init__(self, raw: dict[str, Rows]) -> None:
        self.users = {r["id"]: r["external_id"] for r in raw["users"]}
        self.messages = {r["id"]: (r["session_id"], r["seq"]) for r in raw["messages"]}
        self.facts = {
            r["id"]: (self.users[r["user_pk"]], r["created_at"], r["valid_from"])
            for r in raw["facts"]
        }

    def of(self, ids: list[int] | None, names: dict[int, Any]) -> list[Any] | None:
        return None if ids is None else [names[i] for i in ids]

    def snapshot(self, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        found = value | {"source_message_ids": self.of(value["source_message_ids"], self.messages)}
        if "superseded_by" in found:
            found["superseded_by"] = self.facts[found["superseded_by"]]
        return found

    def scope(self, value: str) -> str:
        kind, _, number = value.partition(":")
        return value if kind == "tenant" else f"user:{self.users[int(number)]}"


def name_references(raw: dict[str, Rows]) -> None:
    """Every id that names a row replaced by that row's natural key."""
    names = Names(raw)
    for r in raw["users"]:
        r["facts_through_message_id"] = names.messages.get(r["facts_through_message_id"])
    for name in ("chat_sessions", "messages", "facts", "knowledge_documents"):
        for r in raw[name]:
            r["user_pk"] = names.users.get(r["user_pk"])
    for r in raw["messages"]:
        r["context_note_ids"] = names.of(r["context_note_ids"], names.messages)
        r["context_note_fact_ids"] = names.of(r["context_note_fact_ids"], names.facts)
    for r in raw["facts"]:
        r["source_message_ids"] = names.of(r["source_message_ids"], names.messages)
    for r in raw["fact_changes"]:
        r["fact_id"] = names.facts[r["fact_id"]]
        r["before"], r["after"] = names.snapshot(r["before"]), names.snapshot(r["after"])
    for r in raw["session_summaries"]:
        r["pinned_fact_ids"] = names.of(r["pinned_fact_ids"], names.facts)
    for r in raw["knowledge_documents"]:
        r["scope"] = names.scope(r["scope"])


async def dump(url: str) -> dict[str, dict[Any, dict[str, Any]]]:
    """Every exported table, keyed by natural keys, ids replaced by the natural keys of
    the rows they name; surrogate ids and derived vectors left out."""
    raw = await read_tables(url)
    embeddings = raw.pop("message_embeddings")
    # Derived: every message has its vector, every fact too (made again on import).
    assert sorted(r["message_id"] for r in embeddings) == sorted(r["id"] for r in raw["messages"])
    for r in raw["facts"]:
        assert r.pop("model") == "hash-64" and r.pop("vector") is not None
    # Derived, made when a search first needs them (this store has no second model).
    assert raw.pop("fact_embeddings") == []
    for r in raw["users"]:
        # Derived: counts the changes of the user's vectors, which each store makes its own.
        r.pop("memory_version", None)
    for r in raw["messages"]:
        # Not exported: a reply's turn report is the inspector's record of that turn in
        # this store (its memories and facts by this store's ids), left behind by a move.
        r.pop("turn_report", None)
    name_references(raw)
    for name in RENUMBERED:
        for r in raw[name]:
            del r["id"]
    return {name: {KEYS[name](r): r for r in rows} for name, rows in raw.items()}


def check_the_source_has_everything(tables: dict[str, dict[Any, dict[str, Any]]]) -> None:
    """The round trip is only worth as much as what the source holds."""
    derived = {"message_embeddings", "fact_embeddings"}
    assert set(tables) | derived | NOT_EXPORTED == set(Base.metadata.tables)
    facts = list(tables["facts"].values())
    assert {f["status"] for f in facts} == {"active", "superseded", "deleted"}
    actions = {c["action"] for c in tables["fact_changes"].values()}
    assert {"created", "superseded", "updated", "deleted"} <= actions
    assert any(c["after"].get("superseded_by") for c in tables["fact_changes"].values())
    versions = [s["version"] for s in tables["session_summaries"].values()]
    assert max(versions) >= 2
    assert any(s["pinned_fact_ids"] for s in tables["session_summaries"].values())
    messages = list(tables["messages"].values())
    assert any(m["context_note"] and m["context_note_ids"] for m in messages)
    assert any(m["context_note_fact_ids"] for m in messages)
    assert any(m["image_caption"] for m in messages)
    assert any(m["external_id"] for m in messages)
    assert any(f["source_message_ids"] for f in facts)
    assert all(u["facts_through_message_id"] for u in tables["users"].values())
    assert {d["scope"] for d in tables["knowledge_documents"].values()} == {
        "tenant:1",
        "user:alice",
    }
    assert any(c["heading_path"] for c in tables["knowledge_chunks"].values())


@pytest.mark.postgres
async def test_a_tenant_moves_from_sqlite_to_postgres_with_nothing_lost(
    tmp_path: Path, sqlite_url: str, postgres_url: str
) -> None:
    settings = Settings(
        data_dir=tmp_path / "source",
        database_url=sqlite_url,
        chat=ChatSettings(recent_window_messages=4, window_eviction_chunk=2),
    )
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."]))
    async with local_client(app) as client:
        await fill_source(client, sqlite_url)
    source_tables = await dump(sqlite_url)
    check_the_source_has_everything(source_tables)
    source, source_engine = await open_store(sqlite_url)
    exported = await export_bytes(source, None)
    # Pages of two rows read the same rows in the same order as pages of 500.
    assert await export_bytes(source, None, page_size=2) == exported
    await source_engine.dispose()

    target, target_engine = await open_store(postgres_url)
    destination = import_target(target, tmp_path / "target")
    lines = exported.splitlines(keepends=True)
    first = await import_lines(destination, lines, batch_size=7)
    num_rows = sum(len(rows) for rows in source_tables.values())
    assert sum(first.num_added.values()) == num_rows
    target_tables = await dump(postgres_url)
    for name, rows in source_tables.items():
        assert target_tables[name] == rows, name
    assert await export_bytes(target, None, page_size=2) == exported

    second = await import_lines(destination, lines)
    assert (second.num_added, second.num_present) == (added(), num_rows)
    assert await dump(postgres_url) == source_tables
    # The imported turns and documents are searchable in the target.
    user = await target.users.get_user("alice", tenant_id=1)
    memory = served_memory(target, tmp_path / "target")
    vector = (await memory.embed(["peanuts allergic"]))[0]
    [hit] = await memory.search(user.id, vector, 1, query="peanuts allergic")
    [turn] = await target.messages.list_messages_by_id(user.id, [hit.id])
    assert turn.content == "I am allergic to peanuts."
    knowledge = destination.knowledge()
    query = (await memory.embed(["aphids garlic"]))[0]
    [found, *_] = await knowledge.search(1, user.id, DenseQuery(query), 3)
    assert found.chunk.text == "Aphids hate garlic spray."
    await target_engine.dispose()
