"""Conversions from retrieval-layer dataclasses to response bodies."""

from __future__ import annotations

from app.api import admin_schemas as body
from app.api import schemas
from retrieval.chat.events import TurnResult
from retrieval.facts.memory import FactHit, PinnedFact
from retrieval.knowledge.base import KnowledgeHit
from retrieval.prompt.report import ContextReport
from retrieval.protocols import Completion
from retrieval.timeutil import as_utc
from retrieval.turns import SearchHit, StoredTurn
from storage.admin import ErasedUser, UserCounts
from storage.knowledge import scope_of
from storage.models import (
    ChatSession,
    Fact,
    FactChange,
    KnowledgeDocument,
    Message,
    SessionSummary,
    User,
)


def session_body(chat: ChatSession, user: User, num_messages: int) -> schemas.Session:
    return schemas.Session(
        id=chat.id,
        user_id=user.external_id,
        title=chat.title,
        metadata=chat.metadata_json or {},
        created_at=as_utc(chat.created_at),
        num_messages=num_messages,
    )


def message_body(turn: StoredTurn) -> schemas.Message:
    return schemas.Message(
        id=turn.id,
        session_id=turn.session_id,
        seq=turn.seq,
        role=turn.role,
        name=turn.name,
        content=turn.content,
        created_at=turn.created_at,
        external_id=turn.external_id,
        token_count=turn.token_count,
    )


def pinned_fact_body(fact: PinnedFact) -> schemas.PinnedFactUsed:
    return schemas.PinnedFactUsed(
        id=fact.id,
        text=fact.text,
        category=fact.category,
        priority=fact.priority,
        valid_from=fact.valid_from,
    )


def report_body(report: ContextReport) -> schemas.ContextReport:
    return schemas.ContextReport(
        pinned_facts=[pinned_fact_body(f) for f in report.pinned_facts],
        new_facts=[pinned_fact_body(f) for f in report.new_facts],
        facts_omitted=list(report.facts_omitted),
        memories=[
            schemas.MemoryUsed(
                kind="turn",
                id=m.message_id,
                session_id=m.session_id,
                role=m.role,
                name=m.name,
                text=m.text,
                score=round(m.score, 6),
                created_at=m.created_at,
            )
            for m in report.memories
        ],
        recent_message_ids=list(report.recent_message_ids),
        tokens=schemas.SectionTokens(
            system=report.sections.system,
            facts=report.sections.facts,
            summary=report.sections.summary,
            memories=report.sections.memories,
            recent=report.sections.recent,
            new_message=report.sections.new_message,
            template=report.sections.template,
            knowledge=report.sections.knowledge,
        ),
        prompt_tokens=report.prompt_tokens,
        context_window=report.context_window,
        reply_tokens_reserved=report.reply_tokens_reserved,
        prefix_reuse=report.prefix_reuse,
        summary_version=report.summary_version,
        summary_through_seq=report.summary_through_seq,
        pruned_message_ids=list(report.pruned_message_ids),
        knowledge=[
            schemas.KnowledgeUsed(
                kind="knowledge",
                id=k.chunk_id,
                document_id=k.document_id,
                title=k.title,
                heading_path=k.heading_path,
                text=k.text,
                score=round(k.score, 6),
            )
            for k in report.knowledge
        ],
    )


