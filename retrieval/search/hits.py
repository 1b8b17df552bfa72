"""Reading back what the indexes found: the indexes answer with ids, SQL holds the rows.
A hit whose row was deleted meanwhile (a session deleted between search and read) is
dropped, never shown.

A question about the user themselves ("what am I allergic to?", "我是做什么工作的？")
is answered by what the user said; the assistant's reply to it often repeats its words
("Noted, I will avoid peanuts.", "会计工作很细致。") and can rank above it. So for such a
question, a reply found above the user turn it answers (the turn just before it in its
session, found too) gives that turn its place and score: the set found is the same, only
the order changes.

Nor does a question the user once asked ("What's a quick breakfast?", "Which fruits are
high in vitamin C?") say anything about them, nor the reply it got: asked about the user,
the stored questions found, and the replies to them found with them, go after the other
hits ("What do I drink in the morning?" finds "I don't drink coffee anymore, only green
tea." first, not the breakfast question).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from retrieval.protocols import ScoredId
from retrieval.turns import SearchHit
from storage.messages import MessageRepository

# The user speaking of themselves: English first-person singular, or 我 (I, me, my).
FIRST_PERSON = re.compile(r"\b(?:i|me|my|mine|myself)\b|我", re.IGNORECASE)


# A stored question: its text ends with a question mark (closing quotes and brackets
# may follow).
_ENDS_ASKING = re.compile(r"[?？][\s\"'”’)）」』]*$")


def asks_about_the_user(query: str) -> bool:
    return FIRST_PERSON.search(query) is not None


def is_question(text: str) -> bool:
    return _ENDS_ASKING.search(text) is not None


def statements_first(hits: Sequence[SearchHit]) -> list[SearchHit]:
    """The stored questions found, and the assistant's replies to them (the turn just
    after one, in its session) found too, after the other hits, each part in its order;
    a hit moved down takes at most the score of the last hit above it."""
    asked = {(h.turn.session_id, h.turn.seq) for h in hits if is_question(h.turn.content)}
    moves = [
        (h.turn.session_id, h.turn.seq) in asked
        or (h.turn.role == "assistant" and (h.turn.session_id, h.turn.seq - 1) in asked)
        for h in hits
    ]
    first = [h for h, move in zip(hits, moves, strict=True) if not move]
    later = [h for h, move in zip(hits, moves, strict=True) if move]
    if not first or not later:
        return list(hits)
    floor = first[-1].score
    return [*first, *(replace(h, score=min(h.score, floor)) for h in later)]


def sources_before_replies(hits: Sequence[SearchHit]) -> list[SearchHit]:
    """Each assistant turn found above the user turn it answers is put just after that
    turn, which takes the reply's place and score; the other hits keep their order."""
    position = {(h.turn.session_id, h.turn.seq): i for i, h in enumerate(hits)}
    moved: set[int] = set()
    ordered: list[SearchHit] = []
    for index, hit in enumerate(hits):
        if index in moved:
            continue
        turn = hit.turn
        source = position.get((turn.session_id, turn.seq - 1))
        if (
            turn.role == "assistant"
            and source is not None
            and source > index
            and hits[source].turn.role == "user"
        ):
            moved.add(source)
            ordered.append(replace(hits[source], score=max(hit.score, hits[source].score)))
        ordered.append(hit)
    return ordered


async def turn_hits(
    messages: MessageRepository,
    user_pk: int,
    scored: Sequence[ScoredId],
    query: str | None = None,
) -> list[SearchHit]:
    """The stored turns of search hits, best first; hits deleted meanwhile are dropped.
    With the query, a question about the user puts the user's words before replies, and
    stored questions (with their replies) after the other hits."""
    rows = {t.id: t for t in await messages.list_messages_by_id(user_pk, [h.id for h in scored])}
    hits = [SearchHit(rows[h.id], h.score) for h in scored if h.id in rows]
    if query is not None and asks_about_the_user(query):
        return sources_before_replies(statements_first(hits))
    return hits
