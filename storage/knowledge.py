"""Transactions over the knowledge base: documents and their chunks (the source of truth).

Vectors of chunks live only in the derived index; everything needed to rebuild it (the
chunk texts and their scopes) is here.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, or_, select, update

from storage.db import Database, rows_affected
from storage.errors import ConflictError, NotFoundError
from storage.models import KnowledgeChunk, KnowledgeDocument, User, utc_now
from storage.records import Document, to_record
from storage.sessions import is_uuid
from storage.users import get_or_add_user

PROCESSING = "processing"
READY = "ready"
FAILED = "failed"


def scope_of(tenant_id: int, user_pk: int | None) -> int:
    """The scope of a document, as one int: a user's pk (>= 1) for that user's own
    documents, minus the tenant's id for the knowledge its users share."""
    return -tenant_id if user_pk is None else user_pk


def scope_key(scope: int) -> str:
    """The scope as stored beside content hashes (re-uploads within a scope are found)."""
    return f"tenant:{-scope}" if scope < 0 else f"user:{scope}"


@dataclass(frozen=True, slots=True)
class NewDocument:
    tenant_id: int
    user_external_id: str | None
    title: str
    metadata: dict[str, Any]
    source: str
    filename: str | None
    content: str
    content_hash: str


@dataclass(frozen=True, slots=True)
class NewChunk:
    ordinal: int
    text: str
    token_count: int
    heading_path: str


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """A chunk with what retrieval shows of its document."""

    id: int
    document_id: str
    tenant_id: int
    user_pk: int | None
    ordinal: int
    text: str
    token_count: int
    heading_path: str
    title: str

    @property
    def scope(self) -> int:
        return scope_of(self.tenant_id, self.user_pk)


_CHUNK_COLUMNS = (
    KnowledgeChunk.id,
    KnowledgeChunk.document_id,
    KnowledgeDocument.tenant_id,
    KnowledgeDocument.user_pk,
    KnowledgeChunk.ordinal,
    KnowledgeChunk.text,
    KnowledgeChunk.token_count,
    KnowledgeChunk.heading_path,
    KnowledgeDocument.title,
)


def _stored(rows: Sequence[Any]) -> list[StoredChunk]:
    return [StoredChunk(*row) for row in rows]


def _in_scope(scope: int) -> Any:
    if scope < 0:
        return (KnowledgeDocument.user_pk.is_(None)) & (KnowledgeDocument.tenant_id == -scope)
    return KnowledgeDocument.user_pk == scope


