"""Background work exactly once across API processes on one PostgreSQL database: fact
extraction and knowledge processing are claimed by one process at a time (storage/claims.py)
and found again by every process's sweep, so a job whose process was killed mid-way is
finished by another, and nothing is read or stored twice.

First over the repositories (two `Database` engines on one database stand for two
processes), then with two real `memchat serve` processes, one killed with SIGKILL while
it holds a user's extraction."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from retrieval.facts.memory import FactMemory
from retrieval.facts.model import CandidateFact, statement
from retrieval.facts.rules import rule_extractor
from retrieval.facts.worker import FactWorker
from retrieval.indexes.faiss import FaissIndex
from retrieval.knowledge.base import KnowledgeBase, KnowledgeConfig
from retrieval.knowledge.chunking import Chunker
from storage.claims import (
    FACT_EXTRACTION,
    KNOWLEDGE_PROCESSING,
    JobClaimRepository,
    document_key,
    int4_key,
)
from storage.db import Database, create_engine
from storage.facts import STATUSES
from storage.knowledge import NewDocument
from storage.models import DEFAULT_TENANT_ID
from storage.records import NewTurn
from storage.repositories import Repositories
from tests.fakes import HashEmbedder
from tests.live import MEMCHAT, cli_env, free_port

pytestmark = pytest.mark.postgres

# Five batches of extraction for the killed-process test, begun once the import is
# acknowledged (`extraction_held`): the test sees the second begin and kills its process.
LIKES = [f"I like item {n}." for n in range(1, 1001)]


class CountingExtractor:
    """The rule extractor, a little slow (so that claims overlap), keeping every message
    text it was given."""

    name = "rules"

    def __init__(self, delay_s: float = 0.0) -> None:
        self._rules = rule_extractor()
        self._delay_s = delay_s
        self.read: list[str] = []

    async def extract(self, text: str) -> list[CandidateFact]:
        self.read.append(text)
        await asyncio.sleep(self._delay_s)
        return await self._rules.extract(text)


class CountingEmbedder(HashEmbedder):
    """The hash embedder, a little slow, keeping every text it embedded."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self._delay_s = delay_s
        self.texts: list[str] = []

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts += texts
        await asyncio.sleep(self._delay_s)
        return self.embed_now(texts)


@pytest.fixture
async def stores(postgres_url: str) -> AsyncIterator[tuple[Repositories, Repositories]]:
    """The repositories of two processes: two engines (two pools) on one database."""
    first, second = Database.open(postgres_url), Database.open(postgres_url)
    yield Repositories.of(first), Repositories.of(second)
    await first.dispose()
    await second.dispose()


async def add_messages(
    repos: Repositories, user_id: str, texts: Sequence[str]
) -> tuple[int, list[int]]:
    """A new session of the user with these user messages: (user pk, message ids)."""
    chat, user = await repos.sessions.create_session(user_id, None, {}, tenant_id=DEFAULT_TENANT_ID)
    appended = await repos.messages.append(chat, [NewTurn("user", t) for t in texts])
    return user.id, [m.id for m in appended.turns]


def fact_memory(repos: Repositories, extractor: CountingExtractor) -> FactMemory:
    embedder = HashEmbedder()
    return FactMemory(repos.facts, repos.messages, extractor, embedder.embed, embedder.model_name)


async def statements(texts: Sequence[str]) -> list[str]:
    rules = rule_extractor()
    return [statement(c) for t in texts for c in await rules.extract(t)]


async def eventually(check: Callable[[], Awaitable[bool]], what: str, polls: int = 400) -> None:
    for _poll in range(polls):
        if await check():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"{what}: not within {polls} polls")


async def assert_extracted_once(repos: Repositories, user_pk: int, ids: list[int]) -> None:
    """One active fact per message, in message order, each created once; the watermark
    at the last message."""
    facts = await repos.facts.list_facts(user_pk, STATUSES)
    assert [(f.source_message_ids, f.status) for f in facts] == [([i], "active") for i in ids]
    changes = await repos.facts.list_changes([f.id for f in facts])
    assert [(c.fact_id, c.action) for c in changes] == [(f.id, "created") for f in facts]
    assert await repos.facts.get_watermark(user_pk) == ids[-1]


# Fact extraction --------------------------------------------------------------------


