"""One turn at a time per session across API processes: the session's PostgreSQL advisory
lock (storage/locks.py) on its own, then two `memchat serve` processes on one database,
whose turns sent to both at once are stored one after the other, each seeing the one
before."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from app.factory import create_app
from app.settings import ChatSettings, Settings
from retrieval.chat.sessions import SessionLocks
from retrieval.errors import SessionBusyError
from storage.db import create_engine
from storage.errors import LockTimeoutError
from storage.locks import SessionLockRepository
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import serving_together

pytestmark = pytest.mark.postgres

SESSION_ID = "0b6f3c1e-2f4a-4c59-9a57-3f1d2a9e8c10"
OTHER_SESSION_ID = "5d0e7a52-8c1b-4f0e-b7a3-2e9c4d6f1a08"

# Holds the session's lock in a process of its own until killed.
HOLDER_PROCESS = """
import asyncio, sys
from storage.locks import SessionLockRepository

async def main():
    locks = SessionLockRepository.open_or_none(sys.argv[1], timeout_s=5, connect_timeout_s=5)
    async with locks.hold(sys.argv[2]):
        print("held", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


def open_locks(url: str, timeout_s: float) -> SessionLockRepository:
    locks = SessionLockRepository.open_or_none(url, timeout_s=timeout_s, connect_timeout_s=5)
    assert locks is not None
    return locks


@pytest.fixture
async def locks(postgres_url: str) -> AsyncIterator[SessionLockRepository]:
    repository = open_locks(postgres_url, timeout_s=10)
    yield repository
    await repository.dispose()


async def advisory_locks(url: str) -> list[bool]:
    """Whether each advisory lock entry of the database is granted (False: waiting)."""
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            rows = await connection.execute(
                text(
                    "SELECT granted FROM pg_locks WHERE locktype = 'advisory' AND database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                    "ORDER BY granted DESC"
                )
            )
            return [bool(granted) for (granted,) in rows]
    finally:
        await engine.dispose()


async def until_one_waits(url: str) -> None:
    """Until one connection holds the lock and another waits for it."""
    deadline = time.monotonic() + 30
    while await advisory_locks(url) != [True, False]:
        assert time.monotonic() < deadline, await advisory_locks(url)
        await asyncio.sleep(0.02)


async def enter_and_leave(locks: SessionLockRepository, session_id: str) -> None:
    async with locks.hold(session_id):
        pass


def test_only_postgresql_has_shared_locks(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'memchat.db'}"
    assert SessionLockRepository.open_or_none(url, timeout_s=1, connect_timeout_s=1) is None


async def test_a_second_hold_waits_until_the_first_releases(
    locks: SessionLockRepository, postgres_url: str
) -> None:
    order: list[str] = []
    first_in, release_first = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with locks.hold(SESSION_ID):
            order.append("first in")
            first_in.set()
            await release_first.wait()
            order.append("first out")

    async def second() -> None:
        await first_in.wait()
        async with locks.hold(SESSION_ID):
            order.append("second in")

    tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
    await until_one_waits(postgres_url)
    await enter_and_leave(locks, OTHER_SESSION_ID)  # other sessions do not wait
    order.append("other session in and out")
    release_first.set()
    await asyncio.gather(*tasks)
    assert order == ["first in", "other session in and out", "first out", "second in"]
    assert await advisory_locks(postgres_url) == []


async def test_a_hold_not_granted_in_time_raises_and_sessions_report_busy(
    postgres_url: str,
) -> None:
    quick = open_locks(postgres_url, timeout_s=0.2)
    # Two SessionLocks: two processes' in-process locks, one database lock.
    this_process, other_process = SessionLocks(quick), SessionLocks(quick)
    async with other_process.hold(SESSION_ID):
        with pytest.raises(LockTimeoutError) as timed_out:
            await enter_and_leave(quick, SESSION_ID)
        with pytest.raises(SessionBusyError) as busy:
            async with this_process.hold(SESSION_ID):
                pytest.fail("entered a session another process holds")
        assert await advisory_locks(postgres_url) == [True]
    assert (timed_out.value.key, timed_out.value.timeout_s) == (f"session:{SESSION_ID}", 0.2)
    assert (busy.value.session_id, busy.value.timeout_s) == (SESSION_ID, 0.2)
    assert str(busy.value) == (
        f"session {SESSION_ID!r} is busy with another request: not free within 0.2 s"
    )
    async with this_process.hold(SESSION_ID):
        assert await advisory_locks(postgres_url) == [True]
    assert await advisory_locks(postgres_url) == []
    await quick.dispose()


async def test_cancelled_holds_leave_the_lock_free(
    locks: SessionLockRepository, postgres_url: str
) -> None:
    holding = asyncio.Event()

    async def hold_until_cancelled() -> None:
        async with locks.hold(SESSION_ID):
            holding.set()
            await asyncio.Event().wait()

    holder = asyncio.create_task(hold_until_cancelled())
    await holding.wait()
    waiter = asyncio.create_task(enter_and_leave(locks, SESSION_ID))
    await until_one_waits(postgres_url)
    waiter.cancel()  # a client gone while its turn waits ...
    with pytest.raises(asyncio.CancelledError):
        await waiter
    holder.cancel()  # ... and while its turn runs
    with pytest.raises(asyncio.CancelledError):
        await holder
    quick = open_locks(postgres_url, timeout_s=5)
    async with quick.hold(SESSION_ID):
        assert await advisory_locks(postgres_url) == [True]
    assert await advisory_locks(postgres_url) == []
    await quick.dispose()


async def test_a_killed_process_leaves_the_lock_free(postgres_url: str) -> None:
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLDER_PROCESS,
        postgres_url,
        SESSION_ID,
        stdout=asyncio.subprocess.PIPE,
    )
    assert holder.stdout is not None
    assert await holder.stdout.readline() == b"held\n"
    quick = open_locks(postgres_url, timeout_s=0.2)
    with pytest.raises(LockTimeoutError):
        await enter_and_leave(quick, SESSION_ID)
    holder.send_signal(signal.SIGKILL)
    assert await holder.wait() == -signal.SIGKILL
    # The server ends the dead client's connection, and its locks with it.
    patient = open_locks(postgres_url, timeout_s=10)
    async with patient.hold(SESSION_ID):
        assert await advisory_locks(postgres_url) == [True]
    await quick.dispose()
    await patient.dispose()


