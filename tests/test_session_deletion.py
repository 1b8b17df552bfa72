"""Deleting a session leaves nothing of its text, on SQLite and PostgreSQL, on every
surface: search, the context preview and stored messages of the user's other sessions, a
new turn's report, the OpenAI endpoint's answer, MCP, facts and their history, the admin
API and page, `memchat export`; then, after a restart, in no file of the data directory
(the SQLite file included: its connections zero deleted content, `secure_delete`) and in
no row of any table.

The marker is said in the deleted session, in a statement that yields no fact (a locker
code) and in one that does (an allergy: retired, its text redacted); a name said in both
sessions stays a fact with only the kept session's source. A question in the other
session retrieves the locker code first, so that session's stored context quotes it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import select

from app.factory import create_app
from app.settings import Settings
from retrieval.indexes.faiss import FaissIndex
from retrieval.prompt.render import CONTEXT_CLOSE, CONTEXT_OPEN, NEW_FACTS_HEADER
from retrieval.search.memory import RetrievalConfig, TurnMemory
from storage.db import Database, create_engine
from storage.facts import RETIRED_TEXT
from storage.models import Base
from storage.records import NewTurn
from storage.repositories import Repositories
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import MEMCHAT, cli_env, live_server
from tests.test_access import Keys, bearer, make_keys

MARKER = "DELSESSW3V8"
LOCKER = f"My locker code is {MARKER}."
ALLERGY = f"I am allergic to {MARKER} berries."
NAME = "My name is Kestrel."
QUESTION = "What is my locker code again?"
# Replies that never repeat what the user said (a reply quoting the deleted session
# would be the other session's own text).
REPLIES = ["Noted."]


def holds_marker(data: str | bytes) -> bool:
    """The marker in any case: the lexical index keeps its terms lower-cased."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return MARKER.lower() in text.lower()


@pytest.fixture
async def keys(database_url: str) -> Keys:
    return await make_keys(database_url)


async def turn(rest: httpx.AsyncClient, session_id: str, text: str) -> dict[str, Any]:
    answer = await rest.post(f"/v1/sessions/{session_id}/messages", json={"content": text})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def wait_for_facts(rest: httpx.AsyncClient, num_names: int) -> dict[str, dict[str, Any]]:
    """The allergy and the name (said `num_names` times), once background extraction has
    read them."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        facts = (await rest.get("/v1/users/dana/facts")).json()["facts"]
        by_subject = {f["subject"].partition(":")[0]: f for f in facts}
        name = by_subject.get("name")
        if "allergy" in by_subject and name and len(name["source_message_ids"]) == num_names:
            return by_subject
        await asyncio.sleep(0.1)
    raise AssertionError(f"facts not extracted: {facts!r}")


async def mcp_answers(base: str, key: str, session_id: str) -> list[Any]:
    async with (
        httpx2.AsyncClient(headers=bearer(key), timeout=30) as http,
        Client(streamable_http_client(f"{base}/mcp", http_client=http)) as agent,
    ):
        calls = [
            ("search_memory", {"user_id": "dana", "query": f"locker code {MARKER} allergic"}),
            ("list_facts", {"user_id": "dana"}),
            ("list_facts", {"user_id": "dana", "status": "deleted"}),
            ("recent_turns", {"session_id": session_id}),
            ("list_sessions", {"user_id": "dana"}),
        ]
        answers = []
        for tool, arguments in calls:
            result = await agent.call_tool(tool, arguments)
            assert not result.is_error, result
            answers.append(result.structured_content)
        return answers


def export_user(settings: Settings) -> str:
    env = cli_env(settings.data_dir) | {"MEMCHAT_DATABASE_URL": settings.resolved_database_url()}
    done = subprocess.run(
        [*MEMCHAT, "export", "--user-id", "dana", "--tenant", "acme", "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout


async def rows_holding_marker(url: str) -> list[str]:
    """Every row of every table, as text, that holds the marker."""
    engine = create_engine(url)
    found = []
    try:
        async with engine.connect() as connection:
            for table in Base.metadata.sorted_tables:
                for row in (await connection.execute(select(table))).all():
                    text = json.dumps([repr(value) for value in row])
                    if holds_marker(text):
                        found.append(f"{table.name}: {text}")
    finally:
        await engine.dispose()
    return found


def files_holding_marker(directory: Path) -> list[str]:
    """Files holding the marker in any case, as UTF-8 or as the UTF-32 that numpy writes
    strings in (the lexical snapshots)."""
    needles = [MARKER.lower().encode(encoding) for encoding in ("utf-8", "utf-32-le")]
    return sorted(
        str(path.relative_to(directory))
        for path in directory.rglob("*")
        if path.is_file() and any(needle in path.read_bytes().lower() for needle in needles)
    )


async def fill(rest: httpx.AsyncClient) -> tuple[str, str, dict[str, dict[str, Any]]]:
    """Two sessions of dana; the second's stored context quotes the first."""
    first = (await rest.post("/v1/sessions", json={"user_id": "dana"})).json()["id"]
    second = (await rest.post("/v1/sessions", json={"user_id": "dana"})).json()["id"]
    for text in (LOCKER, ALLERGY, NAME):
        await turn(rest, first, text)
    await wait_for_facts(rest, 1)
    # The name said again: its context shows both new facts and the first session's turns.
    await turn(rest, second, NAME)
    facts = await wait_for_facts(rest, 2)
    asked = await turn(rest, second, QUESTION)
    assert holds_marker(json.dumps(asked["context"]))
    preview = await rest.post(f"/v1/sessions/{second}/context", json={"content": "Thanks."})
    assert holds_marker(preview.text)  # the question's stored context quotes the code
    return first, second, facts


