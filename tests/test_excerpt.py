"""A long memory shown by its sentences that match the message: exact excerpts, lines and
prompts, in English and Chinese."""

from __future__ import annotations

import datetime as dt

import pytest

from app.factory import create_app
from app.settings import ChatSettings, FactSettings, Settings
from retrieval.chat.sessions import without_deleted
from retrieval.prompt.excerpt import excerpt, sentences, with_excerpts
from retrieval.prompt.render import (
    CONTEXT_CLOSE,
    CONTEXT_OPEN,
    MEMORY_HEADER,
    context_block,
    format_memory,
    memory_text,
)
from retrieval.search.lexical import tokenize
from retrieval.turns import SearchHit
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.records import hit, turn

LONG_EN = (
    "Wow, congrats on the new job! I went to the LGBTQ support group yesterday and it was "
    "so powerful. The stories there really moved me. Anyway, how is your dog doing?"
)
LONG_ZH = (
    "哇，恭喜你换了新工作！我昨天去了支持小组的聚会，感觉很有力量。"
    "那里的故事真的打动了我。对了，你的狗狗最近怎么样？"
)


def terms(query: str) -> frozenset[str]:
    return frozenset(tokenize(query))


def test_sentences_are_slices_of_the_text() -> None:
    assert sentences(LONG_EN) == [
        "Wow, congrats on the new job!",
        "I went to the LGBTQ support group yesterday and it was so powerful.",
        "The stories there really moved me.",
        "Anyway, how is your dog doing?",
    ]
    assert sentences(LONG_ZH) == [
        "哇，恭喜你换了新工作！",
        "我昨天去了支持小组的聚会，感觉很有力量。",
        "那里的故事真的打动了我。",
        "对了，你的狗狗最近怎么样？",
    ]
    # A decimal point or an abbreviation's dot does not end a sentence; a line break does.
    assert sentences("It costs 3.5 dollars, e.g.x here.\n  Next line") == [
        "It costs 3.5 dollars, e.g.x here.",
        "Next line",
    ]


@pytest.mark.parametrize(
    ("content", "query", "shown"),
    [
        (LONG_EN, "When did I go to the support group?",
         "… I went to the LGBTQ support group yesterday and it was so powerful. …"),
        (LONG_ZH, "我什么时候去的支持小组？", "…我昨天去了支持小组的聚会，感觉很有力量。…"),
        # The first and the last sentence match: the cut is marked where it is.
        (LONG_EN, "congrats on the job, and the dog?",
         "Wow, congrats on the new job! … Anyway, how is your dog doing?"),
        (LONG_ZH, "工作和狗狗", "哇，恭喜你换了新工作！…对了，你的狗狗最近怎么样？"),
    ],
)  # fmt: skip
def test_a_long_memory_is_shown_by_its_matching_sentences(
    content: str, query: str, shown: str
) -> None:
    assert excerpt(content, terms(query), 3) == shown


@pytest.mark.parametrize(
    ("content", "query", "min_sentences"),
    [
        # Nothing shares a term: found by meaning alone, the memory is shown whole.
        (LONG_EN, "Which pets does Melanie have?", 3),
        (LONG_ZH, "她养了什么宠物？", 3),
        # Fewer sentences than the threshold, or excerpts off.
        ("I went to the group. It was great.", "group", 3),
        (LONG_EN, "support group", 0),
        # What matches is most of the text: not worth a cut.
        (LONG_EN, "congrats job support group yesterday powerful stories moved", 3),
    ],
)
def test_a_memory_is_shown_whole(content: str, query: str, min_sentences: int) -> None:
    assert excerpt(content, terms(query), min_sentences) is None


def test_hits_carry_their_excerpt_and_lines_quote_it() -> None:
    hits = with_excerpts([hit(1, LONG_EN, 0.9), hit(2, "Short one.", 0.5)], "the support group?", 3)
    assert [h.excerpt for h in hits] == [
        "… I went to the LGBTQ support group yesterday and it was so powerful. …",
        None,
    ]
    assert format_memory(hits[0]) == (
        '- user: "… I went to the LGBTQ support group yesterday and it was so powerful. …"'
    )
    assert format_memory(hits[1]) == '- user: "Short one."'


