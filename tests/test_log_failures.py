"""A log that cannot be written (its disk full: ENOSPC) fails no request: the service
starts, answers as it would, and a request whose own storage fails is still the 503
problem document; the lines are dropped and counted on /metrics."""

from __future__ import annotations

import errno
import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from app.cli.logs import configure_logging
from app.factory import create_app
from app.settings import Settings
from retrieval.errors import EngineError
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_api_errors import database_down
from tests.test_observability import scrape, value

PROBLEM = "application/problem+json"


class FullDisk(io.TextIOBase):
    """A log file on a full disk: every write and flush fails as the kernel says."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def full_disk_log() -> Iterator[None]:
    """The process's log, configured as the service configures it, on a full disk."""
    handlers = list(logging.getLogger().handlers)
    configure_logging("info", stream=FullDisk())
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers[:] = handlers


def problem(status: int, detail: str, instance: str) -> dict[str, object]:
    title = {503: "Service Unavailable"}[status]
    return {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
    }


@pytest.mark.usefixtures("full_disk_log")
async def test_requests_are_answered_as_usual_when_the_log_cannot_be_written(
    settings: Settings,
) -> None:
    engine = ScriptedEngine(["Noted."])
    app = create_app(settings, embedder=HashEmbedder(), engine=engine)
    # As a server answers: an exception that escapes the app is a plain 500, not raised here.
    async with local_client(app, raise_server_exceptions=False) as client:
        # Each line is dropped and counted: the first scrape's own line, then /healthz's
        # (before any turn, whose fact extraction logs in the background).
        before = value(await scrape(client), "memchat_log_write_failures_total")
        assert before is not None
        assert (await client.get("/healthz")).status_code == 200
        after = value(await scrape(client), "memchat_log_write_failures_total")
        assert after == before + 2

        created = await client.post("/v1/sessions", json={"user_id": "alice", "title": "t"})
        assert created.status_code == 201, created.text
        assert (created.json()["user_id"], created.json()["title"]) == ("alice", "t")
        path = f"/v1/sessions/{created.json()['id']}/messages"
        turn = await client.post(path, json={"content": "I keep bees."})
        assert turn.status_code == 200, turn.text
        assert turn.json()["reply"]["content"] == "Noted."

        # A failure that the service logs as it answers: still its problem document.
        engine.fail_with = EngineError("the engine is down")
        failed = await client.post(path, json={"content": "And now?"})
        assert (failed.status_code, failed.headers["content-type"]) == (503, PROBLEM)
        assert failed.json() == problem(
            503, "the LLM engine failed: the engine is down. Your message was stored; retry later.",
            path,
        )  # fmt: skip


@pytest.mark.postgres
@pytest.mark.usefixtures("full_disk_log")
async def test_a_request_whose_database_is_down_is_the_503_problem_with_the_log_full(
    tmp_path: Path, postgres_url: str
) -> None:
    app = create_app(
        Settings(data_dir=tmp_path / "data", database_url=postgres_url),
        embedder=HashEmbedder(),
        engine=ScriptedEngine(),
    )
    async with local_client(app, raise_server_exceptions=False) as client:
        async with database_down(postgres_url):
            response = await client.post("/v1/sessions", json={"user_id": "bob"})
        assert (response.status_code, response.headers["content-type"]) == (503, PROBLEM)
        assert response.headers["retry-after"] == "5"
        assert response.json() == problem(503, "the database is unavailable", "/v1/sessions")
        sessions = await client.get("/v1/sessions", params={"user_id": "bob"})
        assert sessions.json() == {"sessions": []}