async def test_two_workers_racing_on_one_user_read_each_message_once(
    stores: tuple[Repositories, Repositories],
) -> None:
    first, second = stores
    texts = LIKES[:40]
    user_pk, ids = await add_messages(first, "olga", texts)
    extractors = [CountingExtractor(delay_s=0.005), CountingExtractor(delay_s=0.005)]
    workers = [
        FactWorker(fact_memory(repos, extractor), sweep_interval_s=0)
        for repos, extractor in zip(stores, extractors, strict=True)
    ]
    # Both queue the user at start (messages ahead of the watermark) and start at once.
    await asyncio.gather(*(worker.start() for worker in workers))
    try:
        await asyncio.gather(*(worker.drain() for worker in workers))
    finally:
        await asyncio.gather(*(worker.stop() for worker in workers))
    # One worker held the user's batch and read every message; the other read none.
    assert sorted(len(e.read) for e in extractors) == [0, len(texts)]
    assert sorted(extractors[0].read + extractors[1].read) == sorted(texts)
    await assert_extracted_once(second, user_pk, ids)
    facts = await second.facts.list_facts(user_pk)
    assert [f.text for f in facts] == await statements(texts)


async def test_a_claimed_batch_is_skipped_and_taken_once_its_holder_is_gone(
    stores: tuple[Repositories, Repositories], postgres_url: str
) -> None:
    repos = stores[0]
    texts = LIKES[:5]
    user_pk, ids = await add_messages(repos, "olga", texts)
    extractor = CountingExtractor()
    memory = fact_memory(repos, extractor)
    holder = create_engine(postgres_url)
    try:
        async with holder.connect() as other:
            # A session lock of the one-bigint key space with the same bits is another lock.
            same_bits = (FACT_EXTRACTION << 32) | user_pk
            await other.execute(text("SELECT pg_advisory_lock(:k)"), {"k": same_bits})
            held = await holder.connect()
            await held.begin()
            pid = await held.scalar(text("SELECT pg_backend_pid()"))
            claimed = await held.scalar(
                text("SELECT pg_try_advisory_xact_lock(:c, :k)"),
                {"c": FACT_EXTRACTION, "k": user_pk},
            )
            assert claimed is True
            assert await memory.extract_pending(user_pk) is None
            assert extractor.read == []
            assert await repos.facts.get_watermark(user_pk) == 0
            # The holder dies: its connection ends, and its claim with it. The timeout makes
            # PostgreSQL wait until the backend has exited (and so released its locks):
            # without it the call returns once the signal is sent.
            ended = await other.scalar(
                text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid}
            )
            assert ended is True
            assert await memory.extract_pending(user_pk) == len(texts)
            await held.invalidate()
            await other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": same_bits})
    finally:
        await holder.dispose()
    assert extractor.read == texts
    await assert_extracted_once(repos, user_pk, ids)


async def test_the_sweep_finds_the_messages_another_process_was_told_of(
    stores: tuple[Repositories, Repositories],
) -> None:
    first, second = stores
    extractor = CountingExtractor()
    worker = FactWorker(fact_memory(second, extractor), sweep_interval_s=0.05)
    await worker.start()
    try:
        # Stored through the other process, which (killed) told no one.
        user_pk, ids = await add_messages(first, "olga", LIKES[:3])

        async def caught_up() -> bool:
            return await second.facts.get_watermark(user_pk) == ids[-1]

        await eventually(caught_up, "the sweep did not find the user")
    finally:
        await worker.stop()
    assert extractor.read == LIKES[:3]
    await assert_extracted_once(second, user_pk, ids)


# Knowledge processing ---------------------------------------------------------------

DOCUMENT = "\n\n".join(f"Fact number {n} is that the code word is w{n}x." for n in range(10))
SMALL_CHUNKS = KnowledgeConfig(chunk_tokens=16, overlap_tokens=0, embed_batch_size=3)


async def add_processing_document(repos: Repositories) -> str:
    """A document stored and left `processing`, as by an uploader killed before its chunks."""
    document, _owner, created = await repos.knowledge.add_document(
        NewDocument(
            tenant_id=DEFAULT_TENANT_ID,
            user_external_id="olga",
            title="Facts",
            metadata={},
            source="text",
            filename=None,
            content=DOCUMENT,
            content_hash="facts",
        )
    )
    assert created and document.status == "processing"
    return document.id


def knowledge_base(
    repos: Repositories, embedder: CountingEmbedder, directory: Path, url: str, **config: Any
) -> KnowledgeBase:
    claims = JobClaimRepository.open_or_none(url, timeout_s=10)
    assert claims is not None
    index = FaissIndex(directory, embedder.dimension)
    return KnowledgeBase(
        repos.knowledge, embedder, index, dataclasses.replace(SMALL_CHUNKS, **config), claims=claims
    )


def document_chunks() -> list[str]:
    return [c.text for c in Chunker(16, 0).split(DOCUMENT, markdown=True)]


async def assert_processed_once(repos: Repositories, document_id: str) -> None:
    chunks = document_chunks()
    document, _owner = await repos.knowledge.get_document(document_id)
    assert (document.status, document.num_chunks, document.num_chunks_indexed) == (
        "ready",
        len(chunks),
        len(chunks),
    )
    stored = await repos.knowledge.list_chunks_after_id(0, 1000)
    assert [(c.document_id, c.ordinal, c.text) for c in stored] == [
        (document_id, n, chunk) for n, chunk in enumerate(chunks)
    ]


