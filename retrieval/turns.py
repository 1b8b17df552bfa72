"""A stored turn as the retrieval layer hands it out, a search hit (that turn and its
score), and a message of an imported history."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from retrieval.timeutil import as_utc
from storage.models import Message


@dataclass(frozen=True, slots=True)
class StoredTurn:
    id: int
    session_id: str
    seq: int
    role: str
    name: str | None
    content: str
    created_at: dt.datetime
    external_id: str | None
    token_count: int

    @classmethod
    def from_row(cls, row: Message) -> StoredTurn:
        return cls(
            id=row.id,
            session_id=row.session_id,
            seq=row.seq,
            role=row.role,
            name=row.name,
            content=row.content,
            created_at=as_utc(row.created_at),
            external_id=row.external_id,
            token_count=row.token_count,
        )


@dataclass(frozen=True, slots=True)
class SearchHit:
    turn: StoredTurn
    score: float


@dataclass(frozen=True, slots=True)
class ImportedMessage:
    role: str
    content: str
    name: str | None = None
    created_at: dt.datetime | None = None
    external_id: str | None = None
    image_caption: str | None = None
