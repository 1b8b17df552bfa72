"""SQLAlchemy models. The schema itself is created only by the Alembic migrations."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# Stable constraint names keep Alembic diffs identical on SQLite and PostgreSQL.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments INTEGER PRIMARY KEY, so big ids are plain integers there.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UtcDateTime(TypeDecorator[dt.datetime]):
    """An instant, stored in UTC and read back in UTC on every backend.

    SQLite keeps no zone: a value written with its offset would be read back as if it
    were UTC (`+05:00` losing five hours). Values are converted to UTC before they are
    bound, so both databases keep the instant; a naive value is taken as UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


DEFAULT_TENANT_ID = 1


class Tenant(Base):
    """An isolated customer of the service: its users and their data are invisible to others.

    The migrations create tenant 1, `default`: every request of local mode (no API keys)
    runs in it, and data stored before tenants existed belongs to it.
    """

    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)


class ApiKey(Base):
    """An API key of a tenant. Only the SHA-256 of the secret is stored (the secret is
    random, 256 bits, so a fast hash is enough); `prefix` identifies it in listings."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(255))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    # None: the service's default (MEMCHAT_ACCESS__REQUESTS_PER_MINUTE).
    requests_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime(), nullable=True)


class AuditEntry(Base):
    """One change made through the admin API: who (the key), what, on what, when."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)
    actor: Mapped[str] = mapped_column(String(300))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(300))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class AdminSession(Base):
    """A signed-in browser of the admin page. The cookie holds a random token, never the
    key; only the token's SHA-256 is stored. A session ends at `expires_at`, at sign-out,
    or when its key is revoked."""

    __tablename__ = "admin_sessions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("api_keys.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)
    expires_at: Mapped[dt.datetime] = mapped_column(UtcDateTime())


class ReadinessProbe(Base):
    """One row that `/readyz` rewrites: a database that cannot take a write (a full disk,
    a read-only replica) is not ready, though it still answers reads."""

    __tablename__ = "readiness_probe"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    checked_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)


class User(Base):
    """A user of the client application, known by the client's own id string, which is
    unique within its tenant (two tenants may both have a user `alice`)."""

    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("tenant_id", "external_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(
        BigId,
        ForeignKey("tenants.id", ondelete="CASCADE"),
        default=DEFAULT_TENANT_ID,
        server_default=str(DEFAULT_TENANT_ID),
    )
    external_id: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)
    # Key facts are extracted from this user's messages up to this id (see FactWorker).
    facts_through_message_id: Mapped[int] = mapped_column(BigId, default=0, server_default="0")
    # Counts the changes of this user's stored vectors (turns indexed or deleted), in the
    # transactions that make them: a process whose derived indexes of the user saw an
    # older count catches them up from SQL before it searches (storage/embeddings.py).
    memory_version: Mapped[int] = mapped_column(BigId, default=0, server_default="0")


