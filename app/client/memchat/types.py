"""The API's request and response bodies, as the client sends and reads them.

These are copies of the server's msgspec structs (`app/api/schemas.py`, whose response
structs extend the storage layer's records), field for field and with the same names,
so that this distribution installs without the server. `tests/test_client_types.py`
compares every struct here with the server's, both ways: a field added, dropped or
retyped on one side only fails it.

The server's limits (lengths, ranges, the user id pattern) are left out on purpose: the
server checks them and answers a 422 with the field and the rule, which the client
raises as `memchat.errors.InvalidRequestError`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal, TypedDict

from msgspec import Struct

Role = Literal["user", "assistant", "system"]
Kind = Literal["turn", "fact", "knowledge"]
FactCategory = Literal["identity", "constraint", "preference", "relationship", "plan", "other"]
FactStatus = Literal["active", "superseded", "deleted", "all"]

# Requests ---------------------------------------------------------------------------
# `omit_defaults`: a field left at its default is not sent, so the server's own default
# (a setting, for sampling) applies.


class SessionCreate(Struct, omit_defaults=True):
    user_id: str
    title: str | None = None
    metadata: dict[str, Any] = {}


class MessageCreate(Struct, omit_defaults=True):
    content: str
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    seed: int | None = None


class Sampling(TypedDict, total=False):
    """A chat turn's sampling, as keyword arguments; each left out is the server's
    setting."""

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop: list[str]
    seed: int


class HistoryMessage(Struct, omit_defaults=True):
    """One message of imported history; `external_id` makes a re-import skip it."""

    role: Role
    content: str
    name: str | None = None
    created_at: dt.datetime | None = None
    external_id: str | None = None
    image_caption: str | None = None


class HistoryImport(Struct):
    messages: list[HistoryMessage]


class SearchRequest(Struct, omit_defaults=True):
    user_id: str
    query: str
    k: int = 10
    session_id: str | None = None
    kinds: list[Kind] | None = None


class ContextRequest(Struct, omit_defaults=True):
    content: str
    max_tokens: int | None = None


class FactCreate(Struct, omit_defaults=True):
    text: str
    category: FactCategory | None = None
    subject: str | None = None
    pinned: bool | None = None
    priority: int | None = None


class FactFields(TypedDict, total=False):
    """A new fact's optional fields, as keyword arguments."""

    category: FactCategory
    subject: str
    pinned: bool
    priority: int


class FactChanges(TypedDict, total=False):
    """What a fact update changes, as keyword arguments."""

    text: str
    pinned: bool
    priority: int


class FactUpdate(Struct, omit_defaults=True):
    text: str | None = None
    pinned: bool | None = None
    priority: int | None = None


class KnowledgeCreate(Struct, omit_defaults=True):
    title: str
    text: str
    user_id: str | None = None
    metadata: dict[str, Any] = {}


# Responses --------------------------------------------------------------------------


class Session(Struct, frozen=True):
    id: str
    user_id: str
    title: str | None
    metadata: dict[str, Any]
    created_at: dt.datetime
    num_messages: int


class SessionList(Struct, frozen=True):
    sessions: list[Session]


class Message(Struct, frozen=True, kw_only=True):
    """A stored message; `seq` is its place in the session (1, 2, ...)."""

    id: int
    session_id: str
    seq: int
    role: Role
    name: str | None
    content: str
    created_at: dt.datetime
    external_id: str | None
    token_count: int


class MessageList(Struct, frozen=True):
    messages: list[Message]


class MemoryUsed(Struct, frozen=True):
    """A past turn a chat turn's prompt showed, with its score; `excerpt` is what the
    prompt quoted of a long turn cut to its matching sentences (None: shown whole)."""

    kind: str
    id: int
    session_id: str
    role: str
    name: str | None
    text: str
    score: float
    created_at: dt.datetime
    excerpt: str | None = None