async def test_two_processes_resuming_one_document_process_it_once(
    stores: tuple[Repositories, Repositories], postgres_url: str, tmp_path: Path
) -> None:
    document_id = await add_processing_document(stores[0])
    embedders = [CountingEmbedder(delay_s=0.01), CountingEmbedder(delay_s=0.01)]
    bases = [
        knowledge_base(repos, embedder, tmp_path / str(n), postgres_url, sweep_interval_s=0)
        for n, (repos, embedder) in enumerate(zip(stores, embedders, strict=True))
    ]
    try:
        # Both start at once (a rolling restart) and find the document unfinished.
        await asyncio.gather(*(base.start() for base in bases))
        await asyncio.gather(*(base.wait_idle() for base in bases))
    finally:
        await asyncio.gather(*(base.close() for base in bases))
    chunks = document_chunks()
    assert sorted(len(e.texts) for e in embedders) == [0, len(chunks)]
    await assert_processed_once(stores[1], document_id)


async def test_a_claimed_document_is_left_to_its_holder_and_swept_up_when_it_is_gone(
    stores: tuple[Repositories, Repositories], postgres_url: str, tmp_path: Path
) -> None:
    document_id = await add_processing_document(stores[0])
    embedder = CountingEmbedder()
    base = knowledge_base(stores[1], embedder, tmp_path, postgres_url, sweep_interval_s=0.05)
    holder = JobClaimRepository.open_or_none(postgres_url, timeout_s=10)
    assert holder is not None
    try:
        async with holder.try_hold(KNOWLEDGE_PROCESSING, document_key(document_id)) as is_held:
            assert is_held
            await base.start()
            await asyncio.sleep(0.3)  # a resume at start and several sweeps
            document, _owner = await stores[1].knowledge.get_document(document_id)
            assert (document.status, document.num_chunks, embedder.texts) == ("processing", 0, [])

        async def ready() -> bool:
            document, _owner = await stores[1].knowledge.get_document(document_id)
            return document.status == "ready"

        await eventually(ready, "no sweep took the released document")
        await base.wait_idle()
    finally:
        await base.close()
        await holder.dispose()
    assert len(embedder.texts) == len(document_chunks())
    await assert_processed_once(stores[1], document_id)


# Two real processes, one killed mid-job --------------------------------------------

SWEEP_INTERVAL_S = 2
# The log line of each claimed batch after the first: its process holds a job begun.
LATER_BATCH = re.compile(r"fact_extraction_batch\s.*after_message_id=[1-9]")


@dataclasses.dataclass
class Served:
    """One `memchat serve` process: its client, the process, the file its log goes to
    (read while it runs: a pipe nobody reads would fill and stop it)."""

    client: httpx.Client
    process: subprocess.Popen[str]
    log_path: Path


@contextmanager
def api_processes(directory: Path, database_url: str, count: int) -> Iterator[list[Served]]:
    """`count` processes on the shared database, each with its own data directory and a
    short fact sweep; started together, ready when this enters."""
    started: list[tuple[subprocess.Popen[str], Path, str]] = []
    try:
        for n in range(count):
            data_dir = directory / f"process-{n}"
            data_dir.mkdir(parents=True)
            port = free_port()
            env = cli_env(data_dir, port) | {
                "MEMCHAT_DATABASE_URL": database_url,
                "MEMCHAT_FACTS__SWEEP_INTERVAL_S": str(SWEEP_INTERVAL_S),
            }
            log_path = data_dir / "serve.log"
            with log_path.open("w") as log_file:
                process = subprocess.Popen(
                    [*MEMCHAT, "serve"],
                    env=env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            started.append((process, log_path, f"http://127.0.0.1:{port}"))
        for process, log_path, base in started:
            wait_until_ready(process, log_path, base)
        with ExitStack() as clients:
            yield [
                Served(clients.enter_context(httpx.Client(base_url=base, timeout=300)), p, log)
                for p, log, base in started
            ]
    finally:
        for process, _log_path, _base in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, _log_path, _base in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_until_ready(process: subprocess.Popen[str], log_path: Path, base: str) -> None:
    deadline = time.monotonic() + 240
    while True:
        assert process.poll() is None, log_path.read_text()
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"memchat serve did not become ready in 240 s:\n{log_path.read_text()}")
        time.sleep(0.5)


def import_history(client: httpx.Client, user_id: str, texts: Sequence[str]) -> list[int]:
    session_id = client.post("/v1/sessions", json={"user_id": user_id}).json()["id"]
    return import_into(client, session_id, texts)


