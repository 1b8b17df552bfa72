"""What a prompt is made of: the items retrieved for it, the recent turns it carries, and
the per-section report of a turn (what went in, how many tokens each section took, how
much of the previous prompt it reuses)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from retrieval.facts.memory import PinnedFact
from retrieval.protocols import ChatMessage


@dataclass(frozen=True, slots=True)
class RetrievedMemory:
    message_id: int
    session_id: str
    role: str
    name: str | None
    text: str
    score: float
    created_at: dt.datetime
    external_id: str | None
    token_count: int


@dataclass(frozen=True, slots=True)
class RetrievedKnowledge:
    """A chunk of a knowledge-base document, shown in the prompt under its title."""

    chunk_id: int
    document_id: str
    title: str
    heading_path: str
    text: str
    score: float


@dataclass(frozen=True, slots=True)
class RecentTurn:
    message_id: int
    role: str
    name: str | None
    text: str
    token_count: int
    # The per-turn context the message was sent with; re-inserted before it, as sent.
    # `token_count` is what the turn takes in a prompt: its content and this note.
    note: str = ""


@dataclass(frozen=True, slots=True)
class SectionTokens:
    """Prompt tokens per section; they add up to the whole prompt.

    `template` is what the chat template adds beyond the messages (the reply's opening).
    """

    system: int
    facts: int
    summary: int
    memories: int
    recent: int
    new_message: int
    template: int
    knowledge: int = 0


@dataclass(frozen=True, slots=True)
class ContextReport:
    memories: tuple[RetrievedMemory, ...]
    recent_message_ids: tuple[int, ...]
    sections: SectionTokens
    prompt_tokens: int
    context_window: int
    reply_tokens_reserved: int
    # Leading prompt tokens identical to the session's previous prompt (None: no previous
    # prompt known to this process); what a prefix cache can reuse at best.
    prefix_reuse: int | None = None
    pinned_facts: tuple[PinnedFact, ...] = ()
    # Of those, the ones shown in this turn's own context (pinned since the last compaction).
    new_facts: tuple[PinnedFact, ...] = ()
    # Pinned facts left out because the facts budget was full (lowest priority first out).
    facts_omitted: tuple[int, ...] = ()
    summary_version: int = 0
    # Messages up to this sequence number are in the summary, not in the window.
    summary_through_seq: int = 0
    # Small talk dropped from the window to keep it within budget.
    pruned_message_ids: tuple[int, ...] = ()
    knowledge: tuple[RetrievedKnowledge, ...] = ()


@dataclass(frozen=True, slots=True)
class AssembledContext:
    messages: tuple[ChatMessage, ...]
    report: ContextReport


def shared_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    """How many leading items two sequences share."""
    for position, (a, b) in enumerate(zip(first, second, strict=False)):
        if a != b:
            return position
    return min(len(first), len(second))
