"""The admin page's audit log and a user's sessions, a page at a time on SQLite and
PostgreSQL: the first page holds exactly its entries in order and links to the next;
following the links lists every entry once; a bad cursor is refused as any bad query
value is (422, problem details)."""

from __future__ import annotations

import datetime as dt
import html
import re
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import insert

from app.api.admin_page import AUDIT_ENTRIES_PER_PAGE, SESSIONS_PER_PAGE
from app.factory import create_app
from app.settings import Settings
from storage.access import AccessRepository
from storage.db import Database, create_engine
from storage.models import ChatSession, User
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine

NUM_ENTRIES = 120
NUM_SESSIONS = 120
ENTRY = re.compile(r"<td>test\.entry</td><td>([^<]*)</td>")
OLDER = re.compile(r'<a id="older-entries" href="([^"]+)">')
MORE = re.compile(r'<a id="more-sessions" href="([^"]+)">')
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[AsyncTestClient]:
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."]))
    async with local_client(app) as test_client:
        yield test_client


def links(pattern: re.Pattern[str], page: str) -> list[str]:
    return [html.unescape(url) for url in pattern.findall(page)]


def problem(answer: httpx.Response, field: str) -> None:
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert [error["field"] for error in answer.json()["errors"]] == [field]


async def add_audit_entries(settings: Settings) -> dict[int, str]:
    """Entries whose target must be escaped, by id (written one after another: ids
    ascend)."""
    engine = create_engine(settings.resolved_database_url())
    try:
        access = AccessRepository(Database(engine))
        targets = {}
        for n in range(NUM_ENTRIES):
            entry = await access.record("ops", "test.entry", f"<b>note {n}</b> & co")
            targets[entry.id] = entry.target
        return targets
    finally:
        await engine.dispose()


async def test_the_audit_log_pages_back_from_the_newest_entry(
    settings: Settings, client: AsyncTestClient
) -> None:
    targets = await add_audit_entries(settings)
    newest_first = sorted(targets, reverse=True)

    first = await client.get("/admin/audit")
    assert first.status_code == 200, first.text
    shown = [html.unescape(t) for t in ENTRY.findall(first.text)]
    assert shown == [targets[i] for i in newest_first[:AUDIT_ENTRIES_PER_PAGE]]
    assert "<b>note" not in first.text and "&lt;b&gt;note 119&lt;/b&gt; &amp; co" in first.text
    assert links(OLDER, first.text) == [
        f"/admin/audit?before={newest_first[AUDIT_ENTRIES_PER_PAGE - 1]}"
    ]
    assert 'id="newest-entries"' not in first.text

    seen: list[str] = []
    url: str | None = "/admin/audit"
    num_pages = 0
    while url is not None:
        answer = await client.get(url)
        assert answer.status_code == 200, answer.text
        seen.extend(html.unescape(t) for t in ENTRY.findall(answer.text))
        num_pages += 1
        if num_pages > 1:
            assert '<a id="newest-entries" href="/admin/audit">' in answer.text
        (url,) = links(OLDER, answer.text) or [None]
    assert num_pages == 3
    assert seen == [targets[i] for i in newest_first]

    for bad in ("0", "-5", "abc", str(2**53)):
        problem(await client.get("/admin/audit", params={"before": bad}), "before")


async def add_sessions(settings: Settings) -> tuple[int, list[str], list[str]]:
    """A user with sessions (three to each instant: ties are ordered by id) and another
    user's sessions at the same instants. Their ids, as the page lists them."""
    engine = create_engine(settings.resolved_database_url())
    try:
        async with engine.begin() as connection:
            owner, other = [
                (
                    await connection.execute(
                        insert(User).values(external_id=name).returning(User.id)
                    )
                ).scalar_one()
                for name in ("owner", "other")
            ]
            rows = [
                {
                    "id": str(uuid.uuid4()),
                    "user_pk": user_pk,
                    "title": f"<i>chat {n}</i>",
                    "metadata_json": {},
                    "created_at": START + dt.timedelta(seconds=n // 3),
                }
                for n in range(NUM_SESSIONS)
                for user_pk in (owner, other)
            ]
            await connection.execute(insert(ChatSession), rows)
    finally:
        await engine.dispose()

    def listed(user_pk: int) -> list[str]:
        mine = [r for r in rows if r["user_pk"] == user_pk]
        return [r["id"] for r in sorted(mine, key=lambda r: (r["created_at"], r["id"]))]

    return owner, listed(owner), listed(other)


async def test_a_users_sessions_are_listed_a_page_at_a_time(
    settings: Settings, client: AsyncTestClient
) -> None:
    owner, ids, others = await add_sessions(settings)
    link = re.compile(rf'<a class="session-link" href="/admin/users/{owner}/sessions/([^"]+)">')
    here = f"/admin/users/{owner}"

    first = await client.get(here)
    assert first.status_code == 200, first.text
    assert link.findall(first.text) == ids[:SESSIONS_PER_PAGE]
    assert "<i>chat" not in first.text and "&lt;i&gt;chat 0&lt;/i&gt;" in first.text
    assert links(MORE, first.text) == [f"{here}?after={ids[SESSIONS_PER_PAGE - 1]}"]

    seen: list[str] = []
    url: str | None = here
    num_pages = 0
    while url is not None:
        answer = await client.get(url)
        assert answer.status_code == 200, answer.text
        seen.extend(link.findall(answer.text))
        num_pages += 1
        if num_pages > 1:
            assert f'<a id="first-sessions" href="{here}">' in answer.text
        (url,) = links(MORE, answer.text) or [None]
    assert num_pages == 3
    assert seen == ids

    # A search keeps its words on the link to more sessions.
    searched = await client.get(here, params={"q": "chat & more"})
    assert links(MORE, searched.text) == [
        f"{here}?q=chat+%26+more&after={ids[SESSIONS_PER_PAGE - 1]}"
    ]
    # Another user's session is no place in this user's list.
    elsewhere = await client.get(here, params={"after": others[0]})
    assert link.findall(elsewhere.text) == [] and "No sessions." in elsewhere.text
    for bad in ("not-a-session", "1" * 36, ids[0] + "0"):
        problem(await client.get(here, params={"after": bad}), "after")
