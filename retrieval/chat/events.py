"""The events and the result of a chat turn, and what a turn's prompt shows besides its
window."""

from __future__ import annotations

from dataclasses import dataclass

from retrieval.chat.timing import TurnTimings
from retrieval.facts.memory import PinnedFact
from retrieval.prompt.report import (
    AssembledContext,
    ContextReport,
    RetrievedKnowledge,
    RetrievedMemory,
)
from retrieval.protocols import Completion, TextDelta
from retrieval.turns import StoredTurn


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
class Found:
    """What a turn's prompt shows besides the window: retrieved memories and knowledge,
    and the pinned facts by where they go (see split_pinned)."""

    memories: tuple[RetrievedMemory, ...]
    knowledge: tuple[RetrievedKnowledge, ...]
    in_system: tuple[PinnedFact, ...]
    new_facts: tuple[PinnedFact, ...]
    shown_before: tuple[PinnedFact, ...]


TurnEvent = TurnStarted | TextDelta | TurnResult
