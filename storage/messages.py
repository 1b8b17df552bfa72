"""The messages of sessions, in order: appended, read back by session, id or place."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, bindparam, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from storage.db import Database
from storage.errors import NotFoundError
from storage.models import Message, MessageEmbedding
from storage.records import NewTurn, Session, Turn, records_of, to_record
from storage.sessions import WINDOW, known_external_ids, message_row, select_turns


@dataclass(frozen=True, slots=True)
class AppendResult:
    turns: list[Turn]
    num_skipped: int


@dataclass(frozen=True, slots=True)
class ReportedTurn:
    """A user message, the reply that follows it (None: none stored) and the report of
    their turn the reply keeps (None: none kept, as for imported history)."""

    message: Turn
    reply: Turn | None
    report: dict[str, Any] | None


def _turns(rows: Sequence[Message]) -> list[Turn]:
    return [to_record(Turn, row) for row in rows]


# The reads of every turn, built once: building a statement costs more than SQLite
# takes to run it.
_BY_ID = select_turns().where(
    Message.user_pk == bindparam("user_pk"), Message.id.in_(bindparam("ids", expanding=True))
)


async def _drop_notes_of_deleted(session: AsyncSession, rows: Sequence[Message]) -> None:
    """A context that shows a message deleted since it was retrieved is not stored (the
    deletion rewrote the stored ones before it). Checked after the insert: on SQLite the
    write lock is held by then, and on PostgreSQL the shown messages are held (FOR KEY
    SHARE) until commit, so a deletion either sees this message or is seen by it."""
    noted = [row for row in rows if row.context_note_ids]
    if not noted:
        return
    shown = {i for row in noted for i in row.context_note_ids or ()}
    found = await session.scalars(
        select(Message.id)
        .where(Message.id.in_(sorted(shown)))
        .with_for_update(read=True, key_share=True)
    )
    gone = shown - {int(i) for i in found.all()}
    for row in noted:
        if gone.intersection(row.context_note_ids or ()):
            row.context_note = None
            row.context_note_tokens = 0
            row.context_note_ids = None
            row.context_note_fact_ids = None
    if gone:
        await session.flush()


class MessageRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def append(
        self, chat: Session, new: Sequence[NewTurn], *, last_seq: int | None = None
    ) -> AppendResult:
        """Append messages in order; ones whose external_id the session holds are skipped.

        `last_seq` is the session's last sequence number when the caller has just read it
        (a turn has its window): then nothing is read first. Two writers of one session
        with the same number conflict on (session, seq), and nothing of the later one is
        stored (ConflictError).
        """
        async with self._db.transaction() as session:
            if last_seq is None:
                last_seq = await session.scalar(
                    select(func.max(Message.seq)).where(Message.session_id == chat.id)
                )
            known = await known_external_ids(session, chat.id, new)
            seq = int(last_seq or 0)
            rows: list[Message] = []
            num_skipped = 0
            for item in new:
                if item.external_id is not None and item.external_id in known:
                    num_skipped += 1
                    continue
                if item.external_id is not None:
                    known.add(item.external_id)
                seq += 1
                rows.append(message_row(chat.id, chat.user_pk, seq, item))
            session.add_all(rows)
            await session.flush()
            await _drop_notes_of_deleted(session, rows)
            return AppendResult(_turns(rows), num_skipped)

    async def list_messages(
        self, session_id: str, *, limit: int | None = None, after_seq: int = 0
    ) -> list[Turn]:
        query = WINDOW if limit is None else WINDOW.limit(limit)
        params = {"session_id": session_id, "after_seq": after_seq}
        async with self._db.transaction() as session:
            return records_of(Turn, (await session.execute(query, params)).all())

    async def list_last_messages(self, session_id: str, limit: int) -> list[Turn]:
        """The session's last `limit` messages, in order (a client's resent history is
        matched against them)."""
        if limit <= 0:
            return []
        query = (
            select_turns()
            .where(Message.session_id == session_id)
            .order_by(Message.seq.desc())
            .limit(limit)
        )
        async with self._db.transaction() as session:
            return records_of(Turn, (await session.execute(query)).all())[::-1]

    async def get_reported_turn(self, session_id: str, message_id: int) -> ReportedTurn:
        """A message of a session with its reply and their turn's report; raises
        NotFoundError if the session holds no such message."""
        async with self._db.transaction() as session:
            found = records_of(
                Turn,
                (
                    await session.execute(
                        select_turns().where(
                            Message.session_id == session_id, Message.id == message_id
                        )
                    )
                ).all(),
            )
            if not found:
                raise NotFoundError("message", message_id)
            message = found[0]
            row = (
                await session.execute(
                    select(*select_turns().selected_columns, Message.turn_report).where(
                        Message.session_id == session_id, Message.seq == message.seq + 1
                    )
                )
            ).first()
        if row is None or row.role != "assistant":
            return ReportedTurn(message, None, None)
        report = row[-1]
        if not isinstance(report, dict) or report.get("message_id") != message.id:
            report = None
        return ReportedTurn(message, records_of(Turn, [row[:-1]])[0], report)

    async def list_reported_message_ids(self, session_id: str) -> set[int]:
        """The session's messages whose turn's report their reply keeps."""
        reply = aliased(Message)
        async with self._db.transaction() as session:
            ids = await session.scalars(
                select(Message.id)
                .join(
                    reply,
                    (reply.session_id == Message.session_id) & (reply.seq == Message.seq + 1),
                )
                .where(Message.session_id == session_id, reply.turn_report.is_not(None))
            )
            return {int(i) for i in ids.all()}

    async def list_messages_by_id(self, user_pk: int, ids: Collection[int]) -> list[Turn]:
        """Messages of one user by id (order not kept; ids of other users are ignored)."""
        if not ids:
            return []
        params = {"user_pk": user_pk, "ids": list(ids)}
        return await self._db.read(
            lambda session: records_of(Turn, session.execute(_BY_ID, params).all())
        )

    async def list_ids_said_between(
        self, user_pk: int, start: dt.datetime, end: dt.datetime, limit: int
    ) -> list[int]:
        """Ids of the user's messages stored with a time in [start, end), the newest
        first, at most `limit`."""
        async with self._db.transaction() as session:
            ids = await session.scalars(
                select(Message.id)
                .where(
                    Message.user_pk == user_pk,
                    Message.created_at >= start,
                    Message.created_at < end,
                )
                .order_by(Message.created_at.desc(), Message.id.desc())
                .limit(limit)
            )
            return [int(i) for i in ids.all()]

    async def sessions_of(self, user_pk: int, ids: Collection[int]) -> dict[int, str]:
        """The session of each of the user's messages among `ids` (others are left out)."""
        if not ids:
            return {}
        return await self._sessions(Message.user_pk == user_pk, Message.id.in_(list(ids)))

    async def sessions_of_user(self, user_pk: int) -> dict[int, str]:
        """The session of each of the user's messages."""
        return await self._sessions(Message.user_pk == user_pk)

    async def _sessions(self, *where: ColumnElement[bool]) -> dict[int, str]:
        async with self._db.transaction() as session:
            rows = await session.execute(select(Message.id, Message.session_id).where(*where))
            return {int(i): str(s) for i, s in rows.all()}

    async def list_user_messages(self, user_pk: int) -> list[Turn]:
        """Every message of a user, each session's in order (to build derived indexes)."""
        async with self._db.transaction() as session:
            rows = await session.execute(
                select_turns()
                .where(Message.user_pk == user_pk)
                .order_by(Message.session_id, Message.seq)
            )
            return records_of(Turn, rows.all())

    async def list_messages_by_seq(self, keys: Collection[tuple[str, int]]) -> list[Turn]:
        """Messages by (session id, seq), in one query; keys that match nothing are ignored."""
        if not keys:
            return []
        by_session: dict[str, set[int]] = {}
        for session_id, seq in keys:
            by_session.setdefault(session_id, set()).add(seq)
        condition = or_(
            *(
                (Message.session_id == session_id) & Message.seq.in_(sorted(seqs))
                for session_id, seqs in sorted(by_session.items())
            )
        )
        async with self._db.transaction() as session:
            rows = await session.execute(
                select_turns().where(condition).order_by(Message.session_id, Message.seq)
            )
            return records_of(Turn, rows.all())

    async def list_unembedded_messages(self, limit: int, model: str) -> list[Turn]:
        """Messages stored without a vector of `model` (a crash between the two writes)."""
        async with self._db.transaction() as session:
            rows = await session.execute(
                select_turns()
                .outerjoin(
                    MessageEmbedding,
                    (MessageEmbedding.message_id == Message.id) & (MessageEmbedding.model == model),
                )
                .where(MessageEmbedding.message_id.is_(None))
                .order_by(Message.id)
                .limit(limit)
            )
            return records_of(Turn, rows.all())

    async def list_lacking_second_vector(
        self, first: str, second: str, limit: int, *, user_pk: int | None = None
    ) -> list[Turn]:
        """Messages that hold a vector of model `first` and none of model `second`, in id
        order (of one user when given): what a store indexed before `second` was added
        still needs. A message just stored gets both in one transaction, so it is never
        among them."""
        has_first = (
            select(MessageEmbedding.message_id)
            .where(MessageEmbedding.message_id == Message.id, MessageEmbedding.model == first)
            .exists()
        )
        has_second = (
            select(MessageEmbedding.message_id)
            .where(MessageEmbedding.message_id == Message.id, MessageEmbedding.model == second)
            .exists()
        )
        query = select_turns().where(has_first, ~has_second)
        if user_pk is not None:
            query = query.where(Message.user_pk == user_pk)
        async with self._db.transaction() as session:
            rows = await session.execute(query.order_by(Message.id).limit(limit))
            return records_of(Turn, rows.all())

    async def list_users_lacking_second_vector(self, first: str, second: str) -> list[int]:
        """The users with messages that `list_lacking_second_vector` would find."""
        held = aliased(MessageEmbedding)
        second_held = (
            select(held.message_id)
            .where(held.message_id == MessageEmbedding.message_id, held.model == second)
            .exists()
        )
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(MessageEmbedding.user_pk)
                .where(MessageEmbedding.model == first, ~second_held)
                .distinct()
                .order_by(MessageEmbedding.user_pk)
            )
            return [int(user_pk) for user_pk in rows.all()]

    async def list_messages_after_id(
        self, after_id: int, limit: int, *, user_pk: int | None = None
    ) -> list[Turn]:
        """Messages in id order after `after_id` (of one user when given), a page at a time."""
        query = select_turns().where(Message.id > after_id)
        if user_pk is not None:
            query = query.where(Message.user_pk == user_pk)
        async with self._db.transaction() as session:
            rows = await session.execute(query.order_by(Message.id).limit(limit))
            return records_of(Turn, rows.all())
