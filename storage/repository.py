"""Transactions over the relational store. Each public coroutine is one transaction."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from storage.db import transaction
from storage.errors import NotFoundError
from storage.models import (
    ChatSession,
    Message,
    MessageEmbedding,
    ReadinessProbe,
    User,
    utc_now,
)

# The largest id a BigInteger column holds.
MAX_ID = 2**63 - 1


def is_uuid(value: str) -> bool:
    """Session and document ids are UUIDs: anything else names no row (and is never sent
    to the database, which may refuse it as a value: NUL)."""
    try:
        return str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class NewMessage:
    role: str
    content: str
    token_count: int
    name: str | None = None
    created_at: dt.datetime | None = None
    external_id: str | None = None
    image_caption: str | None = None


@dataclass(frozen=True, slots=True)
class RestoredMessage:
    """A message as exported: its place (seq) and time are kept, its id is not."""

    seq: int
    role: str
    content: str
    created_at: dt.datetime
    token_count: int
    name: str | None = None
    external_id: str | None = None
    image_caption: str | None = None


@dataclass(frozen=True, slots=True)
class StoredVector:
    message_id: int
    user_pk: int
    vector: bytes


@dataclass(frozen=True, slots=True)
class ImportResult:
    messages: list[Message]
    num_skipped: int


class Store:
    """Owns the session factory; translates driver errors into storage errors."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        self._sessionmaker = sessionmaker

    @property
    def sessionmaker(self) -> async_sessionmaker[AsyncSession]:
        return self._sessionmaker

    def _transaction(self) -> AbstractAsyncContextManager[AsyncSession]:
        return transaction(self._sessionmaker)

    async def ping(self) -> None:
        async with self._transaction() as session:
            await session.execute(text("SELECT 1"))

    async def check_writable(self) -> None:
        """Rewrite the readiness row and commit: raises where the database answers reads
        but takes no writes (a full disk, a read-only replica)."""
        async with self._transaction() as session:
            await session.execute(
                update(ReadinessProbe).where(ReadinessProbe.id == 1).values(checked_at=utc_now())
            )

    # Users and sessions -------------------------------------------------------------

    # A user is known by the client's id within a tenant: every lookup names the tenant.

    async def get_user_or_none(self, external_id: str, *, tenant_id: int) -> User | None:
        async with self._transaction() as session:
            return await _user_by_external_id(session, tenant_id, external_id)

    async def get_user(self, external_id: str, *, tenant_id: int) -> User:
        user = await self.get_user_or_none(external_id, tenant_id=tenant_id)
        if user is None:
            raise NotFoundError("user", external_id)
        return user

    async def get_user_by_pk(self, user_pk: int) -> User:
        if not 1 <= user_pk <= MAX_ID:  # no such row can exist; the driver would overflow
            raise NotFoundError("user", user_pk)
        async with self._transaction() as session:
            user = await session.get(User, user_pk)
        if user is None:
            raise NotFoundError("user", user_pk)
        return user

    async def ensure_user(self, external_id: str, *, tenant_id: int) -> User:
        """The user, created if unknown (a client may state facts before any session)."""
        async with self._transaction() as session:
            return await _get_or_add_user(session, tenant_id, external_id)

    async def create_session(
        self, user_external_id: str, title: str | None, metadata: dict[str, Any], *, tenant_id: int
    ) -> tuple[ChatSession, User]:
        async with self._transaction() as session:
            user = await _get_or_add_user(session, tenant_id, user_external_id)
            chat = ChatSession(
                id=str(uuid.uuid4()),
                user_pk=user.id,
                title=title,
                metadata_json=metadata,
                created_at=utc_now(),
            )
            session.add(chat)
        return chat, user

    async def get_session(self, session_id: str) -> tuple[ChatSession, User]:
        if not is_uuid(session_id):
            raise NotFoundError("session", session_id)
        async with self._transaction() as session:
            return await _session_and_user(session, session_id)

    async def list_sessions(
        self, user_external_id: str, *, tenant_id: int
    ) -> list[tuple[ChatSession, int]]:
        """Sessions of a user, oldest first, each with its number of messages."""
        counts = (
            select(Message.session_id, func.count(Message.id).label("n"))
            .group_by(Message.session_id)
            .subquery()
        )
        async with self._transaction() as session:
            rows = await session.execute(
                select(ChatSession, func.coalesce(counts.c.n, 0))
                .join(User, User.id == ChatSession.user_pk)
                .outerjoin(counts, counts.c.session_id == ChatSession.id)
                .where(User.tenant_id == tenant_id, User.external_id == user_external_id)
                .order_by(ChatSession.created_at, ChatSession.id)
            )
            return [(chat, int(n)) for chat, n in rows.all()]

    async def count_messages(self, session_id: str) -> int:
        async with self._transaction() as session:
            result = await session.scalar(
                select(func.count(Message.id)).where(Message.session_id == session_id)
            )
            return int(result or 0)

    async def delete_session(self, session_id: str) -> list[int]:
        """Delete a session and its messages; returns the deleted message ids."""
        async with self._transaction() as session:
            chat = await session.get(ChatSession, session_id)
            if chat is None:
                raise NotFoundError("session", session_id)
            ids = list(
                (
                    await session.scalars(
                        select(Message.id).where(Message.session_id == session_id)
                    )
                ).all()
            )
            # Explicit deletes: SQLite cascades only with its pragma, so do not rely on it.
            await session.execute(
                delete(MessageEmbedding).where(MessageEmbedding.message_id.in_(ids))
            )
            await session.execute(delete(Message).where(Message.session_id == session_id))
            await session.delete(chat)
            return ids

    async def list_user_sessions(
        self, user_external_id: str, *, tenant_id: int
    ) -> list[tuple[ChatSession, list[Message]]]:
        """Every session of a user with all its messages, both in order (for export)."""
        async with self._transaction() as session:
            chats = (
                await session.scalars(
                    select(ChatSession)
                    .join(User, User.id == ChatSession.user_pk)
                    .where(User.tenant_id == tenant_id, User.external_id == user_external_id)
                    .order_by(ChatSession.created_at, ChatSession.id)
                )
            ).all()
            found = []
            for chat in chats:
                rows = await session.scalars(
                    select(Message).where(Message.session_id == chat.id).order_by(Message.seq)
                )
                found.append((chat, list(rows.all())))
            return found

    async def restore_session(
        self,
        user_external_id: str,
        chat: ChatSession,
        messages: Sequence[RestoredMessage],
        *,
        tenant_id: int,
    ) -> list[Message] | None:
        """Recreate an exported session as it was; None (and no change) if its id exists."""
        async with self._transaction() as session:
            if await session.get(ChatSession, chat.id) is not None:
                return None
            user = await _get_or_add_user(session, tenant_id, user_external_id)
            chat.user_pk = user.id
            session.add(chat)
            rows = [
                Message(
                    session_id=chat.id,
                    user_pk=user.id,
                    seq=m.seq,
                    role=m.role,
                    name=m.name,
                    content=m.content,
                    created_at=m.created_at,
                    external_id=m.external_id,
                    token_count=m.token_count,
                    image_caption=m.image_caption,
                )
                for m in messages
            ]
            session.add_all(rows)
            await session.flush()
            return rows

    # Messages -----------------------------------------------------------------------

    async def add_messages(
        self, chat: ChatSession, new_messages: Sequence[NewMessage]
    ) -> ImportResult:
        """Append messages in order; ones whose external_id the session holds are skipped."""
        async with self._transaction() as session:
            last_seq = await session.scalar(
                select(func.max(Message.seq)).where(Message.session_id == chat.id)
            )
            known = await _known_external_ids(session, chat.id, new_messages)
            seq = int(last_seq or 0)
            rows: list[Message] = []
            num_skipped = 0
            for item in new_messages:
                if item.external_id is not None and item.external_id in known:
                    num_skipped += 1
                    continue
                if item.external_id is not None:
                    known.add(item.external_id)
                seq += 1
                rows.append(
                    Message(
                        session_id=chat.id,
                        user_pk=chat.user_pk,
                        seq=seq,
                        role=item.role,
                        name=item.name,
                        content=item.content,
                        created_at=item.created_at or utc_now(),
                        external_id=item.external_id,
                        token_count=item.token_count,
                        image_caption=item.image_caption,
                    )
                )
            session.add_all(rows)
            await session.flush()
        return ImportResult(messages=rows, num_skipped=num_skipped)

    async def list_messages(
        self, session_id: str, *, limit: int | None = None, after_seq: int = 0
    ) -> list[Message]:
        async with self._transaction() as session:
            query = (
                select(Message)
                .where(Message.session_id == session_id, Message.seq > after_seq)
                .order_by(Message.seq)
            )
            if limit is not None:
                query = query.limit(limit)
            return list((await session.scalars(query)).all())

    async def list_messages_by_id(self, user_pk: int, ids: Sequence[int]) -> list[Message]:
        """Messages of one user by id (order not kept; ids of other users are ignored)."""
        if not ids:
            return []
        async with self._transaction() as session:
            rows = await session.scalars(
                select(Message).where(Message.user_pk == user_pk, Message.id.in_(list(ids)))
            )
            return list(rows.all())

    async def list_user_messages(self, user_pk: int) -> list[Message]:
        """Every message of a user, each session's in order (to build derived indexes)."""
        async with self._transaction() as session:
            rows = await session.scalars(
                select(Message)
                .where(Message.user_pk == user_pk)
                .order_by(Message.session_id, Message.seq)
            )
            return list(rows.all())

    async def list_messages_by_seq(self, keys: Collection[tuple[str, int]]) -> list[Message]:
        """Messages by (session id, seq); keys that match nothing are ignored."""
        by_session: dict[str, list[int]] = {}
        for session_id, seq in keys:
            by_session.setdefault(session_id, []).append(seq)
        found: list[Message] = []
        async with self._transaction() as session:
            for session_id, seqs in sorted(by_session.items()):
                rows = await session.scalars(
                    select(Message).where(
                        Message.session_id == session_id, Message.seq.in_(sorted(set(seqs)))
                    )
                )
                found.extend(rows.all())
        return found

    # Embeddings ---------------------------------------------------------------------

    async def save_embeddings(
        self, model: str, dimension: int, vectors: Sequence[StoredVector]
    ) -> None:
        """Store (or replace) the vectors of messages, in one transaction."""
        if not vectors:
            return
        ids = [item.message_id for item in vectors]
        async with self._transaction() as session:
            for start in range(0, len(ids), 500):
                await session.execute(
                    delete(MessageEmbedding).where(
                        MessageEmbedding.message_id.in_(ids[start : start + 500])
                    )
                )
            await session.execute(
                insert(MessageEmbedding),
                [
                    {
                        "message_id": item.message_id,
                        "user_pk": item.user_pk,
                        "model": model,
                        "dimension": dimension,
                        "vector": item.vector,
                    }
                    for item in vectors
                ],
            )

    async def list_embedding_models(self) -> list[tuple[str, int]]:
        async with self._transaction() as session:
            rows = await session.execute(
                select(MessageEmbedding.model, MessageEmbedding.dimension).distinct()
            )
            return [(model, int(dim)) for model, dim in rows.all()]

    async def list_user_vector_ids(self, user_pk: int) -> set[int]:
        async with self._transaction() as session:
            rows = await session.scalars(
                select(MessageEmbedding.message_id).where(MessageEmbedding.user_pk == user_pk)
            )
            return {int(i) for i in rows.all()}

    async def list_user_vectors(
        self, user_pk: int, ids: Collection[int] | None = None
    ) -> list[StoredVector]:
        """Vectors of a user, by message id; all of them when `ids` is None."""
        query = select(MessageEmbedding.message_id, MessageEmbedding.vector).where(
            MessageEmbedding.user_pk == user_pk
        )
        chunks: list[list[int] | None] = [None]
        if ids is not None:
            ordered = sorted(ids)
            chunks = [ordered[i : i + 500] for i in range(0, len(ordered), 500)]
        found: list[StoredVector] = []
        async with self._transaction() as session:
            for chunk in chunks:
                chunk_query = (
                    query if chunk is None else query.where(MessageEmbedding.message_id.in_(chunk))
                )
                rows = await session.execute(chunk_query.order_by(MessageEmbedding.message_id))
                found.extend(StoredVector(int(mid), user_pk, vec) for mid, vec in rows.all())
        return found

    async def list_unembedded_messages(self, limit: int) -> list[Message]:
        """Messages stored without a vector (a crash between the two writes)."""
        async with self._transaction() as session:
            rows = await session.scalars(
                select(Message)
                .outerjoin(MessageEmbedding, MessageEmbedding.message_id == Message.id)
                .where(MessageEmbedding.message_id.is_(None))
                .order_by(Message.id)
                .limit(limit)
            )
            return list(rows.all())

    async def list_user_pks(self) -> list[int]:
        async with self._transaction() as session:
            return list((await session.scalars(select(User.id).order_by(User.id))).all())

    async def list_messages_after_id(self, after_id: int, limit: int) -> list[Message]:
        async with self._transaction() as session:
            rows = await session.scalars(
                select(Message).where(Message.id > after_id).order_by(Message.id).limit(limit)
            )
            return list(rows.all())

    async def delete_user_embeddings(self, user_pk: int) -> None:
        async with self._transaction() as session:
            await session.execute(
                delete(MessageEmbedding).where(MessageEmbedding.user_pk == user_pk)
            )

    async def delete_all_embeddings(self) -> None:
        async with self._transaction() as session:
            await session.execute(delete(MessageEmbedding))


