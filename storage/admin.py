"""What operators read across tenants: counts, statistics, and erasing a user for good."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Subquery, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.db import Database, rows_affected
from storage.errors import NotFoundError
from storage.models import (
    AdminSession,
    ApiKey,
    AuditEntry,
    ChatSession,
    Fact,
    FactChange,
    KnowledgeChunk,
    KnowledgeDocument,
    Message,
    MessageEmbedding,
    SessionSummary,
    Tenant,
    User,
)
from storage.records import User as UserRecord
from storage.records import to_record
from storage.users import is_row_id


@dataclass(frozen=True, slots=True)
class TenantCounts:
    id: int
    name: str
    num_users: int
    num_keys: int


@dataclass(frozen=True, slots=True)
class UserCounts:
    user: UserRecord
    tenant_name: str
    num_sessions: int
    num_messages: int
    num_facts: int
    num_documents: int


@dataclass(frozen=True, slots=True)
class ErasedUser:
    """What erasing a user removed from SQL; the ids let the caller drop their vectors."""

    user_pk: int
    tenant_id: int
    external_id: str
    num_sessions: int
    num_messages: int
    num_embeddings: int
    num_summaries: int
    num_facts: int
    num_fact_changes: int
    num_documents: int
    num_chunks: int

    def removed(self) -> dict[str, int]:
        """Rows removed, by table."""
        return {
            "sessions": self.num_sessions,
            "messages": self.num_messages,
            "message_embeddings": self.num_embeddings,
            "session_summaries": self.num_summaries,
            "facts": self.num_facts,
            "fact_changes": self.num_fact_changes,
            "knowledge_documents": self.num_documents,
            "knowledge_chunks": self.num_chunks,
            "users": 1,
        }


def _count_by(column: Any, *where: Any) -> Subquery:
    return select(column, func.count().label("n")).where(*where).group_by(column).subquery()


class AdminRepository:
    """Reads across tenants for operators, and the erasure of a user."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def list_tenants_with_counts(self) -> list[TenantCounts]:
        users = _count_by(User.tenant_id)
        keys = _count_by(ApiKey.tenant_id, ApiKey.revoked_at.is_(None))
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(
                    Tenant.id,
                    Tenant.name,
                    func.coalesce(users.c.n, 0),
                    func.coalesce(keys.c.n, 0),
                )
                .outerjoin(users, users.c.tenant_id == Tenant.id)
                .outerjoin(keys, keys.c.tenant_id == Tenant.id)
                .order_by(Tenant.id)
            )
            return [TenantCounts(int(a), b, int(c), int(d)) for a, b, c, d in rows.all()]

    async def list_users_with_counts(
        self,
        tenant_id: int | None = None,
        user_pk: int | None = None,
        *,
        prefix: str | None = None,
        after_id: int = 0,
        limit: int | None = None,
    ) -> list[UserCounts]:
        """Users (of one tenant, or one user, or all) by id, each with the size of their
        memory: those whose id string starts with `prefix` (exactly, case included),
        from the first id after `after_id`, at most `limit` (a page: its last user's id
        is the next page's `after_id`). The counts are read for the page's users only."""
        page = (
            select(User, Tenant.name)
            .join(Tenant, Tenant.id == User.tenant_id)
            .where(User.id > after_id)
            .order_by(User.id)
        )
        if tenant_id is not None:
            page = page.where(User.tenant_id == tenant_id)
        if user_pk is not None:
            page = page.where(User.id == user_pk)
        if prefix:
            page = page.where(func.substr(User.external_id, 1, len(prefix)) == prefix)
        if limit is not None:
            page = page.limit(limit)
        async with self._db.transaction() as session:
            users = (await session.execute(page)).all()
            pks = [user.id for user, _ in users]
            counts = [
                await self._counts(session, column, pks, *where)
                for column, *where in (
                    (ChatSession.user_pk,),
                    (Message.user_pk,),
                    (Fact.user_pk, Fact.status == "active"),
                    (KnowledgeDocument.user_pk,),
                )
            ]
        return [
            UserCounts(to_record(UserRecord, user), tenant, *(c.get(user.id, 0) for c in counts))
            for user, tenant in users
        ]

    @staticmethod
    async def _counts(
        session: AsyncSession, column: Any, pks: list[int], *where: Any
    ) -> dict[int, int]:
        """Rows per user among `pks` (absent: none)."""
        if not pks:
            return {}
        rows = await session.execute(
            select(column, func.count()).where(column.in_(pks), *where).group_by(column)
        )
        return {int(pk): int(n) for pk, n in rows.all()}

    async def get_user_counts(self, user_pk: int) -> UserCounts:
        found = await self.list_users_with_counts(user_pk=user_pk) if is_row_id(user_pk) else []
        if not found:
            raise NotFoundError("user", user_pk)
        return found[0]

    async def list_user_chunk_ids(self, user_pk: int) -> list[int]:
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(KnowledgeChunk.id)
                .join(KnowledgeDocument, KnowledgeDocument.id == KnowledgeChunk.document_id)
                .where(KnowledgeDocument.user_pk == user_pk)
            )
            return [int(i) for i in rows.all()]

    async def erase_user(self, user_pk: int) -> ErasedUser:
        """Delete every row of the user in one transaction, children first (SQLite cascades
        only with its pragma on, so nothing relies on it)."""
        async with self._db.transaction() as session:
            user = await session.get(User, user_pk)
            if user is None:
                raise NotFoundError("user", user_pk)
            session_ids = select(ChatSession.id).where(ChatSession.user_pk == user_pk)
            fact_ids = select(Fact.id).where(Fact.user_pk == user_pk)
            document_ids = select(KnowledgeDocument.id).where(KnowledgeDocument.user_pk == user_pk)
            counts = {}
            for name, statement in (
                ("embeddings", delete(MessageEmbedding).where(MessageEmbedding.user_pk == user_pk)),
                (
                    "summaries",
                    delete(SessionSummary).where(SessionSummary.session_id.in_(session_ids)),
                ),
                ("messages", delete(Message).where(Message.user_pk == user_pk)),
                ("sessions", delete(ChatSession).where(ChatSession.user_pk == user_pk)),
                ("fact_changes", delete(FactChange).where(FactChange.fact_id.in_(fact_ids))),
                ("facts", delete(Fact).where(Fact.user_pk == user_pk)),
                (
                    "chunks",
                    delete(KnowledgeChunk).where(KnowledgeChunk.document_id.in_(document_ids)),
                ),
                (
                    "documents",
                    delete(KnowledgeDocument).where(KnowledgeDocument.user_pk == user_pk),
                ),
            ):
                result = await session.execute(statement)
                counts[name] = rows_affected(result)
            erased = ErasedUser(
                user_pk=user.id,
                tenant_id=user.tenant_id,
                external_id=user.external_id,
                num_sessions=counts["sessions"],
                num_messages=counts["messages"],
                num_embeddings=counts["embeddings"],
                num_summaries=counts["summaries"],
                num_facts=counts["facts"],
                num_fact_changes=counts["fact_changes"],
                num_documents=counts["documents"],
                num_chunks=counts["chunks"],
            )
            await session.delete(user)
        return erased

    async def count_rows(self) -> dict[str, int]:
        """Rows per table, for the statistics page."""
        tables = {
            "tenants": Tenant,
            "api_keys": ApiKey,
            "admin_sessions": AdminSession,
            "audit_log": AuditEntry,
            "users": User,
            "sessions": ChatSession,
            "messages": Message,
            "message_embeddings": MessageEmbedding,
            "session_summaries": SessionSummary,
            "facts": Fact,
            "fact_changes": FactChange,
            "knowledge_documents": KnowledgeDocument,
            "knowledge_chunks": KnowledgeChunk,
        }
        async with self._db.transaction() as session:
            return {
                name: int(await session.scalar(select(func.count()).select_from(model)) or 0)
                for name, model in tables.items()
            }
