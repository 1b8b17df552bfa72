"""Export and import one user's whole memory as JSON Lines.

Line 1 is a header; then each session, followed by its messages in order. Message ids
are not exported (a target store numbers its own); session ids, sequence numbers, times,
external ids and token counts are, so an export, import and export again gives the same
bytes. Vectors are derived: import re-embeds with the target's model. Facts, summaries
and knowledge join the format when the service stores them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from retrieval.search.memory import TurnMemory
from storage.records import NewTurn, Session, StoredMessage
from storage.sessions import SessionRepository

FORMAT = "memchat-export"
VERSION = 1


class Header(msgspec.Struct, tag="header", forbid_unknown_fields=True):
    format: str
    version: int
    user_id: str


class SessionRecord(msgspec.Struct, tag="session", forbid_unknown_fields=True):
    id: str
    title: str | None
    metadata: dict[str, Any]
    created_at: dt.datetime


class MessageRecord(
    StoredMessage, frozen=True, tag="message", forbid_unknown_fields=True, omit_defaults=True
):
    """A message (its fields: `storage.records.StoredMessage`)."""

    # Only written when set, so exports without captions read as before.
    image_caption: str | None = None


Record = Header | SessionRecord | MessageRecord
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)


class BackupFormatError(ValueError):
    """An import file that is not a memchat export."""


async def export_user(sessions: SessionRepository, user_id: str, tenant_id: int) -> Iterator[bytes]:
    """The user's memory as JSON lines (each ending with a newline)."""
    found = await sessions.list_user_sessions(user_id, tenant_id=tenant_id)
    lines = [_encoder.encode(Header(FORMAT, VERSION, user_id))]
    for chat, turns in found:
        record = SessionRecord(chat.id, chat.title, chat.metadata_json or {}, chat.created_at)
        lines.append(_encoder.encode(record))
        lines.extend(
            _encoder.encode(msgspec.convert(t, MessageRecord, from_attributes=True)) for t in turns
        )
    return (line + b"\n" for line in lines)


def parse_export(
    lines: Iterable[bytes],
) -> tuple[str, list[tuple[SessionRecord, list[MessageRecord]]]]:
    records = [_decode(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not records or not isinstance(records[0], Header) or records[0].format != FORMAT:
        raise BackupFormatError("not a memchat export: the first line must be its header")
    if records[0].version != VERSION:
        raise BackupFormatError(f"export version {records[0].version} is not supported")
    sessions: list[tuple[SessionRecord, list[MessageRecord]]] = []
    for record in records[1:]:
        if isinstance(record, SessionRecord):
            sessions.append((record, []))
        elif (
            isinstance(record, MessageRecord)
            and sessions
            and record.session_id == sessions[-1][0].id
        ):
            sessions[-1][1].append(record)
        else:
            raise BackupFormatError("a message must follow its own session's line")
    return records[0].user_id, sessions


def _decode(number: int, line: bytes) -> Record:
    try:
        return _decoder.decode(line)
    except msgspec.ValidationError as exc:
        raise BackupFormatError(f"line {number}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise BackupFormatError(f"line {number}: not JSON: {exc}") from exc


async def import_user(
    sessions: SessionRepository, memory: TurnMemory, lines: Iterable[bytes], tenant_id: int
) -> tuple[int, int, int]:
    """Restore an export; returns (sessions restored, messages restored, sessions skipped)."""
    user_id, exported = parse_export(lines)
    num_sessions = num_messages = num_skipped = 0
    for record, messages in exported:
        chat = Session(record.id, 0, record.title, record.metadata, record.created_at)
        restored = await sessions.restore_session(
            user_id,
            chat,
            [
                NewTurn(**{k: v for k, v in msgspec.structs.asdict(m).items() if k != "session_id"})
                for m in messages
            ],
            tenant_id=tenant_id,
        )
        if restored is None:
            num_skipped += 1
            continue
        await memory.index(restored, fresh=True)
        num_sessions += 1
        num_messages += len(restored)
    await memory.save()
    return num_sessions, num_messages, num_skipped