async def _session_and_user(session: AsyncSession, session_id: str) -> tuple[ChatSession, User]:
    row = (
        await session.execute(
            select(ChatSession, User)
            .join(User, User.id == ChatSession.user_pk)
            .where(ChatSession.id == session_id)
        )
    ).first()
    if row is None:
        raise NotFoundError("session", session_id)
    return row[0], row[1]


async def _user_by_external_id(
    session: AsyncSession, tenant_id: int, external_id: str
) -> User | None:
    return await session.scalar(
        select(User).where(User.tenant_id == tenant_id, User.external_id == external_id)
    )


async def _get_or_add_user(session: AsyncSession, tenant_id: int, external_id: str) -> User:
    user = await _user_by_external_id(session, tenant_id, external_id)
    if user is None:
        user = User(tenant_id=tenant_id, external_id=external_id, created_at=utc_now())
        session.add(user)
        await session.flush()
    return user


async def _known_external_ids(
    session: AsyncSession, session_id: str, new_messages: Sequence[NewMessage]
) -> set[str]:
    wanted = {m.external_id for m in new_messages if m.external_id is not None}
    if not wanted:
        return set()
    rows = await session.scalars(
        select(Message.external_id).where(
            Message.session_id == session_id, Message.external_id.in_(wanted)
        )
    )
    return {value for value in rows.all() if value is not None}
