"""What the chat service hands out and takes in: stored turns, the events and result
of a turn, search hits, imported messages; and the small rules a turn's prompt follows
(which pinned facts go where, how much of the window a reply may reserve)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from retrieval.facts.service import PinnedFact
from retrieval.protocols import Completion, TextDelta
from retrieval.sections import AssembledContext, ContextReport, RetrievedKnowledge, RetrievedMemory
from retrieval.timeutil import as_utc
from retrieval.timing import TurnTimings
from retrieval.window import WindowView
from storage.models import Message


@dataclass(frozen=True, slots=True)
class StoredTurn:
    id: int
    session_id: str
    seq: int
    role: str
    name: str | None
    content: str
    created_at: dt.datetime
    external_id: str | None
    token_count: int

    @classmethod
    def from_row(cls, row: Message) -> StoredTurn:
        return cls(
            id=row.id,
            session_id=row.session_id,
            seq=row.seq,
            role=row.role,
            name=row.name,
            content=row.content,
            created_at=as_utc(row.created_at),
            external_id=row.external_id,
            token_count=row.token_count,
        )


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """First event of a turn: the user message is stored and the context is assembled."""

    message: StoredTurn
    context: AssembledContext


@dataclass(frozen=True, slots=True)
class TurnResult:
    message: StoredTurn
    reply: StoredTurn
    context: ContextReport
    completion: Completion
    timings: TurnTimings


@dataclass(frozen=True, slots=True)
class SearchHit:
    turn: StoredTurn
    score: float


@dataclass(frozen=True, slots=True)
class ImportedMessage:
    role: str
    content: str
    name: str | None = None
    created_at: dt.datetime | None = None
    external_id: str | None = None
    image_caption: str | None = None


@dataclass(frozen=True, slots=True)
class Found:
    """What a turn's prompt shows besides the window: retrieved memories and knowledge,
    and the pinned facts by where they go (see split_pinned)."""

    memories: tuple[RetrievedMemory, ...]
    knowledge: tuple[RetrievedKnowledge, ...]
    in_system: tuple[PinnedFact, ...]
    new_facts: tuple[PinnedFact, ...]
    shown_before: tuple[PinnedFact, ...]


TurnEvent = TurnStarted | TextDelta | TurnResult


def shared_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    """How many leading items two sequences share."""
    for position, (a, b) in enumerate(zip(first, second, strict=False)):
        if a != b:
            return position
    return min(len(first), len(second))


def split_pinned(
    pinned: Sequence[PinnedFact], view: WindowView, session_started: dt.datetime
) -> tuple[list[PinnedFact], list[PinnedFact], list[PinnedFact]]:
    """(in the system message, new this turn, shown by an earlier turn in the window).

    The system message carries the facts pinned as of the window's last compaction, or,
    before the session's first compaction, the facts that existed when the session
    began; facts pinned since are shown once, in a turn's own context, which the
    transcript then keeps: a new fact never changes the prompt's prefix.
    """
    if view.state.version:
        snapshot = view.state.pinned_fact_ids
    else:
        snapshot = frozenset(f.id for f in pinned if f.created_at <= session_started)
    in_notes = {i for t in view.turns for i in t.note_fact_ids}
    in_system = [f for f in pinned if f.id in snapshot]
    new = [f for f in pinned if f.id not in snapshot and f.id not in in_notes]
    shown = [f for f in pinned if f.id not in snapshot and f.id in in_notes]
    return in_system, new, shown


def max_reply_tokens(context_window: int) -> int:
    """The most reply tokens a turn may reserve: half the window, the rest is for context."""
    return max(1, context_window // 2)
