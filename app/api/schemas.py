"""Request and response bodies. ORM rows never cross the HTTP boundary; these do."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from retrieval.prompt.report import SectionTokens
from retrieval.text import INVISIBLE, WHITESPACE
from storage.records import DocumentFields, FactFields, StoredMessage

# A user id is addressable in a path: no "/", no control (C0 or C1) or invisible
# characters, no space at either end, not blank. Whitespace is spelled out rather than
# `\s`, which means other characters in Python (U+0085, U+001C-U+001F) than in the
# JSON Schema (ECMA-262) reading of the documented pattern. Python's `$` (msgspec
# matches patterns with `re.search`) also matches before a final newline, and `\Z` is
# not ECMA-262: `$(?!\n)` ends the text in both readings, so "alice\n" is refused.
_ID_CHAR = f"[^/\\x00-\\x1f\\x7f-\\x9f{INVISIBLE}]"
_ID_EDGE = f"[^{WHITESPACE}/\\x00-\\x1f\\x7f-\\x9f{INVISIBLE}]"
USER_ID_PATTERN = f"^{_ID_EDGE}(?:{_ID_CHAR}*{_ID_EDGE})?$(?!\\n)"
# Lengths of client strings, in characters (`memchat import` holds records to them too).
MAX_ID_CHARS = 255
MAX_NAME_CHARS = 255
MAX_TITLE_CHARS = 500
MAX_CAPTION_CHARS = 2000
UserId = Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS, pattern=USER_ID_PATTERN)]
Role = Literal["user", "assistant", "system"]
Kind = Literal["turn", "fact", "knowledge"]
FactCategory = Literal["identity", "constraint", "preference", "relationship", "plan", "other"]
FactText = Annotated[str, Meta(min_length=1, max_length=2000)]


class SessionCreate(Struct, forbid_unknown_fields=True):
    user_id: UserId
    title: Annotated[str, Meta(max_length=MAX_TITLE_CHARS)] | None = None
    metadata: dict[str, Any] = {}


class Session(Struct):
    id: str
    user_id: str
    title: str | None
    metadata: dict[str, Any]
    created_at: dt.datetime
    num_messages: int


class SessionList(Struct):
    sessions: list[Session]


class MessageCreate(Struct, forbid_unknown_fields=True):
    content: str
    stream: bool = False
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    stop: Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(max_length=8)] | None = None
    seed: Annotated[int, Meta(ge=0, le=2**32 - 1)] | None = None


class Message(StoredMessage, frozen=True, kw_only=True):
    """A stored message (its fields: `storage.records.StoredMessage`) and its id."""

    id: int


class MessageList(Struct):
    messages: list[Message]


class MemoryUsed(Struct):
    kind: str
    id: int
    session_id: str
    role: str
    name: str | None
    text: str
    score: float
    created_at: dt.datetime
    # What the prompt quoted of a long turn: its sentences that match the message, cuts
    # marked with `…`; null when the whole text was shown.
    excerpt: str | None = None


class KnowledgeResult(Struct, tag_field="kind", tag="knowledge"):
    """A chunk of a knowledge-base document (`id` is the chunk's): in a turn's context,
    shown under its document's title, and among search results."""

    id: int
    document_id: str
    title: str
    heading_path: str
    text: str
    score: float


class PinnedFactUsed(Struct):
    id: int
    text: str
    category: str
    priority: int
    valid_from: dt.datetime


class ContextReport(Struct):
    pinned_facts: list[PinnedFactUsed]
    # Of those, the ones pinned since the window's last compaction, shown in this turn's
    # own context (the system message keeps its facts until the next compaction).
    new_facts: list[PinnedFactUsed]
    facts_omitted: list[int]
    memories: list[MemoryUsed]
    recent_message_ids: list[int]
    tokens: SectionTokens
    prompt_tokens: int
    context_window: int
    reply_tokens_reserved: int
    prefix_reuse: int | None
    summary_version: int
    summary_through_seq: int
    pruned_message_ids: list[int]
    knowledge: list[KnowledgeResult]


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_prompt_tokens: int | None


class Turn(Struct):
    message: Message
    reply: Message
    finish_reason: str
    context: ContextReport
    usage: Usage


class HistoryMessage(Struct, forbid_unknown_fields=True):
    role: Role
    content: str
    name: Annotated[str, Meta(max_length=MAX_NAME_CHARS)] | None = None
    created_at: dt.datetime | None = None
    external_id: Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)] | None = None
    # What an image shared with the turn shows: indexed for search, not shown in results.
    image_caption: Annotated[str, Meta(max_length=MAX_CAPTION_CHARS)] | None = None