async def test_a_turn_whose_session_stays_busy_answers_503(
    tmp_path: Path, postgres_url: str
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=postgres_url,
        chat=ChatSettings(session_lock_timeout_s=0.2),
    )
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."]))
    other_process = open_locks(postgres_url, timeout_s=5)
    async with local_client(app) as client:
        created = await client.post("/v1/sessions", json={"user_id": "kim"})
        session_id = created.json()["id"]
        url = f"/v1/sessions/{session_id}/messages"
        async with other_process.hold(session_id):
            busy = await client.post(url, json={"content": "My locker is 12."})
        assert (busy.status_code, busy.headers["retry-after"]) == (503, "2")
        assert busy.json() == {
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": f"session {session_id!r} is busy with another request: not free "
            "within 0.2 s; nothing was stored, retry later",
            "instance": url,
        }
        assert (await client.get(url)).json() == {"messages": []}
        answer = await client.post(url, json={"content": "My locker is 12."})
        assert answer.status_code == 200
        assert answer.json()["reply"]["content"] == "Noted."
    await other_process.dispose()


# Two API processes -----------------------------------------------------------------

NUM_TURNS_PER_PROCESS = 5


def send_turns_at_once(
    urls: list[str], session_id: str, num_per_url: int
) -> list[tuple[str, httpx.Response]]:
    """`num_per_url` turns to each server, all released together by one barrier."""
    jobs = [
        (url, f"Note {name}{i}: my locker is number {i}{i}.")
        for i in range(num_per_url)
        for url, name in zip(urls, "AB", strict=True)
    ]
    start = threading.Barrier(len(jobs))
    answers: list[tuple[str, httpx.Response]] = []

    def send(url: str, content: str) -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            start.wait()
            response = client.post(
                f"/v1/sessions/{session_id}/messages",
                json={"content": content, "max_tokens": 8, "temperature": 0},
            )
        answers.append((content, response))

    threads = [threading.Thread(target=send, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


@pytest.mark.model
def test_two_processes_serialise_the_turns_of_one_session(
    tmp_path: Path, postgres_url: str
) -> None:
    env = {"MEMCHAT_DATABASE_URL": postgres_url}
    with serving_together([tmp_path / "a", tmp_path / "b"], extra_env=env) as (first, second):
        created = first.post("/v1/sessions", json={"user_id": "kim"})
        assert created.status_code == 201
        session_id = created.json()["id"]

        answers = send_turns_at_once(
            [str(first.base_url), str(second.base_url)], session_id, NUM_TURNS_PER_PROCESS
        )
        statuses = sorted(response.status_code for _, response in answers)
        refused = Counter((r.status_code, r.json()["detail"]) for _, r in answers if r.is_error)
        assert statuses == [200] * 2 * NUM_TURNS_PER_PROCESS, refused

        stored = second.get(f"/v1/sessions/{session_id}/messages").json()["messages"]
    turns: list[dict[str, Any]] = sorted(
        (response.json() for _, response in answers), key=lambda t: t["message"]["seq"]
    )
    assert [m["seq"] for m in stored] == list(range(1, 4 * NUM_TURNS_PER_PROCESS + 1))
    assert [m["role"] for m in stored] == ["user", "assistant"] * 2 * NUM_TURNS_PER_PROCESS
    by_id = {m["id"]: m for m in stored}
    assert sorted(by_id) == sorted(i for t in turns for i in (t["message"]["id"], t["reply"]["id"]))
    for content, response in answers:
        turn = response.json()
        assert turn["message"]["content"] == content
        assert by_id[turn["message"]["id"]]["content"] == content
        assert turn["reply"]["seq"] == turn["message"]["seq"] + 1
        assert by_id[turn["reply"]["id"]]["seq"] == turn["reply"]["seq"]

    # Each turn's window is every message stored before it (nothing compacted or pruned
    # in ten short turns), so its last entry is the previous turn's reply.
    assert turns[0]["context"]["recent_message_ids"] == []
    for earlier, turn in pairwise(turns):
        context = turn["context"]
        assert (context["summary_through_seq"], context["pruned_message_ids"]) == (0, [])
        before = [m["id"] for m in stored if m["seq"] < turn["message"]["seq"]]
        assert context["recent_message_ids"] == before
        assert context["recent_message_ids"][-1] == earlier["reply"]["id"]
