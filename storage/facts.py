"""Transactions over key facts and their history. Each public coroutine is one transaction.

Every change of a fact writes a FactChange row in the same transaction, so the history
is complete by construction. What a new fact does to the stored ones (merge, supersede,
insert) is decided by the caller's `resolve` function, inside the transaction that
applies it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from storage.claims import FACT_EXTRACTION, claim_in_transaction, int4_key
from storage.db import Database, insert_or_skip, rows_affected
from storage.errors import ConflictError, NotFoundError
from storage.models import Fact as FactRow
from storage.models import FactChange as FactChangeRow
from storage.models import FactEmbedding as FactEmbeddingRow
from storage.models import Message, utc_now
from storage.models import User as UserRow
from storage.records import Fact, FactChange, User, record_columns, records_of, to_record
from storage.users import is_row_id

# Ids per IN list.
_BATCH = 500

STATUSES = ("active", "superseded", "deleted")


@dataclass(frozen=True, slots=True)
class NewFact:
    text: str
    category: str
    subject: str | None
    value: str | None
    is_pinned: bool
    priority: int
    valid_from: dt.datetime
    source_message_ids: Sequence[int] = ()
    model: str | None = None
    vector: bytes | None = None


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a new fact does: `merge` into `targets[0]`, `supersede` the targets, or be
    `insert`ed; `insert_superseded` stores an older statement as already superseded."""

    action: Literal["insert", "merge", "supersede", "insert_superseded"]
    targets: Sequence[Fact] = field(default_factory=tuple)


Resolver = Callable[[Sequence[Fact], NewFact], Resolution]


def snapshot(fact: FactRow) -> dict[str, Any]:
    """The fields of a fact that its history records."""
    return {
        "text": fact.text,
        "category": fact.category,
        "subject": fact.subject,
        "value": fact.value,
        "status": fact.status,
        "pinned": fact.is_pinned,
        "priority": fact.priority,
        "valid_from": _iso(fact.valid_from),
        "valid_to": _iso(fact.valid_to),
        "source_message_ids": list(fact.source_message_ids),
    }


def _iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).isoformat()


# A user's facts as plain rows (read on every turn): the columns as they are, without the
# ORM's objects, in a statement built once.
_USER_FACTS = (
    select(*record_columns(Fact, FactRow))
    .where(
        FactRow.user_pk == bindparam("user_pk"),
        FactRow.status.in_(bindparam("statuses", expanding=True)),
    )
    .order_by(FactRow.id)
)
# A user's active pinned facts, by id (every turn reads them).
PINNED_FACTS = (
    select(*record_columns(Fact, FactRow))
    .where(
        FactRow.user_pk == bindparam("user_pk"),
        FactRow.status == "active",
        FactRow.is_pinned.is_(True),
    )
    .order_by(FactRow.id)
)


class FactRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def list_facts(self, user_pk: int, statuses: Collection[str] = ("active",)) -> list[Fact]:
        async with self._db.transaction() as session:
            rows = await session.execute(
                _USER_FACTS, {"user_pk": user_pk, "statuses": list(statuses)}
            )
            return records_of(Fact, rows.all())

    async def list_pinned_facts(self, user_pk: int) -> list[Fact]:
        """A user's active pinned facts (every turn reads them), by id."""
        async with self._db.transaction() as session:
            rows = await session.execute(PINNED_FACTS, {"user_pk": user_pk})
            return records_of(Fact, rows.all())

    async def get_fact(self, fact_id: int) -> tuple[Fact, User]:
        async with self._db.transaction() as session:
            fact, user = await _fact_and_user(session, fact_id)
            return to_record(Fact, fact), to_record(User, user)

    async def list_changes(self, fact_ids: Sequence[int]) -> list[FactChange]:
        if not fact_ids:
            return []
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(FactChangeRow)
                .where(FactChangeRow.fact_id.in_(list(fact_ids)))
                .order_by(FactChangeRow.id)
            )
            return [to_record(FactChange, row) for row in rows.all()]

    async def record_facts(
        self, user_pk: int, new_facts: Sequence[NewFact], resolve: Resolver, actor: str
    ) -> list[Fact]:
        """Apply new facts; returns the facts inserted or changed."""
        async with self._db.transaction() as session:
            return await _record(session, user_pk, new_facts, resolve, actor)

    @asynccontextmanager
    async def claim_extraction(self, user_pk: int) -> AsyncIterator[ExtractionClaim | None]:
        """One batch of the user's fact extraction, claimed for the body's transaction:
        None when another process's transaction holds it (that process reads the
        messages). The claim's watermark is read after the claim was granted, so a batch
        another process recorded just before is never read again."""
        async with self._db.transaction() as session:
            if not await claim_in_transaction(session, FACT_EXTRACTION, int4_key(user_pk)):
                yield None
                return
            yield ExtractionClaim(session, user_pk, await _watermark(session, user_pk))

    async def update_fact(self, fact_id: int, actor: str, **fields: Any) -> Fact:
        """Change some of text, is_pinned, priority, category (and text's vector, model)."""
        async with self._db.transaction() as session:
            fact, _user = await _fact_and_user(session, fact_id)
            if fact.status == "deleted":
                raise ConflictError(f"fact {fact_id} is deleted: it can no longer be changed")
            before = snapshot(fact)
            if "text" in fields and fields["text"] != fact.text:
                await session.execute(
                    delete(FactEmbeddingRow).where(FactEmbeddingRow.fact_id == fact_id)
                )
            for name, value in fields.items():
                setattr(fact, name, value)
            fact.updated_at = utc_now()
            session.add(_change(fact, "updated", actor, before))
            return to_record(Fact, fact)

    async def delete_fact(self, fact_id: int, actor: str) -> Fact:
        """Mark a fact deleted; it leaves every prompt and search but stays in history."""
        async with self._db.transaction() as session:
            fact, _user = await _fact_and_user(session, fact_id)
            if fact.status != "deleted":
                before = snapshot(fact)
                fact.status = "deleted"
                fact.valid_to = fact.valid_to or utc_now()
                fact.updated_at = utc_now()
                session.add(_change(fact, "deleted", actor, before))
            return to_record(Fact, fact)

    async def save_vectors(self, vectors: Sequence[tuple[int, str, bytes]]) -> None:
        """Store (fact id, model, vector) without a history entry: vectors are derived."""
        async with self._db.transaction() as session:
            for fact_id, model, vector in vectors:
                await session.execute(
                    update(FactRow).where(FactRow.id == fact_id).values(model=model, vector=vector)
                )

    async def list_model_vectors(self, fact_ids: Collection[int], model: str) -> dict[int, bytes]:
        """The facts' vectors by another model than the rows' own (`FactEmbedding`)."""
        found: dict[int, bytes] = {}
        ids = list(fact_ids)
        async with self._db.transaction() as session:
            for start in range(0, len(ids), _BATCH):
                rows = await session.execute(
                    select(FactEmbeddingRow.fact_id, FactEmbeddingRow.vector).where(
                        FactEmbeddingRow.model == model,
                        FactEmbeddingRow.fact_id.in_(ids[start : start + _BATCH]),
                    )
                )
                found.update({int(fact_id): vector for fact_id, vector in rows.all()})
        return found

    async def save_model_vectors(self, model: str, vectors: Sequence[tuple[int, bytes]]) -> None:
        """Store (fact id, vector) of `model`; a vector another process stored meanwhile
        (from the same text, by the same model) is kept, as is a fact deleted meanwhile
        left without one."""
        if not vectors:
            return
        async with self._db.transaction() as session:
            present = set(
                await session.scalars(
                    select(FactRow.id).where(FactRow.id.in_([fact_id for fact_id, _ in vectors]))
                )
            )
            rows = [
                {"fact_id": fact_id, "model": model, "vector": vector}
                for fact_id, vector in vectors
                if fact_id in present
            ]
            if rows:
                insert = insert_or_skip(session, FactEmbeddingRow, ["fact_id", "model"])
                await session.execute(insert, rows)

    # Extraction progress -------------------------------------------------------------

    async def get_watermark(self, user_pk: int) -> int:
        async with self._db.transaction() as session:
            return await _watermark(session, user_pk)

    async def list_users_behind(self) -> list[int]:
        """Users with messages that fact extraction has not read yet, by pk (one probe of
        the (user, id) index of messages per user: cheap enough for a periodic sweep)."""
        ahead = select(Message.id).where(
            Message.user_pk == UserRow.id, Message.id > UserRow.facts_through_message_id
        )
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(UserRow.id).where(ahead.exists()).order_by(UserRow.id)
            )
            return [int(user_pk) for user_pk in rows.all()]


