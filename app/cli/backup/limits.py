"""What an import takes: the limits the service puts on what it stores, checked on every
record as it is read, before its batch is written (docs/export.md, "What import refuses").

An import writes rows without passing through the API, so without these checks a file
could store what no request can: an id the API refuses (a user id with '/' cannot be
addressed, a session or document id that is not a UUID names nothing), text that is
blank or longer than the API takes, NUL characters (PostgreSQL refuses them in the middle
of an import, SQLite stores them), a place or a count that the database's integer
columns cannot hold (`seq: 10**30`), a context note far larger than any a turn writes,
metadata over the API's size, and a document whose `content_hash` is not its content's
(stored, it would pass for another text of the same scope). The limits that are settings
are taken from the settings, the one place the service's defaults live, so an import
takes what the same service would.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from app.api.errors import ID_RULE
from app.api.schemas import (
    MAX_CAPTION_CHARS,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_TITLE_CHARS,
    USER_ID_PATTERN,
)
from app.settings import ChatSettings, KnowledgeSettings
from retrieval.knowledge.base import content_hash
from retrieval.text import is_blank
from storage.backup.lines import (
    BackupFormatError,
    ChunkRecord,
    DocumentRecord,
    FactChangeRecord,
    FactRecord,
    FactSourcesRecord,
    FactsThroughRecord,
    MessageKey,
    MessageRecord,
    Record,
    SessionRecord,
    SummaryRecord,
    UserRecord,
)
from storage.sessions import is_uuid

# PostgreSQL's `integer`, the type of every column that holds a place or a count.
MAX_INTEGER = 2**31 - 1
# A turn's context note is one block (earlier versions wrote a few parts); it shows at
# most `chat.retrieval_k` past turns (200 at most) and the facts pinned since the last
# summary. These bounds are far above what a turn writes and far below what would make
# every later prompt of the session slow to assemble.
MAX_NOTE_PARTS = 8
MAX_NOTE_REFERENCES = 1000

_USER_ID = re.compile(USER_ID_PATTERN)


@dataclass(frozen=True, slots=True)
class ImportLimits:
    """The settings' limits on stored text (see the module's docstring)."""

    max_content_chars: int
    max_metadata_bytes: int
    max_document_chars: int

    @classmethod
    def of(
        cls, chat: ChatSettings | None = None, knowledge: KnowledgeSettings | None = None
    ) -> ImportLimits:
        """The limits of the service with these settings (default: its defaults)."""
        chat = chat or ChatSettings()
        knowledge = knowledge or KnowledgeSettings()
        return cls(chat.max_content_chars, chat.max_metadata_bytes, knowledge.max_document_chars)

    def accept(self, number: int, record: Record) -> None:
        """Check one record (line `number`); raises BackupFormatError naming the line."""
        try:
            _no_nul(msgspec.structs.asdict(record), "$")
            check = _CHECKS.get(type(record))
            if check is not None:
                check(self, record)
        except ValueError as exc:
            raise BackupFormatError(f"line {number}: {exc}") from exc


# Values ---------------------------------------------------------------------------------


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 80 else f"{value[:40]!r}... ({len(value)} characters)"


def _no_nul(value: Any, path: str) -> None:
    """NUL (U+0000) nowhere: neither database keeps it as text (the API refuses it too)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"text must not contain NUL (U+0000) - at `{path}`")
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_nul(key, path)
            _no_nul(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for position, item in enumerate(value):
            _no_nul(item, f"{path}[{position}]")


def _integer(name: str, value: int, low: int = 0) -> None:
    if not low <= value <= MAX_INTEGER:
        raise ValueError(f"{name} {value} is out of range ({low} to {MAX_INTEGER})")


def _user_id(value: str) -> None:
    if not 1 <= len(value) <= MAX_ID_CHARS or _USER_ID.fullmatch(value) is None:
        raise ValueError(
            f"user id {_shown(value)} is not one the API takes: 1 to {MAX_ID_CHARS} "
            f"characters. {ID_RULE}"
        )


def _uuid(name: str, value: str) -> None:
    if not is_uuid(value):
        raise ValueError(f"{name} {_shown(value)} is not a UUID")


def _length(name: str, value: str | None, maximum: int, *, minimum: int = 0) -> None:
    if value is not None and not minimum <= len(value) <= maximum:
        limits = f"at most {maximum}" if minimum == 0 else f"{minimum} to {maximum}"
        raise ValueError(f"{name} has {len(value)} characters; it takes {limits}")


def _text(name: str, value: str, maximum: int, setting: str, *, may_be_blank: bool) -> None:
    if not may_be_blank and is_blank(value):
        raise ValueError(f"{name} must not be empty")
    if len(value) > maximum:
        raise ValueError(f"{name} has {len(value)} characters; the limit is {maximum} ({setting})")


def _keys(name: str, keys: Iterable[MessageKey]) -> None:
    for session_id, seq in keys:
        _uuid(f"{name}: session id", session_id)
        _integer(f"{name}: seq", seq, 1)


def _at_most(name: str, items: list[Any] | None, maximum: int) -> None:
    if items is not None and len(items) > maximum:
        raise ValueError(f"{name} has {len(items)} items; at most {maximum}")


# Records --------------------------------------------------------------------------------


def _user(_limits: ImportLimits, record: UserRecord) -> None:
    _user_id(record.user_id)


def _session(limits: ImportLimits, record: SessionRecord) -> None:
    _uuid("session id", record.id)
    _length("title", record.title, MAX_TITLE_CHARS)
    # Measured as the API measures it (retrieval/chat/sessions.py).
    size = len(json.dumps(record.metadata, ensure_ascii=False).encode("utf-8"))
    if size > limits.max_metadata_bytes:
        raise ValueError(
            f"metadata takes {size} bytes as JSON; the limit is {limits.max_metadata_bytes} "
            "(chat.max_metadata_bytes)"
        )


def _message(limits: ImportLimits, record: MessageRecord) -> None:
    _uuid("session_id", record.session_id)
    _integer("seq", record.seq, 1)
    # A reply is the engine's, which may answer nothing; what a client sends is not blank.
    _text(
        "content",
        record.content,
        limits.max_content_chars,
        "chat.max_content_chars",
        may_be_blank=record.role == "assistant",
    )
    _length("name", record.name, MAX_NAME_CHARS)
    _length("external_id", record.external_id, MAX_ID_CHARS, minimum=1)
    _length("image_caption", record.image_caption, MAX_CAPTION_CHARS)
    _integer("token_count", record.token_count)
    _integer("context_note_tokens", record.context_note_tokens)
    _at_most("context_note", record.context_note, MAX_NOTE_PARTS)
    for part in record.context_note or ():
        _text(
            "context_note",
            part,
            limits.max_document_chars,
            "knowledge.max_document_chars",
            may_be_blank=True,
        )
    _at_most("context_note_messages", record.context_note_messages, MAX_NOTE_REFERENCES)
    _keys("context_note_messages", record.context_note_messages or ())
    _at_most("context_note_facts", record.context_note_facts, MAX_NOTE_REFERENCES)


def _fact(limits: ImportLimits, record: FactRecord) -> None:
    _text(
        "text", record.text, limits.max_content_chars, "chat.max_content_chars", may_be_blank=False
    )
    _integer("priority", record.priority, -MAX_INTEGER)


def _fact_sources(_limits: ImportLimits, record: FactSourcesRecord) -> None:
    _keys("messages", record.messages)


def _fact_change(_limits: ImportLimits, record: FactChangeRecord) -> None:
    for name, snapshot in (("before", record.before), ("after", record.after)):
        sources = (snapshot or {}).get("source_message_ids")
        if isinstance(sources, list):
            # Keys of another shape are refused as they are restored; bounds are checked here.
            _keys(f"{name}.source_message_ids", [key for key in sources if _is_key(key)])


def _is_key(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
    )


def _summary(_limits: ImportLimits, record: SummaryRecord) -> None:
    _uuid("session_id", record.session_id)
    _integer("version", record.version, 1)
    _integer("through_seq", record.through_seq)
    for seq in record.pruned_seqs:
        _integer("pruned_seqs: seq", seq, 1)
    _integer("token_count", record.token_count)


def _facts_through(_limits: ImportLimits, record: FactsThroughRecord) -> None:
    _keys("message", [record.message])


def _document(limits: ImportLimits, record: DocumentRecord) -> None:
    _uuid("document id", record.id)
    _length("title", record.title, MAX_TITLE_CHARS)
    _text(
        "content",
        record.content,
        limits.max_document_chars,
        "knowledge.max_document_chars",
        may_be_blank=False,
    )
    if record.content_hash != content_hash(record.content):
        raise ValueError(
            f"content_hash {_shown(record.content_hash)} is not the SHA-256 of the "
            "document's content"
        )
    for name in ("num_chars", "num_chunks", "num_chunks_indexed"):
        _integer(name, getattr(record, name))


def _chunk(limits: ImportLimits, record: ChunkRecord) -> None:
    _integer("ordinal", record.ordinal)
    _integer("token_count", record.token_count)
    _text(
        "text",
        record.text,
        limits.max_document_chars,
        "knowledge.max_document_chars",
        may_be_blank=True,
    )


_CHECKS: dict[type[Any], Callable[[ImportLimits, Any], None]] = {
    UserRecord: _user,
    SessionRecord: _session,
    MessageRecord: _message,
    FactRecord: _fact,
    FactSourcesRecord: _fact_sources,
    FactChangeRecord: _fact_change,
    SummaryRecord: _summary,
    FactsThroughRecord: _facts_through,
    DocumentRecord: _document,
    ChunkRecord: _chunk,
}