async def test_a_deleted_session_leaves_nothing_of_its_text(
    settings: Settings, keys: Keys, tmp_path: Path
) -> None:
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(REPLIES))
    with live_server(app) as base:
        async with httpx.AsyncClient(base_url=base, headers=bearer(keys.a), timeout=60) as rest:
            first, second, facts = await fill(rest)
            deleted_ids = {
                m["id"]
                for m in (await rest.get(f"/v1/sessions/{first}/messages")).json()["messages"]
            }
            kept = (await rest.get(f"/v1/sessions/{second}/messages")).json()["messages"]
            assert (await rest.delete(f"/v1/sessions/{first}")).status_code == 204
            assert files_holding_marker(tmp_path) == []

            assert (await rest.get(f"/v1/sessions/{first}/messages")).status_code == 404
            answers = await rest_answers(rest, second)
            messages = (await rest.get(f"/v1/sessions/{second}/messages")).json()["messages"]
            assert [(m["id"], m["content"]) for m in messages[:4]] == [
                (m["id"], m["content"]) for m in kept
            ]
            await check_facts(rest, facts, messages[0]["id"])
            answers += await openai_answers(base, keys.a)
        answers += await mcp_answers(base, keys.a, second)
        admin, stored = await admin_answers(base, keys.admin, first, second)
        answers += admin
        check_contexts(stored, facts["name"], deleted_ids)
        answers.append(export_user(settings))
        leaks = [answer for answer in answers if holds_marker(json.dumps(answer))]
        assert leaks == []

    # A fresh process on the same data: it opens the user's saved indexes.
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(REPLIES))
    with live_server(app) as base:
        async with httpx.AsyncClient(base_url=base, headers=bearer(keys.a), timeout=60) as rest:
            found = await rest.post(
                "/v1/memory/search", json={"user_id": "dana", "query": "locker code"}
            )
            assert found.status_code == 200 and not holds_marker(found.text)
    assert await rows_holding_marker(settings.resolved_database_url()) == []
    assert (settings.data_dir / "index" / "bm25").is_dir()
    assert files_holding_marker(tmp_path) == []