class HistoryImport(Struct, forbid_unknown_fields=True):
    messages: list[HistoryMessage]


class HistoryImported(Struct):
    imported: int
    skipped: int


class SearchRequest(Struct, forbid_unknown_fields=True):
    user_id: UserId
    query: str
    k: Annotated[int, Meta(ge=1, le=100)] = 10
    session_id: str | None = None
    kinds: list[Kind] | None = None


class SearchResult(Struct, tag_field="kind", tag="turn"):
    """A past turn."""

    id: int
    session_id: str
    external_id: str | None
    role: str
    name: str | None
    text: str
    score: float
    created_at: dt.datetime


class FactResult(Struct, tag_field="kind", tag="fact"):
    """A key fact (`created_at` is when it became valid), with the turns it came from."""

    id: int
    text: str
    category: str
    score: float
    created_at: dt.datetime
    source_message_ids: list[int]


class SearchResponse(Struct):
    results: list[SearchResult | FactResult | KnowledgeResult]


class ContextRequest(Struct, forbid_unknown_fields=True):
    content: str
    max_tokens: Annotated[int, Meta(ge=1)] | None = None


class PromptMessage(Struct):
    role: str
    content: str


class ContextPreview(Struct):
    messages: list[PromptMessage]
    context: ContextReport


class Health(Struct):
    status: str
    checks: dict[str, str] = {}


class FieldError(Struct):
    field: str
    message: str


class ProblemDetails(Struct, omit_defaults=True):
    """RFC 9457 problem details: every error answer has this body."""

    type: str
    title: str
    status: int
    detail: str
    instance: str
    errors: list[FieldError] = []


class FactChange(Struct):
    action: str
    actor: str
    changed_at: dt.datetime
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class Fact(FactFields, frozen=True, kw_only=True):
    """A fact (its fields: `storage.records.FactFields`), its user and, when asked for,
    its history."""

    id: int
    user_id: str
    pinned: bool
    history: list[FactChange] | None = None


class FactList(Struct):
    facts: list[Fact]


class FactCreate(Struct, forbid_unknown_fields=True):
    text: FactText
    category: FactCategory | None = None
    subject: Annotated[str, Meta(min_length=1, max_length=255)] | None = None
    pinned: bool | None = None
    priority: Annotated[int, Meta(ge=-1000, le=1000)] | None = None


class FactUpdate(Struct, forbid_unknown_fields=True):
    text: FactText | None = None
    pinned: bool | None = None
    priority: Annotated[int, Meta(ge=-1000, le=1000)] | None = None


class Summary(Struct):
    version: int
    through_seq: int
    pruned_seqs: list[int]
    text: str
    summarizer: str
    token_count: int
    created_at: dt.datetime


class SummaryList(Struct):
    summaries: list[Summary]


class KnowledgeCreate(Struct, forbid_unknown_fields=True):
    title: Annotated[str, Meta(min_length=1, max_length=500)]
    text: str
    user_id: UserId | None = None
    metadata: dict[str, Any] = {}


class KnowledgeDocument(DocumentFields, frozen=True, kw_only=True):
    """A document (its fields: `storage.records.DocumentFields`); `num_chunks_indexed`
    of `num_chunks` shows the progress of processing."""

    user_id: str | None
    metadata: dict[str, Any]


class KnowledgeDocumentList(Struct):
    documents: list[KnowledgeDocument]