class ExtractionClaim:
    """A claimed batch of one user's fact extraction: the facts found in the messages
    after `watermark` are recorded, and the watermark moved, in the claim's transaction."""

    def __init__(self, session: AsyncSession, user_pk: int, watermark: int) -> None:
        self._session = session
        self.user_pk = user_pk
        self.watermark = watermark

    async def record(
        self,
        new_facts: Sequence[NewFact],
        resolve: Resolver,
        actor: str,
        *,
        through_message_id: int,
    ) -> list[Fact] | None:
        """Apply the facts and move the watermark to `through_message_id`; None, and
        nothing written, where the watermark moved meanwhile (a restore from a backup)."""
        moved = await self._session.execute(
            update(UserRow)
            .where(UserRow.id == self.user_pk, UserRow.facts_through_message_id == self.watermark)
            .values(facts_through_message_id=through_message_id)
        )
        if rows_affected(moved) != 1:
            return None
        return await _record(self._session, self.user_pk, new_facts, resolve, actor)


async def _watermark(session: AsyncSession, user_pk: int) -> int:
    value = await session.scalar(
        select(UserRow.facts_through_message_id).where(UserRow.id == user_pk)
    )
    if value is None:
        raise NotFoundError("user", user_pk)
    return int(value)


async def _record(
    session: AsyncSession,
    user_pk: int,
    new_facts: Sequence[NewFact],
    resolve: Resolver,
    actor: str,
) -> list[Fact]:
    active = list(
        (
            await session.scalars(
                select(FactRow).where(FactRow.user_pk == user_pk, FactRow.status == "active")
            )
        ).all()
    )
    touched: list[FactRow] = []
    for new_fact in new_facts:
        touched += await _apply(session, user_pk, active, new_fact, resolve, actor)
    await session.flush()
    return [to_record(Fact, row) for row in touched]


async def _fact_and_user(session: AsyncSession, fact_id: int) -> tuple[FactRow, UserRow]:
    if not is_row_id(fact_id):
        raise NotFoundError("fact", fact_id)
    row = (
        await session.execute(
            select(FactRow, UserRow)
            .join(UserRow, UserRow.id == FactRow.user_pk)
            .where(FactRow.id == fact_id)
        )
    ).first()
    if row is None:
        raise NotFoundError("fact", fact_id)
    return row[0], row[1]


def _change(
    fact: FactRow, action: str, actor: str, before: dict[str, Any] | None, **extra: Any
) -> FactChangeRow:
    after = {**snapshot(fact), **extra}
    return FactChangeRow(
        fact_id=fact.id,
        action=action,
        actor=actor,
        changed_at=utc_now(),
        before=before,
        after=after,
    )


async def _apply(
    session: AsyncSession,
    user_pk: int,
    active: list[FactRow],
    new_fact: NewFact,
    resolve: Resolver,
    actor: str,
) -> list[FactRow]:
    """One new fact against the active ones: the resolver decides on their records, the
    decision is applied to their rows."""
    resolution = resolve([to_record(Fact, row) for row in active], new_fact)
    rows = {row.id: row for row in active}
    targets = [rows[target.id] for target in resolution.targets]
    if resolution.action == "merge":
        target = targets[0]
        before = snapshot(target)
        target.source_message_ids = sorted(
            {*target.source_message_ids, *new_fact.source_message_ids}
        )
        target.updated_at = utc_now()
        session.add(_change(target, "merged", actor, before, merged_text=new_fact.text))
        return [target]
    fact = _new_row(user_pk, new_fact)
    if resolution.action == "insert_superseded":
        fact.status = "superseded"
        fact.valid_to = min(t.valid_from for t in targets)
    session.add(fact)
    await session.flush()
    session.add(_change(fact, "created", actor, None))
    touched = [fact]
    if resolution.action == "supersede":
        for target in targets:
            before = snapshot(target)
            target.status = "superseded"
            target.valid_to = new_fact.valid_from
            target.updated_at = utc_now()
            session.add(_change(target, "superseded", actor, before, superseded_by=fact.id))
            active.remove(target)
            touched.append(target)
    if fact.status == "active":
        active.append(fact)
    return touched


