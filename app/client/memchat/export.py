"""A user's export (`GET /v1/users/{user_id}/export`): its records, and the reading of
its streamed lines.

The records are copies of the server's export format, version 2
(`storage/backup/lines.py`, described in docs/export.md), field for field and with the
same names; `tests/test_client_types.py` compares them both ways. Each line is one
record, named by its `type`: the header first, the user's rows, and last the `end`
record with their count, without which an export is cut short.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Literal

import msgspec
from msgspec import Struct

from memchat.errors import UnexpectedAnswerError

# A message by its natural key: [session id, seq].
MessageKey = tuple[str, int]


class Header(Struct, frozen=True, tag="header"):
    format: str
    version: int
    tenant: str | None
    user_id: str | None


class UserRecord(Struct, frozen=True, tag="user"):
    user_id: str
    created_at: dt.datetime | None = None


class FactRecord(Struct, frozen=True, kw_only=True, tag="fact"):
    """A fact, every version of it; `key` is its number among the user's facts."""

    key: int
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


class SessionRecord(Struct, frozen=True, tag="session"):
    id: str
    title: str | None
    metadata: dict[str, Any]
    created_at: dt.datetime


class MessageRecord(Struct, frozen=True, kw_only=True, tag="message"):
    """A message and the context it was sent with (past turns and facts by key)."""

    session_id: str
    seq: int
    role: Literal["user", "assistant", "system"]
    name: str | None
    content: str
    created_at: dt.datetime
    external_id: str | None
    token_count: int
    image_caption: str | None = None
    context_note: list[str] | None = None
    context_note_tokens: int = 0
    context_note_messages: list[MessageKey] | None = None
    context_note_facts: list[int] | None = None


class FactSourcesRecord(Struct, frozen=True, tag="fact_sources"):
    fact: int
    messages: list[MessageKey]


class FactChangeRecord(Struct, frozen=True, tag="fact_change"):
    fact: int
    action: str
    actor: str
    changed_at: dt.datetime
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class SummaryRecord(Struct, frozen=True, kw_only=True, tag="summary"):
    session_id: str
    version: int
    through_seq: int
    pruned_seqs: list[int]
    pinned_facts: list[int] | None
    text: str
    summarizer: str
    token_count: int
    created_at: dt.datetime


class FactsThroughRecord(Struct, frozen=True, tag="facts_through"):
    message: MessageKey


class DocumentRecord(Struct, frozen=True, kw_only=True, tag="document"):
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
    owner: str | None
    metadata: dict[str, Any]
    content: str


class ChunkRecord(Struct, frozen=True, tag="chunk"):
    document_id: str
    ordinal: int
    text: str
    token_count: int
    heading_path: str


class EndRecord(Struct, frozen=True, tag="end"):
    num_records: int


ExportRecord = (
    Header
    | UserRecord
    | FactRecord
    | SessionRecord
    | MessageRecord
    | FactSourcesRecord
    | FactChangeRecord
    | SummaryRecord
    | FactsThroughRecord
    | DocumentRecord
    | ChunkRecord
    | EndRecord
)

_record = msgspec.json.Decoder(ExportRecord)


class ExportReader:
    """Reads the records of an export's bytes as they arrive, in chunks that may end
    inside a line; a line split over chunks is held until its newline comes."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._num_lines = 0
        self._end: EndRecord | None = None

    def feed(self, chunk: bytes) -> list[ExportRecord]:
        """The records of the lines this chunk completes."""
        *complete, rest = chunk.split(b"\n")
        if complete:
            complete[0] = b"".join((*self._pending, complete[0]))
            self._pending = []
        if rest:
            self._pending.append(rest)
        return [self._read(line) for line in complete if line.strip()]

    def finish(self) -> int:
        """The number of records between the header and the end; an export without its
        end record raises `UnexpectedAnswerError`."""
        if self._end is None or any(piece.strip() for piece in self._pending):
            raise UnexpectedAnswerError("the export is cut short: its `end` record is missing")
        return self._end.num_records

    def _read(self, line: bytes) -> ExportRecord:
        self._num_lines += 1
        try:
            record = _record.decode(line)
        except msgspec.DecodeError as exc:
            raise UnexpectedAnswerError(f"export line {self._num_lines}: {exc}") from exc
        if (self._num_lines == 1) != isinstance(record, Header) or self._end is not None:
            raise UnexpectedAnswerError(
                f"export line {self._num_lines}: a header begins an export and an end "
                "record ends it"
            )
        if isinstance(record, EndRecord):
            self._end = record
        return record


@contextmanager
def partial_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """The file at `path`, written beside it (`<path>.partial`) and renamed over it once
    complete: an export that fails leaves no file that looks whole."""
    target = Path(path)
    partial = target.with_name(f"{target.name}.partial")
    try:
        with partial.open("wb") as handle:
            yield handle
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
