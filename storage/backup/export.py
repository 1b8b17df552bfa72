"""Writing an export: the rows of one user or a whole tenant as lines, a page at a time.

One writer for both ways out of a store: `memchat export` (app/cli/backup) and the API's
`GET /v1/users/{user_id}/export` (app/api/export.py) send these same lines. Everything
is read in one snapshot (`BackupRepository.snapshot`) and written as it is read, so
memory holds a page of rows and, per user, the map from their fact ids to fact keys (a
dict of the user's fact rows). An export of a store that an import of the same file
filled gives the same bytes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Any

from storage.backup import BackupReader, BackupRepository
from storage.backup.lines import (
    FORMAT,
    VERSION,
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
    SessionRecord,
    SummaryRecord,
    UserRecord,
    encode,
)
from storage.errors import NotFoundError
from storage.records import Document, Fact, FactChange, Turn, User

PAGE_SIZE = 500
Counter = Callable[[int], object]


def _ignore(_count: int) -> None:
    return None


class _Writer:
    """One export: counts the records it writes and reports each row to `on_rows`."""

    def __init__(
        self, reader: BackupReader, tenant_id: int, on_rows: Counter, page_size: int
    ) -> None:
        self.reader = reader
        self.tenant_id = tenant_id
        self.on_rows = on_rows
        self.page_size = page_size
        self.num_records = 0

    def line(self, record: Any, *, is_row: bool = True) -> bytes:
        self.num_records += 1
        if is_row:
            self.on_rows(1)
        return encode(record)

    async def user(self, user: User) -> AsyncIterator[bytes]:
        yield self.line(UserRecord(user.external_id, user.created_at))
        keys: dict[int, int] = {}
        async for facts in _pages(
            lambda after: self.reader.list_facts(user.id, after, self.page_size)
        ):
            for fact in facts:
                keys[fact.id] = len(keys) + 1
                yield self.line(_fact_record(keys[fact.id], fact))
        async for line in self._sessions(user):
            yield line
        async for line in self._messages(user, keys):
            yield line
        async for line in self._fact_history(user, keys):
            yield line
        async for line in self._summaries(user, keys):
            yield line
        watermark = await self.reader.get_watermark_key(user.id)
        if watermark is not None:
            yield self.line(FactsThroughRecord(watermark), is_row=False)
        async for line in self.documents(user):
            yield line

    async def _sessions(self, user: User) -> AsyncIterator[bytes]:
        after = None
        while sessions := await self.reader.list_sessions(user.id, after, self.page_size):
            for chat in sessions:
                record = SessionRecord(chat.id, chat.title, chat.metadata_json, chat.created_at)
                yield self.line(record)
            after = (sessions[-1].created_at, sessions[-1].id)

    async def _messages(self, user: User, facts: dict[int, int]) -> AsyncIterator[bytes]:
        async for turns in _pages(
            lambda after: self.reader.list_messages(user.id, after, self.page_size)
        ):
            named = {i for t in turns for i in t.context_note_ids or ()}
            keys = await self.reader.message_keys(user.id, named)
            for turn in turns:
                yield self.line(_message_record(turn, keys, facts))

    async def _fact_history(self, user: User, facts: dict[int, int]) -> AsyncIterator[bytes]:
        """The facts' sources (now that their messages are written), then their changes."""
        async for page in _pages(
            lambda after: self.reader.list_facts(user.id, after, self.page_size)
        ):
            sourced = [f for f in page if f.source_message_ids and f.id in facts]
            keys = await self.reader.message_keys(
                user.id, {i for f in sourced for i in f.source_message_ids}
            )
            for fact in sourced:
                record = FactSourcesRecord(facts[fact.id], _keys(fact.source_message_ids, keys))
                yield self.line(record, is_row=False)
        list_changes = self.reader.list_fact_changes
        async for changes in _pages(lambda after: list_changes(user.id, after, self.page_size)):
            named = {
                i
                for c in changes
                for snapshot in (c.before, c.after)
                for i in (snapshot or {}).get("source_message_ids") or ()
            }
            keys = await self.reader.message_keys(user.id, named)
            for change in changes:
                if change.fact_id in facts:  # else a fact added since its facts were read
                    yield self.line(_change_record(change, keys, facts))

    async def _summaries(self, user: User, facts: dict[int, int]) -> AsyncIterator[bytes]:
        after = None
        while summaries := await self.reader.list_summaries(user.id, after, self.page_size):
            for s in summaries:
                assert s.created_at is not None  # a stored version has its time
                pinned = None if s.pinned_fact_ids is None else _facts(s.pinned_fact_ids, facts)
                yield self.line(
                    SummaryRecord(
                        session_id=s.session_id,
                        version=s.version,
                        through_seq=s.through_seq,
                        pruned_seqs=list(s.pruned_seqs or ()),
                        pinned_facts=pinned,
                        text=s.text,
                        summarizer=s.summarizer,
                        token_count=s.token_count,
                        created_at=s.created_at,
                    )
                )
            after = (summaries[-1].session_id, summaries[-1].version)

    async def documents(self, owner: User | None) -> AsyncIterator[bytes]:
        """The user's own documents with their chunks; with no user, the tenant's shared."""
        user_pk = None if owner is None else owner.id
        after = None
        while found := await self.reader.list_documents(
            self.tenant_id, user_pk, after, self.page_size
        ):
            for document in found:
                yield self.line(_document_record(document, owner))
                ordinal = -1
                while chunks := await self.reader.list_chunks(document.id, ordinal, self.page_size):
                    for c in chunks:
                        record = ChunkRecord(
                            document.id, c.ordinal, c.text, c.token_count, c.heading_path
                        )
                        yield self.line(record)
                    ordinal = chunks[-1].ordinal
            after = (found[-1].created_at, found[-1].id)