async def rest_answers(rest: httpx.AsyncClient, second: str) -> list[Any]:
    """What the REST API answers about the user after the deletion."""
    searched = await rest.post(
        "/v1/memory/search",
        json={"user_id": "dana", "query": f"locker code {MARKER} allergic berries", "k": 50},
    )
    preview = await rest.post(f"/v1/sessions/{second}/context", json={"content": QUESTION})
    new_turn = await turn(rest, second, QUESTION)
    answers = [searched, preview]
    answers += [
        await rest.get(path)
        for path in (
            f"/v1/sessions/{second}/messages",
            f"/v1/sessions/{second}/summaries",
            "/v1/sessions?user_id=dana",
            "/v1/users/dana/facts?status=all&include=history",
        )
    ]
    assert [a.status_code for a in answers] == [200] * len(answers)
    return [new_turn, *(a.json() for a in answers)]


async def check_facts(rest: httpx.AsyncClient, facts: dict[str, Any], kept_source: int) -> None:
    """The allergy, said only in the deleted session, is retired with its history, its
    text redacted; the name, said in both, stays with the kept session's source."""
    listed = (await rest.get("/v1/users/dana/facts?status=all&include=history")).json()["facts"]
    by_id = {f["id"]: f for f in listed}
    allergy, name = by_id[facts["allergy"]["id"]], by_id[facts["name"]["id"]]
    assert (allergy["status"], allergy["text"], allergy["subject"], allergy["value"]) == (
        "deleted",
        RETIRED_TEXT,
        "allergy",
        RETIRED_TEXT,
    )
    assert allergy["source_message_ids"] == []
    assert [(c["action"], c["actor"]) for c in allergy["history"]] == [
        ("created", "extractor:rules"),
        ("retired", "session-deletion"),
    ]
    assert (name["status"], name["text"], name["source_message_ids"]) == (
        "active",
        facts["name"]["text"],
        [kept_source],
    )
    assert [c["action"] for c in name["history"]][-1] == "sources_removed"
    active = (await rest.get("/v1/users/dana/facts")).json()["facts"]
    assert [f["id"] for f in active] == [name["id"]]


def check_contexts(
    stored: list[dict[str, Any]], name: dict[str, Any], deleted_ids: set[int]
) -> None:
    """The stored context of the name said again showed the deleted turns and both new
    facts: only the name is left, under its section. The question's showed only deleted
    turns: it is gone."""
    assert not deleted_ids & {i for m in stored for i in m["memory_ids"]}
    again = stored[0]
    assert again["message"]["content"] == NAME
    assert (again["memory_ids"], again["fact_ids"]) == ([], [name["id"]])
    [note] = again["context_note"]
    lines = note.split("\n")
    assert lines[:3] == [CONTEXT_OPEN, "", NEW_FACTS_HEADER]
    assert lines[3].startswith(f'- "{name["text"]}" (stated ')
    assert lines[4:] == ["", CONTEXT_CLOSE]
    assert [m["context_note"] for m in stored[1:]] == [[]] * 5


async def openai_answers(base: str, key: str) -> list[Any]:
    async with httpx.AsyncClient(base_url=base, headers=bearer(key), timeout=60) as client:
        answer = await client.post(
            "/v1/chat/completions",
            json={
                "model": "memchat",
                "user": "dana",
                "messages": [{"role": "user", "content": QUESTION}],
            },
        )
    assert answer.status_code == 200, answer.text
    return [answer.json()]