class ChatSession(Base):
    """One conversation of one user."""

    __tablename__ = "chat_sessions"
    # A user's sessions in their listed order (oldest first, ties by id): a page of them
    # is read from its start without sorting the rest; it also serves lookups by user.
    __table_args__ = (
        Index("ix_chat_sessions_user_pk_created_at_id", "user_pk", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    user_pk: Mapped[int] = mapped_column(BigId, ForeignKey("users.id", ondelete="CASCADE"))
    title: Mapped[str | None] = mapped_column(String(500), nullable=True)
    metadata_json: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)


class Message(Base):
    """One chat turn. `seq` orders the turns of a session; `id` is the vector-index key."""

    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("session_id", "seq"),
        Index("ix_messages_user_pk_id", "user_pk", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("chat_sessions.id", ondelete="CASCADE")
    )
    # Denormalised so that memory search is scoped to a user without a join.
    user_pk: Mapped[int] = mapped_column(BigId, ForeignKey("users.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)
    external_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    token_count: Mapped[int] = mapped_column(Integer, default=0)
    # The per-turn context a user message was sent with (retrieved memories, knowledge),
    # exactly as sent, so later prompts re-insert it and extend the previous prompt.
    context_note: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    context_note_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Ids of the past turns shown in that note: not retrieved again while it is in view.
    context_note_ids: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    context_note_fact_ids: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    # What an image shared with the turn shows (from the client); indexed, not returned.
    image_caption: Mapped[str | None] = mapped_column(Text, nullable=True)
    # A reply's report of its turn (what its prompt held, how its memories scored, where
    # it spent its time): ids and numbers, no text. Deferred: only the inspector reads it.
    turn_report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True, deferred=True)


class MessageEmbedding(Base):
    """A vector of a message, with the model that made it (one per model: MiniLM's and the
    multilingual model's): vector indexes rebuild from here."""

    __tablename__ = "message_embeddings"

    message_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("messages.id", ondelete="CASCADE"), primary_key=True
    )
    user_pk: Mapped[int] = mapped_column(
        BigId, ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    dimension: Mapped[int] = mapped_column(Integer)
    vector: Mapped[bytes] = mapped_column(LargeBinary)


class Fact(Base):
    """A key fact about a user. Facts are never overwritten silently: every change
    leaves a FactChange row, and a superseded fact keeps its row with `valid_to` set.

    `subject` groups facts that exclude each other (one `home` at a time); a new active
    fact with the subject of an active one supersedes it.
    """

    __tablename__ = "facts"
    __table_args__ = (Index("ix_facts_user_pk_status", "user_pk", "status"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    user_pk: Mapped[int] = mapped_column(BigId, ForeignKey("users.id", ondelete="CASCADE"))
    text: Mapped[str] = mapped_column(Text)
    category: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str | None] = mapped_column(String(255), nullable=True)
    value: Mapped[str | None] = mapped_column(Text, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="active")
    is_pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    valid_from: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)
    valid_to: Mapped[dt.datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    source_message_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)
    # The fact's text embedded for search, with the model that made it.
    model: Mapped[str | None] = mapped_column(String(255), nullable=True)
    vector: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


class FactEmbedding(Base):
    """A fact's text embedded by a model other than the one whose vector the fact row
    holds (the second dense list's): derived, made again when missing; a change of the
    fact's text drops it."""

    __tablename__ = "fact_embeddings"

    fact_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("facts.id", ondelete="CASCADE"), primary_key=True
    )
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    vector: Mapped[bytes] = mapped_column(LargeBinary)


class FactChange(Base):
    """One change of a fact: who or what made it, when, and the fields before and after."""

    __tablename__ = "fact_changes"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    fact_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("facts.id", ondelete="CASCADE"), index=True
    )
    action: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(64))
    changed_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class SessionSummary(Base):
    """One version of a session's rolling summary and window state.

    The recent window of the session is its messages after `through_seq`, less the
    `pruned_seqs` (small talk dropped from the window); the summary text covers the
    messages up to `through_seq`, which stay stored and retrievable. The newest version
    is current; older ones are kept as history.
    """

    __tablename__ = "session_summaries"
    __table_args__ = (UniqueConstraint("session_id", "version"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("chat_sessions.id", ondelete="CASCADE")
    )
    version: Mapped[int] = mapped_column(Integer)
    through_seq: Mapped[int] = mapped_column(Integer)
    pruned_seqs: Mapped[list[int]] = mapped_column(JSON, default=list)
    # The pinned facts the system message carries from this version on; facts pinned
    # later are shown in the turns' own context until the next version.
    pinned_fact_ids: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    text: Mapped[str] = mapped_column(Text)
    summarizer: Mapped[str] = mapped_column(String(64))
    token_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)


class KnowledgeDocument(Base):
    """A document of the knowledge base: shared by a tenant's users (no user) or one user's own.

    `scope` is "tenant:<tenant id>" or "user:<user pk>": with `content_hash` it makes
    re-uploads of the same text in the same scope find the stored document instead of
    adding a copy. The full text is kept so that processing interrupted by a restart can
    resume from SQL alone.
    """

    __tablename__ = "knowledge_documents"
    __table_args__ = (UniqueConstraint("scope", "content_hash"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(
        BigId,
        ForeignKey("tenants.id", ondelete="CASCADE"),
        default=DEFAULT_TENANT_ID,
        server_default=str(DEFAULT_TENANT_ID),
        index=True,
    )
    user_pk: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("users.id", ondelete="CASCADE"), nullable=True, index=True
    )
    scope: Mapped[str] = mapped_column(String(64))
    title: Mapped[str] = mapped_column(String(500))
    metadata_json: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    source: Mapped[str] = mapped_column(String(16))
    filename: Mapped[str | None] = mapped_column(String(255), nullable=True)
    content: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    failure_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    num_chars: Mapped[int] = mapped_column(Integer)
    num_chunks: Mapped[int] = mapped_column(Integer, default=0)
    num_chunks_indexed: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), default=utc_now)


class KnowledgeChunk(Base):
    """One passage of a document, in order; `id` is its key in the vector index."""

    __tablename__ = "knowledge_chunks"
    __table_args__ = (UniqueConstraint("document_id", "ordinal"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    document_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("knowledge_documents.id", ondelete="CASCADE")
    )
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    token_count: Mapped[int] = mapped_column(Integer)
    heading_path: Mapped[str] = mapped_column(String(1000), default="")
