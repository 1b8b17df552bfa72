"""The admin overview and `GET /admin/v1/users` with 10,000 users, on SQLite and
PostgreSQL: one page of users at a time with a link (or cursor) to the next, and a
search by the start of a user's id (exact: `_` and `%` are characters, case counts)."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import insert, select

from app.api.admin_page import USERS_PER_PAGE
from app.factory import create_app
from app.settings import Settings
from storage.db import create_engine
from storage.models import User
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine

NUM_USERS = 10_000
USER_LINK = re.compile(r'<a class="user-link" href="/admin/users/(\d+)">([^<]*)</a>')
NEXT_PAGE = re.compile(r'<a id="next-page" href="([^"]+)">')


def user_id(n: int) -> str:
    return f"user-{n:05d}"


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[AsyncTestClient]:
    engine = create_engine(settings.resolved_database_url())
    async with engine.begin() as connection:
        await connection.execute(
            insert(User), [{"external_id": user_id(n)} for n in range(NUM_USERS)]
        )
    await engine.dispose()
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."] * 5))
    async with local_client(app) as test_client:
        yield test_client


async def pks_by_id(settings: Settings) -> dict[str, int]:
    engine = create_engine(settings.resolved_database_url())
    async with engine.connect() as connection:
        rows = (await connection.execute(select(User.external_id, User.id))).all()
    await engine.dispose()
    return {external_id: int(pk) for external_id, pk in rows}


def next_page(page: str) -> list[str]:
    return [html.unescape(url) for url in NEXT_PAGE.findall(page)]


def listed(page: str) -> list[tuple[int, str]]:
    return [(int(pk), name) for pk, name in USER_LINK.findall(page)]


async def test_the_overview_shows_one_page_of_users_and_a_way_to_the_next(
    client: AsyncTestClient, settings: Settings
) -> None:
    pks = await pks_by_id(settings)
    first = await client.get("/admin")
    assert first.status_code == 200, first.text
    assert listed(first.text) == [(pks[user_id(n)], user_id(n)) for n in range(USERS_PER_PAGE)]
    (next_url,) = next_page(first.text)
    assert next_url == f"/admin?after={pks[user_id(USERS_PER_PAGE - 1)]}"
    second = await client.get(next_url)
    assert listed(second.text) == [
        (pks[user_id(n)], user_id(n)) for n in range(USERS_PER_PAGE, 2 * USERS_PER_PAGE)
    ]
    assert 'id="first-page" href="/admin"' in second.text
    last = await client.get(f"/admin?after={pks[user_id(NUM_USERS - 3)]}")
    assert listed(last.text) == [(pks[user_id(n)], user_id(n)) for n in (9998, 9999)]
    assert next_page(last.text) == []


async def test_a_search_by_the_start_of_an_id_finds_the_users(
    client: AsyncTestClient, settings: Settings
) -> None:
    pks = await pks_by_id(settings)
    found = await client.get("/admin", params={"prefix": "user-0421"})
    assert listed(found.text) == [(pks[user_id(n)], user_id(n)) for n in range(4210, 4220)]
    assert next_page(found.text) == []
    one = await client.get("/admin", params={"prefix": "user-09999"})
    assert listed(one.text) == [(pks["user-09999"], "user-09999")]
    # Wildcards of SQL's LIKE are plain characters here, and case counts.
    for prefix in ("user_", "user-%", "USER-"):
        none = await client.get("/admin", params={"prefix": prefix})
        assert listed(none.text) == [] and "No user id starts with this." in none.text
    # A search that spans pages keeps its prefix on the next page's link.
    many = await client.get("/admin", params={"prefix": "user-01"})
    assert len(listed(many.text)) == USERS_PER_PAGE
    (next_url,) = next_page(many.text)
    assert next_url == f"/admin?prefix=user-01&after={pks[user_id(1000 + USERS_PER_PAGE - 1)]}"


async def test_the_admin_api_pages_users_by_cursor(
    client: AsyncTestClient, settings: Settings
) -> None:
    pks = await pks_by_id(settings)
    seen: list[str] = []
    after = 0
    while True:
        answer = await client.get("/admin/v1/users", params={"after": after})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        seen.extend(u["user_id"] for u in page["users"])
        if page["next_after"] is None:
            break
        assert len(page["users"]) == 1000 and page["next_after"] == page["users"][-1]["id"]
        after = page["next_after"]
    assert seen == [user_id(n) for n in range(NUM_USERS)]
    searched = await client.get("/admin/v1/users", params={"prefix": "user-0777", "limit": 3})
    body = searched.json()
    assert [u["user_id"] for u in body["users"]] == ["user-07770", "user-07771", "user-07772"]
    assert body["next_after"] == pks["user-07772"]
    bad = await client.get("/admin/v1/users", params={"limit": 0})
    assert bad.status_code == 422 and bad.headers["content-type"].startswith(
        "application/problem+json"
    )
