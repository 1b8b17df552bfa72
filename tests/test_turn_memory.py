"""The per-user index is derived from SQL: lost, stale or corrupt files are repaired from it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from retrieval.errors import EmbeddingModelMismatchError
from retrieval.indexes.faiss import FaissIndex
from retrieval.search.memory import TurnMemory
from storage.db import Database, create_engine
from storage.models import DEFAULT_TENANT_ID
from storage.records import NewTurn
from storage.repositories import Repositories
from tests.fakes import HashEmbedder


@pytest.fixture
async def repos(sqlite_url: str):
    engine = create_engine(sqlite_url)
    yield Repositories.of(Database(engine))
    await engine.dispose()


def memory_for(
    repos: Repositories, directory: Path, embedder: HashEmbedder | None = None
) -> TurnMemory:
    embedder = embedder or HashEmbedder()
    return TurnMemory(
        repos.messages, repos.embeddings, embedder, FaissIndex(directory, embedder.dimension)
    )


async def add_turns(
    repos: Repositories, memory: TurnMemory, texts: list[str]
) -> tuple[int, list[int]]:
    chat, user = await repos.sessions.create_session("alice", None, {}, tenant_id=DEFAULT_TENANT_ID)
    result = await repos.messages.append(
        chat, [NewTurn(role="user", content=t, token_count=len(t.split())) for t in texts]
    )
    await memory.index(result.turns)
    return user.id, [m.id for m in result.turns]


async def top_ids(memory: TurnMemory, user_pk: int, query: str, k: int = 3) -> list[int]:
    vector = (await memory.embed([query]))[0]
    return [hit.id for hit in await memory.search(user_pk, vector, k)]


TEXTS = ["green boat on the lake", "red car in the garage", "blue bird in the tree"]


async def test_missing_index_file_is_rebuilt_from_sql(repos: Repositories, tmp_path: Path) -> None:
    memory = memory_for(repos, tmp_path / "a")
    user_pk, ids = await add_turns(repos, memory, TEXTS)
    # Never saved: a crash before shutdown. A fresh process must still find every turn.
    fresh = memory_for(repos, tmp_path / "a")
    assert await top_ids(fresh, user_pk, "green boat", k=1) == [ids[0]]
    assert await top_ids(fresh, user_pk, "red car", k=1) == [ids[1]]


async def test_corrupt_index_file_is_rebuilt_not_emptied(
    repos: Repositories, tmp_path: Path
) -> None:
    memory = memory_for(repos, tmp_path / "b")
    user_pk, ids = await add_turns(repos, memory, TEXTS)
    await memory.save()
    (tmp_path / "b" / f"scope-{user_pk}.faiss").write_bytes(b"\x00garbage")
    fresh = memory_for(repos, tmp_path / "b")
    assert await top_ids(fresh, user_pk, "blue bird", k=1) == [ids[2]]
    assert sorted(await top_ids(fresh, user_pk, "anything", k=10)) == ids


async def test_stale_index_gets_missing_turns_and_loses_deleted_ones(
    repos: Repositories, tmp_path: Path
) -> None:
    memory = memory_for(repos, tmp_path / "c")
    user_pk, _ids = await add_turns(repos, memory, TEXTS[:2])
    await memory.save()
    chat, _ = await repos.sessions.create_session("alice", None, {}, tenant_id=DEFAULT_TENANT_ID)
    later = await repos.messages.append(
        chat, [NewTurn(role="user", content=TEXTS[2], token_count=5)]
    )
    await memory.index(later.turns)  # indexed in SQL and in memory, never saved
    await repos.sessions.delete_session(
        (await repos.sessions.list_sessions("alice", tenant_id=DEFAULT_TENANT_ID))[0][0].id
    )  # drops ids[0:2]

    fresh = memory_for(repos, tmp_path / "c")
    assert await top_ids(fresh, user_pk, "anything", k=10) == [later.turns[0].id]


async def test_vectors_of_another_model_are_refused(repos: Repositories, tmp_path: Path) -> None:
    memory = memory_for(repos, tmp_path / "d")
    await add_turns(repos, memory, TEXTS)
    other = memory_for(repos, tmp_path / "d", HashEmbedder(dimension=32, model_name="other-32"))
    with pytest.raises(EmbeddingModelMismatchError, match="memchat reindex"):
        await other.check_model()
    await memory.check_model()


async def test_reindex_re_embeds_with_the_new_model(repos: Repositories, tmp_path: Path) -> None:
    memory = memory_for(repos, tmp_path / "e")
    user_pk, ids = await add_turns(repos, memory, TEXTS)
    await memory.save()
    other = memory_for(repos, tmp_path / "e", HashEmbedder(dimension=32, model_name="other-32"))
    assert await other.reindex_all() == 3
    await other.check_model()
    # The default dense text: the speaker and windows of eight words.
    assert await repos.embeddings.list_embedding_models() == [("other-32#speaker+window8", 32)]
    assert await top_ids(other, user_pk, "red car", k=1) == [ids[1]]


async def test_unembedded_messages_are_repaired(repos: Repositories, tmp_path: Path) -> None:
    memory = memory_for(repos, tmp_path / "f")
    chat, user = await repos.sessions.create_session("alice", None, {}, tenant_id=DEFAULT_TENANT_ID)
    # Stored but never embedded, as after a crash between the two writes.
    result = await repos.messages.append(
        chat, [NewTurn(role="user", content=TEXTS[0], token_count=5)]
    )
    assert await memory.repair_unembedded() == 1
    assert await memory.repair_unembedded() == 0
    assert await top_ids(memory, user.id, "green boat", k=1) == [result.turns[0].id]
    vectors = await repos.embeddings.list_user_vectors(user.id, memory.vector_model)
    assert len(vectors) == 1
    assert np.frombuffer(vectors[0].vector, dtype=np.float32).shape == (64,)


async def test_idle_users_are_closed_beyond_the_cap_and_reopened_whole(
    repos: Repositories, tmp_path: Path
) -> None:
    """With room for 8 open users, the 9th closes the least recently used (its FAISS
    scope written to its file, its lexical index dropped); that user's next search
    reopens it and ranks exactly as before."""
    from dataclasses import replace

    from retrieval.search.memory import RetrievalConfig

    embedder = HashEmbedder()
    memory = TurnMemory(
        repos.messages,
        repos.embeddings,
        embedder,
        FaissIndex(tmp_path / "cap", embedder.dimension),
        replace(RetrievalConfig(), max_open_users=8),
    )
    users: list[tuple[int, list[int]]] = []
    for number in range(12):
        chat, user = await repos.sessions.create_session(
            f"user-{number}", None, {}, tenant_id=DEFAULT_TENANT_ID
        )
        result = await repos.messages.append(
            chat, [NewTurn(role="user", content=t, token_count=4) for t in TEXTS]
        )
        await memory.index(result.turns)
        users.append((user.id, [m.id for m in result.turns]))
    first_pk, first_ids = users[0]
    before = await top_ids(memory, first_pk, "red car", k=3)
    for user_pk, _ in users[1:]:
        assert await top_ids(memory, user_pk, "blue bird", k=1)
    assert memory.num_open_users == 8
    assert (tmp_path / "cap" / f"scope-{first_pk}.faiss").exists()
    assert await memory.scope_sizes(first_pk) == (0, 0)
    assert await top_ids(memory, first_pk, "red car", k=3) == before
    assert before[0] == first_ids[1]
    assert await memory.scope_sizes(first_pk) == (3, 3)
    assert memory.num_open_users == 8


async def test_a_vector_another_process_stored_meanwhile_is_kept(
    database_url: str, tmp_path: Path
) -> None:
    """A process that starts repairs the messages it finds without a vector, while another
    process may be about to store one of them (its turn is between the two writes): both
    succeed, and the vector stored first stays."""
    engine = create_engine(database_url)
    try:
        repos = Repositories.of(Database(engine))
        starting, serving = memory_for(repos, tmp_path / "a"), memory_for(repos, tmp_path / "b")
        chat, user = await repos.sessions.create_session(
            "alice", None, {}, tenant_id=DEFAULT_TENANT_ID
        )
        result = await repos.messages.append(
            chat, [NewTurn(role="user", content=TEXTS[0], token_count=5)]
        )
        found = await repos.messages.list_unembedded_messages(10, serving.vector_model)
        assert [t.id for t in found] == [result.turns[0].id]
        first, second = np.eye(64, dtype=np.float32)[:2]
        await serving.index(result.turns, vectors=[first], fresh=True)
        await starting.index(found, vectors=[second], fresh=True)  # no ConflictError
        [stored] = await repos.embeddings.list_user_vectors(user.id, serving.vector_model)
        assert np.array_equal(np.frombuffer(stored.vector, dtype=np.float32), first)
        assert await starting.repair_unembedded() == 0
    finally:
        await engine.dispose()