class KnowledgeRepository:
    """Documents are created in `processing`, gain chunks batch by batch, then turn `ready`
    or `failed`; chunk ids are allocated by the database and never reused."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def add_document(self, new: NewDocument) -> tuple[Document, str | None, bool]:
        """The stored document of this content in this scope, or a new one in `processing`.

        Returns (document, owner's user id, created). Creates the owning user if unknown.
        """
        try:
            return await self._add_document(new)
        except ConflictError:
            # A concurrent upload of the same content won the race: answer with it.
            return await self._add_document(new)

    async def _add_document(self, new: NewDocument) -> tuple[Document, str | None, bool]:
        async with self._db.transaction() as session:
            user_pk = None
            if new.user_external_id is not None:
                user = await get_or_add_user(session, new.tenant_id, new.user_external_id)
                user_pk = user.id
            scope = scope_key(scope_of(new.tenant_id, user_pk))
            existing = await session.scalar(
                select(KnowledgeDocument).where(
                    KnowledgeDocument.scope == scope,
                    KnowledgeDocument.content_hash == new.content_hash,
                )
            )
            if existing is not None:
                return to_record(Document, existing), new.user_external_id, False
            now = utc_now()
            document = KnowledgeDocument(
                id=str(uuid.uuid4()),
                tenant_id=new.tenant_id,
                user_pk=user_pk,
                scope=scope,
                title=new.title,
                metadata_json=new.metadata,
                source=new.source,
                filename=new.filename,
                content=new.content,
                content_hash=new.content_hash,
                status=PROCESSING,
                failure_reason=None,
                num_chars=len(new.content),
                num_chunks=0,
                num_chunks_indexed=0,
                created_at=now,
                updated_at=now,
            )
            session.add(document)
            await session.flush()
            return to_record(Document, document), new.user_external_id, True

    async def get_document(self, document_id: str) -> tuple[Document, str | None]:
        """A document and its owner's user id (None for shared knowledge)."""
        if not is_uuid(document_id):
            raise NotFoundError("document", document_id)
        async with self._db.transaction() as session:
            row = (
                await session.execute(
                    select(KnowledgeDocument, User.external_id)
                    .outerjoin(User, User.id == KnowledgeDocument.user_pk)
                    .where(KnowledgeDocument.id == document_id)
                )
            ).first()
        if row is None:
            raise NotFoundError("document", document_id)
        return to_record(Document, row[0]), row[1]

    async def list_documents(self, scope: int) -> list[Document]:
        """Documents of one scope (see `scope_of`), oldest first."""
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(KnowledgeDocument)
                .where(_in_scope(scope))
                .order_by(KnowledgeDocument.created_at, KnowledgeDocument.id)
            )
            return [to_record(Document, row) for row in rows.all()]

    async def list_document_ids_in_status(self, status: str) -> list[str]:
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(KnowledgeDocument.id)
                .where(KnowledgeDocument.status == status)
                .order_by(KnowledgeDocument.created_at)
            )
            return list(rows.all())

    async def start_processing(self, document_id: str, num_chunks: int) -> list[int]:
        """(Re)start a document: status `processing`, planned chunk count, old chunks gone.

        Returns the ids of the chunks removed, whose vectors the caller removes too.
        """
        async with self._db.transaction() as session:
            old = await session.scalars(
                select(KnowledgeChunk.id).where(KnowledgeChunk.document_id == document_id)
            )
            old_ids = [int(i) for i in old.all()]
            await session.execute(
                delete(KnowledgeChunk).where(KnowledgeChunk.document_id == document_id)
            )
            await self._set(session, document_id, PROCESSING, None, num_chunks, 0)
        return old_ids

    async def add_chunks(self, document_id: str, chunks: Sequence[NewChunk]) -> list[int]:
        """Store one batch of chunks and count it as progress; returns their ids in order."""
        async with self._db.transaction() as session:
            ids = await session.scalars(
                # Ids in the order of the chunks: they key the vectors of the same batch.
                insert(KnowledgeChunk).returning(KnowledgeChunk.id, sort_by_parameter_order=True),
                [
                    {
                        "document_id": document_id,
                        "ordinal": c.ordinal,
                        "text": c.text,
                        "token_count": c.token_count,
                        "heading_path": c.heading_path,
                    }
                    for c in chunks
                ],
            )
            chunk_ids = [int(i) for i in ids.all()]
            result = await session.execute(
                update(KnowledgeDocument)
                .where(KnowledgeDocument.id == document_id)
                .values(
                    num_chunks_indexed=KnowledgeDocument.num_chunks_indexed + len(chunks),
                    updated_at=utc_now(),
                )
            )
            if rows_affected(result) == 0:
                raise NotFoundError("document", document_id)
        return chunk_ids

    async def finish_document(self, document_id: str, status: str, reason: str | None) -> None:
        async with self._db.transaction() as session:
            await self._set(session, document_id, status, reason)

    async def _set(
        self,
        session: Any,
        document_id: str,
        status: str,
        reason: str | None,
        num_chunks: int | None = None,
        num_indexed: int | None = None,
    ) -> None:
        values: dict[str, Any] = {
            "status": status,
            "failure_reason": reason,
            "updated_at": utc_now(),
        }
        if num_chunks is not None:
            values["num_chunks"] = num_chunks
        if num_indexed is not None:
            values["num_chunks_indexed"] = num_indexed
        result = await session.execute(
            update(KnowledgeDocument).where(KnowledgeDocument.id == document_id).values(**values)
        )
        if rows_affected(result) == 0:
            raise NotFoundError("document", document_id)

    async def delete_document(self, document_id: str) -> tuple[int, list[int]]:
        """Delete a document and its chunks; returns its scope and chunk ids."""
        if not is_uuid(document_id):
            raise NotFoundError("document", document_id)
        async with self._db.transaction() as session:
            document = await session.get(KnowledgeDocument, document_id)
            if document is None:
                raise NotFoundError("document", document_id)
            ids = await session.scalars(
                select(KnowledgeChunk.id).where(KnowledgeChunk.document_id == document_id)
            )
            chunk_ids = [int(i) for i in ids.all()]
            scope = scope_of(document.tenant_id, document.user_pk)
            await session.execute(
                delete(KnowledgeChunk).where(KnowledgeChunk.document_id == document_id)
            )
            await session.delete(document)
        return scope, chunk_ids

    # Chunks for retrieval and for rebuilding the index --------------------------------

    async def list_ready_chunks_by_id(
        self, scopes: Collection[int], ids: Sequence[int]
    ) -> list[StoredChunk]:
        """Chunks of ready documents in the given scopes, by id (order not kept)."""
        if not ids:
            return []
        in_scopes = or_(*(_in_scope(scope) for scope in scopes))
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(*_CHUNK_COLUMNS)
                .join(KnowledgeDocument, KnowledgeDocument.id == KnowledgeChunk.document_id)
                .where(
                    KnowledgeChunk.id.in_(list(ids)),
                    KnowledgeDocument.status == READY,
                    in_scopes,
                )
            )
            return _stored(rows.all())

    async def list_scopes_with_documents(self, scopes: Collection[int]) -> set[int]:
        """Which of these scopes hold at least one document."""
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(KnowledgeDocument.tenant_id, KnowledgeDocument.user_pk)
                .where(or_(*(_in_scope(scope) for scope in scopes)))
                .distinct()
            )
            return {scope_of(tenant_id, user_pk) for tenant_id, user_pk in rows.all()}

    async def list_chunk_ids(self, scope: int) -> set[int]:
        """Ids of every stored chunk of one scope, whatever its document's status."""
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(KnowledgeChunk.id)
                .join(KnowledgeDocument, KnowledgeDocument.id == KnowledgeChunk.document_id)
                .where(_in_scope(scope))
            )
            return {int(i) for i in rows.all()}

    async def list_chunks_after_id(
        self, after_id: int, limit: int, ids: Collection[int] | None = None
    ) -> list[StoredChunk]:
        """Chunks in id order, a page at a time; only those in `ids` when given."""
        query = (
            select(*_CHUNK_COLUMNS)
            .join(KnowledgeDocument, KnowledgeDocument.id == KnowledgeChunk.document_id)
            .where(KnowledgeChunk.id > after_id)
            .order_by(KnowledgeChunk.id)
            .limit(limit)
        )
        if ids is not None:
            query = query.where(
                KnowledgeChunk.id.in_([i for i in sorted(ids) if i > after_id][:limit])
            )
        async with self._db.transaction() as session:
            return _stored((await session.execute(query)).all())

    async def count_chunks(self) -> int:
        async with self._db.transaction() as session:
            return int(await session.scalar(select(func.count(KnowledgeChunk.id))) or 0)
