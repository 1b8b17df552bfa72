"""Restoring exported rows: each call writes one run of rows inside the caller's
transaction, adding only what is missing, so that restoring the same rows twice changes
nothing the second time.

Rows are found again by their natural keys: a user by (tenant, external id), a session
and a document by id (a document also by its scope and content hash), a message by
(session id, seq), a summary by (session id, version), a chunk by (document id, ordinal),
a fact by (user, created_at, valid_from), a fact change by (fact, action, changed_at).
A stored row is never changed, with two exceptions that only fill in what an earlier,
interrupted restore left unset: a fact's sources when it has none, and the user's fact
extraction watermark, which only moves forward.

References to messages arrive as natural keys and are resolved here, after the run's own
rows are flushed, so a message may name one stored earlier in the same batch. A key that
names no message of the user, or a session of another user, is refused
(`RestoreRefusedError`, with the row's position in the run): the batch rolls back.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from storage.backup.reading import MessageKey
from storage.backup.restored import (
    RestoredChange,
    RestoredDocument,
    RestoredFact,
    RestoredMessage,
)
from storage.errors import RestoreRefusedError
from storage.knowledge import NewChunk, scope_key, scope_of
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
from storage.records import DocumentFields, Session, Summary, Turn, User, to_record
from storage.sessions import is_uuid, message_row
from storage.users import user_row_or_none


class RestoreBatch:
    """Writes of one batch, in one transaction (see the module's docstring)."""

    def __init__(self, session: AsyncSession) -> None:
        self._session = session

    async def restore_user(
        self, tenant_id: int, external_id: str, created_at: dt.datetime | None
    ) -> tuple[User, bool]:
        """The user, and whether it was added (with its time, when given)."""
        row = await user_row_or_none(self._session, tenant_id, external_id)
        if row is not None:
            return to_record(User, row), False
        row = UserRow(tenant_id=tenant_id, external_id=external_id)
        if created_at is not None:
            row.created_at = created_at
        self._session.add(row)
        await self._session.flush()
        return to_record(User, row), True

    async def message_ids(
        self, user_pk: int, keys: Collection[MessageKey]
    ) -> dict[MessageKey, int]:
        """The ids of the user's messages with these keys (keys of none are left out)."""
        by_session: dict[str, set[int]] = {}
        for session_id, seq in keys:
            by_session.setdefault(session_id, set()).add(seq)
        found: dict[MessageKey, int] = {}
        items = sorted(by_session.items())
        for start in range(0, len(items), 200):
            condition = or_(
                *(
                    (Message.session_id == session_id) & Message.seq.in_(sorted(seqs))
                    for session_id, seqs in items[start : start + 200]
                )
            )
            rows = await self._session.execute(
                select(Message.session_id, Message.seq, Message.id).where(
                    Message.user_pk == user_pk, condition
                )
            )
            found |= {(s, int(q)): int(i) for s, q, i in rows.all()}
        return found

    async def _resolve(
        self, user_pk: int, wanted: Sequence[Sequence[MessageKey] | None]
    ) -> list[list[int] | None]:
        """Each list of keys as ids, in order; refused at the first list naming a key
        that no message of the user has."""
        keys = {key for group in wanted if group for key in group}
        ids = await self.message_ids(user_pk, keys) if keys else {}
        resolved: list[list[int] | None] = []
        for position, group in enumerate(wanted):
            if group is None:
                resolved.append(None)
                continue
            missing = [key for key in group if key not in ids]
            if missing:
                session_id, seq = missing[0]
                raise RestoreRefusedError(
                    position, f"no message {seq} of session {session_id} is stored before it"
                )
            resolved.append([ids[key] for key in group])
        return resolved

    async def _session_owners(self, session_ids: Collection[str]) -> dict[str, int]:
        rows = await self._session.execute(
            select(ChatSession.id, ChatSession.user_pk).where(
                ChatSession.id.in_(sorted(session_ids))
            )
        )
        return {session_id: int(owner) for session_id, owner in rows.all()}

    async def _check_sessions(self, user_pk: int, session_ids: Sequence[str]) -> None:
        owners = await self._session_owners(set(session_ids))
        for position, session_id in enumerate(session_ids):
            if owners.get(session_id) != user_pk:
                raise RestoreRefusedError(
                    position, f"session {session_id} is not a session of this user stored before"
                )

    # Facts ------------------------------------------------------------------------------

    async def restore_facts(
        self, user_pk: int, facts: Sequence[RestoredFact], claimed: Collection[int]
    ) -> list[tuple[int, bool]]:
        """Each fact's id here and whether it was added; a stored fact with the same
        creation time and validity start is the same fact unless `claimed` (mapped
        already) or claimed by an earlier fact of this run."""
        stored = await self._session.execute(
            select(FactRow.id, FactRow.created_at, FactRow.valid_from).where(
                FactRow.user_pk == user_pk,
                FactRow.created_at.in_(sorted({f.created_at for f in facts})),
            )
        )
        candidates: dict[tuple[dt.datetime, dt.datetime], list[int]] = {}
        for fact_id, created_at, valid_from in stored.all():
            candidates.setdefault((created_at, valid_from), []).append(int(fact_id))
        taken = set(claimed)
        result: list[tuple[int, bool] | FactRow] = []
        for fact in facts:
            free = [
                i for i in candidates.get((fact.created_at, fact.valid_from), []) if i not in taken
            ]
            if free:
                taken.add(free[0])
                result.append((free[0], False))
                continue
            row = FactRow(user_pk=user_pk, source_message_ids=[], model=None, vector=None)
            for name in RestoredFact.__slots__:
                setattr(row, name, getattr(fact, name))
            self._session.add(row)
            result.append(row)
        await self._session.flush()
        return [item if isinstance(item, tuple) else (item.id, True) for item in result]

    async def restore_fact_sources(
        self, user_pk: int, sources: Sequence[tuple[int, Sequence[MessageKey]]]
    ) -> int:
        """Set the source messages of facts that have none; returns how many were set."""
        resolved = await self._resolve(user_pk, [keys for _, keys in sources])
        rows = await self._session.execute(
            select(FactRow.id, FactRow.source_message_ids).where(
                FactRow.user_pk == user_pk, FactRow.id.in_(sorted({i for i, _ in sources}))
            )
        )
        empty = {int(fact_id) for fact_id, stored in rows.all() if not stored}
        num_set = 0
        for (fact_id, _keys), ids in zip(sources, resolved, strict=True):
            if fact_id in empty and ids:
                await self._session.execute(
                    update(FactRow).where(FactRow.id == fact_id).values(source_message_ids=ids)
                )
                empty.discard(fact_id)
                num_set += 1
        return num_set

    async def restore_fact_changes(self, user_pk: int, changes: Sequence[RestoredChange]) -> int:
        stored = await self._session.execute(
            select(FactChangeRow.fact_id, FactChangeRow.action, FactChangeRow.changed_at).where(
                FactChangeRow.fact_id.in_(sorted({c.fact_id for c in changes}))
            )
        )
        present = {(int(f), a, at) for f, a, at in stored.all()}
        before = await self._resolve(user_pk, [c.before_sources for c in changes])
        after = await self._resolve(user_pk, [c.after_sources for c in changes])
        rows = []
        for change, before_ids, after_ids in zip(changes, before, after, strict=True):
            key = (change.fact_id, change.action, change.changed_at)
            if key in present:
                continue
            present.add(key)
            rows.append(
                FactChangeRow(
                    fact_id=change.fact_id,
                    action=change.action,
                    actor=change.actor,
                    changed_at=change.changed_at,
                    before=_with_sources(change.before, before_ids),
                    after=_with_sources(change.after, after_ids),
                )
            )
        self._session.add_all(rows)
        await self._session.flush()
        return len(rows)

    async def raise_watermark(self, user_pk: int, key: MessageKey) -> None:
        """Fact extraction has read the user's messages through `key` (never moved back)."""
        [ids] = await self._resolve(user_pk, [[key]])
        message_id = ids[0] if ids else 0
        await self._session.execute(
            update(UserRow)
            .where(UserRow.id == user_pk, UserRow.facts_through_message_id < message_id)
            .values(facts_through_message_id=message_id)
        )

    # Sessions, messages, summaries --------------------------------------------------------

    async def restore_sessions(self, user_pk: int, sessions: Sequence[Session]) -> int:
        """Add the sessions not stored; refused if one is another user's or not a UUID."""
        owners = await self._session_owners({s.id for s in sessions if is_uuid(s.id)})
        rows = []
        for position, chat in enumerate(sessions):
            if not is_uuid(chat.id):
                raise RestoreRefusedError(position, f"session id {chat.id!r} is not a UUID")
            owner = owners.get(chat.id)
            if owner is not None and owner != user_pk:
                raise RestoreRefusedError(position, f"session {chat.id} is another user's")
            if owner is None:
                owners[chat.id] = user_pk
                rows.append(
                    ChatSession(
                        id=chat.id,
                        user_pk=user_pk,
                        title=chat.title,
                        metadata_json=chat.metadata_json,
                        created_at=chat.created_at,
                    )
                )
        self._session.add_all(rows)
        await self._session.flush()
        return len(rows)

    async def restore_messages(
        self, user_pk: int, messages: Sequence[RestoredMessage]
    ) -> tuple[list[Turn], int]:
        """Add the messages whose (session, seq) is not stored; returns them and how many
        were there already. Their sessions must be the user's, stored before."""
        await self._check_sessions(user_pk, [m.session_id for m in messages])
        present = set(
            await self.message_ids(user_pk, {(m.session_id, m.turn.seq or 0) for m in messages})
        )
        added: list[tuple[int, Message]] = []
        for position, item in enumerate(messages):
            key = (item.session_id, item.turn.seq or 0)
            if key in present:
                continue
            present.add(key)
            row = message_row(item.session_id, user_pk, key[1], item.turn)
            row.context_note_ids = None
            added.append((position, row))
        self._session.add_all([row for _, row in added])
        await self._session.flush()
        wanted = [messages[position].context_note_keys for position, _ in added]
        try:
            resolved = await self._resolve(user_pk, wanted)
        except RestoreRefusedError as exc:
            raise RestoreRefusedError(added[exc.position][0], exc.reason) from exc
        for (_, row), ids in zip(added, resolved, strict=True):
            if ids is not None:
                row.context_note_ids = ids
        await self._session.flush()
        return [to_record(Turn, row) for _, row in added], len(messages) - len(added)

    async def restore_summaries(self, user_pk: int, summaries: Sequence[Summary]) -> int:
        await self._check_sessions(user_pk, [s.session_id for s in summaries])
        stored = await self._session.execute(
            select(SessionSummary.session_id, SessionSummary.version).where(
                SessionSummary.session_id.in_(sorted({s.session_id for s in summaries}))
            )
        )
        present = {(s, int(v)) for s, v in stored.all()}
        rows = []
        for summary in summaries:
            if (summary.session_id, summary.version) in present:
                continue
            present.add((summary.session_id, summary.version))
            rows.append(
                SessionSummary(
                    session_id=summary.session_id,
                    version=summary.version,
                    through_seq=summary.through_seq,
                    pruned_seqs=list(summary.pruned_seqs or ()),
                    pinned_fact_ids=summary.pinned_fact_ids,
                    text=summary.text,
                    summarizer=summary.summarizer,
                    token_count=summary.token_count,
                    created_at=summary.created_at,
                )
            )
        self._session.add_all(rows)
        await self._session.flush()
        return len(rows)

    # Knowledge --------------------------------------------------------------------------

    async def restore_documents(
        self, tenant_id: int, documents: Sequence[RestoredDocument]
    ) -> list[bool]:
        """Whether each document was added: one whose id, or whose text in the same scope,
        is stored already is not (its chunks are then skipped: they name no stored id)."""
        for position, document in enumerate(documents):
            if not is_uuid(document.fields.id):
                raise RestoreRefusedError(
                    position, f"document id {document.fields.id!r} is not a UUID"
                )
        scopes = [scope_key(scope_of(tenant_id, d.user_pk)) for d in documents]
        stored = await self._session.execute(
            select(
                KnowledgeDocument.id, KnowledgeDocument.scope, KnowledgeDocument.content_hash
            ).where(
                or_(
                    KnowledgeDocument.id.in_(sorted({d.fields.id for d in documents})),
                    KnowledgeDocument.content_hash.in_(
                        sorted({d.fields.content_hash for d in documents})
                    ),
                )
            )
        )
        ids, contents = set(), set()
        for document_id, scope, content in stored.all():
            ids.add(document_id)
            contents.add((scope, content))
        added = []
        for document, scope in zip(documents, scopes, strict=True):
            fields = document.fields
            if fields.id in ids or (scope, fields.content_hash) in contents:
                added.append(False)
                continue
            ids.add(fields.id)
            contents.add((scope, fields.content_hash))
            row = KnowledgeDocument(
                tenant_id=tenant_id,
                user_pk=document.user_pk,
                scope=scope,
                metadata_json=document.metadata,
                content=document.content,
            )
            for name in DocumentFields.__struct_fields__:
                setattr(row, name, getattr(fields, name))
            self._session.add(row)
            added.append(True)
        await self._session.flush()
        return added

    async def restore_chunks(self, chunks: Sequence[tuple[str, NewChunk]]) -> list[tuple[int, int]]:
        """Add the chunks not stored of stored documents; returns (scope, id) of each added."""
        document_ids = sorted({document_id for document_id, _ in chunks})
        documents = await self._session.execute(
            select(
                KnowledgeDocument.id, KnowledgeDocument.tenant_id, KnowledgeDocument.user_pk
            ).where(KnowledgeDocument.id.in_(document_ids))
        )
        scopes = {d: scope_of(int(t), None if u is None else int(u)) for d, t, u in documents.all()}
        stored = await self._session.execute(
            select(KnowledgeChunk.document_id, KnowledgeChunk.ordinal).where(
                KnowledgeChunk.document_id.in_(document_ids),
                KnowledgeChunk.ordinal.in_(sorted({chunk.ordinal for _, chunk in chunks})),
            )
        )
        present = {(d, int(o)) for d, o in stored.all()}
        rows = []
        for document_id, chunk in chunks:
            if document_id not in scopes or (document_id, chunk.ordinal) in present:
                continue
            present.add((document_id, chunk.ordinal))
            rows.append(
                KnowledgeChunk(
                    document_id=document_id,
                    ordinal=chunk.ordinal,
                    text=chunk.text,
                    token_count=chunk.token_count,
                    heading_path=chunk.heading_path,
                )
            )
        self._session.add_all(rows)
        await self._session.flush()
        return [(scopes[row.document_id], row.id) for row in rows]


def _with_sources(snapshot: dict[str, Any] | None, ids: list[int] | None) -> dict[str, Any] | None:
    if snapshot is None or ids is None:
        return snapshot
    return {**snapshot, "source_message_ids": ids}
