"""`memchat serve --workers 2` (the default embedder and engine) on PostgreSQL with the
turn vectors in a Chroma server: each worker is a process with its own in-memory
indexes, and a turn imported through one request is found by every search after it,
whichever worker answers. Each search opens a connection of its own, so the kernel
hands them to either worker; the workers' log lines (with their pid and the request id)
say which answered."""

from __future__ import annotations

import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.live import MEMCHAT, cli_env, free_port

CAT = "My cat is named Zorbulon and she loves tuna."
FILLER = [
    "I went hiking in the Alps last summer.",
    "My favourite dish is mushroom risotto.",
    "I work as a nurse at the city hospital.",
    "I am learning to play the cello.",
    "My sister lives in Montreal.",
    "I prefer trains to planes.",
]
# Searches before giving up on seeing both workers answer (each is a new connection).
MAX_SEARCHES = 40


@contextmanager
def serving_workers(env: dict[str, str], log: Path) -> Iterator[str]:
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*MEMCHAT, "serve", "--workers", "2"], env=env, stdout=output, stderr=output
        )
    base = f"http://127.0.0.1:{env['MEMCHAT_PORT']}"
    try:
        deadline = time.monotonic() + 300
        while not _ready(base):
            assert process.poll() is None, log.read_text(errors="replace")[-3000:]
            if time.monotonic() > deadline:
                pytest.fail("memchat serve --workers 2 did not become ready in 300 s")
            time.sleep(0.5)
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def search_on_new_connection(base: str, log: Path, query: str) -> tuple[list[int], int]:
    """The ranked ids, and the pid of the worker that answered (from its log line)."""
    request_id = uuid.uuid4().hex
    answer = httpx.post(
        f"{base}/v1/memory/search",
        json={"user_id": "olga", "query": query, "k": 3},
        headers={"X-Request-ID": request_id},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    line = re.compile(rf"http_request .*request_id={request_id}")
    for _ in range(50):  # the log line is written as the response ends
        for text in log.read_text(errors="replace").splitlines():
            if line.search(text):
                pid = re.search(r"\bpid=(\d+)", text)
                assert pid is not None, text
                return [r["id"] for r in answer.json()["results"]], int(pid.group(1))
        time.sleep(0.1)
    raise AssertionError(f"no log line for request {request_id}")


def searches_on_both_workers(base: str, log: Path, query: str) -> list[tuple[list[int], int]]:
    """Searches until both workers have answered at least one (each a new connection)."""
    answers: list[tuple[list[int], int]] = []
    while len({pid for _, pid in answers}) < 2:
        assert len(answers) < MAX_SEARCHES, f"one worker answered all {len(answers)} searches"
        answers.append(search_on_new_connection(base, log, query))
    return answers


@pytest.mark.postgres
@pytest.mark.model
def test_a_turn_imported_through_one_worker_is_found_by_both(
    tmp_path: Path, postgres_url: str, chroma_server_url: str
) -> None:
    env = cli_env(tmp_path / "data", free_port()) | {
        "MEMCHAT_DATABASE_URL": postgres_url,
        "MEMCHAT_INDEX__KIND": "chroma",
        "MEMCHAT_CHROMA_URL": chroma_server_url,
        "MEMCHAT_CHROMA_PREFIX": f"workers{uuid.uuid4().hex[:8]}",
    }
    log = tmp_path / "serve.log"
    with serving_workers(env, log) as base:
        session = httpx.post(f"{base}/v1/sessions", json={"user_id": "olga"}).json()["id"]
        history = f"{base}/v1/sessions/{session}/history"
        turns = [{"role": "user", "content": t} for t in FILLER]
        assert httpx.post(history, json={"messages": turns}, timeout=60).status_code == 201
        # Both workers have the user's indexes open before the cat turn arrives: each
        # must catch up from SQL (the change counter), not open the scope afresh.
        before = searches_on_both_workers(base, log, "what is my cat called?")
        assert len({pid for _, pid in before}) == 2

        imported = httpx.post(history, json={"messages": [{"role": "user", "content": CAT}]})
        assert imported.status_code == 201, imported.text
        listed = httpx.get(f"{base}/v1/sessions/{session}/messages").json()["messages"]
        cat_id = listed[-1]["id"]
        assert listed[-1]["content"] == CAT

        after = searches_on_both_workers(base, log, "what is my cat called?")
        after += [search_on_new_connection(base, log, "what is my cat called?") for _ in range(4)]
        assert [ids[0] for ids, _ in after] == [cat_id] * len(after)
        assert len({pid for _, pid in after}) == 2
    # SIGTERM stops the parent, which stops both workers.
    assert "Stopping parent process" in log.read_text(errors="replace")


@pytest.mark.parametrize(
    ("extra", "needs"),
    [
        ({}, "a PostgreSQL database"),
        (
            {"MEMCHAT_DATABASE_URL": "postgresql+asyncpg://postgres@127.0.0.1:5432/none"},
            "the turn vectors in a Chroma server",
        ),
        (
            {
                "MEMCHAT_DATABASE_URL": "postgresql+asyncpg://postgres@127.0.0.1:5432/none",
                "MEMCHAT_INDEX__KIND": "chroma",
            },
            "the turn vectors in a Chroma server",
        ),
    ],
)
def test_workers_refuse_what_one_process_owns(
    tmp_path: Path, extra: dict[str, str], needs: str
) -> None:
    """SQLite, FAISS files and an embedded Chroma: refused before anything starts."""
    env = cli_env(tmp_path / "data", free_port()) | extra
    done = subprocess.run(
        [*MEMCHAT, "serve", "--workers", "2"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert f"memchat serve: --workers 2 needs {needs}" in done.stderr
    assert not (tmp_path / "data").exists()
