"""Reading back what the indexes found: the indexes answer with ids, SQL holds the rows.
A hit whose row was deleted meanwhile (a session deleted between search and read) is
dropped, never shown.

A question about the user themselves ("what am I allergic to?", "我是做什么工作的？")
is answered by what the user said; the assistant's reply to it often repeats its words
("Noted, I will avoid peanuts.", "会计工作很细致。") and can rank above it. So for such a
question, a reply found above the user turn it answers (the turn just before it in its
session, found too) gives that turn its place and score: the set found is the same, only
the order changes.
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


def asks_about_the_user(query: str) -> bool:
    return FIRST_PERSON.search(query) is not None


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
    With the query, a question about the user puts the user's words before replies."""
    rows = {t.id: t for t in await messages.list_messages_by_id(user_pk, [h.id for h in scored])}
    hits = [SearchHit(rows[h.id], h.score) for h in scored if h.id in rows]
    if query is not None and asks_about_the_user(query):
        return sources_before_replies(hits)
    return hits