def test_a_day_shows_its_memories_as_said_each_whole_or_cut() -> None:
    day = dt.datetime(2023, 5, 8, 13, 0, tzinfo=dt.UTC)
    later = day + dt.timedelta(minutes=1)
    memories = [
        hit(3, "我也领养了一只猫。", 0.9, seq=3, name="小明", created_at=later),
        hit(2, "That sounds wonderful.", 0.7, role="assistant", seq=2, created_at=day),
        hit(1, LONG_EN, 0.6, seq=1, name="小明", created_at=day),
        hit(4, LONG_ZH, 0.5, seq=4, name="小明", created_at=later),
    ]
    shown = with_excerpts(memories, "support group 支持小组", 3)
    assert memory_text(shown).splitlines() == [
        MEMORY_HEADER,
        "[8 May 2023]",
        '- user (name "小明"): "… I went to the LGBTQ support group yesterday and it was so '
        'powerful. …"',
        '- assistant: "That sounds wonderful."',
        '- user (name "小明"): "我也领养了一只猫。"',
        '- user (name "小明"): "…我昨天去了支持小组的聚会，感觉很有力量。…"',
    ]


STORES = {
    "en": (
        [("user", LONG_EN), ("assistant", "That sounds wonderful."),
         ("user", "I also adopted a cat."), ("user", "Her name is Luna.")],
        "When did I go to the support group?",
        "… I went to the LGBTQ support group yesterday and it was so powerful. …",
    ),
    "zh": (
        [("user", LONG_ZH), ("assistant", "听起来很棒。"),
         ("user", "我也领养了一只猫。"), ("user", "它叫露娜。")],
        "我什么时候去的支持小组？",
        "…我昨天去了支持小组的聚会，感觉很有力量。…",
    ),
}  # fmt: skip


@pytest.mark.parametrize("language", ["en", "zh"])
async def test_the_prompt_of_a_message_shows_a_long_turn_cut(
    settings: Settings, language: str
) -> None:
    turns, question, shown = STORES[language]
    when = dt.datetime(2023, 5, 8, 13, 0, tzinfo=dt.UTC)
    configured = settings.model_copy(
        update={
            "chat": ChatSettings(excerpt_min_sentences=3),
            "facts": FactSettings(extractor="none"),
        }
    )
    app = create_app(configured, embedder=HashEmbedder(), engine=ScriptedEngine(["Ok."]))
    async with local_client(app) as client:
        old = (await client.post("/v1/sessions", json={"user_id": "mia"})).json()
        messages = [
            {
                "role": role,
                "content": text,
                "created_at": (when + dt.timedelta(minutes=i)).isoformat(),
            }
            for i, (role, text) in enumerate(turns)
        ]
        imported = await client.post(
            f"/v1/sessions/{old['id']}/history", json={"messages": messages}
        )
        assert imported.status_code == 201, imported.text
        new = (await client.post("/v1/sessions", json={"user_id": "mia"})).json()
        response = await client.post(
            f"/v1/sessions/{new['id']}/context", json={"content": question}
        )
    assert response.status_code == 200, response.text
    body = response.json()
    memories = [f'- user: "{shown}"', *(f'- {role}: "{text}"' for role, text in turns[1:])]
    assert body["messages"][-1]["content"] == "\n".join(
        [CONTEXT_OPEN, "", MEMORY_HEADER, "[8 May 2023]", *memories, "", CONTEXT_CLOSE, question]
    )
    # The report says what was shown of each memory: the cut turn's excerpt, the rest whole.
    excerpts = {m["text"]: m["excerpt"] for m in body["context"]["memories"]}
    assert excerpts == {text: (shown if i == 0 else None) for i, (_, text) in enumerate(turns)}


def test_a_deleted_turn_shown_cut_takes_the_whole_context_with_it() -> None:
    """Scrubbing a deleted session's turns from another session's stored contexts removes
    the lines showing them whole; a turn shown by an excerpt has no such line, so the
    whole context goes: nothing of the deleted session stays."""
    deleted = turn(1, LONG_EN, session_id="s-gone")
    kept = turn(2, "I drink green tea.", session_id="s-old", seq=2)
    shown = with_excerpts([SearchHit(deleted, 0.9), SearchHit(kept, 0.5)], "support group", 3)
    note = context_block([], shown, [])
    asked = turn(3, "When did I go?", session_id="s-new", context_note=[note])
    assert without_deleted(asked, [deleted], []) is None
    # Shown whole, only its line goes.
    whole = context_block([], [SearchHit(deleted, 0.9), SearchHit(kept, 0.5)], [])
    asked = turn(3, "When did I go?", session_id="s-new", context_note=[whole])
    assert without_deleted(asked, [deleted], []) == [context_block([], [SearchHit(kept, 0.5)], [])]
