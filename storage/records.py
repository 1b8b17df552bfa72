"""What the storage layer hands out: frozen records of stored rows, never ORM objects.

Each record's fields carry the names of its model's attributes (`storage.models`), so a
row becomes its record in one generic step (`to_record`) and the layers above see plain
values: no lazy loading, no session, nothing that a later write could change under them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance | msgspec.Struct")


def to_record(cls: type[R], row: object) -> R:
    """The record of an ORM row: each field read from the attribute of the same name."""
    return cls(**{name: getattr(row, name) for name in field_names(cls)})


def record_columns(cls: type[R], model: type) -> list[Any]:
    """The model's columns of a record's fields, in field order: a select of these gives
    plain rows for `records_of`, without the ORM's objects."""
    return [getattr(model, name) for name in field_names(cls)]


def records_of(cls: type[R], rows: Iterable[Sequence[Any]]) -> list[R]:
    """The records of plain rows selected by `record_columns`."""
    names = field_names(cls)
    return [cls(**dict(zip(names, row, strict=True))) for row in rows]


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type[R]) -> tuple[str, ...]:
    """A record class's field names (dataclass or Struct), kept per class: msgspec
    resolves a Struct's annotations on every `fields` call."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if issubclass(cls, msgspec.Struct):
            names = tuple(f.name for f in msgspec.structs.fields(cls))
        else:
            names = tuple(f.name for f in fields(cls))
        _FIELD_NAMES[cls] = names
    return names


@dataclass(frozen=True, slots=True)
class Tenant:
    id: int
    name: str
    created_at: dt.datetime


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: int
    tenant_id: int
    name: str
    prefix: str
    is_admin: bool
    requests_per_minute: int | None
    created_at: dt.datetime
    revoked_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: dt.datetime
    actor: str
    action: str
    target: str
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class User:
    id: int
    tenant_id: int
    external_id: str
    created_at: dt.datetime
    # The user's change counter when read (see storage.models.User.memory_version).
    memory_version: int = 0


@dataclass(frozen=True, slots=True)
class Session:
    """A chat session of one user."""

    id: str
    user_pk: int
    title: str | None
    metadata_json: dict[str, Any]
    created_at: dt.datetime


class StoredMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A stored message's fields as every interface shows them: `Turn` below, the API's
    `Message` and the export's `MessageRecord` extend this one list."""

    session_id: str
    seq: int
    role: Literal["user", "assistant", "system"]
    name: str | None
    content: str
    created_at: dt.datetime
    external_id: str | None
    token_count: int


class Turn(StoredMessage, frozen=True, kw_only=True):
    """A stored message: the one shape of a turn above SQL.

    `context_note` is the per-turn context a user message was sent with (retrieved
    memories, knowledge, facts pinned since), exactly as sent, so that later prompts
    re-insert it; `context_note_ids` are the past turns it shows.
    """

    id: int
    user_pk: int
    image_caption: str | None = None
    context_note: list[str] | None = None
    context_note_tokens: int = 0
    context_note_ids: list[int] | None = None
    context_note_fact_ids: list[int] | None = None

    @property
    def speaker(self) -> str:
        return self.name or self.role

    @property
    def prompt_tokens(self) -> int:
        """What the turn takes in a prompt: its content and the context it was sent with."""
        return self.token_count + self.context_note_tokens


@dataclass(frozen=True, slots=True)
class NewTurn:
    """A message to store: a turn's, an imported one (with its time and the client's id),
    or a restored one (with its place, `seq`). The one shape of a message on its way in."""

    role: str
    content: str
    token_count: int = 0
    name: str | None = None
    created_at: dt.datetime | None = None
    external_id: str | None = None
    image_caption: str | None = None
    seq: int | None = None
    context_note: list[str] | None = None
    context_note_tokens: int = 0
    context_note_ids: list[int] | None = None
    context_note_fact_ids: list[int] | None = None
    # A reply's report of its turn (`retrieval.chat.turn_report`), as JSON.
    turn_report: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Summary:
    """A version of a session's rolling summary and window state (see
    `storage.models.SessionSummary`); version 0, never stored, is "nothing compacted"."""

    session_id: str
    version: int = 0
    through_seq: int = 0
    pruned_seqs: list[int] | None = None
    pinned_fact_ids: list[int] | None = None
    text: str = ""
    summarizer: str = ""
    token_count: int = 0
    created_at: dt.datetime | None = None


class FactFields(msgspec.Struct, frozen=True, kw_only=True):
    """A fact's fields as every interface shows them: `Fact` below and the API's `Fact`
    extend this one list."""

    text: str
    category: str
    subject: str | None
    value: str | None
    status: str
    priority: int
    valid_from: dt.datetime
    valid_to: dt.datetime | None
    source_message_ids: list[int]
    created_at: dt.datetime
    updated_at: dt.datetime


class Fact(FactFields, frozen=True, kw_only=True):
    """A stored fact of one user; `vector` is its embedding by `model`, if any."""

    id: int
    user_pk: int
    is_pinned: bool
    model: str | None
    vector: bytes | None


@dataclass(frozen=True, slots=True)
class FactChange:
    id: int
    fact_id: int
    action: str
    actor: str
    changed_at: dt.datetime
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class DocumentFields(msgspec.Struct, frozen=True, kw_only=True):
    """A knowledge document's fields as every interface shows them: `Document` below
    and the API's `KnowledgeDocument` extend this one list."""

    id: str
    title: str
    source: str
    filename: str | None
    content_hash: str
    status: Literal["processing", "ready", "failed"]
    failure_reason: str | None
    num_chars: int
    num_chunks: int
    num_chunks_indexed: int
    created_at: dt.datetime
    updated_at: dt.datetime


class Document(DocumentFields, frozen=True, kw_only=True):
    """A knowledge-base document (see `storage.models.KnowledgeDocument`)."""

    tenant_id: int
    user_pk: int | None
    scope: str
    metadata_json: dict[str, Any]
    content: str
