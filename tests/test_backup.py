"""Export and import of one user's memory: a round trip gives the same bytes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from app.cli.backup import BackupFormatError, export_user, import_user
from app.settings import Settings
from retrieval.indexes.faiss import FaissIndex
from retrieval.search.memory import TurnMemory
from storage import migrate
from storage.db import Database, create_engine
from storage.models import DEFAULT_TENANT_ID
from storage.repositories import Repositories
from tests.fakes import HashEmbedder
from tests.live import MEMCHAT, cli_env
from tests.test_api_sessions import create_session

HISTORY = [
    {"role": "user", "content": "我叫小明，我今年6岁了", "name": "小明",
     "created_at": "2026-01-05T10:00:00Z", "external_id": "x1"},
    {"role": "assistant", "content": "Nice to meet you!", "created_at": "2026-01-05T10:00:02Z"},
    {"role": "system", "content": "Keep answers short <b>please</b>", "external_id": "x3"},
]  # fmt: skip


async def fill(client: AsyncTestClient) -> None:
    first = await create_session(client, title="intro", metadata={"channel": "app", "n": 1})
    await client.post(f"/v1/sessions/{first['id']}/history", json={"messages": HISTORY})
    second = await create_session(client)
    await client.post(f"/v1/sessions/{second['id']}/messages", json={"content": "I like kites"})
    await create_session(client, user_id="someone-else")


async def open_store(url: str) -> tuple[Repositories, object]:
    engine = create_engine(url)
    await migrate.upgrade(engine)
    return Repositories.of(Database(engine)), engine


async def test_round_trip_between_databases_is_byte_identical(
    client: AsyncTestClient, settings: Settings, tmp_path: Path
) -> None:
    await fill(client)
    source, source_engine = await open_store(settings.resolved_database_url())
    exported = b"".join(await export_user(source.sessions, "alice", DEFAULT_TENANT_ID))
    await source_engine.dispose()
    lines = exported.splitlines(keepends=True)
    assert len(lines) == 1 + 2 + 3 + 2  # header, 2 sessions, their 5 messages
    assert b"someone-else" not in exported

    target, target_engine = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'target.db'}")
    embedder = HashEmbedder()
    memory = TurnMemory(
        target.messages,
        target.embeddings,
        embedder,
        FaissIndex(tmp_path / "index", embedder.dimension),
    )
    assert await import_user(target.sessions, memory, lines, DEFAULT_TENANT_ID) == (2, 5, 0)
    assert b"".join(await export_user(target.sessions, "alice", DEFAULT_TENANT_ID)) == exported
    # Imported turns are searchable in the target, and a second import changes nothing.
    user = await target.users.get_user("alice", tenant_id=DEFAULT_TENANT_ID)
    vector = (await memory.embed(["小明 6岁"]))[0]
    hits = await memory.search(user.id, vector, 1)
    [row] = await target.messages.list_messages_by_id(user.id, [hits[0].id])
    assert row.content == "我叫小明，我今年6岁了"
    assert await import_user(target.sessions, memory, lines, DEFAULT_TENANT_ID) == (0, 0, 2)
    assert b"".join(await export_user(target.sessions, "alice", DEFAULT_TENANT_ID)) == exported
    await target_engine.dispose()


@pytest.mark.parametrize(
    "content",
    [b"", b'{"format": "x"}\n', b"not json\n",
     b'{"type":"header","format":"memchat-export","version":1,"user_id":"a"}\n'
     b'{"type":"message","session_id":"s","seq":1,"role":"user","name":null,"content":"x",'
     b'"created_at":"2026-01-01T00:00:00Z","external_id":null,"token_count":1}\n'],
    ids=["empty", "no-header", "not-json", "orphan-message"],
)  # fmt: skip
async def test_malformed_exports_are_refused(
    content: bytes, sqlite_url: str, tmp_path: Path
) -> None:
    repos, engine = await open_store(sqlite_url)
    embedder = HashEmbedder()
    memory = TurnMemory(
        repos.messages,
        repos.embeddings,
        embedder,
        FaissIndex(tmp_path / "index", embedder.dimension),
    )
    with pytest.raises(BackupFormatError):
        await import_user(
            repos.sessions, memory, content.splitlines(keepends=True), DEFAULT_TENANT_ID
        )
    assert await repos.users.list_user_pks() == []
    await engine.dispose()


@pytest.mark.model
def test_cli_export_and_import(tmp_path: Path) -> None:
    export = (
        b'{"type":"header","format":"memchat-export","version":1,"user_id":"ana"}\n'
        b'{"type":"session","id":"0b0c0d0e-0000-4000-8000-000000000001","title":"t",'
        b'"metadata":{},"created_at":"2026-01-01T00:00:00Z"}\n'
        b'{"type":"message","session_id":"0b0c0d0e-0000-4000-8000-000000000001","seq":1,'
        b'"role":"user","name":null,"content":"I keep bees.","created_at":'
        b'"2026-01-01T00:00:01Z","external_id":"e1","token_count":4}\n'
    )
    (tmp_path / "in.jsonl").write_bytes(export)
    env = cli_env(tmp_path / "data")
    restored = subprocess.run(
        [*MEMCHAT, "import", str(tmp_path / "in.jsonl")],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert restored.stdout.strip() == "imported 1 sessions, 1 messages; skipped 0 existing sessions"
    again = subprocess.run(
        [*MEMCHAT, "export", "--user-id", "ana"], env=env, capture_output=True, check=True
    )
    assert again.stdout == export
