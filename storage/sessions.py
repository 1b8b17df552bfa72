"""Chat sessions: each of one user, its messages in order, its summary versions."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from sqlalchemy import (
    BindParameter,
    ScalarSelect,
    Select,
    bindparam,
    delete,
    exists,
    func,
    select,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session as SyncSession
from sqlalchemy.orm import aliased

from storage.db import Database
from storage.embeddings import bump_memory_versions
from storage.errors import NotFoundError
from storage.facts import PINNED_FACTS, forget_message_sources
from storage.models import (
    ChatSession,
    KnowledgeDocument,
    Message,
    MessageEmbedding,
    SessionSummary,
    utc_now,
)
from storage.models import User as UserRow
from storage.records import (
    Fact,
    NewTurn,
    Session,
    Summary,
    Turn,
    User,
    record_columns,
    records_of,
    to_record,
)
from storage.users import get_or_add_user


def is_uuid(value: str) -> bool:
    """Session and document ids are UUIDs: anything else names no row (and is never sent
    to the database, which may refuse it as a value: NUL)."""
    try:
        return str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session, its user and its current summary version, read together; and whether
    knowledge documents exist that the user may be answered from (the tenant's shared
    ones, the user's own), so that a turn opens no empty knowledge scope."""

    session: Session
    user: User
    summary: Summary
    has_shared_knowledge: bool = False
    has_own_knowledge: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnState(SessionState):
    """The state and what a turn reads with it, in the same transaction (as of the same
    instant): the messages after the summary's `through_seq` (its window), oldest first,
    and the user's active pinned facts, by id."""

    window: tuple[Turn, ...]
    pinned_facts: tuple[Fact, ...]


def _state_query() -> Select[ChatSession, UserRow, SessionSummary, bool, bool]:
    """A session, its user, its current summary and the knowledge flags (read on every
    turn: built once)."""
    session_id: BindParameter[str] = bindparam("session_id")
    latest = (
        select(func.max(SessionSummary.version))
        .where(SessionSummary.session_id == session_id)
        .scalar_subquery()
    )
    shared = (
        exists()
        .where(KnowledgeDocument.user_pk.is_(None))
        .where(KnowledgeDocument.tenant_id == UserRow.tenant_id)
    )
    own = exists().where(KnowledgeDocument.user_pk == UserRow.id)
    return (
        select(ChatSession, UserRow, SessionSummary, shared, own)
        .join(UserRow, UserRow.id == ChatSession.user_pk)
        .outerjoin(
            SessionSummary,
            (SessionSummary.session_id == ChatSession.id) & (SessionSummary.version == latest),
        )
        .where(ChatSession.id == session_id)
    )


_STATE = _state_query()


def _read_state(session: SyncSession, session_id: str) -> SessionState:
    """The state of a session, in one query (its summary the empty version 0 before the
    first compaction); NotFoundError for none."""
    if not is_uuid(session_id):
        raise NotFoundError("session", session_id)
    row = session.execute(_STATE, {"session_id": session_id}).first()
    if row is None:
        raise NotFoundError("session", session_id)
    chat, user, summary, has_shared, has_own = row
    return SessionState(
        to_record(Session, chat),
        to_record(User, user),
        Summary(session_id) if summary is None else to_record(Summary, summary),
        has_shared_knowledge=bool(has_shared),
        has_own_knowledge=bool(has_own),
    )


def select_turns() -> Select[Any]:
    """The columns of a turn, selected as they are: reads build records from plain rows,
    without the ORM's objects (about half the time of a window's read)."""
    return select(*record_columns(Turn, Message))


# A session's messages after a seq, oldest first: its window after a summary version.
WINDOW = (
    select_turns()
    .where(Message.session_id == bindparam("session_id"), Message.seq > bindparam("after_seq"))
    .order_by(Message.seq)
)


