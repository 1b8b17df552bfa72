"""The order of read-back hits for a question about the user: the user's own words before
the reply that repeats them, stored questions (and the replies to them) after the rest."""

from __future__ import annotations

import pytest

from retrieval.search.hits import (
    asks_about_the_user,
    is_question,
    sources_before_replies,
    statements_first,
    turn_hits,
)
from tests.records import hit


@pytest.mark.parametrize(
    ("query", "about_the_user"),
    [
        ("what am I allergic to?", True),
        ("I'm hungry, any snack ideas?", True),
        ("where is my passport", True),
        ("我是做什么工作的？", True),
        ("is nursing hard work?", False),
        ("what did Caroline research?", False),
        ("Is it raining in Iceland?", False),
        ("护士的工作怎么样？", False),
    ],
)
def test_a_question_about_the_user_is_told_by_its_first_person(
    query: str, about_the_user: bool
) -> None:
    assert asks_about_the_user(query) is about_the_user


def test_a_reply_above_the_turn_it_answers_gives_that_turn_its_place() -> None:
    hits = [
        hit(2, "Nursing is hard work.", 0.9, role="assistant", seq=2),
        hit(11, "Any film tonight?", 0.8, role="user", seq=1, session_id="s-new"),
        hit(12, "Try the new release.", 0.7, role="assistant", seq=2, session_id="s-new"),
        hit(4, "Take water.", 0.6, role="assistant", seq=4),
        hit(1, "I work as a nurse.", 0.5, role="user", seq=1),
        hit(3, "Hiking this weekend.", 0.4, role="assistant", seq=3),
    ]
    ordered = sources_before_replies(hits)
    # 2 answers 1 (found below it): 1 moves up with 2's score. 12 answers 11, already
    # above it. 4 answers 3, an assistant turn: not the user's words. 3's source is not found.
    assert [(h.turn.id, h.score) for h in ordered] == [
        (1, 0.9),
        (2, 0.9),
        (11, 0.8),
        (12, 0.7),
        (4, 0.6),
        (3, 0.4),
    ]


@pytest.mark.parametrize(
    ("text", "asking"),
    [
        ("What's a quick breakfast?", True),
        ("Which fruits are high in vitamin C? ", True),
        ('She asked "why?"', True),
        ("今晚吃什么？", True),
        ("你喜欢吗？」", True),
        ("I don't drink coffee anymore, only green tea.", False),
        ("Why? Because I said so.", False),
        ("我对猕猴桃过敏。", False),
    ],
)
def test_a_stored_question_ends_with_its_question_mark(text: str, asking: bool) -> None:
    assert is_question(text) is asking


def test_stored_questions_and_their_replies_go_after_the_other_hits() -> None:
    hits = [
        hit(1, "Which fruits are high in vitamin C?", 0.9, role="user", seq=1),
        hit(2, "Oranges, kiwis and strawberries.", 0.8, role="assistant", seq=2),
        hit(3, "我对猕猴桃过敏。", 0.7, role="user", seq=3),
        hit(5, "Any plans tonight?", 0.65, role="assistant", seq=5),
        hit(4, "好的，我会记住。", 0.6, role="assistant", seq=4),
        hit(6, "Just reading.", 0.5, role="user", seq=6),
    ]
    ordered = statements_first(hits)
    # 1 and 5 are questions; 2 replies to 1; 6 is the user's answer to the assistant's
    # question, not a reply by the assistant: it stays. Moved hits take at most the
    # score of the last hit above them.
    assert [(h.turn.id, h.score) for h in ordered] == [
        (3, 0.7),
        (4, 0.6),
        (6, 0.5),
        (1, 0.5),
        (2, 0.5),
        (5, 0.5),
    ]
    only_questions = hits[:2]
    assert statements_first(only_questions) == only_questions
    assert statements_first(hits[2:3]) == hits[2:3]


class Rows:
    def __init__(self, hits: list) -> None:
        self._turns = {h.turn.id: h.turn for h in hits}

    async def list_messages_by_id(self, user_pk: int, ids: list[int]) -> list:
        return [self._turns[i] for i in ids if i in self._turns]


async def test_a_question_about_the_user_reads_statements_first_and_others_as_ranked() -> None:
    from retrieval.protocols import ScoredId

    hits = [
        hit(1, "What's a quick breakfast?", 0.9, role="user", seq=1),
        hit(2, "Overnight oats are quick.", 0.8, role="assistant", seq=2),
        hit(3, "I don't drink coffee anymore, only green tea.", 0.7, role="user", seq=3),
    ]
    scored = [ScoredId(h.turn.id, h.score) for h in hits]
    about = await turn_hits(Rows(hits), 1, scored, "What do I drink in the morning?")
    assert [h.turn.id for h in about] == [3, 1, 2]
    other = await turn_hits(Rows(hits), 1, scored, "what is a quick breakfast?")
    assert [h.turn.id for h in other] == [1, 2, 3]
