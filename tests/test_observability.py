"""Metrics, request ids, request logs and readiness, over HTTP, with fake models.

Each chat turn shows once in every stage histogram, its context sections in the token
histograms with their exact counts, its memories by kind; history imports count their
messages; the engine queue shows the turns in flight; requests are counted by route
template ('unmatched' when no route matched); every response carries a request id, the
client's when valid.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import structlog
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from app.cli.logs import configure_logging
from app.factory import create_app
from app.observability.metrics import MEMORY_KINDS, SECTIONS, STAGES, ServiceMetrics
from app.settings import Settings
from retrieval.errors import EngineError, IndexUnavailableError
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import free_port, live_server
from tests.test_api_sessions import create_session

MESSAGES = "/v1/sessions/{session_id}/messages"
HEX_ID = re.compile(r"[0-9a-f]{32}")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: bytes | str) -> Samples:
    text = text.decode() if isinstance(text, bytes) else text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def scrape(client: AsyncTestClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def requests_counted(samples: Samples) -> dict[tuple[str, str, str], float]:
    return {
        (labels["method"], labels["route"], labels["status"]): count
        for (name, label_set), count in samples.items()
        if name == "memchat_http_requests_total"
        for labels in [dict(label_set)]
    }


async def chat(client: AsyncTestClient, session_id: str, content: str, **extra: object) -> dict:
    response = await client.post(
        MESSAGES.format(session_id=session_id), json={"content": content, **extra}
    )
    assert response.status_code == 200, response.text
    return response.json() if not extra.get("stream") else {}


async def test_a_chat_turn_shows_in_every_stage_and_section_histogram(
    client: AsyncTestClient,
) -> None:
    before = await scrape(client)
    assert {value(before, "memchat_turn_stage_seconds_count", stage=s) for s in STAGES} == {0}
    session = await create_session(client)
    turn = await chat(client, session["id"], "I am allergic to peanuts")

    samples = await scrape(client)
    for stage in STAGES:
        assert value(samples, "memchat_turn_stage_seconds_count", stage=stage) == 1, stage
    seconds = {s: value(samples, "memchat_turn_stage_seconds_sum", stage=s) for s in STAGES}
    # Stages nest: the first token comes within the generation, all of it within the turn.
    assert seconds["time_to_first_token"] <= seconds["generation"] <= seconds["total"]
    assert seconds["search"] + seconds["assemble"] + seconds["generation"] <= seconds["total"]
    for section in SECTIONS:
        assert value(samples, "memchat_context_tokens_count", section=section) == 1
        assert (
            value(samples, "memchat_context_tokens_sum", section=section)
            == turn["context"]["tokens"][section]
        ), section
    for kind in MEMORY_KINDS:
        assert value(samples, "memchat_turn_memories_count", kind=kind) == 1, kind
        assert value(samples, "memchat_turn_memories_sum", kind=kind) == 0, kind
    # A session's first prompt has no previous one to share a prefix with.
    assert value(samples, "memchat_prefix_reuse_ratio_count") == 0
    usage = turn["usage"]
    assert value(samples, "memchat_prompt_tokens_total") == usage["prompt_tokens"]
    assert value(samples, "memchat_completion_tokens_total") == usage["completion_tokens"] == 4
    assert value(samples, "memchat_cached_prompt_tokens_total") == 0  # the fake reports none
    # The message and the reply are in the turn index; no knowledge scope is open.
    assert value(samples, "memchat_index_vectors", index="turns") == 2
    assert value(samples, "memchat_index_vectors", index="knowledge") == 0


async def test_the_second_turn_reports_its_prefix_reuse(client: AsyncTestClient) -> None:
    session = await create_session(client)
    await chat(client, session["id"], "I am allergic to peanuts")
    second = await chat(client, session["id"], "What snack do you suggest?")

    samples = await scrape(client)
    assert value(samples, "memchat_turn_stage_seconds_count", stage="total") == 2
    assert value(samples, "memchat_prefix_reuse_ratio_count") == 1
    reuse = second["context"]["prefix_reuse"]
    assert 0 < reuse < second["context"]["prompt_tokens"]
    assert value(samples, "memchat_prefix_reuse_ratio_sum") == pytest.approx(
        reuse / second["context"]["prompt_tokens"]
    )
    assert value(samples, "memchat_index_vectors", index="turns") == 4


async def test_memories_per_turn_count_what_the_prompt_carried(client: AsyncTestClient) -> None:
    first = await create_session(client)
    await chat(client, first["id"], "I am allergic to peanuts")
    # Another session of the same user: the first session's turns are memories here.
    second = await create_session(client)
    turn = await chat(client, second["id"], "Am I allergic to peanuts?")
    assert len(turn["context"]["memories"]) == 2

    samples = await scrape(client)
    assert value(samples, "memchat_turn_memories_count", kind="turn") == 2
    assert value(samples, "memchat_turn_memories_sum", kind="turn") == 2
    assert value(samples, "memchat_turn_memories_sum", kind="knowledge") == 0
    assert value(samples, "memchat_turn_memories_sum", kind="fact") == len(
        turn["context"]["pinned_facts"]
    )


async def test_history_imports_count_imported_and_skipped_messages(
    client: AsyncTestClient,
) -> None:
    session = await create_session(client)
    messages = [
        {"role": "user", "content": "I live in Lisbon", "external_id": "m1"},
        {"role": "assistant", "content": "Noted.", "external_id": "m2"},
    ]
    path = f"/v1/sessions/{session['id']}/history"
    before = await scrape(client)
    assert value(before, "memchat_imported_messages_total", outcome="imported") == 0
    first = await client.post(path, json={"messages": messages})
    assert first.json() == {"imported": 2, "skipped": 0}
    again = [*messages, {"role": "user", "content": "And in Porto", "external_id": "m3"}]
    second = await client.post(path, json={"messages": again})
    assert second.json() == {"imported": 1, "skipped": 2}

    samples = await scrape(client)
    assert value(samples, "memchat_imported_messages_total", outcome="imported") == 3
    assert value(samples, "memchat_imported_messages_total", outcome="skipped") == 2
    assert requests_counted(samples)[("POST", "/v1/sessions/{session_id}/history", "201")] == 2


async def test_the_engine_queue_shows_the_turns_in_flight(
    settings: Settings, embedder: HashEmbedder, engine: ScriptedEngine
) -> None:
    engine.gate = threading.Event()
    # A server of its own: the test client answers one request at a time.
    with live_server(create_app(settings, embedder=embedder, engine=engine)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            created = await client.post("/v1/sessions", json={"user_id": "alice"})
            idle = parse((await client.get("/metrics")).content)
            assert value(idle, "memchat_engine_queue_turns") == 0
            assert value(idle, "memchat_engine_queue_max_turns") == settings.chat.max_pending_turns
            path = MESSAGES.format(session_id=created.json()["id"])
            turn = asyncio.create_task(client.post(path, json={"content": "hello there"}))
            try:
                async with asyncio.timeout(30):
                    while not engine.prompts:  # the turn has reached the engine
                        await asyncio.sleep(0.02)
                busy = parse((await client.get("/metrics")).content)
                assert value(busy, "memchat_engine_queue_turns") == 1
            finally:
                engine.gate.set()
            assert (await turn).status_code == 200
            done = parse((await client.get("/metrics")).content)
            assert value(done, "memchat_engine_queue_turns") == 0


async def test_a_streamed_turn_counts_once(client: AsyncTestClient) -> None:
    session = await create_session(client)
    await chat(client, session["id"], "hello there", stream=True)

    samples = await scrape(client)
    for stage in STAGES:
        assert value(samples, "memchat_turn_stage_seconds_count", stage=stage) == 1, stage
    assert value(samples, "memchat_context_tokens_count", section="new_message") == 1
    assert value(samples, "memchat_completion_tokens_total") == 4


async def test_a_failed_turn_is_no_turn_and_its_request_counts_as_503(
    client: AsyncTestClient, engine: ScriptedEngine
) -> None:
    session = await create_session(client)
    engine.fail_with = EngineError("the engine is down")
    response = await client.post(
        MESSAGES.format(session_id=session["id"]), json={"content": "hello there"}
    )
    assert response.status_code == 503

    samples = await scrape(client)
    assert value(samples, "memchat_turn_stage_seconds_count", stage="total") == 0
    assert requests_counted(samples) == {
        ("POST", "/v1/sessions", "201"): 1,
        ("POST", MESSAGES, "503"): 1,
    }


async def test_requests_are_counted_by_route_template_and_status(
    client: AsyncTestClient,
) -> None:
    session = await create_session(client)
    await chat(client, session["id"], "hello there")
    assert (await client.get("/v1/sessions/no-such-session")).status_code == 404
    assert (await client.get("/no/such/route")).status_code == 404
    assert (await client.delete("/healthz")).status_code == 405
    await client.get("/healthz")

    assert requests_counted(await scrape(client)) == {
        ("POST", "/v1/sessions", "201"): 1,
        ("POST", MESSAGES, "200"): 1,
        # A route that matched: its template, never the session id of the path.
        ("GET", "/v1/sessions/{session_id}", "404"): 1,
        ("GET", "unmatched", "404"): 1,
        ("DELETE", "unmatched", "405"): 1,
        ("GET", "/healthz", "200"): 1,
    }


async def test_the_request_id_is_echoed_when_valid_and_made_otherwise(
    client: AsyncTestClient,
) -> None:
    given = "req-42_A.b"
    ok = await client.get("/healthz", headers={"X-Request-ID": given})
    assert ok.headers["x-request-id"] == given
    not_found = await client.get("/no/such/route", headers={"X-Request-ID": given})
    assert (not_found.status_code, not_found.headers["x-request-id"]) == (404, given)
    refused = await client.post("/v1/sessions", json={}, headers={"X-Request-ID": given})
    assert (refused.status_code, refused.headers["x-request-id"]) == (422, given)

    made = []
    for bad in ("", "a" * 129, "has space", "semi;colon", "ünïcode".encode(), None):
        headers = {"X-Request-ID": bad} if bad is not None else {}
        response = await client.get("/healthz", headers=headers)
        assert HEX_ID.fullmatch(response.headers["x-request-id"]), bad
        made.append(response.headers["x-request-id"])
    assert len(set(made)) == len(made)
    longest = "x" * 128
    assert (await client.get("/healthz", headers={"X-Request-ID": longest})).headers[
        "x-request-id"
    ] == longest


async def test_a_stream_carries_the_request_id(client: AsyncTestClient) -> None:
    session = await create_session(client)
    response = await client.post(
        MESSAGES.format(session_id=session["id"]),
        json={"content": "hello there", "stream": True},
        headers={"X-Request-ID": "stream-1"},
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-request-id"] == "stream-1"
    assert "event: done" in response.text


@pytest.fixture
def restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.mark.usefixtures("restore_logging")
async def test_each_request_logs_one_line_with_its_id_as_do_the_lines_it_causes(
    client: AsyncTestClient, engine: ScriptedEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    # The service's own configuration, writing to this test's captured stderr.
    configure_logging("info")
    session = await create_session(client)
    engine.fail_with = EngineError("the engine is down")
    path = MESSAGES.format(session_id=session["id"])
    response = await client.post(
        path, json={"content": "hello there"}, headers={"X-Request-ID": "trace-7"}
    )
    assert response.status_code == 503

    lines = [line for line in capsys.readouterr().err.splitlines() if "request_id=trace-7" in line]
    # Lines logged inside the request carry its id: here the error handler's.
    assert [line for line in lines if "engine_failed" in line] != []
    assert [line for line in lines if "http_request" in line] == [lines[-1]]
    for field in ("method=POST", f"path={path}", f"route={MESSAGES}", "status=503"):
        assert field in lines[-1], field
    assert re.search(r"duration_ms=\d+(\.\d)?( |$)", lines[-1]), lines[-1]


async def test_readyz_reports_each_dependency(client: AsyncTestClient) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert re.fullmatch(r"ok \(\d+ MiB free\)", body["checks"].pop("disk"))
    assert body == {
        "status": "ready",
        "checks": {
            "database": "ok",
            "embedder": "hash-64",
            "engine": "scripted",
            "index": "ok",
            "knowledge_index": "ok",
        },
    }


async def test_a_vector_store_that_is_down_makes_the_service_not_ready(
    tmp_path: Path, sqlite_url: str
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    app = create_app(
        Settings(data_dir=tmp_path, database_url=sqlite_url, chroma_url=down),
        embedder=HashEmbedder(),
        engine=ScriptedEngine(),
    )
    async with local_client(app) as client:
        response = await client.get("/readyz")
        assert response.status_code == 503
        body = response.json()
        assert body["status"] == "not ready"
        knowledge = body["checks"].pop("knowledge_index")
        assert knowledge.startswith("error: the Chroma vector store failed"), knowledge
        assert body["checks"].pop("disk").startswith("ok (")
        assert body["checks"] == {
            "database": "ok",
            "embedder": "hash-64",
            "engine": "scripted",
            "index": "ok",
        }
        # The scrape needs no vector store: no knowledge scope is open yet.
        samples = await scrape(client)
        assert value(samples, "memchat_index_vectors", index="turns") == 0
        assert value(samples, "memchat_index_vectors", index="knowledge") == 0


async def failing_size() -> int:
    raise IndexUnavailableError("the Chroma vector store failed: gone")


def size_of(num_vectors: int):
    async def size() -> int:
        return num_vectors

    return size


async def test_an_index_size_that_cannot_be_read_is_left_out() -> None:
    metrics = ServiceMetrics()
    runtime = SimpleNamespace(
        engine=ScriptedEngine(),
        turns=SimpleNamespace(num_pending=0, max_pending=8),
        memory=SimpleNamespace(num_vectors=size_of(3)),
        knowledge=SimpleNamespace(num_vectors=size_of(5)),
    )
    samples = parse(await metrics.render(runtime))  # type: ignore[arg-type]
    assert value(samples, "memchat_index_vectors", index="turns") == 3
    assert value(samples, "memchat_index_vectors", index="knowledge") == 5
    runtime.knowledge.num_vectors = failing_size
    samples = parse(await metrics.render(runtime))  # type: ignore[arg-type]
    assert value(samples, "memchat_index_vectors", index="turns") == 3
    assert value(samples, "memchat_index_vectors", index="knowledge") is None