def _read_turn_state(session: SyncSession, session_id: str) -> TurnState:
    """`SessionRepository.get_turn_state`'s reads, in one (sync) transaction."""
    state = _read_state(session, session_id)
    params = {"session_id": session_id, "after_seq": state.summary.through_seq}
    window = records_of(Turn, session.execute(WINDOW, params).all())
    pinned = records_of(Fact, session.execute(PINNED_FACTS, {"user_pk": state.user.id}).all())
    return TurnState(
        **{field.name: getattr(state, field.name) for field in fields(SessionState)},
        window=tuple(window),
        pinned_facts=tuple(pinned),
    )


# A stored context without the deleted turns and facts it showed (these given as they
# read before the deletion); None: the whole context goes (it is not of the format whose
# parts can be taken out, or a part was not found).
NoteScrubber = Callable[[Turn, Sequence[Turn], Sequence[Fact]], list[str] | None]
# Who the history of facts names for the changes a session's deletion makes.
DELETION_ACTOR = "session-deletion"


def _drop_note(_turn: Turn, _turns: Sequence[Turn], _facts: Sequence[Fact]) -> None:
    return None


@dataclass(frozen=True, slots=True)
class DeletedSession:
    """What a session's deletion removed or changed; `rewritten` holds the messages whose
    stored context was rewritten, each with its session and its new context (None: the
    context was dropped), for the caller to count their tokens."""

    user_pk: int
    message_ids: list[int]
    retired_facts: list[Fact]
    trimmed_facts: list[Fact]
    rewritten: list[tuple[int, str, list[str] | None]]


def _num_messages() -> ScalarSelect[int]:
    """A listed session's number of messages (counted through the messages' session
    index)."""
    return (
        select(func.count(Message.id))
        .where(Message.session_id == ChatSession.id)
        .correlate(ChatSession)
        .scalar_subquery()
    )


class SessionRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create_session(
        self,
        user_external_id: str,
        title: str | None,
        metadata: dict[str, Any],
        *,
        tenant_id: int,
        session_id: str | None = None,
    ) -> tuple[Session, User]:
        """A new session (with `session_id` when the client names it: a UUID; an id that
        exists conflicts)."""
        async with self._db.transaction() as session:
            user = await get_or_add_user(session, tenant_id, user_external_id)
            chat = ChatSession(
                id=session_id or str(uuid.uuid4()),
                user_pk=user.id,
                title=title,
                metadata_json=metadata,
                created_at=utc_now(),
            )
            session.add(chat)
            await session.flush()
            return to_record(Session, chat), to_record(User, user)

    async def get_session(self, session_id: str) -> tuple[Session, User]:
        state = await self.get_state(session_id)
        return state.session, state.user

    async def get_state(self, session_id: str) -> SessionState:
        """The session, its user, its current summary and the knowledge flags, in one
        query."""
        return await self._db.read(partial(_read_state, session_id=session_id))

    async def get_turn_state(self, session_id: str) -> TurnState:
        """As `get_state`, and in the same transaction what a turn reads with it: the
        messages after the summary (its window) and the user's active pinned facts."""
        return await self._db.read(partial(_read_turn_state, session_id=session_id))

    async def list_sessions(
        self, user_external_id: str, *, tenant_id: int
    ) -> list[tuple[Session, int]]:
        """Sessions of a user, oldest first, each with its number of messages (counted per
        session through the messages' session index: only this user's rows are read)."""
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(ChatSession, _num_messages())
                .join(UserRow, UserRow.id == ChatSession.user_pk)
                .where(UserRow.tenant_id == tenant_id, UserRow.external_id == user_external_id)
                .order_by(ChatSession.created_at, ChatSession.id)
            )
            return [(to_record(Session, chat), int(n)) for chat, n in rows.all()]

    async def list_sessions_page(
        self, user_pk: int, *, after_id: str | None = None, limit: int
    ) -> list[tuple[Session, int]]:
        """At most `limit` sessions of a user in `list_sessions`' order (oldest first, ties
        by id), from the one after the user's session `after_id` (its last, a page's
        cursor; one that is not the user's gives none), each with its number of messages.
        One query: the (user_pk, created_at, id) index yields the page in order, so the
        counts are read for its sessions only, however many the user has."""
        query = select(ChatSession, _num_messages()).where(ChatSession.user_pk == user_pk)
        if after_id is not None:
            cursor = aliased(ChatSession)
            cursor_at = (
                select(cursor.created_at)
                .where(cursor.id == after_id, cursor.user_pk == user_pk)
                .scalar_subquery()
            )
            query = query.where(
                tuple_(ChatSession.created_at, ChatSession.id) > tuple_(cursor_at, after_id)
            )
        query = query.order_by(ChatSession.created_at, ChatSession.id).limit(limit)
        async with self._db.transaction() as session:
            rows = await session.execute(query)
            return [(to_record(Session, chat), int(n)) for chat, n in rows.all()]

    async def count_messages(self, session_id: str) -> int:
        async with self._db.transaction() as session:
            result = await session.scalar(
                select(func.count(Message.id)).where(Message.session_id == session_id)
            )
            return int(result or 0)

    async def delete_session(
        self, session_id: str, *, scrub: NoteScrubber | None = None, actor: str = DELETION_ACTOR
    ) -> DeletedSession:
        """Delete a session and everything that holds its messages' text, in one
        transaction: its messages, their vectors, its summaries; the facts drawn only from
        its messages are retired and redacted, others lose those sources
        (`forget_message_sources`); the stored contexts of the user's other messages that
        show its messages or those facts are rewritten by `scrub`. The user's change count
        is bumped, so that every process's derived indexes drop the turns. Without `scrub`,
        such contexts are dropped whole.

        The messages go first: on PostgreSQL a turn storing a context that names them
        holds them (`MessageRepository.append`), so the contexts read after the delete
        include every one stored before it."""
        async with self._db.transaction() as session:
            chat = await session.get(ChatSession, session_id) if is_uuid(session_id) else None
            if chat is None:
                raise NotFoundError("session", session_id)
            rows = await session.execute(WINDOW, {"session_id": session_id, "after_seq": 0})
            turns = records_of(Turn, rows.all())
            ids = [t.id for t in turns]
            # Explicit deletes: SQLite cascades only with its pragma, so do not rely on it.
            await session.execute(
                delete(MessageEmbedding).where(MessageEmbedding.message_id.in_(ids))
            )
            await session.execute(
                delete(SessionSummary).where(SessionSummary.session_id == session_id)
            )
            await session.execute(delete(Message).where(Message.session_id == session_id))
            await session.delete(chat)
            facts = await forget_message_sources(session, chat.user_pk, ids, actor)
            rewritten = await _rewrite_notes(
                session, chat.user_pk, turns, facts.retired, scrub or _drop_note
            )
            await bump_memory_versions(session, [chat.user_pk])
            deleted = DeletedSession(chat.user_pk, ids, facts.retired, facts.trimmed, rewritten)
        await self._truncate_log()
        return deleted

    async def _truncate_log(self) -> None:
        """On SQLite, copy the write-ahead log into the file and empty it: the log still
        holds the pages as they were before the deletion (the file's freed space is zeroed,
        `secure_delete`). It waits for readers of older snapshots (the busy timeout);
        one still reading leaves the log to the next checkpoint."""
        if self._db.engine.dialect.name != "sqlite":
            return
        async with self._db.engine.connect() as connection:
            await connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    async def set_note_tokens(self, counts: Mapping[int, int]) -> None:
        """The token counts of rewritten contexts (`DeletedSession.rewritten`), counted
        after their rewrite: until then each kept its old count, an upper bound."""
        if not counts:
            return
        async with self._db.transaction() as session:
            for message_id, tokens in sorted(counts.items()):
                await session.execute(
                    update(Message)
                    .where(Message.id == message_id, Message.context_note.is_not(None))
                    .values(context_note_tokens=tokens)
                )

    async def list_user_sessions(
        self, user_external_id: str, *, tenant_id: int
    ) -> list[tuple[Session, list[Turn]]]:
        """Every session of a user with all its messages, both in order (for export)."""
        async with self._db.transaction() as session:
            chats = (
                await session.scalars(
                    select(ChatSession)
                    .join(UserRow, UserRow.id == ChatSession.user_pk)
                    .where(UserRow.tenant_id == tenant_id, UserRow.external_id == user_external_id)
                    .order_by(ChatSession.created_at, ChatSession.id)
                )
            ).all()
            found = []
            for chat in chats:
                rows = await session.scalars(
                    select(Message).where(Message.session_id == chat.id).order_by(Message.seq)
                )
                found.append((to_record(Session, chat), [to_record(Turn, r) for r in rows]))
            return found

    async def restore_session(
        self, user_external_id: str, chat: Session, messages: Sequence[NewTurn], *, tenant_id: int
    ) -> list[Turn] | None:
        """Recreate an exported session as it was (its id, time and each message's place);
        None, and no change, if its id exists."""
        async with self._db.transaction() as session:
            if await session.get(ChatSession, chat.id) is not None:
                return None
            user = await get_or_add_user(session, tenant_id, user_external_id)
            session.add(
                ChatSession(
                    id=chat.id,
                    user_pk=user.id,
                    title=chat.title,
                    metadata_json=chat.metadata_json,
                    created_at=chat.created_at,
                )
            )
            rows = [message_row(chat.id, user.id, m.seq or 0, m) for m in messages]
            session.add_all(rows)
            await session.flush()
            return [to_record(Turn, r) for r in rows]


