"""Values that must be refused as bad input on both databases (never "retry later"), or
kept exactly: instants with their offsets, NUL in paths, times out of range, ids that a
path cannot address, invisible text, and the limits of the smaller holes, each a
setting stated in the OpenAPI document. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.settings import ChatSettings, Settings
from storage.db import json_loads
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_api_errors import assert_problem
from tests.test_api_sessions import create_session


async def test_an_offset_keeps_its_instant(client: AsyncTestClient) -> None:
    session = await create_session(client)
    imported = await client.post(
        f"/v1/sessions/{session['id']}/history",
        json={
            "messages": [
                {"role": "user", "content": "east", "created_at": "2026-01-01T00:00:00+05:00"},
                {"role": "user", "content": "west", "created_at": "2026-01-01T00:00:00-08:30"},
                {"role": "user", "content": "naive", "created_at": "2026-01-01T00:00:00"},
            ]
        },
    )
    assert imported.status_code == 201, imported.text
    stored = (await client.get(f"/v1/sessions/{session['id']}/messages")).json()["messages"]
    assert [(m["content"], m["created_at"]) for m in stored] == [
        ("east", "2025-12-31T19:00:00Z"),
        ("west", "2026-01-01T08:30:00Z"),
        ("naive", "2026-01-01T00:00:00Z"),
    ]


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+00:01", "9999-12-31T23:59:00-00:01"])
async def test_a_time_out_of_range_is_422_and_nothing_is_stored(
    client: AsyncTestClient, when: str
) -> None:
    session = await create_session(client)
    response = await client.post(
        f"/v1/sessions/{session['id']}/history",
        json={"messages": [{"role": "user", "content": "x", "created_at": when}]},
    )
    assert_problem(response, 422, "messages[0].created_at")
    assert (await client.get(f"/v1/sessions/{session['id']}/messages")).json() == {"messages": []}


async def test_nul_and_unaddressable_ids_in_paths_are_4xx(client: AsyncTestClient) -> None:
    for path in ("/v1/users/%00/facts", "/v1/users/a%00b/facts", "/v1/sessions?user_id=%00"):
        body = assert_problem(await client.get(path), 422, "user_id")
        assert body["errors"][0]["message"].startswith("Expected an id without '/'")
    assert_problem(await client.get("/v1/sessions/%00"), 404)
    assert_problem(await client.get("/v1/sessions/%00/messages"), 404)
    assert_problem(await client.get("/v1/knowledge/%00"), 404)


@pytest.mark.parametrize("user_id", ["a/b", "   ", " alice", "alice ", "\u200b", "a\tb", "a\x7fb"])
async def test_a_user_id_a_path_cannot_address_is_refused(
    client: AsyncTestClient, user_id: str
) -> None:
    assert_problem(await client.post("/v1/sessions", json={"user_id": user_id}), 422, "user_id")
    assert (await client.get("/admin/v1/users")).json()["users"] == []


@pytest.mark.parametrize(
    "content", ["\u200b\u200b", "\u200e\u200f\u202a", " \ufeff\u2060 ", "\u00ad"]
)
async def test_invisible_text_is_blank(client: AsyncTestClient, content: str) -> None:
    session = await create_session(client)
    response = await client.post(
        f"/v1/sessions/{session['id']}/messages", json={"content": content}
    )
    assert_problem(response, 422, "content")
    response = await client.post(
        f"/v1/sessions/{session['id']}/history",
        json={"messages": [{"role": "user", "content": content}]},
    )
    assert_problem(response, 422, "messages[0].content")
    assert (await client.get(f"/v1/sessions/{session['id']}/messages")).json() == {"messages": []}


@pytest.fixture
async def capped(settings: Settings) -> AsyncTestClient:
    chat = ChatSettings(max_metadata_bytes=64, max_import_chars=100)
    limited = settings.model_copy(update={"chat": chat})
    app = create_app(limited, embedder=HashEmbedder(), engine=ScriptedEngine(["ok"]))
    async with local_client(app) as client:
        yield client


async def test_session_metadata_over_its_limit_is_422(capped: AsyncTestClient) -> None:
    fits = {"plan": "pro", "n": 1}
    assert (
        await capped.post("/v1/sessions", json={"user_id": "a", "metadata": fits})
    ).status_code == 201
    big = {"notes": "x" * 100}
    response = await capped.post("/v1/sessions", json={"user_id": "a", "metadata": big})
    body = assert_problem(response, 422, "metadata")
    assert "the limit is 64" in body["detail"]
    sessions = (await capped.get("/v1/sessions?user_id=a")).json()["sessions"]
    assert [s["metadata"] for s in sessions] == [fits]


async def test_an_import_over_its_total_characters_is_413(capped: AsyncTestClient) -> None:
    session = await create_session(capped)
    messages = [{"role": "user", "content": "y" * 40} for _ in range(3)]
    response = await capped.post(
        f"/v1/sessions/{session['id']}/history", json={"messages": messages}
    )
    body = assert_problem(response, 413, "messages")
    assert "120 characters" in body["detail"] and "at most 100" in body["detail"]
    assert (await capped.get(f"/v1/sessions/{session['id']}/messages")).json() == {"messages": []}
    ok = await capped.post(f"/v1/sessions/{session['id']}/history", json={"messages": messages[:2]})
    assert ok.status_code == 201


async def test_readiness_needs_free_disk_and_a_database_that_takes_writes(
    settings: Settings,
) -> None:
    full = settings.model_copy(update={"min_free_disk_bytes": 2**62})
    async with local_client(
        create_app(full, embedder=HashEmbedder(), engine=ScriptedEngine())
    ) as client:
        response = await client.get("/readyz")
        assert response.status_code == 503
        body = response.json()
        assert body["status"] == "not ready"
        assert body["checks"]["disk"].startswith("error: ")
        assert "below MEMCHAT_MIN_FREE_DISK_BYTES" in body["checks"]["disk"]
        assert body["checks"]["database"] == "ok"


async def test_the_readiness_probe_writes(settings: Settings) -> None:
    from sqlalchemy import text

    from storage.db import create_engine

    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine())
    url = settings.resolved_database_url()
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            before = await connection.scalar(text("SELECT checked_at FROM readiness_probe"))
        async with local_client(app) as client:
            assert (await client.get("/readyz")).status_code == 200
        async with engine.connect() as connection:
            after = await connection.scalar(text("SELECT checked_at FROM readiness_probe"))
    finally:
        await engine.dispose()
    assert after != before


async def test_the_openapi_document_states_the_limits(tmp_path: Path, sqlite_url: str) -> None:
    chat = ChatSettings(max_metadata_bytes=1234, max_import_chars=5678, max_import_messages=9)
    settings = Settings(data_dir=tmp_path, database_url=sqlite_url, chat=chat)
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine())
    async with local_client(app) as client:
        schema = (await client.get("/schema/openapi.json")).json()
    components = schema["components"]["schemas"]
    assert "1234 bytes" in components["SessionCreate"]["properties"]["metadata"]["description"]
    history = components["HistoryImport"]
    assert "5678 characters together" in history["description"]
    assert history["properties"]["messages"]["maxItems"] == 9
    assert "pattern" in components["SessionCreate"]["properties"]["user_id"]
    facts = schema["paths"]["/v1/users/{user_id}/facts"]["post"]
    assert "415" in facts["responses"]


def test_a_json_column_reads_what_the_standard_library_wrote() -> None:
    """JSON columns are decoded by msgspec; what only the standard library writes and
    reads (NaN, Infinity, integers past 64 bits) is still read as it was stored."""
    value = {
        "ids": [1, 2, 3],
        "big": 2**70,
        "text": "花生\u2028x",
        "nan": math.nan,
        "inf": -math.inf,
    }
    decoded = json_loads(json.dumps(value, ensure_ascii=False))
    assert math.isnan(decoded.pop("nan"))
    assert decoded == {"ids": [1, 2, 3], "big": 2**70, "text": "花生\u2028x", "inf": -math.inf}
    assert json_loads(b"[4, 5]") == [4, 5]
