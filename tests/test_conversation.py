"""Matching a client's resent conversation against the session's stored messages."""

from __future__ import annotations

import pytest

from retrieval.chat.conversation import new_part
from retrieval.protocols import ChatMessage
from tests.records import turn

ROLES = ("user", "assistant")


def stored(*contents: str) -> list:
    return [turn(i + 1, c, ROLES[i % 2]) for i, c in enumerate(contents)]


def sent(*contents: str) -> list[ChatMessage]:
    return [ChatMessage(ROLES[i % 2], c) for i, c in enumerate(contents)]


@pytest.mark.parametrize(
    ("held", "history", "new"),
    [
        (stored(), sent("a", "b"), ["a", "b"]),
        (stored("a", "b"), sent("a", "b"), []),
        (stored("a", "b"), sent(" a ", "b\n", "c", "d"), ["c", "d"]),
        # The client trimmed old messages: its history starts later in the session.
        (stored("a", "b", "c", "d"), sent("c", "d", "e", "f"), ["e", "f"]),
        # The longest overlap wins, where a shorter one (a, b) repeats inside it.
        (stored("x", "y", "a", "b", "a", "b"), sent("a", "b", "a", "b", "c", "d"), ["c", "d"]),
        (stored("a", "b", "a", "b", "a", "b"), sent("a", "b", "a", "b", "a"), ["a"]),
        (stored("a", "b"), sent("b", "a"), ["b", "a"]),
    ],
)
def test_only_what_the_session_lacks_is_new(held: list, history: list, new: list) -> None:
    assert [m.content for m in new_part(held, history, "next")] == new


def test_a_retried_turn_matches_the_messages_before_it() -> None:
    held = stored("a", "b", "next")
    assert [m.content for m in new_part(held, sent("a", "b"), "next")] == []


def test_long_conversations_match_in_linear_time() -> None:
    # Quadratic before: every overlap size was tried, each compared message by message.
    # 20,000 x 20,000 near-misses took minutes; the answer is checked, not the time.
    held = stored(*["same"] * 19_999, "other")
    history = sent(*["same"] * 20_000)
    assert len(new_part(held, history, "next")) == 20_000
    history = sent(*["same"] * 19_999, "other", "more")
    assert [m.content for m in new_part(held, history, "next")] == ["more"]
