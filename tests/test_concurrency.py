"""Concurrency over a real server: per-session order, a bounded engine queue."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from app.factory import create_app
from app.settings import ChatSettings, Settings
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import live_server


@pytest.fixture
def busy_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"chat": ChatSettings(max_pending_turns=2)})


async def new_session(client: httpx.AsyncClient, user_id: str) -> str:
    response = await client.post("/v1/sessions", json={"user_id": user_id})
    return str(response.json()["id"])


async def test_full_engine_queue_answers_503_and_stores_nothing(
    busy_settings: Settings, embedder: HashEmbedder, engine: ScriptedEngine
) -> None:
    engine.gate = threading.Event()
    app = create_app(busy_settings, embedder=embedder, engine=engine)
    with live_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            sessions = [await new_session(client, f"user{i}") for i in range(3)]
            waiting = [
                asyncio.create_task(
                    client.post(f"/v1/sessions/{s}/messages", json={"content": f"hello {s}"})
                )
                for s in sessions[:2]
            ]
            async with asyncio.timeout(30):
                while len(engine.prompts) < 2:  # both turns have reached the engine
                    await asyncio.sleep(0.02)
            refused = await client.post(
                f"/v1/sessions/{sessions[2]}/messages", json={"content": "me too"}
            )
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "2"
            assert refused.headers["x-should-retry"] == "true"  # nothing was done
            assert refused.headers["content-type"].startswith("application/problem+json")
            assert "nothing was stored" in refused.json()["detail"]
            stored = await client.get(f"/v1/sessions/{sessions[2]}/messages")
            assert stored.json() == {"messages": []}

            engine.gate.set()
            assert [(await t).status_code for t in waiting] == [200, 200]
            admitted = await client.post(
                f"/v1/sessions/{sessions[2]}/messages", json={"content": "me too"}
            )
            assert admitted.status_code == 200


async def test_concurrent_messages_to_one_session_are_serialised(
    settings: Settings, embedder: HashEmbedder, engine: ScriptedEngine
) -> None:
    app = create_app(settings, embedder=embedder, engine=engine)
    with live_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            session = await new_session(client, "alice")
            texts = [f"message number {i}" for i in range(6)]
            responses = await asyncio.gather(
                *(
                    client.post(f"/v1/sessions/{session}/messages", json={"content": t})
                    for t in texts
                )
            )
            assert [r.status_code for r in responses] == [200] * 6
            stored = (await client.get(f"/v1/sessions/{session}/messages")).json()["messages"]
    assert [m["seq"] for m in stored] == list(range(1, 13))
    assert [m["role"] for m in stored] == ["user", "assistant"] * 6
    # Each turn saw every earlier turn of the session, replies included.
    for turn, prompt in enumerate(engine.prompts):
        window = [m.content for m in prompt[1:-1] if m.role != "system"]
        assert window == [m["content"] for m in stored[: 2 * turn]]
