"""A new user's first turns, through the API with the service's defaults and its default
embedders (all-MiniLM-L6-v2 and multilingual-e5-small): a constraint stated once is found
again, in English, in Chinese and across the two.

The stores are four turns of one user, the statement first, small talk or a question
and its answer after it. Exact orders of all four turns.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.settings import FactSettings, Settings
from retrieval.protocols import Embedder
from tests.clients import local_client
from tests.fakes import ScriptedEngine

pytestmark = pytest.mark.model

START = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)


@pytest.fixture
def embedders(real_embedder: Embedder, real_second_embedder: Embedder) -> tuple[Embedder, Embedder]:
    return real_embedder, real_second_embedder


@asynccontextmanager
async def default_service(
    settings: Settings, embedders: tuple[Embedder, Embedder]
) -> AsyncIterator[AsyncTestClient]:
    """The service with its default embedders (loaded once per run), no fact extraction."""
    quiet = settings.model_copy(update={"facts": FactSettings(extractor="none")})
    first, second = embedders
    app = create_app(
        quiet, embedder=first, second_embedder=second, engine=ScriptedEngine(["Noted."])
    )
    async with local_client(app) as client:
        yield client


MIXED = [
    "I am allergic to peanuts. 我对花生过敏。",
    "Noted, I will avoid peanuts.",
    "What snack do you suggest?",
    "How about some apple slices with cheese?",
]
CHINESE = ["我对花生过敏。", "好的，我记住了。", "今晚吃点什么零食好？", "可以试试酸奶配水果。"]


async def ranked(client: AsyncTestClient, user_id: str, turns: list[str], query: str) -> list[int]:
    """The positions of the user's turns, best first, for `query` (the turns imported
    first, as a user's and an assistant's in turn)."""
    session = (await client.post("/v1/sessions", json={"user_id": user_id})).json()
    messages = [
        {
            "role": "user" if position % 2 == 0 else "assistant",
            "content": text,
            "external_id": str(position),
            "created_at": (START + dt.timedelta(minutes=position)).isoformat(),
        }
        for position, text in enumerate(turns)
    ]
    imported = await client.post(
        f"/v1/sessions/{session['id']}/history", json={"messages": messages}
    )
    assert imported.status_code == 201, imported.text
    body = {"user_id": user_id, "query": query, "k": 5, "kinds": ["turn"]}
    response = await client.post("/v1/memory/search", json=body)
    assert response.status_code == 200, response.text
    return [int(hit["external_id"]) for hit in response.json()["results"]]


@pytest.mark.parametrize(
    ("turns", "query", "order"),
    [
        # The snack question and its answer say nothing about the user: last.
        (MIXED, "what am I allergic to?", [0, 1, 2, 3]),
        (MIXED, "我对什么过敏？", [0, 1, 2, 3]),
        (CHINESE, "我有什么过敏的食物吗？", [0, 1, 2, 3]),
    ],
)
async def test_a_constraint_stated_once_comes_back_first(
    settings: Settings,
    embedders: tuple[Embedder, Embedder],
    turns: list[str],
    query: str,
    order: list[int],
) -> None:
    async with default_service(settings, embedders) as client:
        assert await ranked(client, "new-user", turns, query) == order


JOB_ZH = [
    "我在一家医院当护士。",
    "护士的工作很辛苦。",
    "明天想去看电影。",
    "可以看看新上映的片子。",
]
JOB_EN = [
    "I work as a nurse at the city hospital.",
    "Nursing is hard work, take care.",
    "I want to see a film tomorrow.",
    "Try the new release downtown.",
]


@pytest.mark.parametrize(
    ("turns", "query", "order"),
    [
        # About the user: the user's own words first, the reply repeating them after.
        (JOB_ZH, "我是做什么工作的？", [0, 1, 2, 3]),
        (JOB_EN, "what work do I do?", [0, 1, 2, 3]),
        # Not about the user: the order as found (the reply about nursing, then the
        # user's job).
        (JOB_ZH, "护士的工作怎么样？", [1, 0, 2, 3]),
        (JOB_EN, "is nursing hard work?", [1, 0, 2, 3]),
    ],
)
async def test_a_question_about_the_user_finds_their_words_before_the_reply(
    settings: Settings,
    embedders: tuple[Embedder, Embedder],
    turns: list[str],
    query: str,
    order: list[int],
) -> None:
    async with default_service(settings, embedders) as client:
        assert await ranked(client, "new-user", turns, query) == order


SISTER_EN = [
    "My sister Anna lives in Lisbon.",
    "Lisbon is lovely.",
    "The printer at the office jammed again today.",
    "Printers always break at the worst time.",
]
SISTER_ZH = [
    "我妹妹住在里斯本。",
    "里斯本很美。",
    "办公室的打印机今天又卡纸了。",
    "打印机总在最忙的时候坏。",
]


@pytest.mark.parametrize(
    ("turns", "query", "order"),
    [
        (
            SISTER_EN,
            "The office printer jammed again, what a day... anyway, where does my sister live?",
            [0, 1, 2, 3],
        ),
        (SISTER_ZH, "办公室的打印机又卡纸了，真烦。对了，我妹妹住在哪里？", [0, 1, 2, 3]),
    ],
)
async def test_a_chatty_message_finds_what_its_last_question_asks(
    settings: Settings,
    embedders: tuple[Embedder, Embedder],
    turns: list[str],
    query: str,
    order: list[int],
) -> None:
    """The small talk before "anyway" / 对了 matches the printer turns word for word; the
    question after it is what the message asks (retrieval/search/focus.py)."""
    async with default_service(settings, embedders) as client:
        assert await ranked(client, "new-user", turns, query) == order


SISTER_IN_CHENGDU = ["我姐姐住在成都。", "今天天气真不错。", "哈哈，好的。", "我晚饭吃了面条。"]
RED_TESLA = [
    "I drive a red Tesla.",
    "The weather is lovely today.",
    "Haha, okay.",
    "I had noodles for dinner.",
]
PEANUTS_ZH = ["我对花生过敏。", "周末去爬山了。", "好累啊。", "明天还要上班。"]
VIOLIN_EN = [
    "My daughter is learning to play the violin.",
    "We went hiking at the weekend.",
    "So tiring.",
    "Back to work tomorrow.",
]


@pytest.mark.parametrize(
    ("turns", "query", "order"),
    [
        (SISTER_IN_CHENGDU, "Where does my sister live?", [0, 2, 3, 1]),
        (RED_TESLA, "我开什么车？", [0, 2, 3, 1]),
        (PEANUTS_ZH, "What am I allergic to?", [0, 2, 3, 1]),
        (VIOLIN_EN, "我女儿在学什么乐器？", [0, 2, 3, 1]),
    ],
)
async def test_a_statement_in_one_language_answers_a_question_in_the_other(
    settings: Settings,
    embedders: tuple[Embedder, Embedder],
    turns: list[str],
    query: str,
    order: list[int],
) -> None:
    async with default_service(settings, embedders) as client:
        assert await ranked(client, "new-user", turns, query) == order


FRUIT_QUESTION = [
    "Which fruits are high in vitamin C?",
    "Oranges, kiwis and strawberries.",
    "我对猕猴桃过敏。",
    "好的，我会记住。",
]
FRUIT_QUESTION_ZH = [
    "哪些水果富含维生素C？",
    "橙子、猕猴桃和草莓。",
    "I'm allergic to kiwi.",
    "Noted.",
]
BREAKFAST = [
    "What's a quick breakfast?",
    "Overnight oats are quick.",
    "I don't drink coffee anymore, only green tea.",
    "Green tea is a good choice.",
]


@pytest.mark.parametrize(
    ("turns", "query", "order"),
    [
        (FRUIT_QUESTION, "Which fruit am I allergic to?", [2, 3, 0, 1]),
        (FRUIT_QUESTION_ZH, "我对哪种水果过敏？", [2, 3, 0, 1]),
        (BREAKFAST, "What do I drink in the morning?", [2, 3, 0, 1]),
    ],
)
async def test_a_question_about_the_user_finds_a_statement_before_a_stored_question(
    settings: Settings,
    embedders: tuple[Embedder, Embedder],
    turns: list[str],
    query: str,
    order: list[int],
) -> None:
    """A question the user once asked, and its reply, say nothing about the user: the
    statement comes first, in either language (retrieval/search/hits.py)."""
    async with default_service(settings, embedders) as client:
        assert await ranked(client, "new-user", turns, query) == order
