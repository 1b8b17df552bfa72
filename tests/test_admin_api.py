"""The admin API, on SQLite and PostgreSQL: inspect a user's memory, correct facts, erase a
user from SQL, FAISS and Chroma, and the audit log of every change."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select

from app.factory import create_app
from app.settings import Settings
from retrieval.indexes.chroma import embedded_client
from storage.db import create_engine
from storage.models import (
    ApiKey,
    ChatSession,
    Fact,
    FactChange,
    KnowledgeChunk,
    KnowledgeDocument,
    Message,
    MessageEmbedding,
    SessionSummary,
    User,
)
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_access import Keys, bearer, make_keys


@pytest.fixture
async def keys(database_url: str) -> Keys:
    return await make_keys(database_url)


@pytest.fixture
async def client(settings: Settings, keys: Keys) -> AsyncIterator[AsyncTestClient]:
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."] * 20))
    async with local_client(app) as test_client:
        yield test_client


async def fill_alice(client: AsyncTestClient, headers: dict[str, str]) -> dict:
    """A user with two sessions, turns, facts (one extracted, one stated) and a document."""
    first = (await client.post("/v1/sessions", json={"user_id": "alice"}, headers=headers)).json()
    second = (await client.post("/v1/sessions", json={"user_id": "alice"}, headers=headers)).json()
    for session, text in ((first, "I am allergic to peanuts."), (second, "我住在上海。")):
        turn = await client.post(
            f"/v1/sessions/{session['id']}/messages", json={"content": text}, headers=headers
        )
        assert turn.status_code == 200, turn.text
    stated = await client.post(
        "/v1/users/alice/facts",
        json={"text": "Alice is vegetarian", "pinned": True},
        headers=headers,
    )
    document = await client.post(
        "/v1/knowledge",
        json={"title": "Diet", "text": "Vegetarian recipes without peanuts.", "user_id": "alice"},
        headers=headers,
    )
    assert stated.status_code == 201 and document.status_code == 201
    return {"sessions": [first, second], "fact": stated.json(), "document": document.json()}


async def user_pk_of(client: AsyncTestClient, admin: dict[str, str], tenant: str) -> int:
    users = (await client.get("/admin/v1/users", params={"tenant": tenant}, headers=admin)).json()
    return next(u["id"] for u in users["users"] if u["user_id"] == "alice")


async def test_admin_reads_a_users_memory_across_tenants(
    client: AsyncTestClient, keys: Keys
) -> None:
    admin = bearer(keys.admin)
    alice = await fill_alice(client, bearer(keys.a))
    await client.post("/v1/sessions", json={"user_id": "alice"}, headers=bearer(keys.b))
    listed = (await client.get("/admin/v1/users", headers=admin)).json()["users"]
    assert [(u["tenant"], u["user_id"]) for u in listed] == [("acme", "alice"), ("globex", "alice")]
    acme = listed[0]
    assert (acme["num_sessions"], acme["num_messages"], acme["num_documents"]) == (2, 4, 1)
    pk = acme["id"]

    detail = (await client.get(f"/admin/v1/users/{pk}", headers=admin)).json()
    assert [s["id"] for s in detail["sessions"]] == [s["id"] for s in alice["sessions"]]
    assert detail["num_vectors"] == 4

    second = alice["sessions"][1]["id"]
    messages = (
        await client.get(f"/admin/v1/users/{pk}/sessions/{second}/messages", headers=admin)
    ).json()["messages"]
    assert [m["message"]["content"] for m in messages] == ["我住在上海。", "Noted."]
    # The second session's turn was sent with memories of the first: the admin sees which.
    first_ids = [
        m["message"]["id"]
        for m in (
            await client.get(
                f"/admin/v1/users/{pk}/sessions/{alice['sessions'][0]['id']}/messages",
                headers=admin,
            )
        ).json()["messages"]
    ]
    assert set(messages[0]["memory_ids"]) <= set(first_ids) and messages[0]["memory_ids"]
    assert messages[0]["context_note"]
    wrong_user = await client.get(
        f"/admin/v1/users/{pk + 1}/sessions/{second}/messages", headers=admin
    )
    assert wrong_user.status_code == 404

    facts = (await client.get(f"/admin/v1/users/{pk}/facts", headers=admin)).json()["facts"]
    assert alice["fact"]["id"] in [f["id"] for f in facts]
    assert all(f["history"] for f in facts)
    found = await client.post(
        f"/admin/v1/users/{pk}/search", json={"query": "peanuts", "k": 3}, headers=admin
    )
    results = found.json()["results"]
    assert results and all(isinstance(r["score"], float) for r in results)
    assert results == sorted(results, key=lambda r: -r["score"])
    knowledge = (await client.get(f"/admin/v1/users/{pk}/knowledge", headers=admin)).json()
    assert [d["id"] for d in knowledge["documents"]] == [alice["document"]["id"]]
    stats = (await client.get("/admin/v1/stats", headers=admin)).json()
    assert stats["rows"]["users"] == 2 and stats["rows"]["messages"] == 4
    assert stats["database_bytes"] > 0


async def test_fact_corrections_and_erasure_are_audited(
    client: AsyncTestClient, keys: Keys
) -> None:
    admin = bearer(keys.admin)
    alice = await fill_alice(client, bearer(keys.a))
    fact_id = alice["fact"]["id"]
    edited = await client.patch(
        f"/admin/v1/facts/{fact_id}",
        json={"text": "Alice is vegan", "pinned": False},
        headers=admin,
    )
    assert edited.status_code == 200, edited.text
    assert (edited.json()["text"], edited.json()["pinned"]) == ("Alice is vegan", False)
    assert (await client.delete(f"/admin/v1/facts/{fact_id}", headers=admin)).status_code == 204
    # A deleted fact stays in history as it was: a correction is refused, and not audited.
    for change in ({"text": "Alice eats fish"}, {"pinned": True}, {}):
        refused = await client.patch(f"/admin/v1/facts/{fact_id}", json=change, headers=admin)
        assert refused.status_code == 409, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["detail"] == (
            f"conflicts with stored data: fact {fact_id} is deleted: it can no longer be changed"
        )
    pk = await user_pk_of(client, admin, "acme")
    reindexed = await client.post(f"/admin/v1/users/{pk}/reindex", headers=admin)
    assert reindexed.json() == {"num_turns": 4, "num_chunks": 1}

    entries = (await client.get("/admin/v1/audit", headers=admin)).json()["entries"]
    assert [e["action"] for e in entries] == ["user.reindex", "fact.delete", "fact.update"]
    assert all(e["actor"].startswith("key ") and "(ops" in e["actor"] for e in entries)
    assert entries[2]["detail"]["before"]["text"] == "Alice is vegetarian"
    assert entries[2]["detail"]["after"] == {
        "text": "Alice is vegan",
        "pinned": False,
        "priority": 0,
    }
    history = (await client.get(f"/admin/v1/users/{pk}/facts", headers=admin)).json()["facts"]
    changes = next(f for f in history if f["id"] == fact_id)["history"]
    assert [c["action"] for c in changes][-2:] == ["updated", "deleted"]
    assert changes[-1]["actor"].startswith("key ")
    page = await client.get(
        "/admin/v1/audit", params={"limit": 1, "before_id": entries[0]["id"]}, headers=admin
    )
    assert [e["action"] for e in page.json()["entries"]] == ["fact.delete"]


async def count_rows_of(url: str, user_pk: int) -> dict[str, int]:
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:

            async def count(statement) -> int:
                return int((await connection.execute(statement)).scalar_one())

            documents = select(KnowledgeDocument.id).where(KnowledgeDocument.user_pk == user_pk)
            facts = select(Fact.id).where(Fact.user_pk == user_pk)
            sessions = select(ChatSession.id).where(ChatSession.user_pk == user_pk)
            return {
                "users": await count(select(func.count()).where(User.id == user_pk)),
                "sessions": await count(select(func.count()).select_from(sessions.subquery())),
                "messages": await count(select(func.count()).where(Message.user_pk == user_pk)),
                "embeddings": await count(
                    select(func.count()).where(MessageEmbedding.user_pk == user_pk)
                ),
                "summaries": await count(
                    select(func.count()).where(SessionSummary.session_id.in_(sessions))
                ),
                "facts": await count(select(func.count()).where(Fact.user_pk == user_pk)),
                "fact_changes": await count(
                    select(func.count()).where(FactChange.fact_id.in_(facts))
                ),
                "documents": await count(
                    select(func.count()).where(KnowledgeDocument.user_pk == user_pk)
                ),
                "chunks": await count(
                    select(func.count()).where(KnowledgeChunk.document_id.in_(documents))
                ),
                "keys": await count(select(func.count()).select_from(ApiKey)),
            }
    finally:
        await engine.dispose()


def chroma_collections(data_dir: Path) -> set[str]:
    client = embedded_client(data_dir / "index" / "chroma")()
    return {c if isinstance(c, str) else c.name for c in client.list_collections()}


async def test_erase_leaves_nothing_of_the_user_in_sql_faiss_or_chroma(
    client: AsyncTestClient, keys: Keys, settings: Settings, database_url: str
) -> None:
    admin = bearer(keys.admin)
    await fill_alice(client, bearer(keys.a))
    await fill_alice(client, bearer(keys.b))  # the other tenant's alice must survive
    pk = await user_pk_of(client, admin, "acme")
    other = await user_pk_of(client, admin, "globex")
    before = await count_rows_of(database_url, pk)
    assert before["messages"] == 4 and before["facts"] >= 1 and before["chunks"] == 1
    faiss_file = settings.data_dir / "index" / "faiss" / f"scope-{pk}.faiss"
    await client.post(f"/admin/v1/users/{pk}/reindex", headers=admin)  # writes the scope
    assert faiss_file.exists()
    assert f"memchat-knowledge-{pk}" in chroma_collections(settings.data_dir)

    erased = await client.delete(f"/admin/v1/users/{pk}", headers=admin)
    assert erased.status_code == 200, erased.text
    report = erased.json()
    assert report["user_id"] == "alice"
    assert report["removed"]["messages"] == 4 and report["removed"]["users"] == 1
    assert report["removed"]["knowledge_chunks"] == 1
    assert report["removed"]["facts"] == before["facts"]

    after = await count_rows_of(database_url, pk)
    assert after == {**{name: 0 for name in after}, "keys": before["keys"]}
    assert not faiss_file.exists()
    assert f"memchat-knowledge-{pk}" not in chroma_collections(settings.data_dir)
    assert (await client.get(f"/admin/v1/users/{pk}", headers=admin)).status_code == 404
    # Tenant A's key finds nothing; tenant B's alice is untouched.
    gone = await client.get("/v1/sessions", params={"user_id": "alice"}, headers=bearer(keys.a))
    assert gone.json() == {"sessions": []}
    kept = await count_rows_of(database_url, other)
    assert kept["messages"] == 4 and kept["chunks"] == 1
    found = await client.post(
        "/v1/memory/search",
        json={"user_id": "alice", "query": "peanuts", "kinds": ["turn", "knowledge"]},
        headers=bearer(keys.b),
    )
    assert {r["kind"] for r in found.json()["results"]} == {"turn", "knowledge"}
    audit = (await client.get("/admin/v1/audit", headers=admin)).json()["entries"]
    assert [e["action"] for e in audit] == ["user.erase", "user.reindex"]
    assert audit[0]["detail"]["removed"]["messages"] == 4
