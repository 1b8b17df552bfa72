"""`GET /v1/users/{user_id}/export`: one user of the caller's tenant, in English and
Chinese, is the same bytes as `memchat export --user-id X --tenant T` writes for the
same store; what it sends imports into a fresh database with the user's messages and
facts intact; an unknown user, or another tenant's, is a 404."""

from __future__ import annotations

import typing
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from app.api.export import CHUNK_BYTES, _send
from app.cli.backup import import_lines
from app.factory import create_app
from app.settings import Settings
from storage.access import AccessRepository
from storage.backup.lines import FactRecord, Header, MessageRecord, Record
from storage.db import Database, create_engine
from storage.models import DEFAULT_TENANT_ID
from storage.repositories import Repositories
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import cli_env
from tests.test_access import bearer
from tests.test_backup import (
    export_bytes,
    import_target,
    open_store,
    run_cli,
    wait_for_extraction,
)

HISTORY = [
    {"role": "user", "content": "我叫小明，我住在上海。", "external_id": "h1",
     "created_at": "2026-01-05T10:00:00Z"},
    {"role": "assistant", "content": "很高兴认识你，小明！", "created_at": "2026-01-05T10:00:02Z"},
    {"role": "user", "content": "I am allergic to peanuts.", "name": "小明",
     "image_caption": "a bag of peanuts"},
]  # fmt: skip
NDJSON = "application/x-ndjson"


async def tenant_keys(url: str) -> tuple[str, str]:
    """A key of tenant `acme` and one of tenant `globex`."""
    engine = create_engine(url)
    access = AccessRepository(Database(engine))
    try:
        _, acme = await access.create_key("acme", "acme app")
        _, globex = await access.create_key("globex", "globex app")
    finally:
        await engine.dispose()
    return acme, globex


def serve(settings: Settings) -> AsyncTestClient:
    engine = ScriptedEngine(["记下了。Noted."] * 10)
    return local_client(create_app(settings, embedder=HashEmbedder(), engine=engine))


async def fill(client: AsyncTestClient, key: str, user_id: str, knowledge: str) -> None:
    """A user with history, a turn, a fact stated and corrected, and a document."""
    headers = bearer(key)
    session = await client.post(
        "/v1/sessions", json={"user_id": user_id, "title": "日常"}, headers=headers
    )
    assert session.status_code == 201, session.text
    path = f"/v1/sessions/{session.json()['id']}"
    history = await client.post(f"{path}/history", json={"messages": HISTORY}, headers=headers)
    assert history.status_code == 201, history.text
    turn = await client.post(f"{path}/messages", json={"content": "我喜欢放风筝"}, headers=headers)
    assert turn.status_code == 200, turn.text
    fact = await client.post(
        f"/v1/users/{user_id}/facts", json={"text": "小明是素食者"}, headers=headers
    )
    assert fact.status_code == 201, fact.text
    corrected = await client.patch(
        f"/v1/facts/{fact.json()['id']}", json={"text": "小明吃纯素"}, headers=headers
    )
    assert corrected.status_code == 200, corrected.text
    document = await client.post(
        "/v1/knowledge",
        json={"title": "Notes 笔记", "text": knowledge, "user_id": user_id},
        headers=headers,
    )
    assert document.status_code == 201, document.text


async def export_route(client: AsyncTestClient, key: str, user_id: str) -> bytes:
    response = await client.get(f"/v1/users/{user_id}/export", headers=bearer(key))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == NDJSON
    return response.content


def records(exported: bytes) -> list[Any]:
    return [msgspec.json.decode(line, type=Record) for line in exported.splitlines()]


def not_found(response: Any, user_id: str) -> None:
    assert response.status_code == 404, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["detail"] == f"user {user_id!r} not found"


@pytest.fixture
async def keyed_store(tmp_path: Path) -> AsyncIterator[tuple[Settings, str, str]]:
    """A SQLite store in `tmp_path/data`, where `memchat export` finds it, with keys."""
    settings = Settings(data_dir=tmp_path / "data")
    _repos, engine = await open_store(settings.resolved_database_url())
    await engine.dispose()
    acme, globex = await tenant_keys(settings.resolved_database_url())
    yield settings, acme, globex