def _new_row(user_pk: int, new_fact: NewFact) -> FactRow:
    now = utc_now()
    return FactRow(
        user_pk=user_pk,
        text=new_fact.text,
        category=new_fact.category,
        subject=new_fact.subject,
        value=new_fact.value,
        status="active",
        is_pinned=new_fact.is_pinned,
        priority=new_fact.priority,
        valid_from=new_fact.valid_from,
        valid_to=None,
        source_message_ids=list(new_fact.source_message_ids),
        created_at=now,
        updated_at=now,
        model=new_fact.model,
        vector=new_fact.vector,
    )


# What a fact retired with the messages it came from reads as, in its row and in every
# entry of its history: the text was the deleted messages' text.
RETIRED_TEXT = "(deleted with the messages it was stated in)"
# The fields of a fact (and of its history's snapshots) that hold what was stated.
_STATED = ("text", "value")


@dataclass(frozen=True, slots=True)
class FactsOfDeletedMessages:
    """What deleting messages did to the facts drawn from them: `retired` (as they read
    before, for the caller to take their lines out of stored contexts) had no other
    source; `trimmed` keep their other sources."""

    retired: list[Fact]
    trimmed: list[Fact]


def _subject_key(subject: str | None) -> str | None:
    """A subject without its item, which may be a stated value (`allergy:peanuts`)."""
    return None if subject is None else subject.partition(":")[0]


def _redacted(values: dict[str, Any] | None) -> dict[str, Any] | None:
    if values is None:
        return None
    found = {**values, **{name: RETIRED_TEXT for name in _STATED if values.get(name) is not None}}
    if "subject" in found:
        found["subject"] = _subject_key(found["subject"])
    if "merged_text" in found:
        found["merged_text"] = RETIRED_TEXT
    return found


async def forget_message_sources(
    session: AsyncSession, user_pk: int, message_ids: Collection[int], actor: str
) -> FactsOfDeletedMessages:
    """In the caller's transaction (which deletes the messages): each fact of the user
    whose only sources were `message_ids` is retired (status `deleted`, a `retired`
    change recorded) and what it stated is redacted in its row and its whole history, so
    that no surface returns the deleted messages' text; a fact with other sources keeps
    them (a `sources_removed` change), and the merges that the deleted messages made
    into it lose their quoted text. Facts stated without a source are left alone."""
    deleted = set(message_ids)
    if not deleted:
        return FactsOfDeletedMessages([], [])
    rows = (await session.scalars(select(FactRow).where(FactRow.user_pk == user_pk))).all()
    sourced = [row for row in rows if deleted.intersection(row.source_message_ids or ())]
    retired: list[Fact] = []
    trimmed: list[Fact] = []
    for fact in sourced:
        before = snapshot(fact)
        kept = [i for i in fact.source_message_ids if i not in deleted]
        if kept:
            fact.source_message_ids = kept
            fact.updated_at = utc_now()
            session.add(_change(fact, "sources_removed", actor, before))
            trimmed.append(to_record(Fact, fact))
            await _redact_merges(session, fact.id, deleted)
            continue
        retired.append(to_record(Fact, fact))
        fact.source_message_ids = []
        fact.status = "deleted"
        fact.valid_to = fact.valid_to or utc_now()
        fact.text = RETIRED_TEXT
        fact.value = None if fact.value is None else RETIRED_TEXT
        fact.subject = _subject_key(fact.subject)
        fact.model = None
        fact.vector = None
        fact.updated_at = utc_now()
        await _redact_history(session, fact.id)
        session.add(_change(fact, "retired", actor, _redacted(before)))
    await session.flush()
    return FactsOfDeletedMessages(retired, trimmed)


async def _redact_history(session: AsyncSession, fact_id: int) -> None:
    changes = await session.scalars(select(FactChangeRow).where(FactChangeRow.fact_id == fact_id))
    for change in changes.all():
        change.before = _redacted(change.before)
        change.after = _redacted(change.after)


async def _redact_merges(session: AsyncSession, fact_id: int, deleted: set[int]) -> None:
    """The quoted text of merges whose new sources were all deleted messages."""
    changes = await session.scalars(
        select(FactChangeRow).where(
            FactChangeRow.fact_id == fact_id, FactChangeRow.action == "merged"
        )
    )
    for change in changes.all():
        before = set((change.before or {}).get("source_message_ids") or ())
        added = set((change.after or {}).get("source_message_ids") or ()) - before
        if added and added <= deleted and change.after is not None:
            change.after = {**change.after, "merged_text": RETIRED_TEXT}
