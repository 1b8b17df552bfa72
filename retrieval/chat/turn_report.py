"""A turn's report, kept with its reply: what the prompt held, section by section, which
memories it showed and how each scored, the candidates it left out and why, the facts
it pinned and left out, and where the turn spent its time.

The report is made when the turn ends and stored in the reply's row (`turn_report`),
so that it is exact for past turns, in any process and after restarts. It holds ids,
numbers and days, never stored text: a memory or fact deleted later leaves no copy of
its words here (what it said is read from its own row, if still there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from retrieval.chat.timing import TurnTimings
from retrieval.knowledge.base import KnowledgeHit
from retrieval.prompt.report import ContextReport, SectionTokens
from retrieval.protocols import Completion, ScoredId
from retrieval.search.trace import MemoryScores, SearchTrace
from retrieval.turns import SearchHit

# Bump when the stored shape changes incompatibly; older reports are then not shown.
REPORT_VERSION = 1
# Left-out candidates kept per turn, best first (the counts by reason cover them all).
MAX_LEFT_OUT = 20

LeftOutReason = Literal["budget", "duplicate", "deleted"]


@dataclass(frozen=True, slots=True)
class ReportedMemory:
    """A memory a turn's search found: its scores (4 decimals), its day (UTC, ISO; None
    where its row was not read) and, for one left out, why."""

    id: int
    fused: float
    dense: float | None = None
    second: float | None = None
    lexical: float | None = None
    day: str | None = None
    role: str | None = None
    reason: LeftOutReason | None = None


@dataclass(frozen=True, slots=True)
class ReportedKnowledge:
    chunk_id: int
    document_id: str
    ordinal: int
    score: float


@dataclass(frozen=True, slots=True)
class StageSeconds:
    """Where the turn spent its time (see `TurnTimings`). `prefill_s` runs from handing
    the prompt to the engine to its first text, `decode_s` from there to its last event,
    `first_token_s` from admitting the turn to the reply's first text (what the user
    waits); None where the reply had no text. `total_s` stops before the reply is stored."""

    embed_s: float
    search_s: float
    assemble_s: float
    prefill_s: float | None
    decode_s: float | None
    first_token_s: float | None
    generation_s: float
    total_s: float


@dataclass(frozen=True, slots=True)
class FoundMemories:
    """A turn's memories as its search and its prompt weighed them."""

    shown: tuple[ReportedMemory, ...] = ()
    left_out: tuple[ReportedMemory, ...] = ()
    # Candidates left out, by reason, the ones not kept in `left_out` included.
    num_left_out: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TurnReport:
    message_id: int
    prompt_tokens: int
    context_window: int
    reply_tokens_reserved: int
    sections: SectionTokens
    memories: tuple[ReportedMemory, ...]
    left_out: tuple[ReportedMemory, ...]
    num_left_out: dict[str, int]
    knowledge: tuple[ReportedKnowledge, ...]
    pinned_fact_ids: tuple[int, ...]
    new_fact_ids: tuple[int, ...]
    omitted_fact_ids: tuple[int, ...]
    recent_message_ids: tuple[int, ...]
    summary_version: int
    timings: StageSeconds
    # The prompt's leading tokens the engine reported cached (None: it reports none) and
    # those it shares with the session's previous prompt (None: none known then).
    cached_prompt_tokens: int | None = None
    prefix_reuse: int | None = None
    version: int = REPORT_VERSION

    @property
    def cached_prefix(self) -> int | None:
        """The prompt's prefix to mark as cached: the engine's count, else the reuse."""
        return self.cached_prompt_tokens if self.cached_prompt_tokens else self.prefix_reuse


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def _reported(
    hit: ScoredId,
    scores: Mapping[int, MemoryScores],
    hit_of: Mapping[int, SearchHit],
    reason: LeftOutReason | None = None,
) -> ReportedMemory:
    found = scores.get(hit.id, MemoryScores(fused=hit.score))
    row = hit_of.get(hit.id)
    return ReportedMemory(
        id=hit.id,
        fused=round(found.fused, 4),
        dense=_rounded(found.dense),
        second=_rounded(found.second),
        lexical=_rounded(found.lexical),
        day=row.turn.created_at.date().isoformat() if row is not None else None,
        role=row.turn.role if row is not None else None,
        reason=reason,
    )