async def _pages(
    read: Callable[[int], Any],
) -> AsyncIterator[Any]:
    """Pages of rows with an integer `id`, each read after the last id of the one before."""
    after = 0
    while page := await read(after):
        yield page
        after = page[-1].id


def _keys(ids: Iterable[int], keys: dict[int, MessageKey]) -> list[MessageKey]:
    """The keys of the messages; ids that name no message of the user are left out."""
    return [keys[i] for i in ids if i in keys]


def _facts(ids: Iterable[int], facts: dict[int, int]) -> list[int]:
    return [facts[i] for i in ids if i in facts]


def _fact_record(key: int, fact: Fact) -> FactRecord:
    return FactRecord(
        key=key,
        text=fact.text,
        category=fact.category,
        subject=fact.subject,
        value=fact.value,
        status=fact.status,
        is_pinned=fact.is_pinned,
        priority=fact.priority,
        valid_from=fact.valid_from,
        valid_to=fact.valid_to,
        created_at=fact.created_at,
        updated_at=fact.updated_at,
    )


def _message_record(
    turn: Turn, keys: dict[int, MessageKey], facts: dict[int, int]
) -> MessageRecord:
    shown = turn.context_note_ids
    shown_facts = turn.context_note_fact_ids
    return MessageRecord(
        session_id=turn.session_id,
        seq=turn.seq,
        role=turn.role,
        name=turn.name,
        content=turn.content,
        created_at=turn.created_at,
        external_id=turn.external_id,
        token_count=turn.token_count,
        image_caption=turn.image_caption,
        context_note=turn.context_note,
        context_note_tokens=turn.context_note_tokens,
        context_note_messages=None if shown is None else _keys(shown, keys),
        context_note_facts=None if shown_facts is None else _facts(shown_facts, facts),
    )


def _snapshot(
    snapshot: dict[str, Any] | None, keys: dict[int, MessageKey], facts: dict[int, int]
) -> dict[str, Any] | None:
    """A fact's snapshot with its ids as keys (every other entry as it is)."""
    if snapshot is None:
        return None
    found = dict(snapshot)
    if isinstance(found.get("source_message_ids"), list):
        found["source_message_ids"] = _keys(found["source_message_ids"], keys)
    if "superseded_by" in found:
        found["superseded_by"] = facts.get(found["superseded_by"])
    return found


def _change_record(
    change: FactChange, keys: dict[int, MessageKey], facts: dict[int, int]
) -> FactChangeRecord:
    return FactChangeRecord(
        facts[change.fact_id],
        change.action,
        change.actor,
        change.changed_at,
        _snapshot(change.before, keys, facts),
        _snapshot(change.after, keys, facts),
    )


def _document_record(document: Document, owner: User | None) -> DocumentRecord:
    return DocumentRecord(
        id=document.id,
        title=document.title,
        source=document.source,
        filename=document.filename,
        content_hash=document.content_hash,
        status=document.status,
        failure_reason=document.failure_reason,
        num_chars=document.num_chars,
        num_chunks=document.num_chunks,
        num_chunks_indexed=document.num_chunks_indexed,
        created_at=document.created_at,
        updated_at=document.updated_at,
        owner=None if owner is None else owner.external_id,
        metadata=document.metadata_json,
        content=document.content,
    )


async def export_lines(
    store: BackupRepository,
    tenant_id: int,
    tenant_name: str,
    user_id: str | None,
    *,
    on_total: Counter | None = None,
    on_rows: Counter = _ignore,
    page_size: int = PAGE_SIZE,
) -> AsyncGenerator[bytes]:
    """The export of one user of the tenant (None: of every user and the tenant's shared
    knowledge), line by line, the header naming the tenant `tenant_name`. `on_total`, if
    given, is told the number of rows first (counted for it only), `on_rows` each row as
    it is written; rows are read `page_size` at a time. Raises NotFoundError for an
    unknown user (at the first line)."""
    async with store.snapshot() as reader:
        only = None
        if user_id is not None:
            only = await reader.get_user_or_none(tenant_id, user_id)
            if only is None:
                raise NotFoundError("user", user_id)
        if on_total is not None:
            counts = await reader.count_rows(tenant_id, None if only is None else only.id)
            on_total(sum(counts.values()))
        writer = _Writer(reader, tenant_id, on_rows, page_size)
        yield encode(Header(FORMAT, VERSION, tenant_name, user_id))
        if only is not None:
            async for line in writer.user(only):
                yield line
        else:
            list_users = reader.list_users
            async for users in _pages(lambda after: list_users(tenant_id, after, page_size)):
                for user in users:
                    async for line in writer.user(user):
                        yield line
            async for line in writer.documents(None):
                yield line
        yield encode(EndRecord(writer.num_records))
