"""The order of read-back hits for a question about the user: the user's own words before
the reply that repeats them."""

from __future__ import annotations

import pytest

from retrieval.search.hits import asks_about_the_user, sources_before_replies
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
