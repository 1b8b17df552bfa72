"""Bodies of the admin API (`/admin/v1`): operators see across tenants, by internal ids."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from msgspec import Meta, Struct

from app.api import schemas
from retrieval.chat.turn_report import TurnReport
from storage.records import AuditEntry


class Tenant(Struct):
    id: int
    name: str
    num_users: int
    num_active_keys: int


class TenantList(Struct):
    tenants: list[Tenant]


class User(Struct):
    id: Annotated[int, Meta(description="internal id: the admin API addresses users by it")]
    tenant: str
    user_id: Annotated[str, Meta(description="the client's own id, unique within the tenant")]
    created_at: dt.datetime
    num_sessions: int
    num_messages: int
    num_active_facts: int
    num_documents: int


class UserList(Struct):
    users: list[User]
    next_after: Annotated[
        int | None,
        Meta(description="where a list cut at `limit` goes on (as `after`); null at the end"),
    ] = None


class UserDetail(Struct):
    user: User
    sessions: list[schemas.Session]
    num_vectors: Annotated[int, Meta(description="turn vectors in the loaded index scope")]


class AdminMessage(Struct):
    message: schemas.Message
    context_note: Annotated[
        list[str],
        Meta(description="the retrieved context this turn was sent with, as sent"),
    ]
    memory_ids: Annotated[list[int], Meta(description="past turns shown to this turn")]
    fact_ids: Annotated[list[int], Meta(description="facts shown to this turn")]


class AdminMessageList(Struct):
    messages: list[AdminMessage]


class AdminTurn(Struct):
    """A stored turn with the report its reply keeps (what the admin page's inspector
    draws): ids, token counts, scores and timings, as stored when the turn ended."""

    message: schemas.Message
    reply: schemas.Message
    report: TurnReport


class SessionSummaries(Struct):
    session_id: str
    summaries: list[schemas.Summary]


class UserSummaries(Struct):
    sessions: list[SessionSummaries]


class AdminSearch(Struct, forbid_unknown_fields=True):
    query: str
    k: Annotated[int, Meta(ge=1, le=100)] = 10
    kinds: list[schemas.Kind] | None = None


class Erased(Struct):
    user_id: str
    tenant_id: int
    removed: Annotated[dict[str, int], Meta(description="rows removed, per table")]
    vectors_removed: Annotated[
        list[str], Meta(description="the vector scopes dropped (turns, own knowledge)")
    ]


class Reindexed(Struct):
    num_turns: int
    num_chunks: int


class Statistics(Struct):
    rows: dict[str, int]
    database_bytes: int | None
    index_kind: str
    index_bytes: Annotated[int | None, Meta(description="FAISS files on disk")]
    embedder: str
    engine: str
    second_embedder: Annotated[
        str | None, Meta(description="the second dense list's model (multilingual)")
    ] = None
    second_index: Annotated[
        str | None,
        Meta(description="whether every turn holds the second list's vector, else how many do"),
    ] = None


class AuditLog(Struct):
    entries: list[AuditEntry]
