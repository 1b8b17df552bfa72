"""The export format, one record per line (JSON Lines): the records of each version, and
reading a file's lines as records of the current version. `docs/export.md` is its
reference; this module is its definition.

Version 2 (written): a header, then for each user their rows, then the tenant's shared
knowledge (whole-tenant exports), then an end record with the number of records. Rows
name each other by natural keys, never by this store's ids: a message is
`[session id, seq]`, a fact is its `key` (its number among its user's facts, 1 first).
Version 1 (read): a header naming one user, then each session followed by its messages.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from storage.records import DocumentFields, StoredMessage

FORMAT = "memchat-export"
VERSION = 2

MessageKey = tuple[str, int]


class BackupFormatError(ValueError):
    """An import file that is not a memchat export, or a damaged one (the message names
    the line)."""


# Version 2 -------------------------------------------------------------------------------


class Header(msgspec.Struct, tag="header", forbid_unknown_fields=True):
    format: str
    version: int
    # The tenant exported from (informative: an import writes into the tenant it is given).
    tenant: str | None
    # The one user exported, or None for the whole tenant.
    user_id: str | None


class UserRecord(msgspec.Struct, tag="user", forbid_unknown_fields=True):
    """Starts a user's rows: every record up to the next user record is theirs."""

    user_id: str
    created_at: dt.datetime | None = None


class FactRecord(msgspec.Struct, tag="fact", forbid_unknown_fields=True, kw_only=True):
    """A fact row (every version: superseded and deleted ones too). Its sources follow
    the messages, as a `fact_sources` record; its vector is derived, made on import."""

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


class SessionRecord(msgspec.Struct, tag="session", forbid_unknown_fields=True):
    id: str
    title: str | None
    metadata: dict[str, Any]
    created_at: dt.datetime


class MessageRecord(
    StoredMessage,
    frozen=True,
    kw_only=True,
    tag="message",
    forbid_unknown_fields=True,
    omit_defaults=True,
):
    """A message (`storage.records.StoredMessage`) and the context it was sent with; the
    past turns and facts that context showed are given by key."""

    image_caption: str | None = None
    context_note: list[str] | None = None
    context_note_tokens: int = 0
    context_note_messages: list[MessageKey] | None = None
    context_note_facts: list[int] | None = None


class FactSourcesRecord(msgspec.Struct, tag="fact_sources", forbid_unknown_fields=True):
    fact: int
    messages: list[MessageKey]


class FactChangeRecord(msgspec.Struct, tag="fact_change", forbid_unknown_fields=True):
    """One history entry of a fact; in `before` and `after`, `source_message_ids` holds
    message keys and `superseded_by` a fact key."""

    fact: int
    action: str
    actor: str
    changed_at: dt.datetime
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class SummaryRecord(msgspec.Struct, tag="summary", forbid_unknown_fields=True, kw_only=True):
    session_id: str
    version: int
    through_seq: int
    pruned_seqs: list[int]
    pinned_facts: list[int] | None
    text: str
    summarizer: str
    token_count: int
    created_at: dt.datetime


class FactsThroughRecord(msgspec.Struct, tag="facts_through", forbid_unknown_fields=True):
    """Fact extraction has read the user's messages up to and including this one."""

    message: MessageKey


class DocumentRecord(
    DocumentFields, frozen=True, kw_only=True, tag="document", forbid_unknown_fields=True
):
    """A knowledge document (`storage.records.DocumentFields`), the user's own (`owner`)
    or, with no owner, shared by the tenant's users."""

    owner: str | None
    metadata: dict[str, Any]
    content: str


class ChunkRecord(msgspec.Struct, tag="chunk", forbid_unknown_fields=True):
    document_id: str
    ordinal: int
    text: str
    token_count: int
    heading_path: str


class EndRecord(msgspec.Struct, tag="end", forbid_unknown_fields=True):
    """The last line: how many records are between it and the header (a cut file lacks it)."""

    num_records: int


Record = (
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

# Version 1 -------------------------------------------------------------------------------


class HeaderV1(msgspec.Struct, tag="header", forbid_unknown_fields=True):
    format: str
    version: int
    user_id: str


class MessageRecordV1(
    StoredMessage,
    frozen=True,
    kw_only=True,
    tag="message",
    forbid_unknown_fields=True,
    omit_defaults=True,
):
    image_caption: str | None = None


RecordV1 = HeaderV1 | SessionRecord | MessageRecordV1


class _Probe(msgspec.Struct):
    """What any version's header has."""

    type: str = ""
    format: str = ""
    version: int = 0


_encoder = msgspec.json.Encoder()
_probe = msgspec.json.Decoder(_Probe)
_decoders: dict[int, msgspec.json.Decoder[Any]] = {
    1: msgspec.json.Decoder(RecordV1),
    2: msgspec.json.Decoder(Record),
}


def encode(record: Record) -> bytes:
    return _encoder.encode(record) + b"\n"


def _decode(decoder: msgspec.json.Decoder[Any], number: int, line: bytes) -> Any:
    try:
        return decoder.decode(line)
    except msgspec.ValidationError as exc:
        raise BackupFormatError(f"line {number}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise BackupFormatError(f"line {number}: not JSON: {exc}") from exc


def _version(number: int, line: bytes) -> int:
    probe = _decode(_probe, number, line)
    if probe.type != "header" or probe.format != FORMAT:
        raise BackupFormatError("not a memchat export: the first line must be its header")
    if probe.version not in _decoders:
        raise BackupFormatError(f"export version {probe.version} is not supported")
    return int(probe.version)


def read_records(lines: Iterable[bytes]) -> Iterator[tuple[int, Record, int]]:
    """(line number, record, size in bytes) of each non-blank line, as records of the
    current version; a version 1 file's records converted. A line that is not a record
    raises BackupFormatError naming it."""
    numbered = ((n, line) for n, line in enumerate(lines, 1) if line.strip())
    first = next(numbered, None)
    if first is None:
        raise BackupFormatError("not a memchat export: the file is empty")
    version = _version(*first)
    decoder = _decoders[version]
    if version == 1:
        yield from _from_version_1(decoder, first, numbered)
        return
    yield first[0], _decode(decoder, *first), len(first[1])
    for number, line in numbered:
        yield number, _decode(decoder, number, line), len(line)


def _from_version_1(
    decoder: msgspec.json.Decoder[Any],
    first: tuple[int, bytes],
    numbered: Iterator[tuple[int, bytes]],
) -> Iterator[tuple[int, Record, int]]:
    """Version 1 as version 2: the header names the user, messages follow their session."""
    header = _decode(decoder, *first)
    if not isinstance(header, HeaderV1):
        raise BackupFormatError(f"line {first[0]}: expected the header")
    yield first[0], Header(FORMAT, 1, None, header.user_id), len(first[1])
    yield first[0], UserRecord(header.user_id), 0
    session_id: str | None = None
    num_records = 0
    for number, line in numbered:
        record = _decode(decoder, number, line)
        if isinstance(record, SessionRecord):
            session_id = record.id
            yield number, record, len(line)
        elif isinstance(record, MessageRecordV1) and record.session_id == session_id:
            fields = msgspec.structs.asdict(record)
            yield number, MessageRecord(**fields), len(line)
        else:
            raise BackupFormatError(f"line {number}: a message must follow its own session's line")
        num_records += 1
    yield first[0], EndRecord(num_records + 1), 0
