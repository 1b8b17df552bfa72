"""Bad input and unknown ids: problem details with the offending field, nothing stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.factory import create_app
from app.settings import Settings
from tests.clients import local_client
from tests.conftest import POSTGRES_ADMIN_URL
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_api_sessions import create_session


def assert_problem(response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    assert body["title"]
    assert body["detail"]
    if field is not None:
        assert [e["field"] for e in body["errors"]] == [field]
    return body


async def stored_messages(client: AsyncTestClient, session_id: str) -> list[dict]:
    return (await client.get(f"/v1/sessions/{session_id}/messages")).json()["messages"]


async def test_unknown_session_is_404_everywhere(client: AsyncTestClient) -> None:
    missing = "00000000-0000-0000-0000-000000000000"
    assert_problem(await client.get(f"/v1/sessions/{missing}"), 404)
    assert_problem(await client.delete(f"/v1/sessions/{missing}"), 404)
    assert_problem(await client.get(f"/v1/sessions/{missing}/messages"), 404)
    body = assert_problem(
        await client.post(f"/v1/sessions/{missing}/messages", json={"content": "hi"}), 404
    )
    assert missing in body["detail"]
    assert_problem(await client.post(f"/v1/sessions/{missing}/history", json={"messages": []}), 404)
    assert_problem(await client.post(f"/v1/sessions/{missing}/context", json={"content": "x"}), 404)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"content": ""}, "content"),
        ({"content": "   \n"}, "content"),
        ({"content": "x" * 32_001}, "content"),
        ({"content": 42}, "content"),
        ({}, "content"),
        ({"content": "hi", "temperature": -1}, "temperature"),
        ({"content": "hi", "max_tokens": 0}, "max_tokens"),
        ({"content": "hi", "colour": "red"}, "colour"),
    ],
)
async def test_bad_message_is_422_and_stores_nothing(
    client: AsyncTestClient, body: dict, field: str
) -> None:
    session = await create_session(client)
    response = await client.post(f"/v1/sessions/{session['id']}/messages", json=body)
    problem = assert_problem(response, 422)
    assert [e["field"] for e in problem["errors"]] == [field]
    assert await stored_messages(client, session["id"]) == []


async def test_message_too_long_for_the_context_window_is_422(client: AsyncTestClient) -> None:
    session = await create_session(client)
    # The scripted engine has a 2,048-token window and counts one token per word.
    response = await client.post(
        f"/v1/sessions/{session['id']}/messages", json={"content": "word " * 1900}
    )
    problem = assert_problem(response, 422, "content")
    assert "context window" in problem["detail"]
    assert await stored_messages(client, session["id"]) == []


async def test_malformed_json_is_400(client: AsyncTestClient) -> None:
    session = await create_session(client)
    response = await client.post(
        f"/v1/sessions/{session['id']}/messages",
        content=b'{"content": ',
        headers={"content-type": "application/json"},
    )
    assert_problem(response, 400)


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"role": "robot", "content": "hi"}, "messages[0].role"),
        ({"role": "user", "content": "hi", "created_at": "yesterday"}, "messages[0].created_at"),
        ({"role": "user", "content": ""}, "messages[0].content"),
        ({"role": "user"}, "messages[0].content"),
        ({"role": "user", "content": "hi", "mood": "sad"}, "messages[0].mood"),
    ],
)
async def test_bad_history_is_422_naming_the_field_and_imports_nothing(
    client: AsyncTestClient, message: dict, field: str
) -> None:
    session = await create_session(client)
    response = await client.post(
        f"/v1/sessions/{session['id']}/history",
        json={"messages": [{"role": "user", "content": "fine"}, message]},
    )
    problem = assert_problem(response, 422)
    assert [e["field"] for e in problem["errors"]] == [field.replace("[0]", "[1]")]
    assert await stored_messages(client, session["id"]) == []


async def test_import_over_the_limit_is_422(client: AsyncTestClient) -> None:
    session = await create_session(client)
    messages = [{"role": "user", "content": f"m{i}"} for i in range(1001)]
    response = await client.post(
        f"/v1/sessions/{session['id']}/history", json={"messages": messages}
    )
    problem = assert_problem(response, 422, "messages")
    assert "1000" in problem["detail"].replace(",", "")
    assert await stored_messages(client, session["id"]) == []


async def test_bad_session_create_is_422(client: AsyncTestClient) -> None:
    assert_problem(await client.post("/v1/sessions", json={"user_id": ""}), 422, "user_id")
    assert_problem(await client.post("/v1/sessions", json={"title": "x"}), 422)
    assert_problem(
        await client.post("/v1/sessions", json={"user_id": "a", "metadata": []}), 422, "metadata"
    )


async def test_search_errors(client: AsyncTestClient) -> None:
    assert_problem(
        await client.post("/v1/memory/search", json={"user_id": "ghost", "query": "x"}), 404
    )
    await create_session(client, user_id="ghost")
    assert_problem(
        await client.post("/v1/memory/search", json={"user_id": "ghost", "query": "x", "k": 0}),
        422,
        "k",
    )
    assert_problem(
        await client.post(
            "/v1/memory/search", json={"user_id": "ghost", "query": "x", "kinds": ["dream"]}
        ),
        422,
    )
    assert_problem(
        await client.post("/v1/memory/search", json={"user_id": "ghost", "query": ""}), 422, "query"
    )


async def test_unknown_route_is_a_problem_404(client: AsyncTestClient) -> None:
    assert_problem(await client.get("/v1/nothing-here"), 404)


@asynccontextmanager
async def database_down(database_url: str) -> AsyncIterator[None]:
    """The database refuses every connection, its open ones ended, as if its server were
    down; allowed again at the end. (The server itself is shared by the whole run.)"""
    name = database_url.rpartition("/")[2]
    admin = create_async_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as connection:
            await connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            # The timeout makes each call wait until its backend has gone.
            await connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                    " WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
        try:
            yield
        finally:
            async with admin.connect() as connection:
                await connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
    finally:
        await admin.dispose()


@pytest.mark.postgres
async def test_a_database_that_is_down_is_a_503_and_loses_nothing_acknowledged(
    tmp_path: Path, postgres_url: str
) -> None:
    app = create_app(
        Settings(data_dir=tmp_path / "data", database_url=postgres_url),
        embedder=HashEmbedder(),
        engine=ScriptedEngine(["Noted.", "Still here."]),
    )
    async with local_client(app) as client:
        session_id = (await create_session(client, "alice"))["id"]
        turn = {"content": "I am allergic to peanuts.", "max_tokens": 8}
        assert (await client.post(f"/v1/sessions/{session_id}/messages", json=turn)).is_success
        before = await stored_messages(client, session_id)
        async with database_down(postgres_url):
            for response in (
                await client.post("/v1/sessions", json={"user_id": "bob"}),
                await client.post(
                    f"/v1/sessions/{session_id}/messages", json={"content": "And now?"}
                ),
                await client.post(
                    "/v1/memory/search", json={"user_id": "alice", "query": "peanuts"}
                ),
            ):
                body = assert_problem(response, 503)
                assert body["detail"] == "the database is unavailable"
                assert response.headers["retry-after"] == "5"
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["checks"]["database"].startswith("error: ")
        # Back up: everything acknowledged is there, nothing of the refused requests.
        assert (await client.get("/readyz")).status_code == 200
        assert await stored_messages(client, session_id) == before
        assert [m["content"] for m in before] == ["I am allergic to peanuts.", "Noted."]
        sessions = await client.get("/v1/sessions", params={"user_id": "bob"})
        assert sessions.json() == {"sessions": []}
        found = await client.post(
            "/v1/memory/search", json={"user_id": "alice", "query": "peanuts", "k": 1}
        )
        assert [r["id"] for r in found.json()["results"]] == [before[0]["id"]]
