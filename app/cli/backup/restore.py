"""Importing an export: lines read one at a time, rows written in bounded batches.

Each batch (at most `batch_size` records or `max_batch_bytes` of lines) is one
transaction; once it is committed its new messages are embedded and indexed
(`TurnMemory.index`), its new facts given vectors and its new knowledge chunks indexed,
before the next batch is read. A line that is not a valid record, or out of order, is
found before its batch is written, and so is a record beyond the service's limits
(`limits.py`): that batch is not written, the batches before it are (they are valid, and
importing the file again adds only what is missing). `check_lines`
reads a whole file first, so that a damaged file can be refused before anything is written.

Memory holds one batch and the map from the current user's fact keys to fact ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, ClassVar

import numpy as np

from app.cli.backup.limits import ImportLimits
from app.cli.backup.order import OrderCheck
from retrieval.knowledge.base import KnowledgeBase
from retrieval.search.memory import RetrievalConfig, TurnMemory
from storage.backup import (
    BackupRepository,
    RestoreBatch,
    RestoredChange,
    RestoredDocument,
    RestoredFact,
    RestoredMessage,
)
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
    MessageKey,
    MessageRecord,
    Record,
    SessionRecord,
    SummaryRecord,
    UserRecord,
    read_records,
)
from storage.errors import ConflictError, InvalidDataError, RestoreRefusedError
from storage.facts import FactRepository
from storage.knowledge import NewChunk
from storage.records import NewTurn, Session, Summary, Turn, User

BATCH_SIZE = 500
MAX_BATCH_BYTES = 16 * 1024 * 1024
KINDS = ("users", "facts", "fact_changes", "sessions", "messages", "summaries", "documents")
Numbered = list[tuple[int, Any]]


@dataclass(frozen=True, slots=True)
class ImportTarget:
    """Where an import writes: the store, the turn memory that indexes new messages (built
    with `vectors_only`), and the knowledge base (built on first use: most exports have
    no documents)."""

    store: BackupRepository
    facts: FactRepository
    memory: TurnMemory
    knowledge: Callable[[], KnowledgeBase]
    tenant_id: int


@dataclass
class ImportCounts:
    """Rows added, by kind (`KINDS` and "chunks"), and rows of the file already stored."""

    num_added: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*KINDS, "chunks"), 0))
    num_present: int = 0

    def add(self, kind: str, num_added: int, num_rows: int) -> None:
        self.num_added[kind] += num_added
        self.num_present += num_rows - num_added


def vectors_only(config: RetrievalConfig) -> RetrievalConfig:
    """The turn memory an import writes with: the service's vectors (the same model and
    text recipe, so the same stored vectors), without the lexical index and duplicate
    fingerprints. Those have no file (the service builds them from SQL when it first
    uses a user); kept here they would hold every turn of every user restored."""
    return dataclasses.replace(config, mode="dense", duplicate_threshold=2.0)


def check_lines(lines: Iterable[bytes], limits: ImportLimits | None = None) -> int:
    """Read a whole export without writing; returns its number of records, or raises
    BackupFormatError naming the first bad line. `limits`: the service's (default: its
    default settings')."""
    check = OrderCheck()
    limits = limits or ImportLimits.of()
    for number, record, _size in read_records(lines):
        check.accept(number, record)
        limits.accept(number, record)
    check.finish()
    return check.num_records


async def import_lines(
    target: ImportTarget,
    lines: Iterable[bytes],
    *,
    batch_size: int = BATCH_SIZE,
    max_batch_bytes: int = MAX_BATCH_BYTES,
    on_records: Callable[[int], object] | None = None,
    limits: ImportLimits | None = None,
) -> ImportCounts:
    """Restore an export into the target's tenant (see the module's docstring); records
    beyond `limits` (default: the service's default settings') are refused."""
    restore = _Import(target, on_records or (lambda _n: None))
    check = OrderCheck()
    limits = limits or ImportLimits.of()
    batch: Numbered = []
    size = 0
    for number, record, num_bytes in read_records(lines):
        check.accept(number, record)
        limits.accept(number, record)
        if isinstance(record, Header | EndRecord):
            continue
        batch.append((number, record))
        size += num_bytes
        if len(batch) >= batch_size or size >= max_batch_bytes:
            await restore.write(batch)
            batch, size = [], 0
    check.finish()
    if batch:
        await restore.write(batch)
    await target.memory.save()
    return restore.counts


