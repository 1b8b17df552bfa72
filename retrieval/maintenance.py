"""Operator actions that span SQL and the derived indexes: erase and reindex users.

SQL goes first: rows are the source of truth, and a crash after the rows are gone but
before the vectors are leaves only stray vectors, which reconciliation removes when the
scope is next loaded (and which no search can return, as hits are read back from SQL).
"""

from __future__ import annotations

from dataclasses import dataclass

from retrieval.knowledge.base import KnowledgeBase
from retrieval.search.memory import TurnMemory
from storage.admin import AdminRepository, ErasedUser
from storage.knowledge import scope_of
from storage.messages import MessageRepository
from storage.users import UserRepository


@dataclass(frozen=True, slots=True)
class Reindexed:
    num_turns: int
    num_chunks: int


class MemoryOperations:
    def __init__(
        self,
        admin: AdminRepository,
        users: UserRepository,
        messages: MessageRepository,
        memory: TurnMemory,
        knowledge: KnowledgeBase | None,
    ) -> None:
        self._admin = admin
        self._users = users
        self._messages = messages
        self._memory = memory
        self._knowledge = knowledge

    async def erase_user(self, user_pk: int) -> ErasedUser:
        """Every row of the user, then every vector (turns and own knowledge)."""
        await self._users.get_user_by_pk(user_pk)
        message_ids = [t.id for t in await self._messages.list_user_messages(user_pk)]
        erased = await self._admin.erase_user(user_pk)
        await self._memory.forget_user(user_pk, message_ids)
        if self._knowledge is not None:
            await self._knowledge.drop_scope(scope_of(erased.tenant_id, user_pk))
        return erased

    async def reindex_user(self, user_pk: int) -> Reindexed:
        user = await self._users.get_user_by_pk(user_pk)
        num_turns = await self._memory.reindex_user(user_pk)
        num_chunks = 0
        if self._knowledge is not None:
            num_chunks = await self._knowledge.reindex_scope(scope_of(user.tenant_id, user_pk))
        return Reindexed(num_turns, num_chunks)

    async def reindex_all(self) -> Reindexed:
        num_turns = await self._memory.reindex_all()
        num_chunks = await self._knowledge.rebuild() if self._knowledge is not None else 0
        return Reindexed(num_turns, num_chunks)
