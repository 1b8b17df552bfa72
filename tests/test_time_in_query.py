"""A query that names a time ("last week", "on 13 October 2023", 上周, 2023年5月): the span
it names, exactly, in English and Chinese; and through the API with the default models,
the turns said then ranked first and the exact prompt a message asking so is sent with.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.settings import FactSettings, RetrievalSettings, Settings
from retrieval.prompt.render import CONTEXT_CLOSE, CONTEXT_OPEN, MEMORY_HEADER, day_of
from retrieval.protocols import Embedder
from retrieval.search.when import Span, time_span
from tests.clients import local_client
from tests.fakes import ScriptedEngine

# A Wednesday.
NOW = dt.datetime(2026, 3, 18, 12, 0, tzinfo=dt.UTC)


def days(start: str, end: str) -> Span:
    return Span(
        dt.datetime.fromisoformat(start).replace(tzinfo=dt.UTC),
        dt.datetime.fromisoformat(end).replace(tzinfo=dt.UTC),
    )


@pytest.mark.parametrize(
    ("query", "span"),
    [
        ("What painting did she show on October 13, 2023?", days("2023-10-13", "2023-10-14")),
        ("What did she ask on 13 March, 2023?", days("2023-03-13", "2023-03-14")),
        ("Where did he fly on 1st September 2023?", days("2023-09-01", "2023-09-02")),
        ("What did Dave open in May 2023?", days("2023-05-01", "2023-06-01")),
        ("Which cities did Dave visit in 2023?", days("2023-01-01", "2024-01-01")),
        ("what did I cook last week?", days("2026-03-09", "2026-03-16")),
        ("where did we go last weekend", days("2026-03-14", "2026-03-16")),
        ("what did I read last month", days("2026-02-01", "2026-03-01")),
        ("what did I do last May?", days("2025-05-01", "2025-06-01")),
        ("where was I last summer?", days("2025-06-01", "2025-09-01")),
        ("what did I buy in June", days("2025-06-01", "2025-07-01")),
        ("what did I say two weeks ago", days("2026-03-02", "2026-03-09")),
        ("the doctor I saw 3 days ago", days("2026-03-15", "2026-03-16")),
        ("what did I eat yesterday?", days("2026-03-17", "2026-03-18")),
        ("我去年夏天去了哪里？", days("2025-06-01", "2025-09-01")),
        ("我上周做了什么菜？", days("2026-03-09", "2026-03-16")),
        ("上个月我读了什么书？", days("2026-02-01", "2026-03-01")),
        ("我2023年5月在哪里？", days("2023-05-01", "2023-06-01")),
        ("2023年10月13日她展示了什么画？", days("2023-10-13", "2023-10-14")),
        ("我十二月去了哪里？", days("2025-12-01", "2026-01-01")),
        ("三天前我看了哪个医生？", days("2026-03-15", "2026-03-16")),
        ("两周前我说了什么？", days("2026-03-02", "2026-03-09")),
        ("我昨天吃了什么？", days("2026-03-17", "2026-03-18")),
        ("我今年去了哪些城市？", days("2026-01-01", "2027-01-01")),
        # Several times: the span covers them all.
        ("in May 2023 and in August 2023", days("2023-05-01", "2023-09-01")),
    ],
)
def test_the_span_a_query_names(query: str, span: Span) -> None:
    assert time_span(query, NOW) == span


@pytest.mark.parametrize(
    "query",
    [
        "what am I allergic to?",
        "this may help",
        "how are you today?",
        "What did she paint on February 30, 2023?",
        "我对什么过敏？",
        "岁月静好，月亮很圆。",
    ],
)
def test_a_query_naming_no_time_has_no_span(query: str) -> None:
    assert time_span(query, NOW) is None


@given(
    st.lists(
        st.sampled_from(
            [
                *"0123456789 ,.年月日号天周前个份去今上这本一二两三四五六七八九十",
                " May ",
                " last ",
                " ago ",
                " days ",
                " in ",
                " on ",
                " 9999",
                " of ",
            ]
        ),
        max_size=24,
    ).map("".join)
)
def test_any_text_gives_a_span_or_none(text: str) -> None:
    span = time_span(text, NOW)
    assert span is None or span.start < span.end


@pytest.mark.parametrize(
    ("query", "span"),
    [
        ("二十天前我去了哪里？", days("2026-02-26", "2026-02-27")),
        ("二十五年前", days("2001-01-01", "2002-01-01")),
    ],
)
def test_chinese_numbers_of_two_and_three_numerals(query: str, span: Span) -> None:
    assert time_span(query, NOW) == span


@pytest.mark.parametrize("query", ["9999年12月", "0000年", "五五月", "2023年13月", "三十月"])
def test_no_calendar_has_it(query: str) -> None:
    assert time_span(query, NOW) is None


def wednesday_before(now: dt.datetime, weeks: int) -> dt.datetime:
    """10:00 UTC on the Wednesday of the week `weeks` before this one."""
    today = dt.datetime(now.year, now.month, now.day, 10, 0, tzinfo=dt.UTC)
    monday = today - dt.timedelta(days=today.weekday())
    return monday - dt.timedelta(weeks=weeks) + dt.timedelta(days=2)


@asynccontextmanager
async def default_service(
    settings: Settings, first: Embedder, second: Embedder, retrieval: RetrievalSettings
) -> AsyncIterator[AsyncTestClient]:
    """The service on both default embedders, with these retrieval settings and no fact
    extraction."""
    quiet = settings.model_copy(
        update={"facts": FactSettings(extractor="none"), "retrieval": retrieval}
    )
    app = create_app(quiet, embedder=first, second_embedder=second, engine=ScriptedEngine(["Ok."]))
    async with local_client(app) as client:
        yield client


async def import_session(client: AsyncTestClient, user_id: str, when: dt.datetime, turns) -> None:
    session = (await client.post("/v1/sessions", json={"user_id": user_id})).json()
    messages = [
        {
            "role": role,
            "content": text,
            "external_id": external_id,
            "created_at": (when + dt.timedelta(minutes=position)).isoformat(),
        }
        for position, (external_id, role, text) in enumerate(turns)
    ]
    response = await client.post(
        f"/v1/sessions/{session['id']}/history", json={"messages": messages}
    )
    assert response.status_code == 201, response.text


STORES = {
    "en": (
        [("old-hike", "user", "I went hiking in Yosemite with my brother."),
         ("old-reply", "assistant", "Yosemite is beautiful in that season.")],
        [("new-hike", "user", "Jo and I walked the trail up Mount Tam."),
         ("new-reply", "assistant", "Mount Tam has great views of the bay.")],
        "Where did I go hiking last week?",
    ),
    "zh": (
        [("old-hike", "user", "我和哥哥去黄山爬山了。"),
         ("old-reply", "assistant", "黄山的风景很美。")],
        [("new-hike", "user", "我和小王去香山爬山了。"),
         ("new-reply", "assistant", "香山的红叶很有名。")],
        "我上周去哪里爬山了？",
    ),
}  # fmt: skip


async def search(client: AsyncTestClient, query: str) -> list[str]:
    body = {"user_id": "hiker", "query": query, "k": 4, "kinds": ["turn"]}
    response = await client.post("/v1/memory/search", json=body)
    assert response.status_code == 200, response.text
    return [hit["external_id"] for hit in response.json()["results"]]


@pytest.mark.model
@pytest.mark.parametrize(
    ("language", "boosted", "plain"),
    [
        # A question about the user: the user's statements before the replies, each
        # raised by the time it names (last week's walk from third to second; 香山 first).
        (
            "en",
            ["old-hike", "new-hike", "old-reply", "new-reply"],
            ["old-hike", "old-reply", "new-hike", "new-reply"],
        ),
        (
            "zh",
            ["new-hike", "old-hike", "new-reply", "old-reply"],
            ["old-hike", "new-hike", "new-reply", "old-reply"],
        ),
    ],
)
async def test_the_turns_said_when_the_query_says_are_raised(
    settings: Settings,
    real_embedder: Embedder,
    real_second_embedder: Embedder,
    language: str,
    boosted: list[str],
    plain: list[str],
) -> None:
    old, new, question = STORES[language]
    now = dt.datetime.now(dt.UTC)
    found = {}
    for boost in (1.0, 0.0):
        retrieval = RetrievalSettings(time_boost=boost)
        async with default_service(
            settings, real_embedder, real_second_embedder, retrieval
        ) as client:
            if boost:
                await import_session(client, "hiker", wednesday_before(now, 12), old)
                await import_session(client, "hiker", wednesday_before(now, 1), new)
            found[boost] = await search(client, question)
    assert found[1.0] == boosted
    assert found[0.0] == plain


@pytest.mark.model
@pytest.mark.parametrize(("language", "new_day_first"), [("en", False), ("zh", True)])
async def test_the_prompt_of_a_message_asking_about_last_week(
    settings: Settings,
    real_embedder: Embedder,
    real_second_embedder: Embedder,
    language: str,
    new_day_first: bool,
) -> None:
    old, new, question = STORES[language]
    now = dt.datetime.now(dt.UTC)
    old_day, new_day = wednesday_before(now, 12), wednesday_before(now, 1)
    retrieval = RetrievalSettings(time_boost=1.0)
    async with default_service(settings, real_embedder, real_second_embedder, retrieval) as client:
        await import_session(client, "hiker", old_day, old)
        await import_session(client, "hiker", new_day, new)
        session = (await client.post("/v1/sessions", json={"user_id": "hiker"})).json()
        response = await client.post(
            f"/v1/sessions/{session['id']}/context", json={"content": question}
        )
    assert response.status_code == 200, response.text
    last = response.json()["messages"][-1]["content"]
    (_, _, new_user), (_, _, new_reply) = new
    (_, _, old_user), (_, _, old_reply) = old
    # The days in the order of their best memory (the search's, above), each day's
    # memories as they were said.
    newer = f'[{day_of(new_day)}]\n- user: "{new_user}"\n- assistant: "{new_reply}"\n'
    older = f'[{day_of(old_day)}]\n- user: "{old_user}"\n- assistant: "{old_reply}"\n'
    memories = newer + older if new_day_first else older + newer
    assert last == f"{CONTEXT_OPEN}\n\n{MEMORY_HEADER}\n{memories}\n{CONTEXT_CLOSE}\n{question}"