async def _rewrite_notes(
    session: AsyncSession,
    user_pk: int,
    deleted: Sequence[Turn],
    retired: Sequence[Fact],
    scrub: NoteScrubber,
) -> list[tuple[int, str, list[str] | None]]:
    """The user's stored contexts that show a deleted turn or a retired fact, rewritten
    without them (their ids lists too). Only the id lists are read for every message of
    the user; the contexts themselves only where they show something deleted."""
    turns = {t.id: t for t in deleted}
    facts = {f.id: f for f in retired}
    named = await session.execute(
        select(Message.id, Message.context_note_ids, Message.context_note_fact_ids).where(
            Message.user_pk == user_pk, Message.context_note.is_not(None)
        )
    )
    wanted = [
        int(message_id)
        for message_id, note_ids, fact_ids in named.all()
        if turns.keys() & set(note_ids or ()) or facts.keys() & set(fact_ids or ())
    ]
    if not wanted:
        return []
    rows = await session.execute(select_turns().where(Message.id.in_(wanted)))
    rewritten = []
    for turn in records_of(Turn, rows.all()):
        note = scrub(
            turn,
            [turns[i] for i in turn.context_note_ids or () if i in turns],
            [facts[i] for i in turn.context_note_fact_ids or () if i in facts],
        )
        values: dict[str, Any] = {
            "context_note": note,
            "context_note_ids": None,
            "context_note_fact_ids": None,
        }
        if note is None:
            values["context_note_tokens"] = 0
        else:
            values["context_note_ids"] = _without(turn.context_note_ids, turns)
            values["context_note_fact_ids"] = _without(turn.context_note_fact_ids, facts)
        await session.execute(update(Message).where(Message.id == turn.id).values(**values))
        rewritten.append((turn.id, turn.session_id, note))
    return rewritten


def _without(ids: list[int] | None, gone: Mapping[int, object]) -> list[int] | None:
    return None if ids is None else [i for i in ids if i not in gone]


def message_row(session_id: str, user_pk: int, seq: int, new: NewTurn) -> Message:
    return Message(
        session_id=session_id,
        user_pk=user_pk,
        seq=seq,
        role=new.role,
        name=new.name,
        content=new.content,
        created_at=new.created_at or utc_now(),
        external_id=new.external_id,
        token_count=new.token_count,
        image_caption=new.image_caption,
        context_note=new.context_note,
        context_note_tokens=new.context_note_tokens,
        context_note_ids=new.context_note_ids,
        context_note_fact_ids=new.context_note_fact_ids,
        turn_report=new.turn_report,
    )


async def known_external_ids(
    session: AsyncSession, session_id: str, new_messages: Sequence[NewTurn]
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
