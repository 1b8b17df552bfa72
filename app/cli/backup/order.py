"""The ordering rules of an export, checked a line at a time (docs/export.md, "Order").

What is checked needs no database: the header first and the end record last with the
right count, every user-scoped record after its user's record and in the order of the
kinds (`PHASES`), chunks right after their document, and every fact key a record names
declared by a fact line of the same user. The keys of the current user's facts are the
only state that grows (with that user's fact rows); everything else is constant.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from storage.backup.lines import (
    BackupFormatError,
    ChunkRecord,
    DocumentRecord,
    EndRecord,
    FactChangeRecord,
    FactRecord,
    FactSourcesRecord,
    FactsThroughRecord,
    Header,
    MessageRecord,
    Record,
    SessionRecord,
    SummaryRecord,
    UserRecord,
)

# The order of a user's records: a record may follow one of its own kind or of a kind
# before it. Documents and their chunks come last.
PHASES: dict[type[Any], int] = {
    UserRecord: 0,
    FactRecord: 1,
    SessionRecord: 2,
    MessageRecord: 3,
    FactSourcesRecord: 4,
    FactChangeRecord: 5,
    SummaryRecord: 6,
    FactsThroughRecord: 7,
    DocumentRecord: 8,
    ChunkRecord: 8,
}


def _tag(record: Record | type[Any]) -> str:
    cls = record if isinstance(record, type) else type(record)
    return str(cls.__struct_config__.tag)


class OrderCheck:
    def __init__(self) -> None:
        self.header: Header | None = None
        self.user_id: str | None = None
        self.num_users = 0
        self.num_records = 0
        self.is_finished = False
        self._phase = 0
        self._last_kind: type[Any] = UserRecord
        self._fact_keys: set[int] = set()
        self._document_id: str | None = None
        self._in_shared = False

    def accept(self, number: int, record: Record) -> None:
        """Check one record (line `number`); raises BackupFormatError naming the line."""
        try:
            self._accept(record)
        except ValueError as exc:
            raise BackupFormatError(f"line {number}: {exc}") from exc

    def finish(self) -> None:
        if not self.is_finished:
            raise BackupFormatError("the export is cut short: its last line, `end`, is missing")

    def _accept(self, record: Record) -> None:
        if self.is_finished:
            raise ValueError("nothing may follow the end record")
        if isinstance(record, Header):
            if self.header is not None:
                raise ValueError("a second header")
            self.header = record
            return
        if isinstance(record, EndRecord):
            if record.num_records != self.num_records:
                raise ValueError(
                    f"the end record counts {record.num_records} records; the file has "
                    f"{self.num_records}"
                )
            self.is_finished = True
            return
        self.num_records += 1
        if isinstance(record, UserRecord):
            self._start_user(record)
        elif isinstance(record, DocumentRecord) and record.owner is None:
            self._in_shared = True
            self._document_id = record.id
        else:
            self._in_user(record)

    def _start_user(self, record: UserRecord) -> None:
        assert self.header is not None
        if self._in_shared:
            raise ValueError("users come before the tenant's shared documents")
        if self.header.user_id is not None and (
            record.user_id != self.header.user_id or self.num_users > 0
        ):
            raise ValueError(f"the export is of user {self.header.user_id!r} only")
        self.user_id = record.user_id
        self.num_users += 1
        self._phase = 0
        self._last_kind = UserRecord
        self._fact_keys = set()
        self._document_id = None

    def _in_user(self, record: Record) -> None:
        kind = type(record)
        if isinstance(record, ChunkRecord):
            if record.document_id != self._document_id:
                raise ValueError("a chunk must follow its document's line or another chunk of it")
            return
        if self.user_id is None or self._in_shared:
            raise ValueError(f"a {_tag(record)} record must follow its user's record")
        phase = PHASES[kind]
        if phase < self._phase:
            raise ValueError(
                f"a {_tag(record)} record may not follow a {_tag(self._last_kind)} record "
                "of the same user"
            )
        self._phase, self._last_kind = phase, kind
        self._check_facts(record)
        if isinstance(record, DocumentRecord):
            if record.owner != self.user_id:
                raise ValueError(f"a document of {record.owner!r} among {self.user_id!r}'s rows")
            self._document_id = record.id

    def _check_facts(self, record: Record) -> None:
        if isinstance(record, FactRecord):
            if record.key in self._fact_keys:
                raise ValueError(f"fact key {record.key} is used twice")
            self._fact_keys.add(record.key)
            return
        for key in _fact_keys_named(record):
            if key not in self._fact_keys:
                raise ValueError(f"fact {key} is not a fact of this user declared before")


def _fact_keys_named(record: Record) -> Iterable[int]:
    if isinstance(record, MessageRecord):
        return record.context_note_facts or ()
    if isinstance(record, SummaryRecord):
        return record.pinned_facts or ()
    if isinstance(record, FactSourcesRecord):
        return (record.fact,)
    if isinstance(record, FactChangeRecord):
        superseding = [
            snapshot.get("superseded_by")
            for snapshot in (record.before, record.after)
            if snapshot is not None
        ]
        return (record.fact, *(key for key in superseding if isinstance(key, int)))
    return ()
