"""Reading back what the indexes found: past turns as stored rows, memories for a prompt,
knowledge chunks, and search over all three kinds for the memory API.

The indexes answer with ids; SQL holds the rows. A hit whose row was deleted meanwhile
(a session deleted between search and read) is dropped, never shown.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from retrieval.facts.memory import FactHit, FactMemory
from retrieval.knowledge.base import KnowledgeBase, KnowledgeHit
from retrieval.prompt.report import RetrievedMemory
from retrieval.protocols import ScoredId
from retrieval.search.memory import TurnMemory
from retrieval.timeutil import as_utc
from retrieval.turns import SearchHit, StoredTurn
from storage.models import Message, User
from storage.repository import Store


class MemoryRecall:
    def __init__(
        self,
        store: Store,
        memory: TurnMemory,
        facts: FactMemory | None = None,
        knowledge: KnowledgeBase | None = None,
    ) -> None:
        self._store = store
        self._memory = memory
        self._facts = facts
        self._knowledge = knowledge

    async def knowledge_for(
        self, tenant_id: int, user_pk: int, vector: np.ndarray, k: int
    ) -> list[KnowledgeHit]:
        """The user's own and their tenant's shared knowledge chunks closest to the message."""
        if self._knowledge is None or k <= 0:
            return []
        return await self._knowledge.search(tenant_id, user_pk, vector, k)

    async def memories(self, user_pk: int, hits: Sequence[ScoredId]) -> list[RetrievedMemory]:
        """The stored turns of search hits, as a prompt shows them, best first."""
        return [
            RetrievedMemory(
                message_id=row.id,
                session_id=row.session_id,
                role=row.role,
                name=row.name,
                text=row.content,
                score=hit.score,
                created_at=as_utc(row.created_at),
                external_id=row.external_id,
                token_count=row.token_count,
            )
            for row, hit in await self._rows_of(user_pk, hits)
        ]

    async def search_all(
        self,
        user: User,
        query: str,
        vector: np.ndarray,
        k: int,
        session_id: str | None,
        kinds: Sequence[str],
    ) -> list[SearchHit | FactHit | KnowledgeHit]:
        """Past turns, key facts and/or knowledge chunks (as `kinds` says), merged best
        first."""
        found: list[SearchHit | FactHit | KnowledgeHit] = []
        if "turn" in kinds:
            found += await self._search_turns(user, query, vector, k, session_id)
        if "fact" in kinds and self._facts is not None:
            found += await self._facts.search(user.id, vector, k)
        if "knowledge" in kinds:
            found += await self.knowledge_for(user.tenant_id, user.id, vector, k)
        return sorted(found, key=lambda hit: -hit.score)[:k]

    async def _search_turns(
        self, user: User, query: str, vector: np.ndarray, k: int, session_id: str | None
    ) -> list[SearchHit]:
        fetch = sys.maxsize if session_id is not None else k
        hits = await self._memory.search(user.id, vector, fetch, query=query)
        found: list[SearchHit] = []
        # With a session filter every hit is ranked; rows are read a page at a time.
        page = k if session_id is None else max(4 * k, 200)
        for start in range(0, len(hits), page):
            found += [
                SearchHit(StoredTurn.from_row(row), hit.score)
                for row, hit in await self._rows_of(user.id, hits[start : start + page])
                if session_id is None or row.session_id == session_id
            ]
            if len(found) >= k:
                break
        return found[:k]

    async def _rows_of(
        self, user_pk: int, hits: Sequence[ScoredId]
    ) -> list[tuple[Message, ScoredId]]:
        """The stored rows of search hits, best first; hits deleted meanwhile are dropped."""
        found = await self._store.list_messages_by_id(user_pk, [h.id for h in hits])
        rows = {m.id: m for m in found}
        return [(rows[h.id], h) for h in hits if h.id in rows]
