"""Rows to restore, as an import hands them to `RestoreBatch`: the columns of exported
rows, with references to messages given by natural key (`MessageKey`) and references to
facts as ids in the target store (the caller maps the file's fact keys)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from storage.backup.reading import MessageKey
from storage.records import DocumentFields, NewTurn


@dataclass(frozen=True, slots=True)
class RestoredFact:
    """A fact row as exported: every column but its id, owner, sources and vector."""

    text: str
    category: str
    subject: str | None
    value: str | None
    status: str
    is_pinned: bool
    priority: int
    valid_from: dt.datetime
    valid_to: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass(frozen=True, slots=True)
class RestoredMessage:
    """A message with its place (`turn.seq`); the past turns its context note shows are
    given by key (`context_note_keys`), the facts it shows by their ids in this store."""

    session_id: str
    turn: NewTurn
    context_note_keys: Sequence[MessageKey] | None = None


@dataclass(frozen=True, slots=True)
class RestoredChange:
    """A fact change; the `source_message_ids` of its snapshots are given by key."""

    fact_id: int
    action: str
    actor: str
    changed_at: dt.datetime
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    before_sources: Sequence[MessageKey] | None = None
    after_sources: Sequence[MessageKey] | None = None


@dataclass(frozen=True, slots=True)
class RestoredDocument:
    fields: DocumentFields
    user_pk: int | None
    metadata: dict[str, Any]
    content: str
