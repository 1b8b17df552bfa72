"""History import, memory search, context preview and index persistence over HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.settings import Settings
from retrieval.errors import EmbeddingModelMismatchError
from retrieval.prompt.render import CONTEXT_CLOSE, CONTEXT_OPEN, MEMORY_HEADER
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_api_sessions import create_session

HISTORY = [
    {
        "role": "user",
        "content": "I am allergic to peanuts",
        "name": "Alice",
        "created_at": "2026-01-05T10:00:00Z",
        "external_id": "a1",
    },
    {
        "role": "assistant",
        "content": "Noted, no peanuts in your recipes",
        "external_id": "a2",
        "created_at": "2026-01-05T10:00:05+00:00",
    },
    {
        "role": "user",
        "content": "My sister Emma lives in Berlin",
        "external_id": "a3",
        "created_at": "2026-01-06T09:00:00Z",
    },
    {"role": "system", "content": "The user prefers short answers", "external_id": "a4"},
    {"role": "user", "content": "我对花生过敏", "external_id": "a5"},
]


async def import_history(client: AsyncTestClient, session_id: str, messages: list[dict]) -> dict:
    response = await client.post(f"/v1/sessions/{session_id}/history", json={"messages": messages})
    assert response.status_code == 201, response.text
    return response.json()


async def search(client: AsyncTestClient, query: str, **extra: object) -> list[dict]:
    response = await client.post(
        "/v1/memory/search", json={"user_id": "alice", "query": query, **extra}
    )
    assert response.status_code == 200, response.text
    return response.json()["results"]


async def test_imported_history_is_stored_in_order_and_searchable(client: AsyncTestClient) -> None:
    session = await create_session(client)
    assert await import_history(client, session["id"], HISTORY) == {"imported": 5, "skipped": 0}
    stored = (await client.get(f"/v1/sessions/{session['id']}/messages")).json()["messages"]
    assert [(m["seq"], m["role"], m["external_id"]) for m in stored] == [
        (1, "user", "a1"),
        (2, "assistant", "a2"),
        (3, "user", "a3"),
        (4, "system", "a4"),
        (5, "user", "a5"),
    ]
    assert stored[0]["name"] == "Alice"
    assert stored[0]["created_at"].startswith("2026-01-05T10:00:00")
    ids = {m["external_id"]: m["id"] for m in stored}

    results = await search(client, "where does my sister live", k=2)
    assert results[0]["id"] == ids["a3"]
    assert results[0]["kind"] == "turn"
    assert results[0]["session_id"] == session["id"]
    assert results[0]["external_id"] == "a3"
    assert results[0]["text"] == "My sister Emma lives in Berlin"
    assert results[0]["created_at"].startswith("2026-01-06T09:00:00")
    assert len(results) == 2
    assert results[0]["score"] >= results[1]["score"]

    chinese = await search(client, "花生", k=1)
    assert [r["id"] for r in chinese] == [ids["a5"]]


async def test_reimport_with_same_external_ids_skips_duplicates(client: AsyncTestClient) -> None:
    session = await create_session(client)
    await import_history(client, session["id"], HISTORY[:2])
    again = await import_history(client, session["id"], HISTORY[:3])
    assert again == {"imported": 1, "skipped": 2}
    stored = (await client.get(f"/v1/sessions/{session['id']}/messages")).json()["messages"]
    assert [m["external_id"] for m in stored] == ["a1", "a2", "a3"]


async def test_search_filtered_by_session(client: AsyncTestClient) -> None:
    first = await create_session(client)
    second = await create_session(client)
    await import_history(
        client, first["id"], [{"role": "user", "content": "peanuts are bad for me"}]
    )
    await import_history(client, second["id"], [{"role": "user", "content": "peanuts again here"}])
    everywhere = await search(client, "peanuts")
    assert {r["session_id"] for r in everywhere} == {first["id"], second["id"]}
    only_second = await search(client, "peanuts", session_id=second["id"])
    assert [r["text"] for r in only_second] == ["peanuts again here"]

    other = await create_session(client, user_id="mallory")
    response = await client.post(
        "/v1/memory/search",
        json={"user_id": "mallory", "query": "peanuts", "session_id": first["id"]},
    )
    assert response.status_code == 404
    assert other["id"]


async def test_deleting_a_session_removes_its_turns_from_search(client: AsyncTestClient) -> None:
    doomed = await create_session(client)
    kept = await create_session(client)
    await import_history(
        client, doomed["id"], [{"role": "user", "content": "the vault code is 4711"}]
    )
    await import_history(
        client, kept["id"], [{"role": "user", "content": "my vault has a red door"}]
    )
    assert (await client.delete(f"/v1/sessions/{doomed['id']}")).status_code == 204
    results = await search(client, "vault code 4711")
    assert [r["text"] for r in results] == ["my vault has a red door"]


async def test_context_preview_stores_and_generates_nothing(
    client: AsyncTestClient, engine: ScriptedEngine
) -> None:
    old = await create_session(client)
    await import_history(client, old["id"], HISTORY)
    session = await create_session(client)
    await import_history(
        client,
        session["id"],
        [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi, how can I help"},
        ],
    )
    response = await client.post(
        f"/v1/sessions/{session['id']}/context",
        json={"content": "snack ideas? I am allergic to some things"},
    )
    assert response.status_code == 200, response.text
    preview = response.json()
    roles = [m["role"] for m in preview["messages"]]
    # One system message, then alternating turns; this turn's context opens the new
    # message: the memories after the facts pinned since (there when extraction of the
    # import has finished, which runs apart).
    assert roles == ["system", "user", "assistant", "user"]
    last = preview["messages"][-1]["content"]
    assert last.startswith(CONTEXT_OPEN)
    assert last.endswith(f"{CONTEXT_CLOSE}\nsnack ideas? I am allergic to some things")
    assert preview["context"]["memories"][0]["text"] == "I am allergic to peanuts"
    assert f"{MEMORY_HEADER}\n[5 Jan 2026]\n- " in last
    assert '\n- user (name "Alice"): "I am allergic to peanuts"\n' in last
    tokens = preview["context"]["tokens"]
    assert preview["context"]["prompt_tokens"] <= preview["context"]["context_window"] - 256
    assert tokens["recent"] > 0 and tokens["memories"] > 0
    assert engine.prompts == []
    stored = (await client.get(f"/v1/sessions/{session['id']}/messages")).json()["messages"]
    assert len(stored) == 2


async def test_turns_survive_a_restart_and_stay_searchable(
    settings: Settings, embedder: HashEmbedder, engine: ScriptedEngine
) -> None:
    app = create_app(settings, embedder=embedder, engine=engine)
    async with local_client(app) as client:
        session = await create_session(client)
        await client.post(
            f"/v1/sessions/{session['id']}/messages", json={"content": "my boat is green"}
        )
    index_files = list(Path(settings.index_dir).rglob("*.faiss"))
    assert len(index_files) == 1

    app = create_app(settings, embedder=embedder, engine=engine)
    async with local_client(app) as client:
        stored = (await client.get(f"/v1/sessions/{session['id']}/messages")).json()["messages"]
        assert [m["content"] for m in stored] == ["my boat is green", "I will remember that."]
        results = await search(client, "green boat", k=1)
        assert [r["id"] for r in results] == [stored[0]["id"]]


async def test_start_with_another_embedding_model_is_refused(
    settings: Settings, embedder: HashEmbedder, engine: ScriptedEngine
) -> None:
    app = create_app(settings, embedder=embedder, engine=engine)
    async with local_client(app) as client:
        session = await create_session(client)
        await import_history(client, session["id"], HISTORY[:1])

    other = HashEmbedder(dimension=32, model_name="other-32")
    app = create_app(settings, embedder=other, engine=engine)
    # The test client runs the app's start-up in a task group, which wraps the error.
    with pytest.raises(BaseExceptionGroup) as caught:
        async with local_client(app):
            pass
    assert caught.group_contains(EmbeddingModelMismatchError, match="run `memchat reindex`")
