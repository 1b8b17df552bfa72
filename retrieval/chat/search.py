"""The search over every kind of memory that the memory API and the admin page answer
with: past turns, key facts and knowledge chunks of one user, merged by score."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from retrieval.chat.config import check_text
from retrieval.facts.memory import FactHit, FactMemory
from retrieval.knowledge.base import KnowledgeBase, KnowledgeHit
from retrieval.search.hits import turn_hits
from retrieval.search.memory import TurnMemory
from retrieval.turns import SearchHit
from storage.messages import MessageRepository
from storage.records import User

Hit = SearchHit | FactHit | KnowledgeHit


class MemorySearch:
    """Past turns, key facts and knowledge chunks of one user for a query, best first."""

    def __init__(
        self,
        messages: MessageRepository,
        memory: TurnMemory,
        facts: FactMemory | None = None,
        knowledge: KnowledgeBase | None = None,
        *,
        max_query_chars: int,
    ) -> None:
        self._max_query_chars = max_query_chars
        self._messages = messages
        self._memory = memory
        self._facts = facts
        self._knowledge = knowledge

    async def search(
        self, user: User, query: str, k: int, session_id: str | None, kinds: Sequence[str]
    ) -> list[Hit]:
        """The kinds asked for (`turn`, `fact`, `knowledge`), merged by score."""
        check_text(query, "query", self._max_query_chars)
        vector = await self._memory.embed_query(user.id, query)
        found: list[Hit] = []
        if "turn" in kinds:
            found += await self._turns(user, query, vector, k, session_id)
        if {"fact", "knowledge"} & set(kinds):
            dense = await self._memory.dense_query(query, vector)
            if "fact" in kinds and self._facts is not None:
                found += await self._facts.search(user.id, dense, k)
            if "knowledge" in kinds and self._knowledge is not None:
                found += await self._knowledge.search(user.tenant_id, user.id, dense, k)
        return sorted(found, key=lambda hit: -hit.score)[:k]

    async def _turns(
        self, user: User, query: str, vector: np.ndarray, k: int, session_id: str | None
    ) -> list[SearchHit]:
        fetch = sys.maxsize if session_id is not None else k
        scored = await self._memory.search(
            user.id, vector, fetch, query=query, version=user.memory_version
        )
        found: list[SearchHit] = []
        # With a session filter every hit is ranked; rows are read a page at a time.
        page = k if session_id is None else max(4 * k, 200)
        for start in range(0, len(scored), page):
            hits = await turn_hits(self._messages, user.id, scored[start : start + page], query)
            found += [h for h in hits if session_id is None or h.turn.session_id == session_id]
            if len(found) >= k:
                break
        return found[:k]