async def weigh_memories(
    trace: SearchTrace,
    k: int,
    scored: Sequence[ScoredId],
    hits: Sequence[SearchHit],
    shown: Sequence[SearchHit],
) -> FoundMemories:
    """The memories a prompt shows and the candidates it left out: passed over by the
    search as near duplicates, deleted before their rows were read, or found and not
    fitting the memory budget."""
    hit_of = {h.turn.id: h for h in hits}
    shown_ids = {h.turn.id for h in shown}
    left: list[tuple[ScoredId, LeftOutReason]] = [
        (h, "duplicate") for h in trace.near_duplicates(scored, k)
    ]
    left += [(h, "deleted") for h in scored if h.id not in hit_of]
    left += [(h, "budget") for h in scored if h.id in hit_of and h.id not in shown_ids]
    left.sort(key=lambda pair: -pair[0].score)
    counts: dict[str, int] = {}
    for _, reason in left:
        counts[reason] = counts.get(reason, 0) + 1
    kept = left[:MAX_LEFT_OUT]
    scores = await trace.scores([*shown_ids, *(h.id for h, _ in kept)])
    fused = {h.id: h for h in trace.ranked}
    return FoundMemories(
        shown=tuple(
            _reported(fused.get(h.turn.id, ScoredId(h.turn.id, h.score)), scores, hit_of)
            for h in shown
        ),
        left_out=tuple(_reported(h, scores, hit_of, reason) for h, reason in kept),
        num_left_out=counts,
    )


def _knowledge(hit: KnowledgeHit) -> ReportedKnowledge:
    chunk = hit.chunk
    return ReportedKnowledge(chunk.id, chunk.document_id, chunk.ordinal, round(hit.score, 4))


def stage_seconds(timings: TurnTimings, first_token_s: float | None) -> StageSeconds:
    ttft = timings.ttft_s
    return StageSeconds(
        embed_s=timings.embed_s,
        search_s=timings.search_s,
        assemble_s=timings.assemble_s,
        prefill_s=ttft,
        decode_s=None if ttft is None else max(0.0, timings.generation_s - ttft),
        first_token_s=first_token_s,
        generation_s=timings.generation_s,
        total_s=timings.total_s,
    )


def turn_report(
    message_id: int,
    report: ContextReport,
    found: FoundMemories,
    completion: Completion,
    seconds: StageSeconds,
) -> TurnReport:
    return TurnReport(
        message_id=message_id,
        prompt_tokens=report.prompt_tokens,
        context_window=report.context_window,
        reply_tokens_reserved=report.reply_tokens_reserved,
        sections=report.sections,
        memories=found.shown,
        left_out=found.left_out,
        num_left_out=dict(found.num_left_out),
        knowledge=tuple(_knowledge(h) for h in report.knowledge),
        pinned_fact_ids=tuple(f.id for f in report.pinned_facts),
        new_fact_ids=tuple(f.id for f in report.new_facts),
        omitted_fact_ids=report.facts_omitted,
        recent_message_ids=report.recent_message_ids,
        summary_version=report.summary_version,
        timings=seconds,
        cached_prompt_tokens=completion.cached_prompt_tokens,
        prefix_reuse=report.prefix_reuse,
    )


def stored_report(report: TurnReport) -> dict[str, Any]:
    """The report as its JSON column holds it."""
    stored: dict[str, Any] = msgspec.to_builtins(report)
    return stored


def report_of_stored(data: Mapping[str, Any] | None) -> TurnReport | None:
    """A stored report read back; None for none, or one of another version."""
    if not data or data.get("version") != REPORT_VERSION:
        return None
    return msgspec.convert(data, TurnReport)