class KnowledgeResult(Struct, frozen=True, tag_field="kind", tag="knowledge"):
    """A chunk of a knowledge document (`id` is the chunk's)."""

    id: int
    document_id: str
    title: str
    heading_path: str
    text: str
    score: float

    @property
    def kind(self) -> Literal["knowledge"]:
        """The result's kind, as the API spells it in `kind`."""
        return "knowledge"


class PinnedFactUsed(Struct, frozen=True):
    id: int
    text: str
    category: str
    priority: int
    valid_from: dt.datetime


class SectionTokens(Struct, frozen=True):
    """Prompt tokens per section; they add up to the whole prompt."""

    system: int
    facts: int
    summary: int
    memories: int
    recent: int
    new_message: int
    template: int
    knowledge: int = 0


class ContextReport(Struct, frozen=True):
    """What a turn's prompt was built from, and its tokens per section."""

    pinned_facts: list[PinnedFactUsed]
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


class Usage(Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_prompt_tokens: int | None


class Turn(Struct, frozen=True):
    """A chat turn: the stored message and reply, and what the prompt held."""

    message: Message
    reply: Message
    finish_reason: str
    context: ContextReport
    usage: Usage


class Token(Struct, frozen=True):
    """A piece of a streamed reply (a `token` event)."""

    text: str


class HistoryImported(Struct, frozen=True):
    imported: int
    skipped: int


class SearchResult(Struct, frozen=True, tag_field="kind", tag="turn"):
    """A past turn found by a search."""

    id: int
    session_id: str
    external_id: str | None
    role: str
    name: str | None
    text: str
    score: float
    created_at: dt.datetime

    @property
    def kind(self) -> Literal["turn"]:
        """The result's kind, as the API spells it in `kind`."""
        return "turn"


class FactResult(Struct, frozen=True, tag_field="kind", tag="fact"):
    """A key fact found by a search (`created_at`: when it became valid)."""

    id: int
    text: str
    category: str
    score: float
    created_at: dt.datetime
    source_message_ids: list[int]

    @property
    def kind(self) -> Literal["fact"]:
        """The result's kind, as the API spells it in `kind`."""
        return "fact"


Memory = SearchResult | FactResult | KnowledgeResult


class SearchResponse(Struct, frozen=True):
    results: list[SearchResult | FactResult | KnowledgeResult]


class PromptMessage(Struct, frozen=True):
    role: str
    content: str


class ContextPreview(Struct, frozen=True):
    messages: list[PromptMessage]
    context: ContextReport


class FieldError(Struct, frozen=True):
    field: str
    message: str


class ProblemDetails(Struct, frozen=True):
    """RFC 9457 problem details: the body of every error answer."""

    type: str
    title: str
    status: int
    detail: str
    instance: str
    errors: list[FieldError] = []


class FactChange(Struct, frozen=True):
    action: str
    actor: str
    changed_at: dt.datetime
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class Fact(Struct, frozen=True, kw_only=True):
    id: int
    user_id: str
    text: str
    category: str
    subject: str | None
    value: str | None
    status: str
    priority: int
    pinned: bool
    valid_from: dt.datetime
    valid_to: dt.datetime | None
    source_message_ids: list[int]
    created_at: dt.datetime
    updated_at: dt.datetime
    history: list[FactChange] | None = None


class FactList(Struct, frozen=True):
    facts: list[Fact]


class Summary(Struct, frozen=True):
    version: int
    through_seq: int
    pruned_seqs: list[int]
    text: str
    summarizer: str
    token_count: int
    created_at: dt.datetime


class SummaryList(Struct, frozen=True):
    summaries: list[Summary]


class KnowledgeDocument(Struct, frozen=True, kw_only=True):
    """A knowledge document; `num_chunks_indexed` of `num_chunks` shows its progress."""

    id: str
    user_id: str | None
    title: str
    source: str
    filename: str | None
    content_hash: str
    status: Literal["processing", "ready", "failed"]
    failure_reason: str | None
    num_chars: int
    num_chunks: int
    num_chunks_indexed: int
    metadata: dict[str, Any]
    created_at: dt.datetime
    updated_at: dt.datetime


class KnowledgeDocumentList(Struct, frozen=True):
    documents: list[KnowledgeDocument]
