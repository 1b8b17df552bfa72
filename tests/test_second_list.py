"""The second dense list of turns (a multilingual model beside the first): both vectors
stored in one write, fused in search, and stores indexed without it completed in the
background, resumably and without embedding a turn twice across processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from retrieval.dense import SecondDense
from retrieval.errors import EmbeddingModelMismatchError
from retrieval.indexes.faiss import FaissIndex
from retrieval.search.backfill import SecondListBackfill
from retrieval.search.memory import REPAIR_BATCH_SIZE, TurnMemory
from storage.claims import JobClaimRepository
from storage.db import Database, create_engine
from storage.models import DEFAULT_TENANT_ID, MessageEmbedding
from storage.records import NewTurn
from storage.repositories import Repositories
from tests.fakes import HashEmbedder

# A stand-in for a multilingual model: Chinese words of a small dictionary are embedded
# as their English translations, so a question in one language meets a statement in the
# other only through this embedder.
DICTIONARY = {
    "姐姐": " sister ",
    "住": " live ",
    "成都": " chengdu ",
    "开": " drive ",
    "车": " car ",
}


class TranslatingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__(dimension=768, model_name="translating-768")
        self.num_texts = 0

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        self.num_texts += len(texts)
        translated = []
        for text in texts:
            for word, english in DICTIONARY.items():
                text = text.replace(word, english)
            translated.append(text)
        return super().embed_now(translated)


class FailingAfter(TranslatingEmbedder):
    """Fails on its call after `calls` calls: a process stopped midway."""

    def __init__(self, calls: int) -> None:
        super().__init__()
        self.calls_left = calls

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        if self.calls_left == 0:
            raise RuntimeError("stopped")
        self.calls_left -= 1
        return super().embed_now(texts)


@pytest.fixture
async def repos(database_url: str) -> AsyncIterator[Repositories]:
    engine = create_engine(database_url)
    yield Repositories.of(Database(engine))
    await engine.dispose()


def memory_for(
    repos: Repositories, directory: Path, second: HashEmbedder | None = None
) -> TurnMemory:
    # Wide enough that no two words of these tests share a bucket.
    first = HashEmbedder(dimension=2048, model_name="hash-2048")
    return TurnMemory(
        repos.messages,
        repos.embeddings,
        first,
        FaissIndex(directory / "first", first.dimension),
        second=None
        if second is None
        else SecondDense(second, FaissIndex(directory / "second", second.dimension)),
    )


SMALL_TALK = ["今天天气不错。", "哈哈，好的。", "晚安！"]


async def store(repos: Repositories, user_id: str, texts: list[str]) -> tuple[int, list[int]]:
    chat, user = await repos.sessions.create_session(user_id, None, {}, tenant_id=DEFAULT_TENANT_ID)
    result = await repos.messages.append(
        chat, [NewTurn(role="user", content=t, token_count=len(t)) for t in texts]
    )
    return user.id, [t.id for t in result.turns]


async def ranked(memory: TurnMemory, user_pk: int, query: str, k: int = 4) -> list[int]:
    vector = await memory.embed_query(user_pk, query)
    return [hit.id for hit in await memory.search(user_pk, vector, k, query=query)]


async def vectors_per_model(repos: Repositories) -> dict[str, list[int]]:
    """Each model's message ids, as stored (a message twice under one model shows twice)."""
    async with repos.db.transaction() as session:
        rows = await session.execute(
            select(MessageEmbedding.model, MessageEmbedding.message_id).order_by(
                MessageEmbedding.model, MessageEmbedding.message_id
            )
        )
        found: dict[str, list[int]] = {}
        for model, message_id in rows.all():
            found.setdefault(model, []).append(int(message_id))
        return found


async def test_a_turn_gets_both_vectors_and_the_second_list_finds_across_languages(
    repos: Repositories, tmp_path: Path
) -> None:
    memory = memory_for(repos, tmp_path, TranslatingEmbedder())
    user_pk, ids = await store(repos, "alice", ["我姐姐住在成都。", *SMALL_TALK])
    turns = await repos.messages.list_user_messages(user_pk)
    await memory.index(turns, fresh=True)
    assert await vectors_per_model(repos) == {
        "hash-2048#speaker+window8": ids,
        "translating-768": ids,
    }
    assert (await ranked(memory, user_pk, "where does my sister live?"))[0] == ids[0]
    # The first list and BM25 alone never meet the statement: every turn ties, the
    # statement comes last.
    alone = memory_for(repos, tmp_path / "alone")
    assert await ranked(alone, user_pk, "where does my sister live?") == ids[::-1]