def import_into(client: httpx.Client, session_id: str, texts: Sequence[str]) -> list[int]:
    answer = client.post(
        f"/v1/sessions/{session_id}/history",
        json={"messages": [{"role": "user", "content": t} for t in texts]},
    )
    assert answer.status_code == 201, answer.text
    messages = client.get(f"/v1/sessions/{session_id}/messages").json()["messages"]
    assert [m["content"] for m in messages] == list(texts)
    return [m["id"] for m in messages]


async def watermark(engine: AsyncEngine, user_id: str) -> int:
    async with engine.connect() as connection:
        value = await connection.scalar(
            text("SELECT facts_through_message_id FROM users WHERE external_id = :u"),
            {"u": user_id},
        )
    return int(value)


@asynccontextmanager
async def extraction_held(
    postgres_url: str, engine: AsyncEngine, user_id: str
) -> AsyncIterator[None]:
    """The user's fact-extraction claim held by the test, as a job's claim is held
    (`JobClaimRepository`): no process extracts the user's messages until this exits;
    each finds the claim taken and tries again at its next sweep."""
    async with engine.connect() as connection:
        user_pk = await connection.scalar(
            text("SELECT id FROM users WHERE external_id = :u"), {"u": user_id}
        )
    claims = JobClaimRepository.open_or_none(postgres_url, timeout_s=10)
    assert claims is not None
    try:
        async with claims.try_hold(FACT_EXTRACTION, int4_key(int(user_pk))) as is_held:
            assert is_held
            yield
    finally:
        await claims.dispose()


async def wait_for_watermark(engine: AsyncEngine, user_id: str, last_id: int, what: str) -> None:
    deadline = time.monotonic() + 180
    while await watermark(engine, user_id) != last_id:
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.2)


def holder_of_a_later_batch(processes: Sequence[Served], timeout_s: float) -> Served:
    """The process whose log shows it holds a batch after the first: the one that
    extracts (the importing process, or the other if its sweep came first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for served in processes:
            if LATER_BATCH.search(served.log_path.read_text()):
                return served
        time.sleep(0.01)
    logs = "\n".join(served.log_path.read_text() for served in processes)
    raise AssertionError(f"no process logged a later batch in {timeout_s} s:\n{logs}")


def fact_rows(client: httpx.Client, user_id: str, ids: list[int]) -> list[tuple[Any, ...]]:
    """The user's facts as stored, their messages by place in the import, every change."""
    answer = client.get(
        f"/v1/users/{user_id}/facts", params={"status": "all", "include": "history"}
    )
    assert answer.status_code == 200, answer.text
    place = {message_id: n for n, message_id in enumerate(ids)}
    return [
        (
            f["text"],
            f["category"],
            f["subject"],
            f["value"],
            f["status"],
            [place[i] for i in f["source_message_ids"]],
            [(c["action"], c["actor"]) for c in f["history"]],
        )
        for f in answer.json()["facts"]
    ]


@pytest.mark.model
async def test_a_job_of_a_killed_process_is_finished_once_by_the_other(
    tmp_path: Path, postgres_url: str
) -> None:
    engine = create_engine(postgres_url)
    try:
        with api_processes(tmp_path, postgres_url, 2) as processes:
            client = processes[0].client
            session_id = client.post("/v1/sessions", json={"user_id": "olga"}).json()["id"]
            # The job begins once the import is acknowledged: on a slow machine the
            # import's embedding takes longer than the whole job, begun as its messages
            # were stored, would.
            async with extraction_held(postgres_url, engine, "olga"):
                ids = import_into(client, session_id, LIKES)
                assert await watermark(engine, "olga") == 0
            # Kill whichever process holds the user's job, one batch of 200 recorded.
            holder = holder_of_a_later_batch(processes, timeout_s=120)
            os.kill(holder.process.pid, signal.SIGKILL)
            holder.process.wait()
            at_kill = await watermark(engine, "olga")
            assert ids[0] <= at_kill < ids[-1], "the job ended before its process was killed"

            # The other finds the user in a sweep and reads the rest, from the watermark on.
            [survivor] = [served for served in processes if served is not holder]
            await wait_for_watermark(engine, "olga", ids[-1], "no process finished the job")
            olga = fact_rows(survivor.client, "olga", ids)

            # A single process reading the same messages from start to end.
            control_ids = import_history(survivor.client, "control", LIKES)
            await wait_for_watermark(engine, "control", control_ids[-1], "no control run")
            control = fact_rows(survivor.client, "control", control_ids)
    finally:
        await engine.dispose()
    # Every message's fact, once, created once, and just as the single process has them.
    assert [(row[4], row[5], row[6]) for row in olga] == [
        ("active", [n], [("created", "extractor:rules")]) for n in range(len(LIKES))
    ]
    assert olga == control
