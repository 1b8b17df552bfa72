"""A new user's first turns, through the API with the service's defaults and the default
embedder: a constraint stated once is found again, in English and in Chinese.

The stores are the issue's own: four turns of one user, the allergy stated first, a
snack question and its answer after it. Exact orders of all four turns. Not yet here,
because they still fail with the default embedder (bench/small_store.py measures them):
"food allergy" and "peanut" on the mixed store (the first finds the snack question
first, the second "Noted, I will avoid peanuts."), and an English question about the Chinese store
(all-MiniLM-L6-v2 reads no Chinese).
"""

from __future__ import annotations

import datetime as dt

import pytest
from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.settings import FactSettings, Settings
from retrieval.protocols import Embedder
from tests.clients import local_client
from tests.fakes import ScriptedEngine

pytestmark = pytest.mark.model

START = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)
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
        (MIXED, "what am I allergic to?", [0, 2, 1, 3]),
        (MIXED, "我对什么过敏？", [0, 1, 2, 3]),
        (CHINESE, "我有什么过敏的食物吗？", [0, 2, 1, 3]),
    ],
)
async def test_a_constraint_stated_once_comes_back_first(
    settings: Settings,
    real_embedder: Embedder,
    turns: list[str],
    query: str,
    order: list[int],
) -> None:
    quiet = settings.model_copy(update={"facts": FactSettings(extractor="none")})
    app = create_app(quiet, embedder=real_embedder, engine=ScriptedEngine(["Noted."]))
    async with local_client(app) as client:
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
        # Not about the user: the order as found.
        (JOB_ZH, "护士的工作怎么样？", [1, 2, 3, 0]),
        (JOB_EN, "is nursing hard work?", [1, 2, 3, 0]),
    ],
)
async def test_a_question_about_the_user_finds_their_words_before_the_reply(
    settings: Settings,
    real_embedder: Embedder,
    turns: list[str],
    query: str,
    order: list[int],
) -> None:
    quiet = settings.model_copy(update={"facts": FactSettings(extractor="none")})
    app = create_app(quiet, embedder=real_embedder, engine=ScriptedEngine(["Noted."]))
    async with local_client(app) as client:
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
    real_embedder: Embedder,
    turns: list[str],
    query: str,
    order: list[int],
) -> None:
    """The small talk before "anyway" / 对了 matches the printer turns word for word; the
    question after it is what the message asks (retrieval/search/focus.py)."""
    quiet = settings.model_copy(update={"facts": FactSettings(extractor="none")})
    app = create_app(quiet, embedder=real_embedder, engine=ScriptedEngine(["Noted."]))
    async with local_client(app) as client:
        assert await ranked(client, "new-user", turns, query) == order