async def admin_answers(
    base: str, key: str, first: str, second: str
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The admin API and page on the user, and the kept session's messages as the admin
    API shows them (with their stored contexts)."""
    async with httpx.AsyncClient(base_url=base, headers=bearer(key), timeout=60) as admin:
        users = (await admin.get("/admin/v1/users", params={"tenant": "acme"})).json()["users"]
        pk = next(u["id"] for u in users if u["user_id"] == "dana")
        gone = [
            await admin.get(f"/admin/v1/users/{pk}/sessions/{first}/messages"),
            await admin.get(f"/admin/users/{pk}/sessions/{first}"),
        ]
        assert [a.status_code for a in gone] == [404, 404]
        answers = [
            await admin.get(path)
            for path in (
                f"/admin/v1/users/{pk}",
                f"/admin/v1/users/{pk}/sessions/{second}/messages",
                f"/admin/v1/users/{pk}/facts?status=all",
                f"/admin/v1/users/{pk}/summaries",
                f"/admin/users/{pk}",
                f"/admin/users/{pk}/sessions/{second}",
            )
        ]
    assert [a.status_code for a in answers] == [200] * len(answers)
    messages = answers[1].json()["messages"]
    assert [m["message"]["role"] for m in messages] == ["user", "assistant"] * 3
    return [a.text for a in answers], messages


async def test_a_context_showing_a_message_deleted_meanwhile_is_not_stored(
    database_url: str,
) -> None:
    """A turn that retrieved a message before its session was deleted and stores its
    context after: that context is dropped, another turn's is kept."""
    engine = create_engine(database_url)
    repos = Repositories.of(Database(engine))
    try:
        first, _ = await repos.sessions.create_session("dana", None, {}, tenant_id=1)
        second, _ = await repos.sessions.create_session("dana", None, {}, tenant_id=1)
        [said] = (await repos.messages.append(first, [NewTurn("user", LOCKER)])).turns
        [kept] = (await repos.messages.append(second, [NewTurn("user", NAME)])).turns
        await repos.sessions.delete_session(first.id)
        late = NewTurn(
            "user",
            QUESTION,
            context_note=[f"quoting {LOCKER}"],
            context_note_tokens=9,
            context_note_ids=[kept.id, said.id],
            context_note_fact_ids=[],
        )
        other = NewTurn(
            "user", QUESTION, context_note=[f"quoting {NAME}"], context_note_ids=[kept.id]
        )
        await repos.messages.append(second, [late, other])
        stored = await repos.messages.list_messages(second.id)
        assert [(t.content, t.context_note, t.context_note_ids) for t in stored] == [
            (NAME, None, None),
            (QUESTION, None, None),
            (QUESTION, [f"quoting {NAME}"], [kept.id]),
        ]
        assert stored[1].context_note_tokens == 0
    finally:
        await engine.dispose()


async def test_another_process_drops_the_turns_and_their_words_at_its_next_search(
    database_url: str, tmp_path: Path
) -> None:
    """Two processes on one database: the one that did not delete catches up at its next
    search (the user's change count) and its saved lexical snapshot holds none of the
    deleted words either."""
    engine = create_engine(database_url)
    repos = Repositories.of(Database(engine))
    files = tmp_path / "processes"

    def process(name: str) -> TurnMemory:
        embedder = HashEmbedder()
        return TurnMemory(
            repos.messages,
            repos.embeddings,
            embedder,
            FaissIndex(files / name / "faiss", embedder.dimension),
            RetrievalConfig(),
            snapshot_dir=files / name / "bm25",
        )

    try:
        deleting, other = process("a"), process("b")
        first, user = await repos.sessions.create_session("dana", None, {}, tenant_id=1)
        second, _ = await repos.sessions.create_session("dana", None, {}, tenant_id=1)
        [said] = (await repos.messages.append(first, [NewTurn("user", LOCKER)])).turns
        [kept] = (await repos.messages.append(second, [NewTurn("user", NAME)])).turns
        await deleting.index([said, kept], fresh=True)
        query = f"locker code {MARKER}"
        vector = await other.embed_query(user.id, query)
        found = await other.search(user.id, vector, 5, query=query)
        assert [hit.id for hit in found] == [said.id, kept.id]
        await other.save()
        assert files_holding_marker(files) == ["b/bm25/scope-1.bm25"]

        deleted = await repos.sessions.delete_session(first.id)
        await deleting.forget(user.id, deleted.message_ids)
        version = await repos.embeddings.get_memory_version(user.id)
        found = await other.search(user.id, vector, 5, query=query, version=version)
        assert [hit.id for hit in found] == [kept.id]
        await other.save()
        assert files_holding_marker(files) == []
    finally:
        await engine.dispose()
