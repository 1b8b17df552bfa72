"""Knowledge in chat turns and search, rebuilt from SQL, on embedded Chroma and a server.

Also past turns kept in Chroma (`MEMCHAT_INDEX__KIND=chroma`), embedded and server.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from chromadb.api.client import SharedSystemClient
from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.runtime import build_knowledge
from app.settings import IndexSettings, KnowledgeSettings, RetrievalSettings, Settings
from retrieval.prompt.render import KNOWLEDGE_HEADER
from retrieval.protocols import Embedder
from storage.db import Database
from storage.repositories import Repositories
from tests.clients import local_client
from tests.documents import HANDBOOK_MD
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_api_knowledge import add_text, search
from tests.test_api_sessions import create_session

DOCUMENTS = [
    (
        "Returns",
        "Items can be returned within thirty days.\n\nRefunds reach the card in five days.",
        None,
    ),
    ("Alice notes", "My locker code is 4417.\n\nMy desk is on floor three.", "alice"),
    ("Bob notes", "My locker code is 9902.\n\nMy desk is on floor seven.", "bob"),
]
QUERIES = [("alice", "my locker code and desk"), ("bob", "refunds to my card"), ("bob", "desk")]


@asynccontextmanager
async def running(
    settings: Settings, embedder: Embedder | None = None
) -> AsyncIterator[AsyncTestClient]:
    app = create_app(settings, embedder=embedder or HashEmbedder(), engine=ScriptedEngine())
    async with local_client(app) as client:
        yield client
    # As a new process would: Chroma otherwise keeps one client per path in this one.
    SharedSystemClient.clear_system_cache()


async def results(client: AsyncTestClient) -> list[list[tuple[str, str, float]]]:
    return [
        [(r["document_id"], r["text"], r["score"]) for r in await search(client, user, query)]
        for user, query in QUERIES
    ]


@pytest.fixture
def settings(tmp_path: Path, sqlite_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=sqlite_url,
        # Small chunks: each document below is two.
        knowledge=KnowledgeSettings(chunk_tokens=12, overlap_tokens=2),
    )


async def _ingest(settings: Settings) -> list[list[tuple[str, str, float]]]:
    async with running(settings) as client:
        for title, text, user_id in DOCUMENTS:
            await add_text(client, title, text, **({"user_id": user_id} if user_id else {}))
        found = await results(client)
    assert [len(r) for r in found] == [4, 4, 4]
    return found


async def test_reindex_rebuilds_chroma_from_sql(settings: Settings) -> None:
    before = await _ingest(settings)
    shutil.rmtree(settings.index_dir / "chroma")
    db = Database.open(settings.resolved_database_url())
    try:
        assert await build_knowledge(settings, Repositories.of(db), HashEmbedder()).rebuild() == 6
    finally:
        await db.dispose()
        SharedSystemClient.clear_system_cache()
    async with running(settings) as client:
        assert await results(client) == before


async def test_a_lost_chroma_directory_heals_on_first_use(settings: Settings) -> None:
    before = await _ingest(settings)
    shutil.rmtree(settings.index_dir / "chroma")
    async with running(settings) as client:
        assert await results(client) == before


async def test_knowledge_and_turns_on_a_chroma_server(
    settings: Settings, chroma_server_url: str
) -> None:
    on_server = settings.model_copy(
        update={
            "chroma_url": chroma_server_url,
            "chroma_prefix": f"t{uuid.uuid4().hex[:12]}",
            "index": IndexSettings(kind="chroma"),
            # The hash embedder puts unrelated words in one bucket ("day" = "cat"), and in
            # a two-turn history one related word outweighs words both turns hold.
            "retrieval": RetrievalSettings(neighbour_words=0),
        }
    )
    async with running(on_server) as client:
        for title, text, user_id in DOCUMENTS:
            await add_text(client, title, text, **({"user_id": user_id} if user_id else {}))
        found = await results(client)
        session = await create_session(client, "alice")
        history = [
            {"role": "user", "content": "I keep a cat named Miso"},
            {"role": "user", "content": "I cycle to work every day"},
        ]
        response = await client.post(
            f"/v1/sessions/{session['id']}/history", json={"messages": history}
        )
        assert response.status_code == 201
        turns = await client.post(
            "/v1/memory/search", json={"user_id": "alice", "query": "cat Miso", "k": 1}
        )
        [hit] = turns.json()["results"]
        assert (hit["kind"], hit["text"]) == ("turn", "I keep a cat named Miso")
    # A second process (same database, same server) sees the same knowledge and turns.
    async with running(on_server) as client:
        assert await results(client) == found
        again = await client.post(
            "/v1/memory/search", json={"user_id": "alice", "query": "cycle to work", "k": 1}
        )
        assert again.json()["results"][0]["text"] == "I cycle to work every day"
    assert not (settings.index_dir / "chroma").exists()


async def test_past_turns_in_embedded_chroma(settings: Settings) -> None:
    in_chroma = settings.model_copy(update={"index": IndexSettings(kind="chroma")})
    async with running(in_chroma) as client:
        session = await create_session(client, "alice")
        history = [{"role": "user", "content": text} for text in ("red bike", "blue car", "我的猫")]
        await client.post(f"/v1/sessions/{session['id']}/history", json={"messages": history})
    async with running(in_chroma) as client:
        found = await client.post(
            "/v1/memory/search",
            json={"user_id": "alice", "query": "猫", "k": 3, "kinds": ["turn", "knowledge"]},
        )
        assert [r["text"] for r in found.json()["results"]][:1] == ["我的猫"]
    assert not (settings.index_dir / "faiss").exists()


@pytest.mark.model
async def test_a_turn_about_a_documented_fact_shows_the_chunk(
    settings: Settings, real_embedder: Embedder
) -> None:
    engine = ScriptedEngine(["Sixty-four gigabytes."])
    defaults = settings.model_copy(update={"knowledge": KnowledgeSettings()})
    app = create_app(defaults, embedder=real_embedder, engine=engine)
    async with local_client(app) as client:
        await add_text(client, "Acme handbook", HANDBOOK_MD)
        await add_text(client, "Cafeteria", "The cafeteria serves lunch from noon to two.")
        session = await create_session(client, "alice")
        response = await client.post(
            f"/v1/sessions/{session['id']}/messages",
            json={"content": "How much memory does the laptop of a new engineer have?"},
        )
        assert response.status_code == 200, response.text
        context = response.json()["context"]
        top = context["knowledge"][0]
        assert (top["kind"], top["title"], top["heading_path"], top["text"]) == (
            "knowledge",
            "Acme handbook",
            "Handbook > Equipment",
            "Every new engineer receives a laptop with 64 GB of memory on the first day.",
        )
        assert sum(context["tokens"].values()) == context["prompt_tokens"]
        assert context["tokens"]["knowledge"] > 0
        last = engine.prompts[-1][-1]
        lines = last.content.splitlines()
        assert last.role == "user"
        assert lines[lines.index(KNOWLEDGE_HEADER) + 1] == (
            '- from "Acme handbook > Handbook > Equipment": "Every new engineer receives a '
            'laptop with 64 GB of memory on the first day."'
        )
        chinese = await search(client, "alice", "每年有多少天年假？", k=1)
        assert chinese[0]["text"] == "公司的年假是每年二十五天，需要提前两周申请。"
    SharedSystemClient.clear_system_cache()