async def test_a_store_indexed_without_it_is_completed_and_searched_as_before_meanwhile(
    repos: Repositories, tmp_path: Path
) -> None:
    before = memory_for(repos, tmp_path / "before")
    user_pk, ids = await store(repos, "alice", ["我姐姐住在成都。", *SMALL_TALK])
    await before.index(await repos.messages.list_user_messages(user_pk), fresh=True)
    query = "where does my sister live?"
    as_before = await ranked(before, user_pk, query)

    second = TranslatingEmbedder()
    memory = memory_for(repos, tmp_path / "after", second)
    await memory.check_model()  # the first list's vectors alone are no mismatch
    assert await memory.second_progress() == (0, 4)
    assert await ranked(memory, user_pk, query) == as_before
    backfill = SecondListBackfill(memory, None)
    assert await backfill.run() == 4
    assert backfill.progress.as_dict() == {
        "done": 4,
        "total": 4,
        "share": 1.0,
        "state": "complete",
    }
    assert (await ranked(memory, user_pk, query))[0] == ids[0]
    assert (await vectors_per_model(repos))["translating-768"] == ids
    # A query's vector is kept by text: asked again, nothing is embedded; a new query
    # is one text.
    num_texts = second.num_texts
    await ranked(memory, user_pk, query)
    assert second.num_texts == num_texts
    await ranked(memory, user_pk, "does my sister live in chengdu?")
    assert second.num_texts == num_texts + 1
    # Another process opening the store afterwards searches the second list at once.
    reopened = memory_for(repos, tmp_path / "after", TranslatingEmbedder())
    assert (await ranked(reopened, user_pk, query))[0] == ids[0]


async def test_a_backfill_stopped_midway_resumes_where_it_stopped(
    repos: Repositories, tmp_path: Path
) -> None:
    plain = memory_for(repos, tmp_path / "plain")
    texts = [f"turn number {n} about the garden" for n in range(2 * REPAIR_BATCH_SIZE + 10)]
    user_pk, ids = await store(repos, "alice", texts)
    await plain.index(await repos.messages.list_user_messages(user_pk), fresh=True)

    stopping = FailingAfter(calls=1)
    memory = memory_for(repos, tmp_path / "a", stopping)
    with pytest.raises(RuntimeError, match="stopped"):
        await memory.backfill_second(SecondListBackfill(memory, None).hold)
    assert await memory.second_progress() == (REPAIR_BATCH_SIZE, len(ids))
    resumed_embedder = TranslatingEmbedder()
    resumed = memory_for(repos, tmp_path / "b", resumed_embedder)
    assert await resumed.backfill_second(SecondListBackfill(resumed, None).hold) == len(ids) - (
        REPAIR_BATCH_SIZE
    )
    assert stopping.num_texts + resumed_embedder.num_texts == len(ids)
    assert (await vectors_per_model(repos))["translating-768"] == ids


async def test_processes_sharing_postgresql_never_embed_a_turn_twice(
    postgres_url: str, tmp_path: Path
) -> None:
    engine = create_engine(postgres_url)
    repos = Repositories.of(Database(engine))
    claims = [JobClaimRepository.open_or_none(postgres_url, timeout_s=10) for _ in range(2)]
    try:
        plain = memory_for(repos, tmp_path / "plain")
        all_ids = []
        for number in range(6):
            texts = [f"user {number} says thing {n}" for n in range(REPAIR_BATCH_SIZE + 20)]
            user_pk, ids = await store(repos, f"user-{number}", texts)
            await plain.index(await repos.messages.list_user_messages(user_pk), fresh=True)
            all_ids += ids
        embedders = [TranslatingEmbedder(), TranslatingEmbedder()]
        memories = [memory_for(repos, tmp_path / str(n), e) for n, e in enumerate(embedders)]
        jobs = [SecondListBackfill(m, c) for m, c in zip(memories, claims, strict=True)]
        done = await asyncio.gather(*(job.run() for job in jobs))
        assert sum(done) == len(all_ids)
        assert sum(e.num_texts for e in embedders) == len(all_ids)
        assert all(done)  # both took part
        assert (await vectors_per_model(repos))["translating-768"] == sorted(all_ids)
    finally:
        for claim in claims:
            assert claim is not None
            await claim.dispose()
        await engine.dispose()


async def test_a_store_of_another_first_model_is_refused_and_second_vectors_are_not(
    repos: Repositories, tmp_path: Path
) -> None:
    memory = memory_for(repos, tmp_path / "a", TranslatingEmbedder())
    user_pk, _ = await store(repos, "alice", ["我姐姐住在成都。"])
    await memory.index(await repos.messages.list_user_messages(user_pk), fresh=True)
    # The second list turned off: its vectors stay, unused.
    await memory_for(repos, tmp_path / "b").check_model()
    first = HashEmbedder(dimension=32, model_name="other-32")
    other = TurnMemory(
        repos.messages, repos.embeddings, first, FaissIndex(tmp_path / "c", first.dimension)
    )
    with pytest.raises(EmbeddingModelMismatchError, match="hash-2048#speaker"):
        await other.check_model()


async def test_the_background_job_survives_a_failing_model_and_finishes_later(
    repos: Repositories, tmp_path: Path
) -> None:
    plain = memory_for(repos, tmp_path / "plain")
    user_pk, ids = await store(repos, "alice", ["我姐姐住在成都。", *SMALL_TALK])
    await plain.index(await repos.messages.list_user_messages(user_pk), fresh=True)
    failing = FailingAfter(calls=0)
    job = SecondListBackfill(memory_for(repos, tmp_path / "a", failing), None, retry_s=0.05)
    await job.start()
    try:
        await asyncio.sleep(0.3)  # several tries, each failing
        assert (job.progress.done, job.progress.total, job.progress.is_complete) == (0, 4, False)
        failing.calls_left = 1  # the model answers again
        for _ in range(100):
            if job.progress.is_complete:
                break
            await asyncio.sleep(0.05)
        assert job.progress.as_dict()["state"] == "complete"
    finally:
        await job.stop()
    assert (await vectors_per_model(repos))["translating-768"] == ids
