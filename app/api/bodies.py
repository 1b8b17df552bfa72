"""Conversions from the retrieval layer's records to response bodies. Where a body's
fields carry the record's names, msgspec converts by attribute (`_from`); the rest is
spelled out once, here."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from app.api import admin_schemas as body
from app.api import schemas
from retrieval.chat.events import TurnResult
from retrieval.facts.memory import FactHit
from retrieval.knowledge.base import KnowledgeHit
from retrieval.prompt.report import ContextReport
from retrieval.protocols import Completion
from retrieval.turns import SearchHit
from storage.admin import ErasedUser, UserCounts
from storage.knowledge import scope_of
from storage.records import (
    Document,
    Fact,
    FactChange,
    Session,
    Summary,
    Turn,
    User,
    field_names,
)

S = TypeVar("S", bound=msgspec.Struct)


def _from(value: object, struct: type[S], **fields: Any) -> S:
    """`struct` from the attributes of `value`, with `fields` given or renamed."""
    if not fields:
        return msgspec.convert(value, struct, from_attributes=True)
    names = field_names(struct)
    found = {name: getattr(value, name) for name in names if hasattr(value, name)}
    return msgspec.convert({**found, **fields}, struct)


def session_body(chat: Session, user: User, num_messages: int) -> schemas.Session:
    return _from(
        chat,
        schemas.Session,
        user_id=user.external_id,
        metadata=chat.metadata_json or {},
        num_messages=num_messages,
    )


def message_body(turn: Turn) -> schemas.Message:
    return _from(turn, schemas.Message)


def report_body(report: ContextReport) -> schemas.ContextReport:
    return _from(
        report,
        schemas.ContextReport,
        pinned_facts=[_from(f, schemas.PinnedFactUsed) for f in report.pinned_facts],
        new_facts=[_from(f, schemas.PinnedFactUsed) for f in report.new_facts],
        memories=[_memory(hit) for hit in report.memories],
        tokens=report.sections,
        knowledge=[_knowledge(hit, schemas.KnowledgeResult) for hit in report.knowledge],
    )


def _memory(hit: SearchHit) -> schemas.MemoryUsed:
    return _from(
        hit.turn,
        schemas.MemoryUsed,
        kind="turn",
        text=hit.turn.content,
        score=round(hit.score, 6),
        excerpt=hit.excerpt,
    )


def _knowledge(hit: KnowledgeHit, struct: type[S], **extra: Any) -> S:
    return _from(hit.chunk, struct, score=round(hit.score, 6), **extra)


def usage_body(completion: Completion) -> schemas.Usage:
    return _from(
        completion,
        schemas.Usage,
        total_tokens=completion.prompt_tokens + completion.completion_tokens,
    )


def turn_body(result: TurnResult) -> schemas.Turn:
    return schemas.Turn(
        message=message_body(result.message),
        reply=message_body(result.reply),
        finish_reason=result.completion.finish_reason,
        context=report_body(result.context),
        usage=usage_body(result.completion),
    )


def fact_body(fact: Fact, user_id: str, history: list[FactChange] | None = None) -> schemas.Fact:
    return _from(
        fact,
        schemas.Fact,
        user_id=user_id,
        pinned=fact.is_pinned,
        history=None if history is None else [_from(c, schemas.FactChange) for c in history],
    )


def document_body(document: Document, user_id: str | None) -> schemas.KnowledgeDocument:
    return _from(
        document,
        schemas.KnowledgeDocument,
        user_id=user_id,
        metadata=document.metadata_json or {},
        content_hash=f"sha256:{document.content_hash}",
    )


def search_result_body(
    hit: SearchHit | FactHit | KnowledgeHit,
) -> schemas.SearchResult | schemas.FactResult | schemas.KnowledgeResult:
    if isinstance(hit, FactHit):
        return _from(
            hit.fact,
            schemas.FactResult,
            score=round(hit.score, 6),
            created_at=hit.fact.valid_from,
        )
    if isinstance(hit, KnowledgeHit):
        return _knowledge(hit, schemas.KnowledgeResult)
    return _from(hit.turn, schemas.SearchResult, text=hit.turn.content, score=round(hit.score, 6))


def summary_body(summary: Summary) -> schemas.Summary:
    return _from(summary, schemas.Summary, pruned_seqs=list(summary.pruned_seqs or ()))


def user_body(counts: UserCounts) -> body.User:
    return _from(
        counts.user,
        body.User,
        tenant=counts.tenant_name,
        user_id=counts.user.external_id,
        num_sessions=counts.num_sessions,
        num_messages=counts.num_messages,
        num_active_facts=counts.num_facts,
        num_documents=counts.num_documents,
    )


def admin_message_body(turn: Turn) -> body.AdminMessage:
    return body.AdminMessage(
        message=message_body(turn),
        context_note=list(turn.context_note or []),
        memory_ids=list(turn.context_note_ids or []),
        fact_ids=list(turn.context_note_fact_ids or []),
    )


def erased_body(erased: ErasedUser) -> body.Erased:
    return body.Erased(
        user_id=erased.external_id,
        tenant_id=erased.tenant_id,
        removed=erased.removed(),
        vectors_removed=[
            f"turns scope {erased.user_pk}",
            f"knowledge scope {scope_of(erased.tenant_id, erased.user_pk)}",
        ],
    )