async def test_the_route_sends_what_memchat_export_writes_and_it_imports(
    keyed_store: tuple[Settings, str, str], tmp_path: Path
) -> None:
    settings, acme, globex = keyed_store
    async with serve(settings) as client:
        await fill(client, acme, "xiaoming", "# 花园\n\n早上浇玫瑰。\n\nWater the roses at dawn.")
        await fill(client, acme, "bob", "Bob's notes")
        await fill(client, globex, "xiaoming", "Another tenant's notes")
        repos, engine = await open_store(settings.resolved_database_url())
        await wait_for_extraction(repos)
        await engine.dispose()
        exported = await export_route(client, acme, "xiaoming")

    output = tmp_path / "cli.jsonl"
    run_cli(
        "export", "--user-id", "xiaoming", "--tenant", "acme", "--output", str(output),
        "--quiet", env=cli_env(tmp_path / "data"), check=True,
    )  # fmt: skip
    assert exported == output.read_bytes()
    found = records(exported)
    assert found[0] == Header("memchat-export", 2, "acme", "xiaoming")
    messages = [r.content for r in found if isinstance(r, MessageRecord)]
    assert messages == [m["content"] for m in HISTORY] + ["我喜欢放风筝", "记下了。Noted."]
    assert "小明吃纯素" in [r.text for r in found if isinstance(r, FactRecord)]
    assert b"Bob's notes" not in exported and b"Another tenant" not in exported

    # What the route sent restores the user into a fresh database, row for row.
    fresh, fresh_engine = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}")
    counts = await import_lines(import_target(fresh, tmp_path / "fresh"), exported.splitlines())
    assert counts.num_added["messages"] == len(messages)
    again = await export_bytes(fresh, "xiaoming")
    header, *rows = again.splitlines(keepends=True)
    assert header == exported.splitlines(keepends=True)[0].replace(b'"acme"', b'"default"')
    assert rows == exported.splitlines(keepends=True)[1:]
    assert await stored_texts(fresh) == (
        messages,
        sorted(r.text for r in found if isinstance(r, FactRecord)),
    )
    await fresh_engine.dispose()


async def stored_texts(repos: Repositories) -> tuple[list[str], list[str]]:
    """The imported user's messages in order and their facts' texts (every status)."""
    user = await repos.users.get_user("xiaoming", tenant_id=DEFAULT_TENANT_ID)
    sessions = await repos.sessions.list_sessions("xiaoming", tenant_id=DEFAULT_TENANT_ID)
    messages = [
        turn.content
        for chat, _count in sessions
        for turn in await repos.messages.list_messages(chat.id)
    ]
    facts = await repos.facts.list_facts(user.id, ("active", "superseded", "deleted"))
    return messages, sorted(f.text for f in facts)


async def test_another_tenants_key_cannot_export_the_user(
    settings: Settings, database_url: str
) -> None:
    acme, globex = await tenant_keys(database_url)
    async with serve(settings) as client:
        await fill(client, acme, "xiaoming", "Acme's notes on 小明")
        await fill(client, acme, "bob", "Bob's notes")
        await fill(client, globex, "xiaoming", "Globex's notes on 小明")
        # Another tenant's user is as unknown as a user that does not exist.
        not_found(await client.get("/v1/users/bob/export", headers=bearer(globex)), "bob")
        not_found(await client.get("/v1/users/nobody/export", headers=bearer(acme)), "nobody")
        # The same user id in each tenant is each tenant's own user.
        for key, tenant, mine, theirs in [
            (acme, "acme", b"Acme's notes", b"Globex's notes"),
            (globex, "globex", b"Globex's notes", b"Acme's notes"),
        ]:
            exported = await export_route(client, key, "xiaoming")
            assert records(exported)[0] == Header("memchat-export", 2, tenant, "xiaoming")
            assert mine in exported and theirs not in exported
        refused = await client.get("/v1/users/bob/export")
        assert refused.status_code == 401
        bad = await client.get("/v1/users/%20bob/export", headers=bearer(acme))
        assert bad.status_code == 422, bad.text
        assert bad.headers["content-type"].startswith("application/problem+json")


async def test_the_openapi_document_describes_the_route(
    keyed_store: tuple[Settings, str, str],
) -> None:
    settings, _acme, _globex = keyed_store
    async with serve(settings) as client:
        document = (await client.get("/schema/openapi.json")).json()
    operation = document["paths"]["/v1/users/{user_id}/export"]["get"]
    content = operation["responses"]["200"]["content"]
    assert list(content) == [NDJSON]
    mapping = content[NDJSON]["x-itemSchema"]["discriminator"]["mapping"]
    assert sorted(mapping) == sorted(
        str(kind.__struct_config__.tag) for kind in typing.get_args(Record)
    )
    assert document["components"]["schemas"]["MessageRecord"]["properties"]["seq"] == {
        "type": "integer"
    }
    statuses = ["200", "400", "401", "403", "404", "422", "429", "503"]
    assert sorted(operation["responses"]) == statuses
    link = document["paths"]["/v1/sessions"]["post"]["responses"]["201"]["links"]["ExportUser"]
    assert link["parameters"] == {"user_id": "$response.body#/user_id"}


async def test_lines_go_out_in_chunks_and_a_stream_closed_early_closes_the_export() -> None:
    """Whole lines grouped to about CHUNK_BYTES; closing the answer's stream closes the
    export's lines (and so its snapshot) where it stands."""
    closed: list[int] = []
    line = b"x" * (CHUNK_BYTES // 2 + 1) + b"\n"

    async def lines(count: int) -> AsyncGenerator[bytes]:
        try:
            yield b"header\n"
            for _ in range(count):
                yield line
        finally:
            closed.append(count)

    whole = lines(3)
    chunks = [chunk async for chunk in _send(await anext(whole), whole)]
    assert chunks == [b"header\n", line * 2, line]
    cut = lines(5)
    stream = _send(await anext(cut), cut)
    assert await anext(stream) == b"header\n"
    await stream.aclose()
    assert closed == [3, 5]
