"""Request and response bodies. ORM rows never cross the HTTP boundary; these do."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

UserId = Annotated[str, Meta(min_length=1, max_length=255)]
Role = Literal["user", "assistant", "system"]
Kind = Literal["turn"]


class SessionCreate(Struct, forbid_unknown_fields=True):
    user_id: UserId
    title: Annotated[str, Meta(max_length=500)] | None = None
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


class Message(Struct):
    id: int
    session_id: str
    seq: int
    role: str
    name: str | None
    content: str
    created_at: dt.datetime
    external_id: str | None
    token_count: int


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


class SectionTokens(Struct):
    system: int
    memories: int
    recent: int
    new_message: int
    template: int


class ContextReport(Struct):
    memories: list[MemoryUsed]
    recent_message_ids: list[int]
    tokens: SectionTokens
    prompt_tokens: int
    context_window: int
    reply_tokens_reserved: int
    prefix_reuse: int | None


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
    name: Annotated[str, Meta(max_length=255)] | None = None
    created_at: dt.datetime | None = None
    external_id: Annotated[str, Meta(min_length=1, max_length=255)] | None = None
    # What an image shared with the turn shows: indexed for search, not shown in results.
    image_caption: Annotated[str, Meta(max_length=2000)] | None = None


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


class SearchResult(Struct):
    kind: str
    id: int
    session_id: str
    external_id: str | None
    role: str
    name: str | None
    text: str
    score: float
    created_at: dt.datetime


class SearchResponse(Struct):
    results: list[SearchResult]


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
