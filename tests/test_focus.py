"""The question of a chatty message, found in English and Chinese: what the message is
searched with."""

from __future__ import annotations

import pytest

from retrieval.search.focus import focus_of
from retrieval.search.memory import searched_text


@pytest.mark.parametrize(
    ("message", "focus"),
    [
        (
            "Long day, the printer jammed twice... anyway, where does my sister live?",
            "where does my sister live?",
        ),
        (
            "I just got home and I'm tired, by the way what time is the dentist?",
            "what time is the dentist?",
        ),
        ("今天好累，开了一天的会。对了，我妹妹住在哪里？", "我妹妹住在哪里？"),
        ("路上堵车了。话说我的牙医预约是几点？", "我的牙医预约是几点？"),
        # Closing quotes and spaces after the question mark.
        ('Long day... anyway, "where does my sister live?" ', "where does my sister live?"),
        # Of two questions, the last; the marker in the sentence that asks.
        (
            "Anyway, how are you? Oh and what is my sister's name?",
            "what is my sister's name?",
        ),
    ],
)
def test_the_focus_is_the_last_question_from_its_last_marker(message: str, focus: str) -> None:
    assert focus_of(message) == focus


@pytest.mark.parametrize(
    "message",
    [
        "What am I allergic to?",  # one question: the message is its own focus
        "我对什么过敏？",
        "I moved to Denver last spring.",  # no question
        "Anyway, I moved to Denver last spring.",
        # Without a marker the whole message is the question.
        "I am going to Paris next week. What should I pack?",
        "How are you? What is my sister's name?",
        "天气不好。我妹妹住在哪里？",
        # A marker before the last sentence is not in the question.
        "Anyway, long day. Where does my sister live?",
        # A question before the end is not what the message ends on.
        "Oh and where does my sister live? She moved last month.",
        "That was a long meeting, anyway. Why?",  # too short to search with
        "",
    ],
)
def test_a_plain_question_or_statement_has_no_focus(message: str) -> None:
    assert focus_of(message) is None


def test_a_chatty_message_is_searched_by_its_question_and_others_as_they_are() -> None:
    assert searched_text("Busy day... anyway, what am I allergic to?") == "what am I allergic to?"
    assert searched_text("What am I allergic to?") == "What am I allergic to?"
    assert searched_text("加班到很晚。对了，我对什么过敏？") == "我对什么过敏？"
