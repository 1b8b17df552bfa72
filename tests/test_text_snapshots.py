"""Snapshots of a user's lexical index and vocabulary: a restart reopens them from their
files, catches them up with SQL, and never uses a damaged or foreign one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from retrieval.indexes.faiss import FaissIndex
from retrieval.search.memory import RetrievalConfig, TurnMemory
from storage.db import Database, create_engine
from storage.models import DEFAULT_TENANT_ID
from storage.records import NewTurn
from storage.repositories import Repositories
from tests.fakes import HashEmbedder

TEXTS = [
    "I adopted a puppy named Rex last spring",
    "Rex loves chasing balls on the beach",
    "我对花生过敏，不能吃花生酱",
    "The violin lessons start on Monday",
    "We painted the fence blue yesterday",
    "今天晚上我们去吃火锅",
]
QUERIES = ["puppy Rex", "花生过敏", "violin lessons", "blue fence", "火锅"]


@pytest.fixture
async def repos(sqlite_url: str):
    engine = create_engine(sqlite_url)
    yield Repositories.of(Database(engine))
    await engine.dispose()


def memory_in(repos: Repositories, directory: Path, context_weight: float = 0.5) -> TurnMemory:
    embedder = HashEmbedder()
    return TurnMemory(
        repos.messages,
        repos.embeddings,
        embedder,
        FaissIndex(directory / "faiss", embedder.dimension),
        RetrievalConfig(context_weight=context_weight),
        snapshot_dir=directory / "bm25",
    )


async def store(repos: Repositories, memory: TurnMemory, texts: list[str]) -> tuple[int, list[int]]:
    chat, user = await repos.sessions.create_session("alice", None, {}, tenant_id=DEFAULT_TENANT_ID)
    result = await repos.messages.append(chat, [NewTurn(role="user", content=t) for t in texts])
    await memory.index(result.turns)
    return user.id, [t.id for t in result.turns]


async def ranked(memory: TurnMemory, user_pk: int, query: str) -> list[tuple[int, float]]:
    vector = (await memory.embed_queries([query]))[0]
    hits = await memory.search(user_pk, vector, 6, query=query)
    return [(hit.id, round(hit.score, 9)) for hit in hits]


def restored(logs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {key: entry[key] for key in ("scope", "num_turns", "num_added", "num_removed")}
        for entry in logs
        if entry["event"] == "lexical_scope_restored"
    ]


async def saved_user(
    repos: Repositories, tmp_path: Path
) -> tuple[int, dict[str, list[tuple[int, float]]]]:
    """A user of TEXTS, saved (snapshots written), and their rankings for QUERIES."""
    memory = memory_in(repos, tmp_path)
    user_pk, _ids = await store(repos, memory, TEXTS)
    before = {query: await ranked(memory, user_pk, query) for query in QUERIES}
    await memory.save()
    return user_pk, before


async def test_a_restart_reopens_the_user_from_the_snapshot(
    repos: Repositories, tmp_path: Path
) -> None:
    user_pk, before = await saved_user(repos, tmp_path)
    assert (tmp_path / "bm25" / f"scope-{user_pk}.bm25").exists()
    assert (tmp_path / "bm25" / f"scope-{user_pk}.words").exists()

    again = memory_in(repos, tmp_path)
    with capture_logs() as logs:
        after = {query: await ranked(again, user_pk, query) for query in QUERIES}
    assert after == before  # same ids, same fused scores
    assert restored(logs) == [{"scope": user_pk, "num_turns": 6, "num_added": 0, "num_removed": 0}]


async def test_turns_stored_or_deleted_after_the_snapshot_are_caught_up(
    repos: Repositories, tmp_path: Path
) -> None:
    memory = memory_in(repos, tmp_path)
    user_pk, ids = await store(repos, memory, TEXTS[:3])
    await memory.save()
    # Later, never saved: another session's turns stored, the first session deleted.
    _user, later = await store(repos, memory, TEXTS[3:])
    sessions = await repos.sessions.list_sessions("alice", tenant_id=DEFAULT_TENANT_ID)
    first = min(sessions, key=lambda item: item[0].created_at)[0]
    await repos.sessions.delete_session(first.id)

    again = memory_in(repos, tmp_path)
    with capture_logs() as logs:
        found = [hit for hit, _score in await ranked(again, user_pk, "Rex violin blue 火锅")]
    assert restored(logs) == [{"scope": user_pk, "num_turns": 3, "num_added": 3, "num_removed": 3}]
    assert sorted(found) == later
    assert not set(found) & set(ids)


async def test_a_damaged_or_foreign_snapshot_is_not_used(
    repos: Repositories, tmp_path: Path
) -> None:
    user_pk, before = await saved_user(repos, tmp_path)
    path = tmp_path / "bm25" / f"scope-{user_pk}.bm25"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # one byte changed: the checksum fails
    path.write_bytes(bytes(data))
    rebuilt = memory_in(repos, tmp_path)
    with capture_logs() as logs:
        after = {query: await ranked(rebuilt, user_pk, query) for query in QUERIES}
    assert restored(logs) == []
    assert after == before
    await rebuilt.save()  # built from SQL: its snapshot written anew, intact
    with capture_logs() as logs:
        await ranked(memory_in(repos, tmp_path), user_pk, "puppy")
    assert len(restored(logs)) == 1
    # Intact, but made with other settings of the index: built from SQL instead.
    with capture_logs() as logs:
        await ranked(memory_in(repos, tmp_path, context_weight=1.0), user_pk, "puppy")
    assert restored(logs) == []
