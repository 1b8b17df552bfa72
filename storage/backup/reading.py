"""Reading a user's or a tenant's rows for export: pages in a fixed order, in one transaction.

Every list is keyset-paginated (`after` the last key of the previous page, `limit` rows),
so memory holds one page whatever the number of rows; the identity map is emptied after
each page. References between rows are surrogate ids, which another store renumbers:
`message_keys` gives the natural key of messages, `(session id, seq)`, for the ids a page
names.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from sqlalchemy import Select, func, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from storage.knowledge import NewChunk
from storage.models import (
    ChatSession,
    KnowledgeChunk,
    KnowledgeDocument,
    Message,
    SessionSummary,
)
from storage.models import Fact as FactRow
from storage.models import FactChange as FactChangeRow
from storage.models import User as UserRow
from storage.records import Document, Fact, FactChange, Session, Summary, Turn, User, to_record

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

MessageKey = tuple[str, int]
R = TypeVar("R", bound="DataclassInstance | msgspec.Struct")

NUM_ROWS_TABLES = (
    "users",
    "facts",
    "fact_changes",
    "sessions",
    "messages",
    "summaries",
    "documents",
    "chunks",
)


class BackupReader:
    """Pages of one unit's rows (a tenant, or one user of it), all read in one transaction."""

    def __init__(self, session: AsyncSession) -> None:
        self._session = session

    async def _page(self, query: Select[Any], record: type[R]) -> list[R]:
        rows = (await self._session.scalars(query)).all()
        found = [to_record(record, row) for row in rows]
        self._session.expunge_all()
        return found

    # Users ------------------------------------------------------------------------------

    async def get_user_or_none(self, tenant_id: int, external_id: str) -> User | None:
        row = await self._session.scalar(
            select(UserRow).where(
                UserRow.tenant_id == tenant_id, UserRow.external_id == external_id
            )
        )
        return None if row is None else to_record(User, row)

    async def list_users(self, tenant_id: int, after_pk: int, limit: int) -> list[User]:
        query = (
            select(UserRow)
            .where(UserRow.tenant_id == tenant_id, UserRow.id > after_pk)
            .order_by(UserRow.id)
            .limit(limit)
        )
        return await self._page(query, User)

    async def get_watermark_key(self, user_pk: int) -> MessageKey | None:
        """The key of the user's last message that fact extraction has read, if any."""
        through = select(UserRow.facts_through_message_id).where(UserRow.id == user_pk)
        row = (
            await self._session.execute(
                select(Message.session_id, Message.seq)
                .where(Message.user_pk == user_pk, Message.id <= through.scalar_subquery())
                .order_by(Message.id.desc())
                .limit(1)
            )
        ).first()
        return None if row is None else (row[0], int(row[1]))

    # Facts ------------------------------------------------------------------------------

    async def list_facts(self, user_pk: int, after_id: int, limit: int) -> list[Fact]:
        query = (
            select(FactRow)
            .where(FactRow.user_pk == user_pk, FactRow.id > after_id)
            .order_by(FactRow.id)
            .limit(limit)
        )
        return await self._page(query, Fact)

    async def list_fact_changes(self, user_pk: int, after_id: int, limit: int) -> list[FactChange]:
        query = (
            select(FactChangeRow)
            .join(FactRow, FactRow.id == FactChangeRow.fact_id)
            .where(FactRow.user_pk == user_pk, FactChangeRow.id > after_id)
            .order_by(FactChangeRow.id)
            .limit(limit)
        )
        return await self._page(query, FactChange)

    async def list_fact_ids(self, user_pk: int, ids: Collection[int]) -> set[int]:
        """Which of `ids` are facts of the user (others name nothing in an export)."""
        if not ids:
            return set()
        rows = await self._session.scalars(
            select(FactRow.id).where(FactRow.user_pk == user_pk, FactRow.id.in_(sorted(ids)))
        )
        return {int(i) for i in rows.all()}

    # Sessions, messages, summaries --------------------------------------------------------

    async def list_sessions(
        self, user_pk: int, after: tuple[dt.datetime, str] | None, limit: int
    ) -> list[Session]:
        """Oldest first (ties by id)."""
        query = select(ChatSession).where(ChatSession.user_pk == user_pk)
        if after is not None:
            query = query.where(tuple_(ChatSession.created_at, ChatSession.id) > tuple_(*after))
        query = query.order_by(ChatSession.created_at, ChatSession.id).limit(limit)
        return await self._page(query, Session)

    async def list_messages(self, user_pk: int, after_id: int, limit: int) -> list[Turn]:
        """In id order, the order they were stored in, across the user's sessions."""
        query = (
            select(Message)
            .where(Message.user_pk == user_pk, Message.id > after_id)
            .order_by(Message.id)
            .limit(limit)
        )
        return await self._page(query, Turn)

    async def message_keys(self, user_pk: int, ids: Collection[int]) -> dict[int, MessageKey]:
        """(session id, seq) of those of `ids` that are messages of the user."""
        if not ids:
            return {}
        rows = await self._session.execute(
            select(Message.id, Message.session_id, Message.seq).where(
                Message.user_pk == user_pk, Message.id.in_(sorted(ids))
            )
        )
        return {int(i): (session_id, int(seq)) for i, session_id, seq in rows.all()}

    async def list_summaries(
        self, user_pk: int, after: tuple[str, int] | None, limit: int
    ) -> list[Summary]:
        """Every version of every summary of the user's sessions, by session then version."""
        query = (
            select(SessionSummary)
            .join(ChatSession, ChatSession.id == SessionSummary.session_id)
            .where(ChatSession.user_pk == user_pk)
        )
        if after is not None:
            query = query.where(
                tuple_(SessionSummary.session_id, SessionSummary.version) > tuple_(*after)
            )
        query = query.order_by(SessionSummary.session_id, SessionSummary.version).limit(limit)
        return await self._page(query, Summary)

    # Knowledge --------------------------------------------------------------------------

    async def list_documents(
        self,
        tenant_id: int,
        user_pk: int | None,
        after: tuple[dt.datetime, str] | None,
        limit: int,
    ) -> list[Document]:
        """A user's own documents, or (no user) the tenant's shared ones; oldest first."""
        owner = (
            KnowledgeDocument.user_pk.is_(None)
            if user_pk is None
            else KnowledgeDocument.user_pk == user_pk
        )
        query = select(KnowledgeDocument).where(KnowledgeDocument.tenant_id == tenant_id, owner)
        if after is not None:
            query = query.where(
                tuple_(KnowledgeDocument.created_at, KnowledgeDocument.id) > tuple_(*after)
            )
        query = query.order_by(KnowledgeDocument.created_at, KnowledgeDocument.id).limit(limit)
        return await self._page(query, Document)

    async def list_chunks(self, document_id: str, after_ordinal: int, limit: int) -> list[NewChunk]:
        rows = await self._session.execute(
            select(
                KnowledgeChunk.ordinal,
                KnowledgeChunk.text,
                KnowledgeChunk.token_count,
                KnowledgeChunk.heading_path,
            )
            .where(
                KnowledgeChunk.document_id == document_id, KnowledgeChunk.ordinal > after_ordinal
            )
            .order_by(KnowledgeChunk.ordinal)
            .limit(limit)
        )
        return [NewChunk(int(o), text, int(n), path) for o, text, n, path in rows.all()]

    # Totals -----------------------------------------------------------------------------

    async def count_rows(self, tenant_id: int, user_pk: int | None) -> dict[str, int]:
        """Rows of each kind in the unit (one user, or the whole tenant: `NUM_ROWS_TABLES`)."""
        users = select(UserRow.id).where(UserRow.tenant_id == tenant_id)
        if user_pk is not None:
            users = users.where(UserRow.id == user_pk)
        sessions = select(ChatSession.id).where(ChatSession.user_pk.in_(users))
        facts = select(FactRow.id).where(FactRow.user_pk.in_(users))
        documents = select(KnowledgeDocument.id).where(
            KnowledgeDocument.tenant_id == tenant_id,
            KnowledgeDocument.user_pk.in_(users)
            if user_pk is not None
            else or_(KnowledgeDocument.user_pk.is_(None), KnowledgeDocument.user_pk.in_(users)),
        )
        queries: Sequence[Select[Any]] = (
            select(func.count()).select_from(users.subquery()),
            select(func.count()).select_from(facts.subquery()),
            select(func.count(FactChangeRow.id)).where(FactChangeRow.fact_id.in_(facts)),
            select(func.count()).select_from(sessions.subquery()),
            select(func.count(Message.id)).where(Message.user_pk.in_(users)),
            select(func.count(SessionSummary.id)).where(SessionSummary.session_id.in_(sessions)),
            select(func.count()).select_from(documents.subquery()),
            select(func.count(KnowledgeChunk.id)).where(KnowledgeChunk.document_id.in_(documents)),
        )
        return {
            name: int(await self._session.scalar(query) or 0)
            for name, query in zip(NUM_ROWS_TABLES, queries, strict=True)
        }
