"""Text that makes a backtracking regular expression slow, sent to a real server: each
request gets its proper answer, and `/healthz` keeps answering while it is processed
(background fact extraction and chunking included), on SQLite and PostgreSQL.

The liveness bound (a few seconds per /healthz) is generous: before these patterns were
made linear, each of these requests froze the whole process for 10 s to hours.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from app.factory import create_app
from app.settings import Settings
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import live_server

# Far above what /healthz takes on a loaded machine, far below a frozen event loop.
HEALTHZ_BOUND_S = 3.0
DEADLINE_S = 120.0


async def _healthz(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz", timeout=DEADLINE_S)
    assert response.status_code == 200, response.text


async def _while_answering(
    client: httpx.AsyncClient, work: Awaitable[Any], done: Callable[[], Awaitable[bool]]
) -> Any:
    """Run `work` (a request), asking /healthz over and over until it has answered and
    `done()` says its background work is over: no two answers of /healthz may lie more
    than HEALTHZ_BOUND_S apart. The gap, not each request's own time, is what counts:
    the server runs in this process, so a regular expression holding the GIL stalls
    this loop wherever it is, most often in its sleep."""
    task = asyncio.ensure_future(work)
    widest = 0.0
    last = time.monotonic()
    deadline = last + DEADLINE_S
    while not task.done() or not await done():
        assert time.monotonic() < deadline, "the request's work did not finish"
        await _healthz(client)
        now = time.monotonic()
        widest, last = max(widest, now - last), now
        await asyncio.sleep(0.05)
    await _healthz(client)
    widest = max(widest, time.monotonic() - last)
    assert widest < HEALTHZ_BOUND_S, f"/healthz was silent for {widest:.1f} s"
    return task.result()


async def _answered() -> bool:
    return True


async def _session(client: httpx.AsyncClient, user_id: str) -> str:
    response = await client.post("/v1/sessions", json={"user_id": user_id})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def _facts(client: httpx.AsyncClient, user_id: str) -> list[tuple[str, str]]:
    response = await client.get(f"/v1/users/{user_id}/facts")
    assert response.status_code == 200, response.text
    return sorted((f["subject"], f["value"]) for f in response.json()["facts"])


def _app(settings: Settings) -> Any:
    engine = ScriptedEngine(["Noted."])
    return create_app(settings, embedder=HashEmbedder(), engine=engine)


async def test_chinese_adverbs_in_imported_history(settings: Settings) -> None:
    """28 x 刚 then X: the Chinese fact rules backtracked through every split of the run."""
    with live_server(_app(settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
            session = await _session(client, "u")
            attack = {"role": "user", "content": "刚" * 28 + "X"}
            # A fact after it: once extracted, the attack message has been read too.
            after = {"role": "user", "content": "我叫小明"}

            async def extracted() -> bool:
                return await _facts(client, "u") == [("name", "小明")]

            response = await _while_answering(
                client,
                client.post(f"/v1/sessions/{session}/history", json={"messages": [attack, after]}),
                extracted,
            )
            assert response.status_code == 201, response.text
            assert response.json() == {"imported": 2, "skipped": 0}


async def test_fact_of_many_line_breaks(settings: Settings) -> None:
    """700 line breaks then x, stated as a fact: the instruction filter's role-line
    patterns (retrieval/facts/model.py) were cubic in a run of line breaks."""
    with live_server(_app(settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
            response = await _while_answering(
                client,
                client.post("/v1/users/u/facts", json={"text": "\n" * 700 + "x"}),
                _answered,
            )
            assert response.status_code == 201, response.text
            fact = response.json()
            assert (fact["text"].strip(), fact["pinned"]) == ("x", False)


async def test_knowledge_heading_of_many_hashes(settings: Settings) -> None:
    """A 30,000-character heading line of "# # # ...": the heading pattern was quadratic."""
    with live_server(_app(settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
            text = "# " + "# " * 15000 + "x\n\nbody"
            document: dict[str, Any] = {}

            async def processed() -> bool:
                answer = await client.get(f"/v1/knowledge/{document['id']}")
                assert answer.status_code == 200, answer.text
                return bool(answer.json()["status"] != "processing")

            async def add() -> httpx.Response:
                response = await client.post("/v1/knowledge", json={"title": "t", "text": text})
                document.update(response.json())
                return response

            response = await _while_answering(client, add(), processed)
            assert response.status_code == 201, response.text
            stored = (await client.get(f"/v1/knowledge/{document['id']}")).json()
            assert (stored["status"], stored["num_chunks"]) == ("ready", 1)


async def test_openai_history_over_the_limit_is_refused_first(settings: Settings) -> None:
    """8,000 messages against a session of 8,000: refused (the OpenAI error body, 400)
    before the session is read or matched. The history differs from the session halfway,
    so trying every overlap size compared 16 million message pairs."""
    with live_server(_app(settings)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
            session = await _session(client, "u")
            # Blanks around the text: each comparison strips two copies of it.
            stored = [{"role": "user", "content": " " + "m" * 380 + " "}] * 8000
            for start in range(0, len(stored), 1000):
                imported = await client.post(
                    f"/v1/sessions/{session}/history",
                    json={"messages": stored[start : start + 1000]},
                )
                assert imported.status_code == 201, imported.text
            history = [*stored[:4000], {"role": "user", "content": "x"}, *stored[:3998]]
            sent = [*history, {"role": "user", "content": "hi"}]
            assert len(sent) == 8000
            response = await _while_answering(
                client,
                client.post(
                    "/v1/chat/completions",
                    json={"model": "memchat", "user": "u", "messages": sent},
                    headers={"X-Memchat-Session-Id": session},
                ),
                _answered,
            )
            assert response.status_code == 400, response.text
            assert response.json() == {
                "error": {
                    "message": "messages: 7999 messages in one import; the limit is 1000",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": None,
                }
            }