def usage_body(completion: Completion) -> schemas.Usage:
    return schemas.Usage(
        prompt_tokens=completion.prompt_tokens,
        completion_tokens=completion.completion_tokens,
        total_tokens=completion.prompt_tokens + completion.completion_tokens,
        cached_prompt_tokens=completion.cached_prompt_tokens,
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
    return schemas.Fact(
        id=fact.id,
        user_id=user_id,
        text=fact.text,
        category=fact.category,
        subject=fact.subject,
        value=fact.value,
        status=fact.status,
        pinned=fact.is_pinned,
        priority=fact.priority,
        valid_from=as_utc(fact.valid_from),
        valid_to=as_utc(fact.valid_to) if fact.valid_to else None,
        source_message_ids=list(fact.source_message_ids),
        created_at=as_utc(fact.created_at),
        updated_at=as_utc(fact.updated_at),
        history=None
        if history is None
        else [
            schemas.FactChange(
                action=c.action,
                actor=c.actor,
                changed_at=as_utc(c.changed_at),
                before=c.before,
                after=c.after,
            )
            for c in history
        ],
    )


def document_body(document: KnowledgeDocument, user_id: str | None) -> schemas.KnowledgeDocument:
    return schemas.KnowledgeDocument(
        id=document.id,
        user_id=user_id,
        title=document.title,
        metadata=document.metadata_json or {},
        source=document.source,
        filename=document.filename,
        content_hash=f"sha256:{document.content_hash}",
        status=document.status,  # type: ignore[arg-type]
        failure_reason=document.failure_reason,
        num_chars=document.num_chars,
        num_chunks=document.num_chunks,
        num_chunks_indexed=document.num_chunks_indexed,
        created_at=as_utc(document.created_at),
        updated_at=as_utc(document.updated_at),
    )


def search_result_body(
    hit: SearchHit | FactHit | KnowledgeHit,
) -> schemas.SearchResult | schemas.FactResult | schemas.KnowledgeResult:
    if isinstance(hit, FactHit):
        return schemas.FactResult(
            id=hit.fact.id,
            text=hit.fact.text,
            category=hit.fact.category,
            score=round(hit.score, 6),
            created_at=as_utc(hit.fact.valid_from),
            source_message_ids=list(hit.fact.source_message_ids),
        )
    if isinstance(hit, KnowledgeHit):
        return schemas.KnowledgeResult(
            id=hit.chunk.id,
            document_id=hit.chunk.document_id,
            title=hit.chunk.title,
            heading_path=hit.chunk.heading_path,
            text=hit.chunk.text,
            score=round(hit.score, 6),
        )
    return schemas.SearchResult(
        id=hit.turn.id,
        session_id=hit.turn.session_id,
        external_id=hit.turn.external_id,
        role=hit.turn.role,
        name=hit.turn.name,
        text=hit.turn.content,
        score=round(hit.score, 6),
        created_at=hit.turn.created_at,
    )


def summary_body(row: SessionSummary) -> schemas.Summary:
    return schemas.Summary(
        version=row.version,
        through_seq=row.through_seq,
        pruned_seqs=list(row.pruned_seqs),
        text=row.text,
        summarizer=row.summarizer,
        token_count=row.token_count,
        created_at=as_utc(row.created_at),
    )


def user_body(counts: UserCounts) -> body.User:
    user = counts.user
    return body.User(
        id=user.id,
        tenant=counts.tenant_name,
        user_id=user.external_id,
        created_at=as_utc(user.created_at),
        num_sessions=counts.num_sessions,
        num_messages=counts.num_messages,
        num_active_facts=counts.num_facts,
        num_documents=counts.num_documents,
    )


def admin_message_body(row: Message) -> body.AdminMessage:
    return body.AdminMessage(
        message=message_body(StoredTurn.from_row(row)),
        context_note=list(row.context_note or []),
        memory_ids=list(row.context_note_ids or []),
        fact_ids=list(row.context_note_fact_ids or []),
    )


def erased_body(erased: ErasedUser) -> body.Erased:
    return body.Erased(
        user_id=erased.external_id,
        tenant_id=erased.tenant_id,
        removed={
            "sessions": erased.num_sessions,
            "messages": erased.num_messages,
            "message_embeddings": erased.num_embeddings,
            "session_summaries": erased.num_summaries,
            "facts": erased.num_facts,
            "fact_changes": erased.num_fact_changes,
            "knowledge_documents": erased.num_documents,
            "knowledge_chunks": erased.num_chunks,
            "users": 1,
        },
        vectors_removed=[
            f"turns scope {erased.user_pk}",
            f"knowledge scope {scope_of(erased.tenant_id, erased.user_pk)}",
        ],
    )
