"""Reading back what the indexes found: the indexes answer with ids, SQL holds the rows.
A hit whose row was deleted meanwhile (a session deleted between search and read) is
dropped, never shown.
"""

from __future__ import annotations

from collections.abc import Sequence

from retrieval.protocols import ScoredId
from retrieval.turns import SearchHit
from storage.messages import MessageRepository


async def turn_hits(
    messages: MessageRepository, user_pk: int, scored: Sequence[ScoredId]
) -> list[SearchHit]:
    """The stored turns of search hits, best first; hits deleted meanwhile are dropped."""
    rows = {t.id: t for t in await messages.list_messages_by_id(user_pk, [h.id for h in scored])}
    return [SearchHit(rows[h.id], h.score) for h in scored if h.id in rows]
