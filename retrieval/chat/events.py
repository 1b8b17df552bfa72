"""What a chat turn yields: its start (the stored message and its prompt), the reply's
text as it comes, and its result."""

from __future__ import annotations

from dataclasses import dataclass

from retrieval.chat.timing import TurnTimings
from retrieval.prompt.report import AssembledContext, ContextReport
from retrieval.protocols import Completion, TextDelta
from storage.records import Turn


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """First event of a turn: the user message is stored and the context is assembled."""

    message: Turn
    context: AssembledContext


@dataclass(frozen=True, slots=True)
class TurnResult:
    message: Turn
    reply: Turn
    context: ContextReport
    completion: Completion
    timings: TurnTimings


TurnEvent = TurnStarted | TextDelta | TurnResult
