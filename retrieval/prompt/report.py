"""What went into a turn's prompt: the items retrieved for it and the recent turns it
carries, how many tokens each section took, and how much of the session's previous
prompt it reuses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from retrieval.knowledge.base import KnowledgeHit
from retrieval.protocols import ChatMessage
from retrieval.turns import SearchHit
from storage.records import Fact


@dataclass(frozen=True, slots=True)
class SectionTokens:
    """Prompt tokens per section; they add up to the whole prompt.

    `template` is what the chat template adds around the messages' contents.
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
    memories: tuple[SearchHit, ...]
    recent_message_ids: tuple[int, ...]
    sections: SectionTokens
    prompt_tokens: int
    context_window: int
    reply_tokens_reserved: int
    # Leading prompt tokens identical to the session's previous prompt (None: no previous
    # prompt known to this process); what a prefix cache can reuse at best.
    prefix_reuse: int | None = None
    pinned_facts: tuple[Fact, ...] = ()
    # Of those, the ones shown in this turn's own context (pinned since the last compaction).
    new_facts: tuple[Fact, ...] = ()
    # Pinned facts left out because the facts budget was full (lowest priority first out).
    facts_omitted: tuple[int, ...] = ()
    summary_version: int = 0
    # Messages up to this sequence number are in the summary, not in the window.
    summary_through_seq: int = 0
    # Small talk dropped from the window to keep it within budget.
    pruned_message_ids: tuple[int, ...] = ()
    knowledge: tuple[KnowledgeHit, ...] = ()


@dataclass(frozen=True, slots=True)
class AssembledContext:
    messages: tuple[ChatMessage, ...]
    report: ContextReport


# Items compared at once by `shared_prefix`.
_BLOCK = 256


def shared_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    """How many leading items two sequences share: compared a block at a time (a slice
    comparison runs in C), then item by item inside the first block that differs."""
    length = min(len(first), len(second))
    start = 0
    while start < length:
        stop = min(length, start + _BLOCK)
        if first[start:stop] != second[start:stop]:
            for position in range(start, stop):
                if first[position] != second[position]:
                    return position
        start = stop
    return length