class _Import:
    def __init__(self, target: ImportTarget, on_records: Callable[[int], object]) -> None:
        self._target = target
        self._on_records = on_records
        self._knowledge: KnowledgeBase | None = None
        self.counts = ImportCounts()
        self._user: User | None = None
        self._facts: dict[int, int] = {}
        # Work after the batch's commit: turns to index, facts to embed, chunks to index.
        self._turns: list[Turn] = []
        self._fact_texts: list[tuple[int, str]] = []
        self._chunks: list[tuple[int, int]] = []

    async def write(self, batch: Numbered) -> None:
        try:
            async with self._target.store.batch() as writer:
                for kind, run in groupby(batch, key=lambda item: type(item[1])):
                    await self._apply(writer, kind, list(run))
        except (ConflictError, InvalidDataError) as exc:
            raise BackupFormatError(f"lines {batch[0][0]}-{batch[-1][0]}: {exc}") from exc
        await self._index()
        self._on_records(len(batch))

    async def _apply(self, writer: RestoreBatch, kind: type[Any], run: Numbered) -> None:
        records = [record for _, record in run]
        try:
            await self._handlers[kind](self, writer, records)
        except RestoreRefusedError as exc:
            raise BackupFormatError(f"line {run[exc.position][0]}: {exc.reason}") from exc
        except (KeyError, TypeError, ValueError) as exc:  # a malformed snapshot or key
            raise BackupFormatError(f"lines {run[0][0]}-{run[-1][0]}: {exc!r}") from exc

    async def _index(self) -> None:
        turns, fact_texts, chunks = self._turns, self._fact_texts, self._chunks
        self._turns, self._fact_texts, self._chunks = [], [], []
        memory = self._target.memory
        if turns:
            await memory.index(turns, fresh=True)
        if fact_texts:
            vectors = await memory.embed([text for _, text in fact_texts])
            model = memory.embedder.model_name
            await self._target.facts.save_vectors(
                [
                    (fact_id, model, np.asarray(vector, dtype=np.float32).tobytes())
                    for (fact_id, _), vector in zip(fact_texts, vectors, strict=True)
                ]
            )
        if chunks:
            if self._knowledge is None:
                self._knowledge = self._target.knowledge()
            await self._knowledge.index_stored_chunks(chunks)

    @property
    def _user_pk(self) -> int:
        assert self._user is not None  # OrderCheck: user-scoped records follow their user
        return self._user.id

    def _fact_ids(self, keys: Sequence[int] | None) -> list[int] | None:
        return None if keys is None else [self._facts[key] for key in keys]

    # One method per kind of record --------------------------------------------------------

    async def _users(self, writer: RestoreBatch, records: list[UserRecord]) -> None:
        for record in records:
            user, created = await writer.restore_user(
                self._target.tenant_id, record.user_id, record.created_at
            )
            self._user, self._facts = user, {}
            self.counts.add("users", int(created), 1)

    async def _facts_rows(self, writer: RestoreBatch, records: list[FactRecord]) -> None:
        restored = await writer.restore_facts(
            self._user_pk,
            [
                RestoredFact(
                    text=r.text,
                    category=r.category,
                    subject=r.subject,
                    value=r.value,
                    status=r.status,
                    is_pinned=r.is_pinned,
                    priority=r.priority,
                    valid_from=r.valid_from,
                    valid_to=r.valid_to,
                    created_at=r.created_at,
                    updated_at=r.updated_at,
                )
                for r in records
            ],
            set(self._facts.values()),
        )
        for record, (fact_id, added) in zip(records, restored, strict=True):
            self._facts[record.key] = fact_id
            if added:
                self._fact_texts.append((fact_id, record.text))
        self.counts.add("facts", sum(added for _, added in restored), len(records))

    async def _sessions(self, writer: RestoreBatch, records: list[SessionRecord]) -> None:
        sessions = [
            Session(r.id, self._user_pk, r.title, r.metadata, r.created_at) for r in records
        ]
        self.counts.add(
            "sessions", await writer.restore_sessions(self._user_pk, sessions), len(records)
        )

    async def _messages(self, writer: RestoreBatch, records: list[MessageRecord]) -> None:
        items = [
            RestoredMessage(
                r.session_id,
                NewTurn(
                    role=r.role,
                    content=r.content,
                    token_count=r.token_count,
                    name=r.name,
                    created_at=r.created_at,
                    external_id=r.external_id,
                    image_caption=r.image_caption,
                    seq=r.seq,
                    context_note=r.context_note,
                    context_note_tokens=r.context_note_tokens,
                    context_note_fact_ids=self._fact_ids(r.context_note_facts),
                ),
                r.context_note_messages,
            )
            for r in records
        ]
        turns, num_present = await writer.restore_messages(self._user_pk, items)
        self._turns += turns
        self.counts.add("messages", len(records) - num_present, len(records))

    async def _fact_sources(self, writer: RestoreBatch, records: list[FactSourcesRecord]) -> None:
        sources = [(self._facts[r.fact], r.messages) for r in records]
        await writer.restore_fact_sources(self._user_pk, sources)

    async def _fact_changes(self, writer: RestoreBatch, records: list[FactChangeRecord]) -> None:
        changes = []
        for r in records:
            before, before_sources = self._snapshot(r.before)
            after, after_sources = self._snapshot(r.after)
            changes.append(
                RestoredChange(
                    self._facts[r.fact],
                    r.action,
                    r.actor,
                    r.changed_at,
                    before,
                    after,
                    before_sources,
                    after_sources,
                )
            )
        num_added = await writer.restore_fact_changes(self._user_pk, changes)
        self.counts.add("fact_changes", num_added, len(records))

    def _snapshot(
        self, snapshot: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, list[MessageKey] | None]:
        """A snapshot with its fact key as an id here, and its source message keys."""
        if snapshot is None:
            return None, None
        found = dict(snapshot)
        if found.get("superseded_by") is not None:
            found["superseded_by"] = self._facts[found["superseded_by"]]
        sources = found.get("source_message_ids")
        if sources is None:
            return found, None
        return found, [_message_key(key) for key in sources]

    async def _summaries(self, writer: RestoreBatch, records: list[SummaryRecord]) -> None:
        summaries = [
            Summary(
                session_id=r.session_id,
                version=r.version,
                through_seq=r.through_seq,
                pruned_seqs=r.pruned_seqs,
                pinned_fact_ids=self._fact_ids(r.pinned_facts),
                text=r.text,
                summarizer=r.summarizer,
                token_count=r.token_count,
                created_at=r.created_at,
            )
            for r in records
        ]
        num_added = await writer.restore_summaries(self._user_pk, summaries)
        self.counts.add("summaries", num_added, len(records))

    async def _facts_through(self, writer: RestoreBatch, records: list[FactsThroughRecord]) -> None:
        for record in records:
            await writer.raise_watermark(self._user_pk, record.message)

    async def _documents(self, writer: RestoreBatch, records: list[DocumentRecord]) -> None:
        documents = [
            RestoredDocument(r, None if r.owner is None else self._user_pk, r.metadata, r.content)
            for r in records
        ]
        added = await writer.restore_documents(self._target.tenant_id, documents)
        self.counts.add("documents", sum(added), len(records))

    async def _chunk_rows(self, writer: RestoreBatch, records: list[ChunkRecord]) -> None:
        chunks = [
            (r.document_id, NewChunk(r.ordinal, r.text, r.token_count, r.heading_path))
            for r in records
        ]
        added = await writer.restore_chunks(chunks)
        self._chunks += added
        self.counts.add("chunks", len(added), len(records))

    _handlers: ClassVar[dict[type[Any], Callable[[_Import, RestoreBatch, Any], Any]]] = {
        UserRecord: _users,
        FactRecord: _facts_rows,
        SessionRecord: _sessions,
        MessageRecord: _messages,
        FactSourcesRecord: _fact_sources,
        FactChangeRecord: _fact_changes,
        SummaryRecord: _summaries,
        FactsThroughRecord: _facts_through,
        DocumentRecord: _documents,
        ChunkRecord: _chunk_rows,
    }


def _message_key(value: Any) -> MessageKey:
    """A message key as a snapshot holds it: `[session id, seq]`."""
    if (
        isinstance(value, list | tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
    ):
        return value[0], value[1]
    raise ValueError(f"{value!r} is not a message key [session id, seq]")


__all__ = ["ImportCounts", "ImportTarget", "Record", "check_lines", "import_lines", "vectors_only"]
